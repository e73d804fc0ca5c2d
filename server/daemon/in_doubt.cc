#include "server/daemon/in_doubt.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/daemon/control_ops.h"
#include "spdlog/spdlog.h"

namespace tessera::control_internal {

void InDoubt::Hold(int64_t entry, v1::ControlOp op, LateCommit late,
                   absl::Status broke) {
  std::optional<Holding> earlier;
  {
    absl::MutexLock lock(&mu_);
    earlier = std::exchange(
        held_,
        Holding{Held{entry, std::move(op), std::move(broke)}, std::move(late)});
  }
  if (earlier.has_value()) {
    spdlog::error(
        "control: log entry {} ({}) was still in doubt when entry {} was; "
        "giving it up",
        earlier->held.entry, OpName(earlier->held.op), entry);
    if (earlier->late.give_up) earlier->late.give_up();
  }
}

void InDoubt::Committed(int64_t entry) {
  absl::MutexLock lock(&mu_);
  last_committed_ = std::max(last_committed_, entry);
}

int64_t InDoubt::last_committed() const {
  absl::MutexLock lock(&mu_);
  return last_committed_;
}

int64_t InDoubt::held_entry() const {
  absl::MutexLock lock(&mu_);
  return held_.has_value() ? held_->held.entry : 0;
}

std::optional<InDoubt::Held> InDoubt::held() const {
  absl::MutexLock lock(&mu_);
  if (!held_.has_value()) return std::nullopt;
  return held_->held;
}

void InDoubt::Resolve(bool committed_elsewhere) {
  std::optional<Holding> holding;
  {
    absl::MutexLock lock(&mu_);
    holding = std::exchange(held_, std::nullopt);
  }
  if (!holding.has_value()) return;
  const Held& held = holding->held;
  Resolved resolved;
  resolved.entry = held.entry;
  resolved.op = held.op;
  if (committed_elsewhere) {
    resolved.result = holding->late.commit();
    spdlog::warn(
        "control: log entry {} ({}) was in doubt here ({}); another daemon "
        "committed it, so this one did too",
        held.entry, OpName(held.op), held.broke.ToString());
  } else {
    if (holding->late.give_up) holding->late.give_up();
    resolved.status = absl::UnavailableError(absl::StrCat(
        OpName(held.op),
        " was not applied: the daemons' process group broke while it ran (",
        held.broke.message(), ") and no daemon committed it; retry it"));
    spdlog::warn(
        "control: log entry {} ({}) was in doubt here; no daemon committed "
        "it, so it is given up",
        held.entry, OpName(held.op));
  }
  holding.reset();  // What the op held goes before the outcome is told.
  absl::MutexLock lock(&mu_);
  if (committed_elsewhere) {
    last_committed_ = std::max(last_committed_, resolved.entry);
  }
  resolved_ = std::move(resolved);
}

std::optional<InDoubt::Resolved> InDoubt::TakeResolved() {
  absl::MutexLock lock(&mu_);
  return std::exchange(resolved_, std::nullopt);
}

}  // namespace tessera::control_internal
