// The state behind ControlServiceImpl (control_service.h), shared by the
// files that implement it: op_log.cc (the operation log: submitting,
// executing in order, agreeing), control_ops.cc (the ops' bodies),
// tensor_table.cc (the table of named tensors and the read-only queries)
// and control_service.cc (the gRPC surface). docs/control_log.md describes
// the protocol. Internal to server/daemon/.
#ifndef TESSERA_SERVER_DAEMON_CONTROL_CORE_H_
#define TESSERA_SERVER_DAEMON_CONTROL_CORE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/nonce.h"
#include "server/collective/process_group.h"
#include "server/daemon/control_service.h"
#include "server/daemon/memory_budget.h"
#include "server/daemon/refill.h"
#include "server/daemon/region_io.h"
#include "server/metrics/metrics.h"
#include "server/rank/rank.h"
#include "server/serve/fetch.h"
#include "server/serve/shard_registry.h"
#include "server/sharded/sharded_tensor.h"
#include "server/store/prefix_store.h"
#include "tessera/v1/control.pb.h"
#include "tessera/v1/control_internal.pb.h"

namespace tessera::control_internal {

inline constexpr char kShuttingDown[] = "daemon is shutting down";
inline constexpr char kStarting[] = "daemon is starting";

// NOT_FOUND for a name the table does not hold.
absl::Status UnknownTensor(absl::string_view name);
// FAILED_PRECONDITION for an op on a degraded tensor, naming its lost
// shards and their owners.
absl::Status DegradedError(const v1::TensorInfo& info);
// The method name of `op` ("CreateTensor", ...), for messages.
const char* OpName(const v1::ControlOp& op);
// The tensor `op` is about (names joined by "," for checkpoints; "" for
// none), for logs.
std::string OpTensor(const v1::ControlOp& op);
// The budget of a daemon whose options name none: DefaultMemoryLimit for
// a daemon alone on its host.
inline std::shared_ptr<MemoryBudget> DefaultBudget() {
  std::string source;
  const int64_t limit = DefaultMemoryLimit(1, &source);
  return MemoryBudget::Create(limit, source);
}

// This daemon's copies of other daemons' shards of one tensor
// (TensorInfo.replicas), served under ReplicaTensorId(tensor id) from
// construction until destruction, and their share of the memory budget.
class ReplicaCopies {
 public:
  // ALREADY_EXISTS / INVALID_ARGUMENT as ShardRegistry::Register.
  static absl::StatusOr<std::shared_ptr<ReplicaCopies>> Register(
      std::shared_ptr<Rank> rank, const std::string& tensor_id,
      std::shared_ptr<RegisteredTensor> copies, MemoryBudget::Reservation held);
  ~ReplicaCopies();
  ReplicaCopies(const ReplicaCopies&) = delete;
  ReplicaCopies& operator=(const ReplicaCopies&) = delete;

 private:
  ReplicaCopies(std::shared_ptr<Rank> rank, std::string id,
                MemoryBudget::Reservation held)
      : rank_(std::move(rank)), id_(std::move(id)), held_(std::move(held)) {}

  const std::shared_ptr<Rank> rank_;
  const std::string id_;
  MemoryBudget::Reservation held_;
};

// What an op produced, for its coordinator's reply.
struct OpResult {
  v1::TensorInfo info;                // CreateTensor, Reshard, Gather
  std::vector<std::string> names;     // SaveCheckpoint
  std::vector<v1::TensorInfo> infos;  // LoadCheckpoint
  Tensor gathered;                    // Gather, on the coordinator
  // Its share of the memory budget, held until the stream is done with it.
  std::shared_ptr<MemoryBudget::Reservation> gathered_reservation;
};

using Completion = std::function<void(const absl::Status&, OpResult)>;

// A call waiting for its op. Completed once, by whichever comes first: the
// executor (the op's outcome), the submit thread (deadline, store failure),
// the reactor (cancellation) or Shutdown.
class PendingCall {
 public:
  PendingCall(uint64_t id, std::string method, std::string request_id,
              absl::Time deadline, Completion completion)
      : id_(id),
        method_(std::move(method)),
        request_id_(std::move(request_id)),
        deadline_(deadline),
        created_(absl::Now()),
        completion_(std::move(completion)) {}

