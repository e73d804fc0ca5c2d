#include "server/daemon/version_leases.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "server/daemon/version_set.h"

namespace tessera::control_internal {

VersionLeases::~VersionLeases() { Stop(); }

void VersionLeases::Start() {
  absl::MutexLock lock(&mu_);
  if (thread_.joinable() || stopping_) return;
  thread_ = std::thread([this] { Loop(); });
}

void VersionLeases::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void VersionLeases::ExpireNow() const {
  // Taken under the table's lock, expired outside it (freeing a version
  // may take a while).
  const std::vector<std::shared_ptr<VersionSet>> sets = table_->VersionSets();
  const absl::Time now = absl::Now();
  for (const std::shared_ptr<VersionSet>& versions : sets) {
    versions->Expire(now);
  }
}

void VersionLeases::Loop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      const auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_;
      };
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping), period_)) return;
    }
    ExpireNow();
  }
}

}  // namespace tessera::control_internal
