#include "server/serve/shard_registry.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace tessera {
namespace {

// Checks that every local shard names a distinct global shard and that its
// tensor has exactly the sizes the global metadata promises, so a fetch
// never streams bytes that disagree with the header it sends.
absl::Status ValidateLocalShards(absl::string_view tensor_id,
                                 const RegisteredTensor& tensor) {
  if (tensor.metadata == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", tensor_id, " has no metadata"));
  }
  const auto& shards = tensor.metadata->shards_metadata;
  int64_t previous = -1;
  for (const LocalShard& local : tensor.local_shards) {
    if (local.index < 0 || local.index >= static_cast<int64_t>(shards.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", tensor_id, ": local shard index ", local.index,
          " is out of range [0, ", shards.size(), ")"));
    }
    if (local.index == previous) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", tensor_id, ": shard ", local.index, " registered twice"));
    }
    previous = local.index;
    if (!local.tensor.defined()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", tensor_id, ": shard ", local.index, " has no tensor"));
    }
    const absl::Span<const int64_t> expected =
        shards[local.index].shard_sizes();
    if (local.tensor.sizes() != expected) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", tensor_id, ": shard ", local.index, " has sizes [",
          absl::StrJoin(local.tensor.sizes(), ", "),
          "] but its metadata says [", absl::StrJoin(expected, ", "), "]"));
    }
  }
  return absl::OkStatus();
}

// `tensor`, or a copy with its local shards in increasing index order
// (FindShard's binary search needs it; callers usually register in order).
std::shared_ptr<const RegisteredTensor> SortedByIndex(
    std::shared_ptr<const RegisteredTensor> tensor) {
  auto by_index = [](const LocalShard& a, const LocalShard& b) {
    return a.index < b.index;
  };
  if (std::is_sorted(tensor->local_shards.begin(), tensor->local_shards.end(),
                     by_index)) {
    return tensor;
  }
  auto sorted = std::make_shared<RegisteredTensor>(*tensor);
  std::sort(sorted->local_shards.begin(), sorted->local_shards.end(), by_index);
  return sorted;
}

}  // namespace

const LocalShard* RegisteredTensor::FindShard(int64_t index) const {
  auto it = std::lower_bound(
      local_shards.begin(), local_shards.end(), index,
      [](const LocalShard& local, int64_t i) { return local.index < i; });
  if (it == local_shards.end() || it->index != index) return nullptr;
  return &*it;
}

absl::Status ShardRegistry::Register(
    std::string tensor_id, std::shared_ptr<const RegisteredTensor> tensor) {
  if (tensor_id.empty()) {
    return absl::InvalidArgumentError("tensor id must not be empty");
  }
  if (tensor == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", tensor_id, ": null registration"));
  }
  tensor = SortedByIndex(std::move(tensor));
  RETURN_IF_ERROR(ValidateLocalShards(tensor_id, *tensor));
  absl::MutexLock lock(&mu_);
  if (retired_.contains(tensor_id)) {
    return absl::AlreadyExistsError(
        absl::StrCat("tensor ", tensor_id, " is already registered"));
  }
  auto [it, inserted] = tensors_.try_emplace(tensor_id, std::move(tensor));
  if (!inserted) {
    return absl::AlreadyExistsError(
        absl::StrCat("tensor ", tensor_id, " is already registered"));
  }
  return absl::OkStatus();
}

void ShardRegistry::SetServeGate(ServeGate gate) {
  std::shared_ptr<const ServeGate> set;
  if (gate) set = std::make_shared<const ServeGate>(std::move(gate));
  absl::MutexLock lock(&gate_mu_);
  gate_ = std::move(set);
}

absl::Status ShardRegistry::CheckServe(absl::string_view id, bool write,
                                       absl::Time deadline) const {
  std::shared_ptr<const ServeGate> gate;
  {
    absl::MutexLock lock(&gate_mu_);
    gate = gate_;
  }
  if (gate == nullptr) return absl::OkStatus();
  return (*gate)(id, write, deadline);
}

