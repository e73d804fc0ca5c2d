// Replication: the copies of a tensor's shards on other daemons than their
// owners (copies > 1: TensorInfo.replicas, placed by wire/replicas.h), and
// the refill that gives a restarted daemon its shards and copies back.
// docs/control_log.md ("Replicas") says when they are written and refilled.
//
// Replicate is collective, run by a control op (CreateTensor, Reshard) on
// every daemon at the same log entry: each daemon allocates its copies in
// host memory within the budget, fills them (from the init kind when that
// needs no data, else from the owners) and registers them; the outcome is
// agreed. Rebuild runs while a restarted daemon joins the running cluster
// (membership.h): the shards it owns that survive on replicas, and its own
// replicas, are fetched back from the other holders on a thread of their
// own, while the table refuses ops on the tensor (UNAVAILABLE), reads go to
// the other holders and writes are kept by the Refill (refill.h).
//
// Failure: a holder that cannot give a shard is skipped for the next one;
// none left is UNAVAILABLE naming the shard and every holder tried. A
// failed refill leaves its entry refused with the reason (TensorTable).
//
// Thread-safety: Replicate and Rebuild run on the executor thread;
// Refilling may be called from any thread. Shutdown joins the refills
// (each bounded by the op timeout). Ownership: the control core owns it;
// it points at the core's table, which outlives it.
#ifndef TESSERA_SERVER_DAEMON_REPLICATION_H_
#define TESSERA_SERVER_DAEMON_REPLICATION_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/collective/process_group.h"
#include "server/daemon/memory_budget.h"
#include "server/daemon/refill.h"
#include "server/daemon/replica_copies.h"
#include "server/daemon/tensor_table.h"
#include "server/daemon/version_set.h"
#include "server/rank/rank.h"
#include "server/serve/shard_registry.h"
#include "tessera/v1/control.pb.h"
#include "tessera/v1/control_internal.pb.h"
#include "tessera/v1/sharding.pb.h"

namespace tessera::control_internal {

class Replication {
 public:
  Replication(std::shared_ptr<Rank> rank, std::shared_ptr<ProcessGroup> group,
              std::shared_ptr<MemoryBudget> budget, absl::Duration op_timeout,
              TensorTable* table);
  // Calls Shutdown().
  ~Replication();
  Replication(const Replication&) = delete;
  Replication& operator=(const Replication&) = delete;

  // Collective: gives the tensor `name` of the table `copies` (> 1)
  // holders of every shard. Places the replicas (PlaceReplicas), allocates
  // this daemon's copies in host memory (within the budget), fills them as
  // `init` says when that needs no data (zeros, ones, full; empty leaves
  // them as allocated) or else from their owners, and registers them; the
  // entry's info lists every shard's replicas. The agreed status (Agree).
  absl::Status Replicate(const std::string& name, int copies,
                         const v1::CreateTensorRequest* init, bool* agreed);

  // This daemon's copies of a tensor that is not in the table yet, and
  // their share of the budget.
  struct PlacedCopies {
    // Its copies of info.replicas' shards, allocated in host memory,
    // unfilled (no shard when it holds none of them).
    std::shared_ptr<RegisteredTensor> mine;
    MemoryBudget::Reservation held;
  };
  // Replicate's placement and allocation, for an op that fills the copies
  // itself before the tensor enters the table (Reshard fills them from the
  // old layout): sets info->replicas to `copies` (> 1) holders of every
  // shard of `metadata` (PlaceReplicas: deterministic) and allocates this
  // daemon's copies within the budget. INVALID_ARGUMENT from
  // PlaceReplicas; RESOURCE_EXHAUSTED naming the tensor beyond the budget.
  absl::StatusOr<PlacedCopies> PlaceCopies(
      v1::TensorInfo* info, const ShardedTensorMetadata& metadata,
      int copies) const;
  // This daemon's copies of the shards that `info.replicas` (placed
  // already) gives it, reserved in the budget (a refusal is
  // RESOURCE_EXHAUSTED naming `what`), then allocated in host memory,
  // unfilled: a new version's copies (BeginVersion), or PlaceCopies'.
  absl::StatusOr<PlacedCopies> CopiesFor(const v1::TensorInfo& info,
                                         const ShardedTensorMetadata& metadata,
                                         const std::string& what) const;

  // A starting daemon's entry for a tensor of the running cluster: its
  // ShardedTensor with no shards of this daemon, or none when this
  // daemon's shards of it were lost. `spec` is the layout it was made by
  // (empty: the metadata's). Shards it owns that survive on replicas, and
  // its own replicas, are refilled in the background from the other
  // holders (not in `starting`): of a versioned tensor, those of every
  // kept version (info.kept_versions, each fetched by its version id),
  // which then form its VersionSet, numbered on from info.next_version.
  // Its open versions are not refilled (a publish of one fails), nor an
  // older version no holder gives any more (freed meanwhile); its `pins`
  // are taken on with the lease they had left.
  absl::Status Rebuild(v1::TensorInfo info, const v1::ShardingSpec& spec,
                       const std::set<int>& starting,
                       std::vector<v1::VersionPin> pins = {});

