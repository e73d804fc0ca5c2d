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
  // A sweep later than this past its period means this daemon did not run
  // (stopped, or starved of CPU): renewals sent meanwhile wait unread in
  // its sockets.
  constexpr absl::Duration kStallSlack = absl::Seconds(1);
  absl::Time last = absl::Now();
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      const auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_;
      };
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping), period_)) return;
    }
    const absl::Time now = absl::Now();
    if (const absl::Duration stalled = now - last - period_;
        stalled > kStallSlack) {
      for (const std::shared_ptr<VersionSet>& versions :
           table_->VersionSets()) {
        versions->Postpone(stalled);
      }
    }
    last = now;
    ExpireNow();
  }
}

}  // namespace tessera::control_internal
