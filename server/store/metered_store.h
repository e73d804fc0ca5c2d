// MeteredStore: a Store that counts every call on another one in the
// process's metrics (tessera_store_op_seconds{op}, and
// tessera_store_op_failures_total{op} for those that fail, a wait that
// timed out and UNIMPLEMENTED aside; see
// server/metrics/metrics.h). The daemon wraps its rendezvous store in one.
//
// Thread-safety and failure: those of the wrapped store, whose results it
// returns unchanged. Ownership: shares the wrapped store.
#ifndef TESSERA_SERVER_STORE_METERED_STORE_H_
#define TESSERA_SERVER_STORE_METERED_STORE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "server/store/store.h"

namespace tessera {

class MeteredStore final : public Store {
 public:
  // Takes `base`'s timeout as its own.
  explicit MeteredStore(std::shared_ptr<Store> base);

  // Each call is counted with the op label in its comment.

  // "set"
  absl::Status Set(absl::string_view key, absl::string_view value) override;
  // "get"; a timeout is not a failure.
  absl::StatusOr<std::string> Get(absl::string_view key,
                                  absl::Duration timeout) override;
  // "add"
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;
  // "compare_set"
  absl::StatusOr<std::string> CompareSet(absl::string_view key,
                                         absl::string_view expected,
                                         absl::string_view desired) override;
  // "delete"
  absl::StatusOr<bool> Delete(absl::string_view key) override;
  // "wait"; a timeout is not a failure.
  absl::Status Wait(absl::Span<const std::string> keys,
                    absl::Duration timeout) override;
  // "check"
  absl::StatusOr<bool> Check(absl::Span<const std::string> keys) override;
  // "set_live"; UNIMPLEMENTED (no leases) is not a failure.
  absl::StatusOr<int64_t> SetLive(absl::string_view key,
                                  absl::string_view value,
                                  absl::Duration ttl) override;
  // "renew"
  absl::Status Renew(int64_t lease) override;

  using Store::Get;
  using Store::Wait;

 private:
  const std::shared_ptr<Store> base_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_STORE_METERED_STORE_H_
