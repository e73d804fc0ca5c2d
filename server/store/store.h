// Store: the rendezvous key-value store ranks use to find each other
// (addresses, Gloo pair endpoints, NCCL unique ids, group names). Modelled
// on c10d's Store; small values only, bulk bytes never go through it.
//
// Implementations:
//   HashStore   in memory, one process (unit tests, threads as ranks);
//   FileStore   one shared file, ranks on one host (PyTorch's file://);
//   GrpcStore   client of a StoreService (grpc_store.h), the multi-host
//               default, served by rank 0 or a standalone process;
//   PrefixStore scopes keys (one per process group).
//
// Thread-safety: every Store is safe to call from any number of threads.
// Failure: a wait that times out is DEADLINE_EXCEEDED and names the missing
// keys; an unreachable store is UNAVAILABLE; Add on a non-integer value is
// FAILED_PRECONDITION. Nothing aborts.
#ifndef TESSERA_SERVER_STORE_STORE_H_
#define TESSERA_SERVER_STORE_STORE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace tessera {

class Store {
 public:
  // c10d's default: long enough for slow ranks to start, short enough that a
  // dead rank is reported rather than waited on forever.
  static constexpr absl::Duration kDefaultTimeout = absl::Seconds(300);

  virtual ~Store() = default;

  // Sets `key` to `value`, replacing any previous value; wakes waiters.
  virtual absl::Status Set(absl::string_view key, absl::string_view value) = 0;

  // The value of `key`, waiting up to `timeout` for it to be set
  // (DEADLINE_EXCEEDED "store wait timed out after 30s; missing keys: [k]").
  virtual absl::StatusOr<std::string> Get(absl::string_view key,
                                          absl::Duration timeout) = 0;
  absl::StatusOr<std::string> Get(absl::string_view key) {
    return Get(key, timeout());
  }

  // Adds `delta` to the decimal integer at `key` (absent counts as 0) and
  // returns the new value.
  virtual absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) = 0;

  // Sets `desired` when the key holds `expected` (or is absent and
  // `expected` is empty) and returns the value held afterwards; an absent
  // key with a non-empty `expected` is left absent and `expected` returned
  // (c10d's compare_set).
  virtual absl::StatusOr<std::string> CompareSet(absl::string_view key,
                                                 absl::string_view expected,
                                                 absl::string_view desired) = 0;

  // Removes `key`; true when it existed.
  virtual absl::StatusOr<bool> Delete(absl::string_view key) = 0;

  // Returns once every key is set; DEADLINE_EXCEEDED after `timeout`.
  virtual absl::Status Wait(absl::Span<const std::string> keys,
                            absl::Duration timeout) = 0;
  absl::Status Wait(absl::Span<const std::string> keys) {
    return Wait(keys, timeout());
  }

  // Whether every key is set, without waiting.
  virtual absl::StatusOr<bool> Check(absl::Span<const std::string> keys) = 0;

  // Liveness (optional; etcd's Leases): SetLive sets `key` to `value` bound
  // to a new lease of `ttl` (stores may round it up) and returns the
  // lease's id; Renew(id) extends the lease by its ttl from now. The store
  // itself removes the key once the lease runs out (its holder died or
  // stalled), judged by its own clock. Renew of a lease that ran out is
  // NOT_FOUND (SetLive again). Stores without leases return UNIMPLEMENTED;
  // callers then fall back to counters they judge themselves.
  virtual absl::StatusOr<int64_t> SetLive(absl::string_view key,
                                          absl::string_view value,
                                          absl::Duration ttl);
  virtual absl::Status Renew(int64_t lease);

  // The timeout of the overloads without one.
  absl::Duration timeout() const { return timeout_; }
  void set_timeout(absl::Duration timeout) { timeout_ = timeout; }

 private:
  absl::Duration timeout_ = kDefaultTimeout;
};

// The DEADLINE_EXCEEDED every store returns when a wait ends early.
absl::Status StoreTimeoutError(absl::Duration timeout,
                               absl::Span<const std::string> missing_keys);

// The rules every implementation shares, so that a program behaves the same
// on any store. `current` is the value a key holds, null when absent.

// INVALID_ARGUMENT for an empty key: PrefixStore would otherwise turn it
// into a real key ("prefix/") of its base.
absl::Status ValidateStoreKey(absl::string_view key);
// ValidateStoreKey for each key; INVALID_ARGUMENT for a negative timeout.
absl::Status ValidateStoreWait(absl::Span<const std::string> keys,
                               absl::Duration timeout);

// The value Add stores: FAILED_PRECONDITION when `current` is not a decimal
// int64, OUT_OF_RANGE when the sum overflows.
absl::StatusOr<int64_t> StoreAddResult(absl::string_view key,
                                       const std::string* current,
                                       int64_t delta);

// What CompareSet does: the value returned, and whether `desired` is
// written (c10d's compare_set, see Store::CompareSet).
struct CompareSetOutcome {
  std::string value;
  bool write = false;
};
CompareSetOutcome StoreCompareSetResult(const std::string* current,
                                        absl::string_view expected,
                                        absl::string_view desired);

}  // namespace tessera

#endif  // TESSERA_SERVER_STORE_STORE_H_