  // Refills this daemon's shards and copies of the unversioned tensor with
  // id `tensor_id` in place, from the other holders, on a thread of its
  // own: its copies here missed a write (stale_copies.h), and are not
  // served meanwhile. Fresh buffers (within the budget) are fetched into
  // while writes that reach this daemon go into them too and are logged
  // (refill.h); the log is replayed and the bytes copied over the
  // registered shards under the refill's lock, so no write falls between.
  // `done(true)` once they hold the fetched bytes, or when there is
  // nothing to refill (the tensor is gone, versioned, or has nothing here);
  // `done(false)` when it failed (logged; the caller tries again).
  void RefillStale(const std::string& tensor_id,
                   std::function<void(bool refilled)> done);

  // The refill in progress of the tensor with this id, or null (writes to
  // its shards go into it: RegionEnv::refilling).
  std::shared_ptr<Refill> Refilling(const std::string& tensor_id) const;

  // Joins the refills. Idempotent.
  void Shutdown();

 private:
  int rank() const { return rank_->rank(); }
  // What Rebuild refills of one tensor: the tensor, or one kept version.
  struct RefillPart {
    // The version; 0 for an unversioned tensor.
    int64_t number = 0;
    // Its buffers here (null: this daemon holds nothing of it).
    std::shared_ptr<Refill> refill;
    // Their share of the budget.
    MemoryBudget::Reservation held;
    // An unversioned tensor's, once complete (CompleteParts).
    std::optional<ShardedTensor> tensor;
    std::shared_ptr<ReplicaCopies> copies;
  };
  // A refill's buffers for `info` (own shards, copies of others'), counted
  // in *host_bytes; null when this daemon holds none of its shards.
  absl::StatusOr<std::shared_ptr<Refill>> RefillBuffers(
      const v1::TensorInfo& info, const ShardedTensorMetadata& metadata,
      int64_t* host_bytes) const;
  // Registers the filled `parts` of `info`: a versioned tensor's
  // VersionSet, or (null) the unversioned tensor and its copies in
  // parts[0].
  absl::StatusOr<std::shared_ptr<VersionSet>> CompleteParts(
      const v1::TensorInfo& info, const v1::ShardingSpec& spec,
      const std::vector<v1::VersionPin>& pins,
      std::vector<RefillPart>* parts) const;
  // The refill thread's body for the tensor `info` (Rebuild): fetches
  // every part, then completes `refill` (the entry's) and the others.
  void RunRefill(v1::TensorInfo info, v1::ShardingSpec spec,
                 std::set<int> starting, std::shared_ptr<Refill> refill,
                 std::vector<RefillPart> parts,
                 std::vector<v1::VersionPin> pins);
  // Each daemon's host, for PlaceReplicas: the host of its address.
  std::vector<std::string> WorkerHosts() const;
  // This daemon's copies of `info`'s shards (as info.replicas says), in
  // host memory, unfilled; `host_bytes` their size.
  absl::StatusOr<std::shared_ptr<RegisteredTensor>> AllocateCopies(
      const v1::TensorInfo& info, const ShardedTensorMetadata& metadata,
      int64_t* host_bytes) const;
  // Fills `shards` (of tensor `info`, this daemon's copies or own shards)
  // from another holder of each: the owner's shard or a replica, the first
  // that answers, skipping the ranks in `gone`; a holder but the last that
  // moves no byte for kDefaultHolderPatience (stalled) is given up for the
  // next (FetchWatched). UNAVAILABLE naming the shard and every holder
  // tried when none could give it.
  absl::Status FetchFromHolders(const v1::TensorInfo& info,
                                const std::vector<LocalShard>& shards,
                                const std::set<int>& gone,
                                absl::Time deadline) const;

  const std::shared_ptr<Rank> rank_;
  const std::shared_ptr<ProcessGroup> group_;
  const std::shared_ptr<MemoryBudget> budget_;
  const absl::Duration op_timeout_;
  TensorTable* const table_;

  mutable absl::Mutex mu_;
  // Refills in the background (RunRefill), joined by Shutdown, and those
  // in progress by tensor id.
  struct Running {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> finished;
  };
  std::vector<Running> refills_ ABSL_GUARDED_BY(mu_);
  // Runs `body` on a refill thread, joining the refills that finished.
  void StartRefillLocked(std::function<void()> body)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<Refill>> refilling_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::control_internal

#endif  // TESSERA_SERVER_DAEMON_REPLICATION_H_