bool ShardRegistry::Unregister(absl::string_view tensor_id) {
  // Destroy the entry outside the lock: it may be the last reference to
  // large shard storage, and freeing it must not stall concurrent lookups.
  std::shared_ptr<const RegisteredTensor> removed;
  {
    absl::MutexLock lock(&mu_);
    if (auto it = tensors_.find(tensor_id); it != tensors_.end()) {
      removed = std::move(it->second);
      tensors_.erase(it);
    } else if (auto r = retired_.find(tensor_id); r != retired_.end()) {
      removed = std::move(r->second.tensor);
      retired_.erase(r);
    } else {
      return false;
    }
  }
  ForgetWrites({std::string(tensor_id)});
  return true;
}

ShardRegistry::WritePass::WritePass(WritePass&& other) noexcept
    : registry_(std::exchange(other.registry_, nullptr)),
      id_(std::move(other.id_)) {}

ShardRegistry::WritePass& ShardRegistry::WritePass::operator=(
    WritePass&& other) noexcept {
  if (this != &other) {
    Release();
    registry_ = std::exchange(other.registry_, nullptr);
    id_ = std::move(other.id_);
  }
  return *this;
}

ShardRegistry::WritePass::~WritePass() { Release(); }

void ShardRegistry::WritePass::Release() {
  if (registry_ == nullptr) return;
  const ShardRegistry* registry = std::exchange(registry_, nullptr);
  absl::MutexLock lock(&registry->writes_mu_);
  auto it = registry->writes_.find(id_);
  if (it == registry->writes_.end()) return;
  if (--it->second.writers <= 0 && !it->second.fenced) {
    registry->writes_.erase(it);
  }
}

absl::StatusOr<ShardRegistry::WritePass> ShardRegistry::EnterWrite(
    absl::string_view id) const {
  absl::MutexLock lock(&writes_mu_);
  WriteState& state = writes_[id];
  if (state.fenced) {
    return absl::AbortedError(
        absl::StrCat("tensor ", id, " takes no writes now (", state.why,
                     "): this write was not applied; write it again"));
  }
  ++state.writers;
  return WritePass(this, std::string(id));
}

