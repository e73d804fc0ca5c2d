// Membership: who takes part in the cluster, and who decides that a
// daemon is dead. Leases, generations of the default group, re-forming
// after a failure, and the rejoin of a restarted daemon.
// docs/control_log.md ("Failure") is the protocol.
//
// Leases: every daemon renews its lease in the store every lease / 10 (an
// etcd lease where the store has them, else a counter). Rank 0 watches
// every other daemon and rank 1 watches rank 0; a daemon silent for most
// of a lease is published as expired in the store and every daemon reads
// that within a period. A silent daemon delays operations, it does not fail
// them: ops already in the log wait for it inside their collectives (up to
// --timeout), and new ones are admitted and held before the log
// (HoldReason) until it is back or their deadline comes; a call that ends
// held was not applied, and says why. The watcher's executor then forms
// the next generation of the default group; the others follow.
//
// Generations: Reform blocks the executor until every daemon takes part
// in the next generation (new ops are held meanwhile, HoldReason naming the
// missing ranks), then JoinInStep brings the daemons back in step: the log
// position (the furthest any daemon reached) and the table (what every
// veteran holds alike stays; a tensor whose shards were on a restarted
// daemon is degraded, or refilled from its replicas: replication.h).
// A daemon whose generation moved on without it is fenced: it refuses
// every call until restarted.
//
// Thread-safety: every method may be called from any thread, except
// JoinInStep and Reform (the executor's, or Start's before it runs).
// Locks: membership's lock may be held while the log's is taken (Admit),
// never the other way round.
// Ownership: the control core owns it; the table and the replication it
// points at outlive it. Stop() ends the lease thread and
// cancels a Reform in progress; Join() waits for the thread.
#ifndef TESSERA_SERVER_DAEMON_MEMBERSHIP_H_
#define TESSERA_SERVER_DAEMON_MEMBERSHIP_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/collective/process_group.h"
#include "server/daemon/control_options.h"
#include "server/daemon/in_doubt.h"
#include "server/daemon/op_outcomes.h"
#include "server/daemon/replication.h"
#include "server/daemon/tensor_table.h"
#include "server/rank/rank.h"
#include "server/store/store.h"

namespace tessera::control_internal {

class Membership {
 public:
  // Where the daemons stand after JoinInStep: the next log entry to run
  // (the furthest any daemon reached), and the earliest any veteran had
  // yet to run (entries from there on may be deleted once all passed).
  struct Resumed {
    int64_t next = 0;
    int64_t earliest = 0;
  };

  // `store` is the control prefix of the rendezvous store.
  Membership(std::shared_ptr<Rank> rank, std::shared_ptr<ProcessGroup> group,
             std::shared_ptr<Store> store, const ControlOptions& options,
             TensorTable* table, Replication* replication, OpOutcomes* outcomes,
             InDoubt* in_doubt);
  // Calls Stop() and Join().
  ~Membership();
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  // Collective, when the default group formed (at Start with `starting`,
  // and inside Reform): every daemon sends its state (log position
  // `next`, device, table) and all continue in step (see above).
  // Tensors the veterans do not all hold alike are dropped everywhere.
  // Daemons that are starting while others are not restarted: every tensor
  // with shards on them is marked degraded (lost_shards) unless replicas
  // hold them, and they build their table from the lowest-ranked
  // veteran's. Every daemon adopts that veteran's committed request ids
  // (op_outcomes.h), so that all tell retries alike; with no veteran, all
  // start with none. First, in an exchange of its own (DecideInDoubt), an
  // op a daemon is in doubt about (in_doubt.h) is decided: committed there
  // when any daemon committed its entry, else given up; so the states
  // compared are the decided ones. The exchanges' errors; DATA_LOSS for an
  // unreadable state.
  absl::StatusOr<Resumed> JoinInStep(bool starting, int64_t next);

  // Starts the lease thread; leases count from now.
  void Start();
  void Stop();
  void Join();

  // Whether the executor must form the next generation before the next
  // entry: the group's transport broke, another daemon asked for one, or a
  // lease expired.
  bool NeedsReform() const;
  // Forms the next generation (blocking until every daemon takes part),
  // then JoinInStep from log position `next`. Nullopt when stopped or
  // fenced.
  std::optional<Resumed> Reform(int64_t next);

  // Runs `enqueue` under membership's lock and returns its status; a
  // fenced daemon refuses instead (UNAVAILABLE naming why).
  absl::Status Admit(const std::function<absl::Status()>& enqueue) const;
  // Why new ops must wait before the log now ("": they need not): fenced,
  // re-forming while daemons are missing, or a daemon silent (an op would
  // wait for it inside a collective). The submit thread holds its queue
  // while this is not empty.
  std::string HoldReason() const;

  // Every daemon's device, by rank (as of the last JoinInStep).
  std::vector<std::string> devices() const;
  // "serving", or why not: fenced, re-forming, waiting for silent ranks.
  std::string State() const;
  // Whether daemon `r`'s lease is current, as far as this daemon knows.
  bool PeerUp(int r) const;

 private:
  // JoinInStep's first exchange, collective: every daemon sends the entry
  // it committed last and the one it is in doubt about, and decides its
  // own op in doubt (InDoubt::Resolve).
  absl::Status DecideInDoubt(bool starting);
  bool running() const;
  // Sleeps up to `d`; false once stopping.
  bool Sleep(absl::Duration d) const;
  void LeaseLoop();
  // The lease thread's look at what the watchers published; when it turns
  // non-empty, every waiting call ends with UNAVAILABLE naming the silent
  // ranks.
  void ReadPublishedExpiry(int64_t generation);
  // "the lease of ranks [2] expired: silent for 5s".
  std::string LeaseText(const std::vector<int>& expired) const;
  // UNAVAILABLE while fenced, or while the group re-forms and waits for a
  // daemon, naming it (also while every daemon is already taking part with
  // `even_if_all_here`, for reports); OK otherwise.
  absl::Status ReformingLocked(bool even_if_all_here) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<Rank> rank_;
  const std::shared_ptr<ProcessGroup> group_;
  const std::shared_ptr<Store> store_;
  const ControlOptions options_;
  TensorTable* const table_;
  Replication* const replication_;
  OpOutcomes* const outcomes_;
  InDoubt* const in_doubt_;
  std::thread lease_keeper_;

  mutable absl::Mutex mu_;
  mutable absl::CondVar stopping_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::string> devices_ ABSL_GUARDED_BY(mu_);
  // Why the default group is being formed again ("" while it serves), and
  // why this daemon was fenced off ("" unless it was).
  std::string reforming_ ABSL_GUARDED_BY(mu_);
  std::string fenced_ ABSL_GUARDED_BY(mu_);
  // Ranks whose lease this daemon (a watcher) found expired, and when the
  // last generation formed (leases count from then on).
  std::vector<int> expired_ ABSL_GUARDED_BY(mu_);
  absl::Time formed_at_ ABSL_GUARDED_BY(mu_) = absl::Now();
  // The ranks a watcher (rank 0 or 1) published as expired in the current
  // generation, as this daemon's lease thread last read them: operations
  // are refused naming them.
  std::vector<int> published_expired_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::control_internal

#endif  // TESSERA_SERVER_DAEMON_MEMBERSHIP_H_