  // Runs the completion unless it ran already.
  void Complete(const absl::Status& status, OpResult result = {}) {
    Completion completion;
    {
      absl::MutexLock lock(&mu_);
      completion = std::exchange(completion_, nullptr);
    }
    if (completion != nullptr) completion(status, std::move(result));
  }
  bool done() const {
    absl::MutexLock lock(&mu_);
    return completion_ == nullptr;
  }

  uint64_t id() const { return id_; }
  const std::string& method() const { return method_; }
  // The client's id of the call (wire/request_id.h); "" when none.
  const std::string& request_id() const { return request_id_; }
  absl::Time deadline() const { return deadline_; }
  // When the call arrived (its op's wait in the log counts from here).
  absl::Time created() const { return created_; }

 private:
  const uint64_t id_;
  const std::string method_;
  const std::string request_id_;
  const absl::Time deadline_;
  const absl::Time created_;
  mutable absl::Mutex mu_;
  Completion completion_ ABSL_GUARDED_BY(mu_);
};

// The outcome of a Gather for the stream that sends it: set once by the
// call's completion, waited for by the stream's own thread.
class ResultSlot {
 public:
  void Set(const absl::Status& status, OpResult result) {
    absl::MutexLock lock(&mu_);
    status_ = status;
    result_ = std::move(result);
    set_ = true;
  }
  absl::StatusOr<OpResult> Wait(absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    if (!mu_.AwaitWithDeadline(absl::Condition(&set_), deadline)) {
      return absl::DeadlineExceededError(
          "Gather did not complete within its deadline (the operation may "
          "still complete)");
    }
    if (!status_.ok()) return status_;
    return std::move(result_);
  }

 private:
  absl::Mutex mu_;
  bool set_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  OpResult result_ ABSL_GUARDED_BY(mu_);
};

// The state of one ControlServiceImpl; see control_service.h for the
// protocol.
class Core : public std::enable_shared_from_this<Core> {
 public:
  Core(std::shared_ptr<Rank> rank, ControlOptions options)
      : rank_(std::move(rank)),
        options_(std::move(options)),
        budget_(options_.memory_budget != nullptr ? options_.memory_budget
                                                  : DefaultBudget()),
        store_(std::make_shared<PrefixStore>("control", rank_->store())),
        incarnation_(RandomNonce()) {}
  ~Core() { Shutdown(); }

  absl::Status Start();
  void Shutdown();

  // OK while running; UNAVAILABLE before Start() and from Shutdown() on.
  absl::Status Accepting() const {
    absl::MutexLock lock(&mu_);
    return AcceptingLocked();
  }

  // A call for an op of `method` that gives up at `deadline` (the
  // client's, capped by op_timeout), with the client's `request_id`; not
  // yet queued. Attach it to its reactor, then Submit it.
  std::shared_ptr<PendingCall> NewCall(std::string method,
                                       std::string request_id,
                                       absl::Time client_deadline,
                                       Completion completion) {
    const absl::Time deadline = CapDeadline(client_deadline);
    absl::MutexLock lock(&mu_);
    return std::make_shared<PendingCall>(next_request_id_++, std::move(method),
                                         std::move(request_id), deadline,
                                         std::move(completion));
  }
  // The deadline of a call: the client's, capped by op_timeout.
  absl::Time CapDeadline(absl::Time client_deadline) const {
    return std::min(client_deadline, absl::Now() + options_.op_timeout);
  }
  // Queues `op` for the log on behalf of `call`; completes the call at once
  // with UNAVAILABLE when the service is not running.
  void Submit(v1::ControlOp op, const std::shared_ptr<PendingCall>& call);
  // Completes `call` and forgets it (a call completes once; later attempts
  // do nothing).
  void Finish(const std::shared_ptr<PendingCall>& call,
              const absl::Status& status, OpResult result = {});

