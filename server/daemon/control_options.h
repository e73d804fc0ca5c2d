// ControlOptions: how a daemon's control service runs its operation log,
// leases, memory budget, streams and checkpoints. Filled by the daemon
// from its resolved settings (daemon_options.h), read by every part of the
// control service (control_core.h and its collaborators).
//
// A plain value: copied into the service at construction, never changed.
#ifndef TESSERA_SERVER_DAEMON_CONTROL_OPTIONS_H_
#define TESSERA_SERVER_DAEMON_CONTROL_OPTIONS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "server/checkpoint/checkpoint_roots.h"
#include "server/daemon/memory_budget.h"

namespace tessera {

struct ControlOptions {
  // The deadline of an operation whose call has none.
  absl::Duration op_timeout = absl::Seconds(300);
  // This daemon's device ("cpu", "cuda:N"), reported in ClusterInfo.
  std::string device = "cpu";
  // How long a claimed log number may stay empty before rank 0 marks it
  // skipped (its coordinator died between claiming and writing it, or
  // someone added to the counter). One wait covers every number claimed
  // when it began, so holes cost this once in all; at most `lease` is used.
  absl::Duration claim_timeout = absl::Seconds(5);
  // The slice of the executor's waits on the store: how soon Shutdown()
  // is noticed while the log is idle.
  absl::Duration poll_interval = absl::Milliseconds(200);
  // Liveness: every daemon renews a counter in the store every lease / 10
  // and rank 0 watches them; a daemon silent for most of a lease (dead,
  // stalled, unreachable) makes rank 0 form a new generation of the
  // default group while the log is idle, the others follow, and operations
  // are refused naming it until it takes part again: reported within
  // about a lease, instead of at the next collective's timeout
  // (membership.h).
  absl::Duration lease = absl::Seconds(5);
  // The daemon's host-memory budget (memory_budget.h): the CPU shards of
  // every tensor, loads, reshards, gathers and region staging are reserved
  // in it before they are allocated; more is RESOURCE_EXHAUSTED on every
  // daemon, rather than an allocation that succeeds lazily and gets the
  // daemon killed once touched. Null: the default limit for a daemon alone
  // on its host.
  std::shared_ptr<MemoryBudget> memory_budget;
  // Chunk size of ReadRegion and Gather streams that ask for 0, and the
  // largest a stream gets (as ShardServiceOptions).
  int64_t default_chunk_bytes = int64_t{512} << 10;
  int64_t max_chunk_bytes = int64_t{16} << 20;
  // Where SaveCheckpoint and LoadCheckpoint may go; none: refused with
  // FAILED_PRECONDITION.
  CheckpointRoots checkpoint_roots;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_DAEMON_CONTROL_OPTIONS_H_
