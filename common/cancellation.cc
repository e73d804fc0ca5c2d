#include "common/cancellation.h"

#include <utility>

namespace tessera {

Cancellation::Registration::Registration(Registration&& other) noexcept
    : owner_(std::exchange(other.owner_, nullptr)), id_(other.id_) {}

Cancellation::Registration& Cancellation::Registration::operator=(
    Registration&& other) noexcept {
  if (this != &other) {
    Reset();
    owner_ = std::exchange(other.owner_, nullptr);
    id_ = other.id_;
  }
  return *this;
}

void Cancellation::Registration::Reset() {
  if (owner_ == nullptr) return;
  // Cancel runs callbacks under the lock, so taking it waits for ours.
  absl::MutexLock lock(&owner_->mu_);
  owner_->callbacks_.erase(id_);
  owner_ = nullptr;
}

void Cancellation::Cancel() {
  absl::MutexLock lock(&mu_);
  if (cancelled_.exchange(true, std::memory_order_acq_rel)) return;
  for (auto& [id, callback] : callbacks_) callback();
  callbacks_.clear();
}

Cancellation::Registration Cancellation::OnCancel(
    std::function<void()> on_cancel) {
  absl::MutexLock lock(&mu_);
  if (cancelled()) {
    on_cancel();
    return {};
  }
  const int64_t id = next_id_++;
  callbacks_.emplace(id, std::move(on_cancel));
  return Registration(this, id);
}

}  // namespace tessera
