// The two collectives every control op ends with, over the daemons'
// default group: agreeing on one outcome, and re-aligning tensor ids after
// an op that created tensors on some daemons only.
//
// Both are collective: every daemon calls them at the same point of the
// same log entry, or the group's timeout fails them (UNAVAILABLE or
// DEADLINE_EXCEEDED from the group). Thread-safety: the executor thread's.
#ifndef TESSERA_SERVER_DAEMON_AGREEMENT_H_
#define TESSERA_SERVER_DAEMON_AGREEMENT_H_

#include "absl/status/status.h"
#include "server/collective/process_group.h"
#include "server/rank/rank.h"

namespace tessera::control_internal {

// The agreed outcome of every daemon's `local` status: this daemon's own
// error first (deterministic errors read the same everywhere), else the
// lowest failing rank's. `*agreed` tells whether the exchange went through
// (every daemon has then read the op).
absl::Status Agree(ProcessGroup& group, const absl::Status& local,
                   bool* agreed);

// Brings every daemon's tensor-id counter to the highest one (one id is
// wasted), so later tensors get the same id everywhere. Errors are logged:
// the ids stay as they are.
void ResyncTensorIds(Rank& rank, ProcessGroup& group);

}  // namespace tessera::control_internal

#endif  // TESSERA_SERVER_DAEMON_AGREEMENT_H_
