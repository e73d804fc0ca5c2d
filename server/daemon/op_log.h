// OpLog: the cluster's operation log, as one daemon takes part in it.
// docs/control_log.md is the protocol.
//
// Submitting: a call for a logged op (CreateTensor, DeleteTensor, Reshard,
// Gather, SaveCheckpoint, LoadCheckpoint) is admitted (membership.h),
// queued, and the submit thread claims the next log number in the
// rendezvous store (Add on "seq") and writes the op there (CompareSet on
// "op/N"); a number rank 0 marked skipped first is given up for another.
// Executing: every daemon's executor thread reads the entries in order,
// runs each op (control_ops.h) and, for ops that change the table,
// confirms the commit with a barrier before the coordinator answers its
// call. Rank 0 deletes an entry once every daemon has read it, and marks a
// number claimed but never written (its coordinator died) skipped after
// ControlOptions::claim_timeout.
//
// Failure: every call ends by its deadline (DEADLINE_EXCEEDED, "the
// operation may still complete"); an unreachable store is UNAVAILABLE
// before the op is logged; an entry the others passed while this daemon
// re-formed ends its call with UNAVAILABLE ("was not applied"); Shutdown
// ends every waiting call with UNAVAILABLE "daemon is shutting down".
// A malformed entry is skipped by every daemon alike.
//
// Thread-safety: every public method may be called from any thread. Two
// threads of its own (submit, executor) from Start to Stop/Join.
// Locks: the log's lock is taken under membership's (Admit, Waiting),
// never the other way round. Ownership: the control core owns it; the
// membership and ops it points at outlive it.
#ifndef TESSERA_SERVER_DAEMON_OP_LOG_H_
#define TESSERA_SERVER_DAEMON_OP_LOG_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/collective/process_group.h"
#include "server/daemon/control_ops.h"
#include "server/daemon/control_options.h"
#include "server/daemon/membership.h"
#include "server/daemon/pending_call.h"
#include "server/rank/rank.h"
#include "server/store/store.h"
#include "tessera/v1/control_internal.pb.h"

namespace tessera::control_internal {

inline constexpr char kShuttingDown[] = "daemon is shutting down";
inline constexpr char kStarting[] = "daemon is starting";

class OpLog final : public WaitingCalls {
 public:
  // `store` is the control prefix of the rendezvous store; `incarnation`
  // tells this process's calls from those of an earlier process of the
  // same rank.
  OpLog(std::shared_ptr<Rank> rank, std::shared_ptr<ProcessGroup> group,
        std::shared_ptr<Store> store, const ControlOptions& options,
        uint64_t incarnation, Membership* membership, ControlOps* ops);
  // Calls Stop(), Join() and FailWaiting().
  ~OpLog() override;
  OpLog(const OpLog&) = delete;
  OpLog& operator=(const OpLog&) = delete;

  // Where the log stands: the next entry a new op would get (rank 0 reads
  // it before the daemons join in step). UNAVAILABLE when the store is
  // unreachable.
  absl::StatusOr<int64_t> Position();
  // Starts the submit and executor threads; the executor runs from entry
  // `first`. Calls are accepted from here on.
  void Start(int64_t first);
  // Refuses new calls ("daemon is shutting down") and wakes the threads;
  // the op running finishes (bounded by the group's timeout).
  void Stop();
  void Join();
  // Completes every call still waiting with UNAVAILABLE (shutting down).
  void FailWaiting();

  // Queues `op` for the log on behalf of `call`; completes the call at once
  // with UNAVAILABLE when the log is not running or membership refuses.
  void Submit(v1::ControlOp op, const std::shared_ptr<PendingCall>& call);
  // Completes `call` and forgets it (a call completes once; later attempts
  // do nothing).
  void Finish(const std::shared_ptr<PendingCall>& call,
              const absl::Status& status, OpResult result = {});
  // How many log entries this daemon has executed or skipped.
  int64_t applied() const { return applied_.load(); }

  // WaitingCalls (membership's view).
  Snapshot Waiting() const override;
  void End(const std::shared_ptr<PendingCall>& call,
           const absl::Status& status) override {
    Finish(call, status);
  }

 private:
  enum class State { kNew, kRunning, kStopped };
  struct Queued {
    v1::ControlOp op;
    std::shared_ptr<PendingCall> call;
  };
  using DeadlineKey = std::pair<absl::Time, uint64_t>;

  // OK while running; UNAVAILABLE before Start() and from Stop() on.
  absl::Status AcceptingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool running() const;
  // Sleeps up to `d`; false when the log stops meanwhile.
  bool Pause(absl::Duration d);

  // ---- Submit thread.
  void SubmitLoop();
  // Claims a log number and writes `op` there; retries when rank 0 marked
  // the number skipped first.
  absl::Status Append(const v1::ControlOp& op, absl::Time deadline);

  // ---- Executor thread.
  void ExecutorLoop();
  // Forms the next generation (membership) and moves the log position
  // `*next` to where the daemons resume, abandoning the entries the others
  // passed meanwhile. False when the log stops or this daemon is fenced.
  bool Reform(int64_t* next);
  // The entry at log number `n`: the op or the skip marker; nullopt when
  // the log stops first. Sets *reform (and returns nullopt) when the
  // default group must be formed again first.
  std::optional<std::string> AwaitEntry(int64_t n, bool* reform);
  void Execute(absl::string_view entry, int64_t n);
  // ops->Run(op), with what it throws turned into INTERNAL (log number n).
  OpOutcome RunGuarded(const v1::ControlOp& op, int64_t n);
  // Log entry `n`, which the other daemons passed while this one did not
  // run it: the call waiting for it here, if any, ends with UNAVAILABLE.
  void Abandon(int64_t n);
  // The call waiting for `op` when this process coordinated it (its rank
  // and incarnation) and the call is still pending; else null.
  std::shared_ptr<PendingCall> OwnCall(const v1::ControlOp& op) const;
  // Completes OwnCall(op), if any.
  void FinishOwnCall(const v1::ControlOp& op, const absl::Status& status,
                     OpResult result = {});

  const std::shared_ptr<Rank> rank_;
  const std::shared_ptr<ProcessGroup> group_;
  const std::shared_ptr<Store> store_;
  const ControlOptions options_;
  const uint64_t incarnation_;
  Membership* const membership_;
  ControlOps* const ops_;
  std::atomic<int64_t> applied_{0};
  std::thread submitter_;
  std::thread executor_;

  mutable absl::Mutex mu_;
  absl::CondVar wake_;  // State changes, queued ops, new deadlines.
  State state_ ABSL_GUARDED_BY(mu_) = State::kNew;
  int64_t first_entry_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, std::shared_ptr<PendingCall>> pending_
      ABSL_GUARDED_BY(mu_);
  std::set<DeadlineKey> deadlines_ ABSL_GUARDED_BY(mu_);
  std::deque<Queued> queue_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::control_internal

#endif  // TESSERA_SERVER_DAEMON_OP_LOG_H_