  absl::StatusOr<v1::TensorInfo> Describe(const std::string& name) const;
  v1::ListTensorsResponse List() const;
  absl::StatusOr<v1::ClusterInfo> Cluster() const;
  RegionEnv Env();
  // How ReadRegion and Gather streams are cut.
  ShardServiceOptions Chunks() const {
    ShardServiceOptions chunks;
    chunks.default_chunk_bytes = options_.default_chunk_bytes;
    chunks.max_chunk_bytes = options_.max_chunk_bytes;
    return chunks;
  }
  int rank() const { return rank_->rank(); }
  const std::shared_ptr<MemoryBudget>& budget() const { return budget_; }
  int64_t applied_ops() const { return applied_.load(); }
  // This daemon's gauges (tessera_tensors, the budget, the generation,
  // peers: docs/metrics.md), read by every scrape while registered:
  // registered by Start(), dropped by Shutdown().
  void RegisterGauges() ABSL_EXCLUSIVE_LOCKS_REQUIRED(shutdown_mu_)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  enum class State { kNew, kRunning, kStopping, kStopped };
  struct Entry {
    // Absent on a daemon that restarted and lost its shards of it (the
    // info then lists them in lost_shards).
    std::optional<ShardedTensor> tensor;
    v1::TensorInfo info;
    // This daemon's CPU shards of it, in the memory budget.
    MemoryBudget::Reservation held;
    // Its copies of other daemons' shards (null when it holds none).
    std::shared_ptr<ReplicaCopies> replicas;
    // While this daemon, restarted, refills its shards and copies in the
    // background (`tensor` and `replicas` are set when it completes).
    std::shared_ptr<Refill> refill;
    // Why the refill failed ("" unless it did).
    std::string refill_error;
  };
  struct Queued {
    v1::ControlOp op;
    std::shared_ptr<PendingCall> call;
  };
  // What an op did on this daemon: the agreed status, the reply, and
  // whether the last agreement went through (every daemon has read the op,
  // so its key may go).
  struct Outcome {
    absl::Status status;
    OpResult result;
    bool agreed = false;
  };
  using DeadlineKey = std::pair<absl::Time, uint64_t>;

  absl::Status AcceptingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    switch (state_) {
      case State::kNew:
        return absl::UnavailableError(kStarting);
      case State::kRunning:
        return absl::OkStatus();
      case State::kStopping:
      case State::kStopped:
        break;
    }
    return absl::UnavailableError(kShuttingDown);
  }
  bool running() const {
    absl::MutexLock lock(&mu_);
    return state_ == State::kRunning;
  }
  // Sleeps up to `d`; false when the service stops meanwhile.
  bool Pause(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    if (state_ == State::kRunning) wake_.WaitWithTimeout(&mu_, d);
    return state_ == State::kRunning;
  }

  // ---- Submit thread.
  void SubmitLoop();
  // Claims a log number and writes `op` there; retries when rank 0 marked
  // the number skipped first.
  absl::Status Append(const v1::ControlOp& op, absl::Time deadline);

  // ---- Lease thread: renews this daemon's lease and watches the others'.
  void LeaseLoop();
  // Sleeps `d` (not cut short by other wake-ups); false once stopping.
  bool Sleep(absl::Duration d);

