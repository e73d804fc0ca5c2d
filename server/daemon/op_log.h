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
// call. Rank 0 deletes an entry once every daemon has read it.
//
// Holes and garbage: numbers claimed but never written (a coordinator died
// between claiming and writing, or someone added to "seq") cost one claim
// timeout (ControlOptions::claim_timeout, at most the lease) for every
// number claimed when rank 0 began to wait, together: rank 0 then writes
// one marker, "skip" or "skip-to M", at the first of them, and every daemon
// goes on at M, however far that is. An op of this daemon written inside a
// range the log jumped over is submitted again under a fresh number (the
// daemon keeps the numbers of its own ops), so a live coordinator's op is
// never lost to a jump. A "seq" that is not a log number (not a decimal
// integer, negative, beyond kMaxLogNumber) or behind this daemon's
// position is repaired by CompareSet to the number before the position (or
// this daemon's highest claim, if higher) and logged as an error; a number
// that collides with a written entry is given up for another, as above.
//
// Holding: while membership says ops must wait (HoldReason: a daemon
// silent, or the group re-forming without every daemon), the submit thread
// logs nothing; queued calls wait within their deadlines, so a stall
// shorter than a deadline delays the op and fails nothing. A call whose
// deadline comes while its op is still unlogged was not applied, and ends
// saying so: UNAVAILABLE naming what the cluster waited for when it was
// held, else DEADLINE_EXCEEDED. Every call is answered kAnswerMargin before
// its deadline, so that the answer reaches the client before its own
// deadline does.
//
// Retries: an op whose client request id committed already
// (op_outcomes.h) is answered with its first outcome, at submit when this
// daemon knows it, else when its entry comes up (every daemon then skips
// it alike). Every op that runs is recorded there, committed or failed.
//
// In doubt: an op whose final exchange broke after this daemon's part
// succeeded may have committed on other daemons (in_doubt.h). Its call is
// not answered then: the op stays running (Pending tells it, a retry's
// deadline says it may still commit) until the group re-forms and decides
// it, committed late or given up, and the call is answered with that.
//
// Failure: a call whose op was logged and did not complete by its deadline
// ends DEADLINE_EXCEEDED naming its log entry and request id, whose
// outcome GetOperation (Pending, then op_outcomes.h) tells; an
// unreachable store is UNAVAILABLE
// before the op is logged; an entry the others passed while this daemon
// re-formed ends its call with UNAVAILABLE ("was not applied"); Shutdown
// ends every waiting call with UNAVAILABLE "daemon is shutting down".
// A malformed entry is skipped by every daemon alike. Rank 0 starts no
// log on a malformed "seq" (FAILED_PRECONDITION from Position(), naming it):
// it cannot tell where the log stood.
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
#include <map>
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
#include "server/daemon/in_doubt.h"
#include "server/daemon/membership.h"
#include "server/daemon/op_outcomes.h"
#include "server/daemon/pending_call.h"
#include "server/rank/rank.h"
#include "server/store/store.h"
#include "tessera/v1/control_internal.pb.h"

namespace tessera::control_internal {

inline constexpr char kShuttingDown[] = "daemon is shutting down";
inline constexpr char kStarting[] = "daemon is starting";
// The highest log number the log accepts ("seq" beyond it is repaired, a
// "skip-to" beyond it is a plain skip): far from overflowing int64.
inline constexpr int64_t kMaxLogNumber = int64_t{1} << 62;
// How long before its deadline a call is answered (see "Holding").
inline constexpr absl::Duration kAnswerMargin = absl::Milliseconds(250);

class OpLog final {
 public:
  // `store` is the control prefix of the rendezvous store; `incarnation`
  // tells this process's calls from those of an earlier process of the
  // same rank.
  OpLog(std::shared_ptr<Rank> rank, std::shared_ptr<ProcessGroup> group,
        std::shared_ptr<Store> store, const ControlOptions& options,
        uint64_t incarnation, Membership* membership, ControlOps* ops,
        OpOutcomes* outcomes, InDoubt* in_doubt);
  // Calls Stop(), Join() and FailWaiting().
  ~OpLog();
  OpLog(const OpLog&) = delete;
  OpLog& operator=(const OpLog&) = delete;

  // Where the log stands: the next entry a new op would get (rank 0 reads
  // it before the daemons join in step). UNAVAILABLE when the store is
  // unreachable; FAILED_PRECONDITION when "seq" is not a log number.
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
  // STATE_PENDING when the executor is running the log entry of an op
  // carrying `request_id` (any daemon's), or an op of this daemon carrying
  // it is in the log and not passed yet (its log entry; also when its call
  // ended at its deadline), or queued for a call still waiting (entry 0);
  // nullopt otherwise.
  std::optional<v1::OperationStatus> Pending(
      const std::string& request_id) const;
  // Whether the executor is running, right now, the log entry of an op
  // carrying `request_id`. Its outcome is recorded (op_outcomes.h) before
  // this turns false; another daemon may have answered its caller
  // already, since daemons answer once they agree.
  bool Executing(const std::string& request_id) const;
  // How many log entries this daemon has executed or skipped.
  int64_t applied() const { return applied_.load(); }

