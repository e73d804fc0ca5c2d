// Core: the state behind one daemon's ControlServiceImpl
// (control_service.h), composed of one collaborator per concern, each with
// its own header:
//
//   TensorTable  (tensor_table.h)  the named tensors; List and Describe
//   OpLog        (op_log.h)        submitting, ordering and executing ops
//   ControlOps   (control_ops.h)   the ops' bodies, ending in an agreement
//   Membership   (membership.h)    leases, generations, re-forming, rejoin
//   Replication  (replication.h)   replicas of shards and their refill
//   OpOutcomes   (op_outcomes.h)   what became of each request id
//   InDoubt      (in_doubt.h)      the op this daemon cannot tell committed
//   VersionLeases (version_leases.h) ends pins and open versions on time
//   VersionWatch (version_watch.h)  who watches which tensor's versions
//   StaleCopies  (stale_copies.h)   copies that missed a write; the fence
//
// Core owns them, starts them in order (the log position, then the
// daemons joining in step, then the lease and log threads) and stops
// them; it answers what needs several of them (GetCluster, the gauges, the
// environment of region reads and writes). docs/control_log.md describes
// the protocol. Internal to server/daemon/.
//
// Thread-safety: every public method may be called from any thread;
// Start and Shutdown are serialised. Ownership: shared by the service and
// its reactors and streams (which may outlive Shutdown briefly); the
// collaborators live until the Core is destroyed.
#ifndef TESSERA_SERVER_DAEMON_CONTROL_CORE_H_
#define TESSERA_SERVER_DAEMON_CONTROL_CORE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/daemon/control_ops.h"
#include "server/daemon/control_options.h"
#include "server/daemon/in_doubt.h"
#include "server/daemon/membership.h"
#include "server/daemon/memory_budget.h"
#include "server/daemon/op_log.h"
#include "server/daemon/op_outcomes.h"
#include "server/daemon/pending_call.h"
#include "server/daemon/region_io.h"
#include "server/daemon/replication.h"
#include "server/daemon/stale_copies.h"
#include "server/daemon/tensor_table.h"
#include "server/daemon/version_leases.h"
#include "server/daemon/version_watch.h"
#include "server/metrics/metrics.h"
#include "server/rank/rank.h"
#include "server/serve/shard_service.h"
#include "server/store/store.h"
#include "tessera/v1/control.pb.h"

namespace tessera::control_internal {

class Core : public std::enable_shared_from_this<Core> {
 public:
  Core(std::shared_ptr<Rank> rank, ControlOptions options);
  // Calls Shutdown().
  ~Core();
  Core(const Core&) = delete;
  Core& operator=(const Core&) = delete;

  // As ControlServiceImpl::Start and Shutdown.
  absl::Status Start();
  void Shutdown();

  // OK while running; UNAVAILABLE before Start() and from Shutdown() on.
  absl::Status Accepting() const;

  // A call for an op of `method` that gives up at `deadline` (the
  // client's, capped by op_timeout), with the client's `request_id`; not
  // yet queued. Attach it to its reactor, then Submit it.
  std::shared_ptr<PendingCall> NewCall(std::string method,
                                       std::string request_id,
                                       absl::Time client_deadline,
                                       Completion completion);
  // Queues `op` for the log on behalf of `call` (OpLog::Submit); completes
  // the call at once with UNAVAILABLE when the service is not running.
  void Submit(v1::ControlOp op, const std::shared_ptr<PendingCall>& call);
  // Completes `call` and forgets it (OpLog::Finish).
  void Finish(const std::shared_ptr<PendingCall>& call,
              const absl::Status& status, OpResult result = {});

  absl::StatusOr<v1::TensorInfo> Describe(const std::string& name) const;
  // TensorTable::List.
  v1::ListTensorsResponse List(const std::vector<std::string>& names = {},
                               const std::string& after = "",
                               int64_t page_bytes = 0) const {
    return table_.List(names, after, page_bytes);
  }
  // What became of the logged call with client request id `request_id`
  // (GetOperation): committed, pending here, failed, or unknown.
  // INVALID_ARGUMENT for an id no client may send.
  absl::StatusOr<v1::OperationStatus> Operation(
      const std::string& request_id) const;
  absl::StatusOr<v1::ClusterInfo> Cluster() const;
  // A writer's MarkStale: the copies of request.tensor_id() on
  // request.ranks() missed a write (StaleCopies::Mark, answered after the
  // fence). INVALID_ARGUMENT for a rank outside the cluster or this
  // daemon's own; FAILED_PRECONDITION for a tensor id that is not an
  // unversioned tensor with copies here.
  absl::Status MarkStale(const v1::MarkStaleRequest& request,
                         absl::Time deadline);
  // A holder's RenewLeases (VersionSet::Renew, RenewPin): renews on this
  // daemon the open versions and pins `request` names and lists in
  // `response` those it does not hold. INVALID_ARGUMENT beyond 100,000
  // versions or 1,024 pins.
  absl::Status RenewLeases(const v1::RenewLeasesRequest& request,
                           v1::RenewLeasesResponse* response);
  // What ReadRegion and WriteRegion need of this daemon (region_io.h).
  RegionEnv Env();
  // How ReadRegion and Gather streams are cut.
  ShardServiceOptions Chunks() const;
  int rank() const { return rank_->rank(); }
  // The watchers of versioned tensors (WatchVersions).
  VersionWatch& watch() { return watch_; }
  int64_t applied_ops() const;

 private:
  enum class State { kNew, kRunning, kStopping, kStopped };

  absl::Status AcceptingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // This daemon's gauges (tessera_tensors, the budget, the generation,
  // peers: docs/metrics.md), read by every scrape while registered:
  // registered by Start(), dropped by Shutdown().
  void RegisterGauges() ABSL_EXCLUSIVE_LOCKS_REQUIRED(shutdown_mu_)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Starts looking at this daemon's stale marks and gates the registry's
  // serving on them (Start).
  void StartStaleCopies();

  const std::shared_ptr<Rank> rank_;
  const ControlOptions options_;
  const std::shared_ptr<MemoryBudget> budget_;
  const std::shared_ptr<Store> store_;
  const uint64_t incarnation_;
  std::atomic<uint64_t> next_call_id_{1};
  // GetOperation calls waiting now for a running op's outcome (Operation).
  mutable std::atomic<int> settling_{0};
  TensorTable table_;
  OpOutcomes outcomes_;
  InDoubt in_doubt_;
  VersionWatch watch_;

  // One per concern, in this order (each points at the ones before),
  // destroyed in reverse; their threads run from Start() to Shutdown().
  Replication replication_;
  Membership membership_;
  ControlOps ops_;
  OpLog log_;
  VersionLeases version_leases_{&table_};
  StaleCopies stale_;

  absl::Mutex shutdown_mu_;  // Serialises Start() and Shutdown().
  std::vector<std::unique_ptr<GaugeSource>> gauges_
      ABSL_GUARDED_BY(shutdown_mu_);

  mutable absl::Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kNew;
};

}  // namespace tessera::control_internal

#endif  // TESSERA_SERVER_DAEMON_CONTROL_CORE_H_