absl::Status ShardRegistry::Fence(const std::string& id, const std::string& why,
                                  absl::Time deadline) {
  absl::MutexLock lock(&writes_mu_);
  WriteState& state = writes_[id];
  state.fenced = true;
  state.why = why;
  const auto drained = [this, &id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(writes_mu_) {
    return writes_[id].writers <= 0;
  };
  if (!writes_mu_.AwaitWithDeadline(absl::Condition(&drained), deadline)) {
    return absl::DeadlineExceededError(
        absl::StrCat("tensor ", id, ": ", writes_[id].writers,
                     " writes in flight did not end in time (", why, ")"));
  }
  return absl::OkStatus();
}

void ShardRegistry::Lift(const std::string& id) {
  absl::MutexLock lock(&writes_mu_);
  auto it = writes_.find(id);
  if (it == writes_.end()) return;
  it->second.fenced = false;
  if (it->second.writers <= 0) writes_.erase(it);
}

void ShardRegistry::ForgetWrites(const std::vector<std::string>& ids) {
  absl::MutexLock lock(&writes_mu_);
  for (const std::string& id : ids) {
    auto it = writes_.find(id);
    if (it != writes_.end() && it->second.writers <= 0) writes_.erase(it);
  }
}

bool ShardRegistry::Retire(absl::string_view tensor_id) {
  absl::MutexLock lock(&mu_);
  auto it = tensors_.find(tensor_id);
  if (it == tensors_.end()) return false;
  retired_[it->first] = Retired{retirements_++, std::move(it->second)};
  tensors_.erase(it);
  return true;
}

uint64_t ShardRegistry::RetirementMark() const {
  absl::MutexLock lock(&mu_);
  return retirements_;
}

size_t ShardRegistry::ReleaseRetired(uint64_t mark) {
  std::vector<std::shared_ptr<const RegisteredTensor>> released;
  std::vector<std::string> ids;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = retired_.begin(); it != retired_.end();) {
      if (it->second.sequence < mark) {
        released.push_back(std::move(it->second.tensor));
        ids.push_back(it->first);
        retired_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  // `released` is destroyed after the lock is dropped (declared first).
  ForgetWrites(ids);
  return released.size();
}

std::shared_ptr<const RegisteredTensor> ShardRegistry::Find(
    absl::string_view tensor_id) const {
  absl::MutexLock lock(&mu_);
  return FindLocked(tensor_id);
}

std::shared_ptr<const RegisteredTensor> ShardRegistry::FindLocked(
    absl::string_view tensor_id) const {
  if (auto it = tensors_.find(tensor_id); it != tensors_.end()) {
    return it->second;
  }
  auto r = retired_.find(tensor_id);
  return r == retired_.end() ? nullptr : r->second.tensor;
}

ShardRegistry::Resolved ShardRegistry::Resolve(absl::string_view id,
                                               absl::Time deadline) const {
  const std::optional<AtLeast> at_least = ParseAtLeast(id);
  absl::MutexLock lock(&mu_);
  if (!at_least.has_value()) return ResolveLocked(id);
  // The latest once it is that version or newer: a publish some daemon has
  // applied reaches this one within moments. Only published versions are
  // served (the version's own registration may still be open here, for
  // all this daemon knows).
  const auto reached = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = versions_.find(at_least->latest_id);
    return it == versions_.end() || it->second.latest >= at_least->number;
  };
  const absl::Time until = std::min(deadline, absl::Now() + kAtLeastWait);
  const bool caught_up =
      reached() || (until > absl::Now() &&
                    mu_.AwaitWithDeadline(absl::Condition(&reached), until));
  Resolved latest = ResolveLocked(at_least->latest_id);
  latest.behind = !caught_up;
  return latest;
}

ShardRegistry::Resolved ShardRegistry::ResolveLocked(
    absl::string_view id) const {
  Resolved resolved;
  if (!versions_.empty()) {
    // The tensor's own id: its latest version.
    if (auto it = versions_.find(id); it != versions_.end()) {
      resolved.writable = false;
      auto latest = it->second.registrations.find(it->second.latest);
      if (latest == it->second.registrations.end()) return resolved;
      resolved.tensor = FindLocked(latest->second);
      resolved.version = latest->first;
      return resolved;
    }
    // A version id: a published one is read-only.
    if (const int64_t number = VersionNumber(id); number >= 1) {
      if (auto it = versions_.find(VersionBase(id)); it != versions_.end()) {
        if (auto published = it->second.registrations.find(number);
            published != it->second.registrations.end()) {
          resolved.tensor = FindLocked(published->second);
          resolved.version = number;
          resolved.writable = false;
          return resolved;
        }
      }
    }
  }
  resolved.tensor = FindLocked(id);
  return resolved;
}

void ShardRegistry::PublishVersion(const std::string& tensor_id, int64_t number,
                                   const std::string& registration_id) {
  absl::MutexLock lock(&mu_);
  VersionIndex& index = versions_[tensor_id];
  index.registrations[number] = registration_id;
  index.latest = std::max(index.latest, number);
}

void ShardRegistry::ForgetVersion(const std::string& tensor_id,
                                  int64_t number) {
  absl::MutexLock lock(&mu_);
  if (auto it = versions_.find(tensor_id); it != versions_.end()) {
    it->second.registrations.erase(number);
  }
}

void ShardRegistry::DropVersions(const std::string& tensor_id) {
  absl::MutexLock lock(&mu_);
  versions_.erase(tensor_id);
}

ShardRegistry::Holdings ShardRegistry::Held() const {
  Holdings held;
  const auto add = [&held](const RegisteredTensor& tensor) {
    ++held.tensors;
    for (const LocalShard& shard : tensor.local_shards) {
      ++held.shards;
      const Device& device = shard.tensor.device();
      if (device.is_cpu()) held.cpu_bytes += shard.tensor.nbytes();
      if (device.is_cuda()) held.cuda_bytes += shard.tensor.nbytes();
    }
  };
  absl::MutexLock lock(&mu_);
  for (const auto& [id, tensor] : tensors_) add(*tensor);
  for (const auto& [id, retired] : retired_) add(*retired.tensor);
  return held;
}

size_t ShardRegistry::retired_size() const {
  absl::MutexLock lock(&mu_);
  return retired_.size();
}

size_t ShardRegistry::size() const {
  absl::MutexLock lock(&mu_);
  return tensors_.size();
}

std::vector<std::string> ShardRegistry::TensorIds() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> ids;
  ids.reserve(tensors_.size());
  for (const auto& [id, tensor] : tensors_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

}  // namespace tessera