 private:
  enum class State { kNew, kRunning, kStopped };
  struct Queued {
    v1::ControlOp op;
    std::shared_ptr<PendingCall> call;
  };
  // When a call is answered at the latest (its deadline less
  // kAnswerMargin), and its id.
  using DeadlineKey = std::pair<absl::Time, uint64_t>;
  static DeadlineKey AnswerBy(const PendingCall& call);
  // Call `id`'s op while it is still queued (not being logged yet); null
  // once it left the queue.
  const v1::ControlOp* QueuedOpLocked(uint64_t id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The log number of call `id`'s op, once claimed; 0 before.
  int64_t EntryOfLocked(uint64_t id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Executing, with mu_ held.
  bool ExecutingLocked(const std::string& request_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why `call` ends at its deadline, its op no longer queued: it was
  // logged (or being logged) and has not finished.
  std::string UnfinishedLocked(const PendingCall& call) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One of this daemon's ops at the log number it claimed, until the
  // executor passes the number.
  struct Appended {
    enum class State {
      kWriting,    // The submit thread's CompareSet is in flight.
      kWritten,    // Written; waits for the executor.
      kSkipped,    // Passed unexecuted while being written: claim again.
      kAbandoned,  // Passed by the others while re-forming: fail the call.
    };
    Queued queued;
    State state = State::kWriting;
  };
  // What the executor does with this daemon's ops at numbers it passed
  // without executing them.
  enum class Passed { kSubmitAgain, kAbandon };
  // Rank 0's wait for claimed numbers: every number up to `through` (the
  // value of "seq" when it began) was claimed by `since`.
  struct ClaimWait {
    absl::Time since;
    int64_t through = 0;
  };

  // OK while running; UNAVAILABLE before Start() and from Stop() on.
  absl::Status AcceptingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool running() const;
  // Sleeps up to `d`; false when the log stops meanwhile.
  bool Pause(absl::Duration d);

  // ---- Submit thread.
  void SubmitLoop();
  // Claims a log number and writes the op there; claims again when rank 0
  // marked the number skipped first or the log jumped over it.
  absl::Status Append(const Queued& queued);
  // Claims a number at or after the executor's position that holds none of
  // this daemon's ops, and records it for `queued` (kWriting). Repairs a
  // malformed or stale "seq" on the way.
  absl::StatusOr<int64_t> Claim(const Queued& queued);
  // Sets "seq" from `held` (its current text) to `floor` by CompareSet,
  // unless someone changed it meanwhile; logs `why` when it did.
  void RepairSeq(absl::string_view held, int64_t floor, absl::string_view why);
  // The lowest value "seq" may be repaired to: below the executor's
  // position and at or above this daemon's own claims.
  int64_t SeqFloor() const;

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
  // Rank 0, idle at `n`: the entry it wrote or found at `n` once every
  // number claimed when it began waiting had claim_timeout to be written
  // (a skip marker over those still empty); nullopt while it waits.
  std::optional<std::string> SkipUnwritten(int64_t n);
  // Rank 0: the value of "seq", repaired first when it is malformed or
  // behind `n` - 1; nullopt when the store fails.
  std::optional<int64_t> ReadSeq(int64_t n);
  // Runs entry `n` and returns the next log number: n + 1, or M for a
  // "skip-to M" marker. Sets *own_request to the op's request id when this
  // daemon (this process) coordinated it.
  int64_t Execute(absl::string_view entry, int64_t n,
                  std::optional<uint64_t>* own_request);
  // ops->Run(op), with what it throws turned into INTERNAL (log number n).
  OpOutcome RunGuarded(const v1::ControlOp& op, int64_t n);
  // Moves the executor's position from `from` to `to`; this daemon's ops
  // at numbers in between that did not run are submitted again or, for
  // entries the others passed while this daemon re-formed, end with
  // UNAVAILABLE. `ran`: the request id of this daemon's op that ran at
  // `from`, if any.
  void Advance(int64_t from, int64_t to, Passed passed,
               std::optional<uint64_t> ran = std::nullopt);
  // Whether this process coordinated `op` (its rank and incarnation).
  bool FromThisDaemon(const v1::ControlOp& op) const;
  // The call waiting for `op` when FromThisDaemon(op) and the call is still
  // pending; else null.
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
  OpOutcomes* const outcomes_;
  InDoubt* const in_doubt_;
  // claim_timeout, at most the lease.
  const absl::Duration claim_timeout_;
  std::atomic<int64_t> applied_{0};
  std::thread submitter_;
  std::thread executor_;
  // Executor thread only (rank 0).
  std::optional<ClaimWait> claim_wait_;

  mutable absl::Mutex mu_;
  absl::CondVar wake_;  // State changes, queued ops, new deadlines.
  State state_ ABSL_GUARDED_BY(mu_) = State::kNew;
  // The next log number the executor reads.
  int64_t position_ ABSL_GUARDED_BY(mu_) = 1;
  // This daemon's ops in the log, by number.
  std::map<int64_t, Appended> appended_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::shared_ptr<PendingCall>> pending_
      ABSL_GUARDED_BY(mu_);
  std::set<DeadlineKey> deadlines_ ABSL_GUARDED_BY(mu_);
  std::deque<Queued> queue_ ABSL_GUARDED_BY(mu_);
  // Why the queue is held now (Membership::HoldReason); "" when it is not.
  std::string held_ ABSL_GUARDED_BY(mu_);
  // The entry the executor is running and its op's request id, method and
  // tensor, until its outcome is recorded (for an op in doubt, until the
  // re-formed group decides it: in_doubt.h); entry 0: none.
  struct RunningEntry {
    int64_t entry = 0;
    std::string request_id;
    std::string method;
    std::string tensor;
  };
  RunningEntry executing_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::control_internal

#endif  // TESSERA_SERVER_DAEMON_OP_LOG_H_
