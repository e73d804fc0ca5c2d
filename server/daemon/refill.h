// Refill: the shards a restarted daemon gets back from the other holders of
// a replicated tensor (TensorInfo.replicas), in the background, while the
// cluster serves.
//
// The daemon allocates the buffers of the shards it owns and of its
// replicas, and fetches them from another holder each. Meanwhile nothing
// serves the buffers (reads of them fall back to the other holders), but
// writes that reach this daemon are applied to them at once and logged;
// Complete replays the log over the fetched bytes, so a write that arrived
// while its box was being fetched is not lost, then registers the buffers
// (the caller's `finish`) before any later write can miss them.
//
// Thread-safety: every method may be called concurrently.
#ifndef TESSERA_SERVER_DAEMON_REFILL_H_
#define TESSERA_SERVER_DAEMON_REFILL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/region_transfer.h"
#include "server/serve/shard_registry.h"

namespace tessera {

class Refill {
 public:
  // `own`: the shards this daemon owns; `copies`: its replicas (may be
  // null). Both are filled by the fetches and then handed to `finish`.
  Refill(std::vector<LocalShard> own, std::shared_ptr<RegisteredTensor> copies);

  std::vector<LocalShard>& own() { return own_; }
  const std::shared_ptr<RegisteredTensor>& copies() const { return copies_; }

  // Applies `piece` of a write to the own shard (replica false) or the copy
  // (true) of piece.shard, and logs it for Complete. False when the refill
  // is complete (the caller writes to the registered shards instead);
  // INVALID_ARGUMENT when this daemon holds no such buffer.
  absl::StatusOr<bool> Write(bool replica, const RegionPiece& piece);

  // Replays the logged writes, then runs `finish` (which registers the
  // buffers), under the lock that Write takes: no write falls between.
  // `finish`'s status; the refill counts as complete either way.
  absl::Status Complete(const std::function<absl::Status()>& finish);
  // Lock-free: callers may hold their own locks.
  bool complete() const { return complete_flag_.load(); }

 private:
  struct Logged {
    bool replica = false;
    int64_t shard = 0;
    std::vector<int64_t> offsets_in_shard;
    Tensor data;  // a copy of the piece's bytes
  };
  // The buffer of `shard` (own or copy); null when this daemon has none.
  const Tensor* Buffer(bool replica, int64_t shard) const;

  std::vector<LocalShard> own_;
  const std::shared_ptr<RegisteredTensor> copies_;
  mutable absl::Mutex mu_;
  bool complete_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> complete_flag_{false};
  std::vector<Logged> log_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_SERVER_DAEMON_REFILL_H_
