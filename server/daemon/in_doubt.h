// InDoubt: the control op this daemon cannot tell committed or not, held
// until the daemons re-form their group and decide it
// (docs/control_log.md, "Ops in doubt").
//
// An op commits on a daemon when that daemon reads every daemon's success
// in the op's final all-gather (agreement.h). A daemon that dies or stalls
// inside that exchange may have sent its success to some daemons and not
// to others: those that read every success commit, the others see the
// exchange break. Such a daemon whose own part succeeded is in doubt about
// the op: it keeps what committing would do (LateCommit) instead of
// failing it. When the group forms again, in JoinInStep's first exchange
// (Membership::DecideInDoubt), every daemon tells the entry it committed
// last and the one it is in doubt about; an op in doubt is committed if
// some daemon committed it (the LateCommit runs), else given up (nothing
// was applied anywhere), before the daemons compare their tables. So every
// daemon ends with the same state and the caller with a true answer: its
// call is answered once the op is decided, not when the exchange broke.
//
// Ops whose split commit is settled otherwise (a tensor that the daemons
// do not all hold alike is dropped everywhere, membership.h) have no
// LateCommit and fail as before.
//
// Thread-safety: every method may be called from any thread; LateCommit
// functions run on the caller's thread without the lock held. Ownership:
// the control core owns it.
#ifndef TESSERA_SERVER_DAEMON_IN_DOUBT_H_
#define TESSERA_SERVER_DAEMON_IN_DOUBT_H_

#include <cstdint>
#include <functional>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "server/daemon/pending_call.h"
#include "tessera/v1/control.pb.h"
#include "tessera/v1/control_internal.pb.h"

namespace tessera::control_internal {

// What a daemon whose part of an op succeeded does once the op is decided.
struct LateCommit {
  // This daemon's effects of the op, which cannot fail, and its result.
  std::function<OpResult()> commit;
  // Undoes this daemon's part when no daemon committed (may be empty:
  // dropping the LateCommit releases what it holds).
  std::function<void()> give_up;
};

class InDoubt {
 public:
  // The op held in doubt.
  struct Held {
    int64_t entry = 0;
    v1::ControlOp op;
    absl::Status broke;  // How its exchange broke.
  };
  // An op decided by Resolve, for its coordinator to answer.
  struct Resolved {
    int64_t entry = 0;
    v1::ControlOp op;
    absl::Status status;  // OK: committed (late).
    OpResult result;
  };

  InDoubt() = default;
  InDoubt(const InDoubt&) = delete;
  InDoubt& operator=(const InDoubt&) = delete;

  // Log entry `entry`, `op`, is in doubt: its exchange broke (`broke`)
  // after this daemon's part succeeded. A daemon runs its log in order,
  // so at most one op is in doubt: an earlier one still held is given up
  // first (not expected: the group re-forms before the next entry).
  void Hold(int64_t entry, v1::ControlOp op, LateCommit late,
            absl::Status broke);
  // This daemon committed log entry `entry`.
  void Committed(int64_t entry);

  // The entry this daemon committed last (0: none since it started).
  int64_t last_committed() const;
  // The entry held in doubt (0: none).
  int64_t held_entry() const;
  // The op held in doubt, if any.
  std::optional<Held> held() const;

  // Decides the held op, if any: commits it when `committed_elsewhere`
  // (some daemon committed its entry), else gives it up. Its outcome waits
  // for TakeResolved.
  void Resolve(bool committed_elsewhere);
  // The last decided op not yet taken.
  std::optional<Resolved> TakeResolved();

 private:
  struct Holding {
    Held held;
    LateCommit late;
  };

  mutable absl::Mutex mu_;
  std::optional<Holding> held_ ABSL_GUARDED_BY(mu_);
  int64_t last_committed_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<Resolved> resolved_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::control_internal

#endif  // TESSERA_SERVER_DAEMON_IN_DOUBT_H_