  // ---- Executor thread.
  void ExecutorLoop();
  // Whether the default group must be formed again (its transport broke,
  // or another daemon asked for a new generation).
  bool NeedsReform() const;
  // Whether some daemon's lease expired (LeaseLoop).
  bool LeaseExpired() const;
  // "the lease of ranks [2] expired: silent for 5s".
  std::string LeaseText(const std::vector<int>& expired) const;
  // The lease thread's look at what the watchers published (ExpiredKey);
  // when it turns non-empty, every pending call ends with UNAVAILABLE
  // naming the silent ranks.
  void ReadPublishedExpiry(int64_t generation);
  // Forms the next generation of the default group (blocking until every
  // daemon takes part; calls are refused meanwhile), then brings the
  // daemons back in step: the log position (`*next`, the next entry to
  // run) and the table. False when the service stops or this daemon is
  // fenced.
  bool Reform(int64_t* next);
  // When the default group formed (collective: at Start, `starting`, and
  // after each new generation): every daemon sends a v1::ResumeState and
  // all continue in step. The log position (*next) becomes the furthest
  // any daemon reached (a starting daemon skips the log before it; a
  // veteran's call waiting for an entry it skips ends with UNAVAILABLE).
  // Tensors the veterans do not all hold alike (an op committed on some
  // only when the old generation broke) are dropped everywhere. Daemons
  // that are starting while others are not restarted: every tensor with
  // shards on them is marked degraded (lost_shards), and they build their
  // table from the lowest-ranked veteran's.
  absl::Status JoinInStep(bool starting, int64_t* next);
  // A starting daemon's entry for a tensor of the running cluster: its
  // ShardedTensor with no shards of this daemon, or none when this
  // daemon's shards of it were lost. `spec` is the layout it was made by
  // (empty: the metadata's).
  // Shards it owns that survive on replicas, and its own replicas, are
  // refilled from the other holders (not in `starting`) in the background
  // (RunRefill): meanwhile operations on the tensor are refused here
  // (UNAVAILABLE, which Agree spreads), reads go to the other holders and
  // writes are kept by the Refill.
  absl::Status Rebuild(v1::TensorInfo info, const v1::ShardingSpec& spec,
                       const std::set<int>& starting);
  // The refill thread's body for the tensor `info` (Rebuild).
  void RunRefill(v1::TensorInfo info, v1::ShardingSpec spec,
                 std::set<int> starting, std::shared_ptr<Refill> refill);
  // `entry`'s info with this daemon's refill in progress marked
  // (ShardReplicas.refilling).
  v1::TensorInfo InfoWithState(const Entry& entry) const;
  // UNAVAILABLE for an op on a tensor this daemon is still refilling (or
  // failed to refill).
  absl::Status RefillingError(const std::string& name,
                              const Entry& entry) const;
  // Log entry `n`, which the other daemons passed while this one did not
  // run it: the call waiting for it here, if any, ends with UNAVAILABLE.
  void Abandon(int64_t n);
  // The op of a log entry ("op:" and the serialized ControlOp); nullopt
  // when it is malformed.
  static std::optional<v1::ControlOp> ParseEntry(absl::string_view entry);
  // The call waiting for `op` when this process coordinated it (its rank
  // and incarnation) and the call is still pending; else null.
  std::shared_ptr<PendingCall> OwnCall(const v1::ControlOp& op) const;
  // Completes OwnCall(op), if any.
  void FinishOwnCall(const v1::ControlOp& op, const absl::Status& status,
                     OpResult result = {});
  // UNAVAILABLE while the group re-forms and waits for a daemon, naming
  // it (also while every daemon is already taking part with
  // `even_if_all_here`, for reports); OK otherwise, and for a call then:
  // it is queued and runs once the generation formed.
  absl::Status ReformingLocked(bool even_if_all_here) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The entry at log number `n`: the op or the skip marker; nullopt when
  // the service stops first.
  // Sets *reform (and returns nullopt) when the default group must be
  // formed again first (NeedsReform).
  std::optional<std::string> AwaitEntry(int64_t n, bool* reform);
  void Execute(absl::string_view entry, int64_t n);
  // Run(op), with what it throws turned into INTERNAL (log number `n`).
  Outcome RunGuarded(const v1::ControlOp& op, int64_t n);
  Outcome Run(const v1::ControlOp& op);
  Outcome RunCreate(const v1::ControlOp& op);
  // CreateTensor's tensor (this daemon's shards), filled by its init kind.
  absl::StatusOr<ShardedTensor> NewTensor(
      const v1::CreateTensorRequest& request, DType dtype,
      const ShardingSpec& spec, absl::Span<const int64_t> sizes);
  Outcome RunDelete(const v1::ControlOp& op);

