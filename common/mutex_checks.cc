#include "common/mutex_checks.h"

#include "absl/synchronization/mutex.h"

namespace tessera {

void SkipMutexDeadlockChecks() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

}  // namespace tessera
