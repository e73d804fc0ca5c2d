// VersionLeases: ends the leases of versions on time (docs/versions.md):
// a thread that, every `period`, expires the pins and open versions of
// every versioned tensor in the table whose lease ended (VersionSet::
// Expire), so that a reader that died holding a pin, or a writer that died
// before it published, gives its memory back without waiting for the next
// version op on that tensor. A sweep that comes more than a second late
// (the daemon was stopped or starved) first moves the renewed leases
// (VersionSet::Postpone) by the delay: their holders' renewals could not
// be read meanwhile, so a stall of the daemon does not end them.
//
// An open version that a PublishVersion op has claimed (VersionSet::Claim)
// is not expired until the op ends: every daemon that agreed to publish it
// still holds it then.
//
// Thread-safety: Start and Stop from one thread (the control core's Start
// and Shutdown). Ownership: the control core owns it; the table outlives
// it.
#ifndef TESSERA_SERVER_DAEMON_VERSION_LEASES_H_
#define TESSERA_SERVER_DAEMON_VERSION_LEASES_H_

#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/daemon/tensor_table.h"

namespace tessera::control_internal {

class VersionLeases {
 public:
  explicit VersionLeases(TensorTable* table,
                         absl::Duration period = absl::Milliseconds(200))
      : table_(table), period_(period) {}
  // Calls Stop().
  ~VersionLeases();
  VersionLeases(const VersionLeases&) = delete;
  VersionLeases& operator=(const VersionLeases&) = delete;

  void Start();
  // Stops the thread and waits for it.
  void Stop();
  // One sweep now (the thread's body).
  void ExpireNow() const;

 private:
  void Loop();

  TensorTable* const table_;
  const absl::Duration period_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace tessera::control_internal

#endif  // TESSERA_SERVER_DAEMON_VERSION_LEASES_H_