  // ---- Replicas (replicas.cc).
  // Each daemon's host, for PlaceReplicas: the host of its address.
  std::vector<std::string> WorkerHosts() const;
  // Collective: gives the tensor `name` of the table `replicas` (> 1)
  // copies of every shard. Places them (PlaceReplicas), allocates this
  // daemon's copies in host memory (within the budget), fills them as
  // `init` says when that needs no data (zeros, ones, full; empty leaves
  // them as allocated) or else from their owners, and registers them; the
  // entry's info lists every shard's replicas. The agreed status, as Agree.
  absl::Status Replicate(const std::string& name, int replicas,
                         const v1::CreateTensorRequest* init, bool* agreed);
  // This daemon's copies of `info`'s shards (as info.replicas says), in
  // host memory, unfilled; `host_bytes` their size.
  absl::StatusOr<std::shared_ptr<RegisteredTensor>> AllocateCopies(
      const v1::TensorInfo& info, const ShardedTensorMetadata& metadata,
      int64_t* host_bytes) const;
  // Fills `shards` (of tensor `info`, this daemon's copies or own shards)
  // from another holder of each: the owner's shard or a replica, the first
  // that answers, skipping the ranks in `gone`. UNAVAILABLE naming the
  // shard and every holder tried when none could give it.
  absl::Status FetchFromHolders(const v1::TensorInfo& info,
                                const std::vector<LocalShard>& shards,
                                const std::set<int>& gone,
                                absl::Time deadline) const;
  Outcome RunReshard(const v1::ControlOp& op);
  Outcome RunGather(const v1::ControlOp& op);
  Outcome RunSave(const v1::ControlOp& op);
  Outcome RunLoad(const v1::ControlOp& op);
  // The agreed outcome of every daemon's `local` status: this daemon's own
  // error first (deterministic errors read the same everywhere), else the
  // lowest failing rank's. `agreed` tells whether the exchange went through.
  absl::Status Agree(const absl::Status& local, bool* agreed);
  // After an op that may have created tensors on some daemons only (an
  // allocation or I/O error on one), brings every daemon's tensor-id
  // counter to the highest one, so later tensors get the same id
  // everywhere. Collective.
  void ResyncTensorIds();
  absl::StatusOr<v1::TensorInfo> InfoOf(const std::string& name,
                                        const ShardedTensor& tensor) const;
  // The tensor named `name`: NOT_FOUND when the table holds none,
  // FAILED_PRECONDITION when it is degraded (DegradedError).
  absl::StatusOr<ShardedTensor> Lookup(const std::string& name) const;
  // Whether the table holds `name` (degraded or not).
  bool Holds(const std::string& name) const;
  // A request's spec, its placements checked against the cluster: each
  // names a daemon (by rank or worker name) and a device that daemon can
  // hold (CPU anywhere; CUDA on a CUDA daemon; never meta, which would
  // drop the data). INVALID_ARGUMENT naming `what` and the placement.
  // Deterministic: every daemon decides alike.
  absl::StatusOr<ShardingSpec> SpecOf(bool has_spec,
                                      const v1::ShardingSpec& proto,
                                      absl::string_view what) const;
  // The bytes of `metadata`'s shards this daemon holds in host memory.
  absl::StatusOr<int64_t> LocalHostBytes(
      const ShardedTensorMetadata& metadata) const;
  absl::Status CheckPlacement(const std::optional<RemoteDevice>& placement,
                              absl::Span<const std::string> devices) const;

  const std::shared_ptr<Rank> rank_;
  const ControlOptions options_;
  const std::shared_ptr<MemoryBudget> budget_;
  const std::shared_ptr<Store> store_;
  const uint64_t incarnation_;
  std::shared_ptr<ProcessGroup> group_;  // Set by Start().
  std::atomic<int64_t> applied_{0};

  absl::Mutex shutdown_mu_;  // Serialises Start() and Shutdown().
  mutable absl::Mutex mu_;
  absl::CondVar wake_;  // State changes, queued ops, new deadlines.
  State state_ ABSL_GUARDED_BY(mu_) = State::kNew;
  int64_t first_entry_ ABSL_GUARDED_BY(mu_) = 1;
  // Why the default group is being formed again ("" while it serves), and
  // why this daemon was fenced off ("" unless it was).
  std::string reforming_ ABSL_GUARDED_BY(mu_);
  // Ranks whose lease expired (LeaseLoop), and when the last generation
  // formed (leases count from then on).
  std::vector<int> expired_ ABSL_GUARDED_BY(mu_);
  // The ranks a watcher (rank 0 or 1) published as expired in the current
  // generation, as every daemon's lease thread last read them: operations
  // are refused naming them, and calls already submitted end (their op may
  // wait for the silent daemon inside a collective).
  std::vector<int> published_expired_ ABSL_GUARDED_BY(mu_);
  absl::Time formed_at_ ABSL_GUARDED_BY(mu_) = absl::Now();
  std::string fenced_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> devices_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Entry> table_ ABSL_GUARDED_BY(mu_);
  uint64_t next_request_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, std::shared_ptr<PendingCall>> pending_
      ABSL_GUARDED_BY(mu_);
  std::set<DeadlineKey> deadlines_ ABSL_GUARDED_BY(mu_);
  std::deque<Queued> queue_ ABSL_GUARDED_BY(mu_);
  std::thread submitter_;
  std::thread executor_;
  std::thread lease_keeper_;
  std::vector<std::unique_ptr<GaugeSource>> gauges_
      ABSL_GUARDED_BY(shutdown_mu_);
  // Refills in the background (RunRefill), joined by Shutdown, and those
  // in progress by tensor id (for writes: Env().refilling).
  std::vector<std::thread> refills_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<Refill>> refilling_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::control_internal

#endif  // TESSERA_SERVER_DAEMON_CONTROL_CORE_H_
