// HashStore: the in-memory Store of one process (c10d's HashStore). Unit
// tests use it with threads as ranks; StoreServiceImpl (grpc_store.h) keeps
// its keys in one.
//
// Besides the blocking Store calls it offers Watch(), a callback-based wait
// that holds no thread, so that a server can park thousands of waiting RPCs.
//
// Thread-safety: every method may be called from any thread. Watch
// callbacks run without HashStore's lock held, so they may call back into
// the store; they must not block, since they run on the thread of the Set
// that completed them.
// Failure: see store.h; nothing here touches I/O, so the only errors are
// bad arguments, non-integer Adds, timeouts, and RESOURCE_EXHAUSTED for a
// write past the store's limits (HashStoreLimits: one value's size, and
// the keys and values held in all), which changes nothing.
#ifndef TESSERA_SERVER_STORE_HASH_STORE_H_
#define TESSERA_SERVER_STORE_HASH_STORE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "server/store/store.h"

namespace tessera {

// How much a HashStore holds: a served store's memory is the control
// plane's, and a client must not be able to exhaust it.
struct HashStoreLimits {
  int64_t max_value_bytes = int64_t{64} << 20;
  // Keys and values together.
  int64_t max_total_bytes = int64_t{1} << 30;
};

class HashStore : public Store {
 public:
  using WatchId = uint64_t;
  // Receives the values of the watched keys, in the order they were given,
  // as they stood when the last of them was set.
  using WatchCallback = std::function<void(std::vector<std::string> values)>;

  HashStore() = default;
  explicit HashStore(HashStoreLimits limits) : limits_(limits) {}
  HashStore(const HashStore&) = delete;
  HashStore& operator=(const HashStore&) = delete;

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key,
                                  absl::Duration timeout) override;
  using Store::Get;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;
  absl::StatusOr<std::string> CompareSet(absl::string_view key,
                                         absl::string_view expected,
                                         absl::string_view desired) override;
  absl::StatusOr<bool> Delete(absl::string_view key) override;
  absl::Status Wait(absl::Span<const std::string> keys,
                    absl::Duration timeout) override;
  using Store::Wait;
  absl::StatusOr<bool> Check(absl::Span<const std::string> keys) override;

  // Calls `on_ready` once, when every key in `keys` is set: before
  // returning if they already are, otherwise on the thread whose
  // Set/Add/CompareSet sets the last of them. Keys are not validated.
  WatchId Watch(std::vector<std::string> keys, WatchCallback on_ready);
  // Cancels a watch. True when it had not fired (and now never will);
  // false when its callback has run or is about to run.
  bool Unwatch(WatchId id);

  // The keys among `keys` that are not set now, in order.
  std::vector<std::string> MissingKeys(absl::Span<const std::string> keys);

 private:
  struct Watcher {
    std::vector<std::string> keys;
    WatchCallback on_ready;
  };
  using Ready = std::vector<std::pair<WatchCallback, std::vector<std::string>>>;

  // Runs `mutate` on the map under the lock, then the watches it completed
  // on `key`, unlocked.
  template <typename Mutate>
  auto MutateAndNotify(absl::string_view key, Mutate mutate);
  // Blocks until every key is set; their values, or DEADLINE_EXCEEDED.
  absl::StatusOr<std::vector<std::string>> WaitForValues(
      absl::Span<const std::string> keys, absl::Duration timeout);

  // The values of `keys` when all are set, else false.
  bool ValuesOf(absl::Span<const std::string> keys,
                std::vector<std::string>* values) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves the watches that `key` completed into `ready`.
  void TakeReady(absl::string_view key, Ready* ready)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops a watch from both indexes; false when it is not there.
  bool Forget(WatchId id, Watcher* watcher) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // OK when `key` may hold `size` bytes (replacing what it holds).
  absl::Status Admit(absl::string_view key, size_t size) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets `key` to `value`, keeping total_bytes_.
  void Put(absl::string_view key, std::string value)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const HashStoreLimits limits_ = HashStoreLimits();
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
  int64_t total_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  WatchId next_watch_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<WatchId, Watcher> watchers_ ABSL_GUARDED_BY(mu_);
  // Which watches a key can complete, so a Set looks only at those.
  absl::flat_hash_map<std::string, absl::flat_hash_set<WatchId>> watches_of_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_SERVER_STORE_HASH_STORE_H_
