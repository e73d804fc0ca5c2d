#include "server/daemon/version_set.h"

#include <algorithm>
#include <atomic>
#include <iterator>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "server/serve/shard_registry.h"
#include "wire/replicas.h"
#include "wire/version_id.h"

namespace tessera::control_internal {

VersionSet::VersionSet(std::shared_ptr<Rank> rank, std::string name,
                       std::string tensor_id, int kept)
    : rank_(std::move(rank)),
      name_(std::move(name)),
      tensor_id_(std::move(tensor_id)),
      kept_(std::max(kept, 1)) {}

VersionSet::~VersionSet() {
  rank_->registry().DropVersions(tensor_id_);
  rank_->registry().DropVersions(ReplicaTensorId(tensor_id_));
}

void VersionSet::RegisterPublishedLocked(int64_t number, const std::string& id,
                                         const Version& version) {
  rank_->registry().PublishVersion(tensor_id_, number, id);
  if (version.copies != nullptr) {
    rank_->registry().PublishVersion(ReplicaTensorId(tensor_id_), number,
                                     ReplicaTensorId(id));
  }
}

int64_t VersionSet::latest() const {
  absl::MutexLock lock(&mu_);
  return latest_;
}

int64_t VersionSet::next() const {
  absl::MutexLock lock(&mu_);
  return next_;
}

ShardedTensor VersionSet::Latest() const {
  absl::MutexLock lock(&mu_);
  return published_.at(latest_).tensor;
}

absl::StatusOr<ShardedTensor> VersionSet::Published(const std::string& name,
                                                    int64_t number) const {
  absl::MutexLock lock(&mu_);
  auto it = published_.find(number);
  if (it == published_.end()) {
    return absl::NotFoundError(
        absl::StrCat("version ", number, " of tensor ", name,
                     " is not kept (kept: ", KeptListLocked(), ")"));
  }
  return it->second.tensor;
}

void VersionSet::AddFirst(ShardedTensor tensor,
                          MemoryBudget::Reservation held) {
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = published_.insert_or_assign(
      1, Version{std::move(tensor), nullptr, std::move(held)});
  latest_ = 1;
  next_ = 2;
  RegisterPublishedLocked(1, tensor_id_, it->second);
}

void VersionSet::AddPublished(int64_t number, ShardedTensor tensor,
                              std::shared_ptr<ReplicaCopies> copies,
                              MemoryBudget::Reservation held, int64_t next) {
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = published_.insert_or_assign(
      number, Version{std::move(tensor), std::move(copies), std::move(held)});
  latest_ = std::max(latest_, number);
  next_ = std::max({next_, number + 1, next});
  untrimmed_ = true;  // Trimmed at the next Expire (its pins may follow).
  RegisterPublishedLocked(number, RegistrationId(tensor_id_, number),
                          it->second);
}

void VersionSet::SetCopies(int64_t number,
                           std::shared_ptr<ReplicaCopies> copies) {
  absl::MutexLock lock(&mu_);
  auto it = published_.find(number);
  if (it == published_.end()) return;
  it->second.copies = std::move(copies);
  RegisterPublishedLocked(number, RegistrationId(tensor_id_, number),
                          it->second);
}

int64_t VersionSet::Open(ShardedTensor tensor,
                         std::shared_ptr<ReplicaCopies> copies,
                         MemoryBudget::Reservation held, absl::Time lease_end,
                         absl::Duration renewal) {
  absl::MutexLock lock(&mu_);
  const int64_t number = next_++;
  AddToBudgetLocked(held);
  open_.insert_or_assign(
      number, Version{std::move(tensor), std::move(copies), std::move(held),
                      lease_end, std::max(renewal, absl::ZeroDuration())});
  return number;
}

void VersionSet::AddToBudgetLocked(const MemoryBudget::Reservation& held) {
  if (reclaimable_added_ || !held.budget()) return;
  held.budget()->AddReclaimable(weak_from_this());
  reclaimable_added_ = true;
}

absl::Status VersionSet::CheckOpen(const std::string& name,
                                   int64_t number) const {
  absl::MutexLock lock(&mu_);
  return CheckOpenLocked(name, number);
}

absl::Status VersionSet::CheckOpenLocked(const std::string& name,
                                         int64_t number) const {
  if (open_.count(number) > 0) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("version ", number, " of tensor ", name, " is not open: ",
                   number <= 0 || number >= next_
                       ? "it was never begun"
                       : "it was published or aborted, or its lease ended",
                   " (latest published: ", latest_, ")"));
}

absl::Status VersionSet::Claim(const std::string& name, int64_t number) {
  RETURN_IF_ERROR(CheckOpen(name, number));
  absl::MutexLock lock(&mu_);
  auto it = open_.find(number);
  if (it == open_.end()) return CheckOpenLocked(name, number);
  it->second.claimed = true;
  return absl::OkStatus();
}

void VersionSet::Unclaim(int64_t number) {
  absl::MutexLock lock(&mu_);
  if (auto it = open_.find(number); it != open_.end()) {
    it->second.claimed = false;
  }
}

void VersionSet::Publish(int64_t number) {
  Freed freed;
  absl::MutexLock lock(&mu_);
  auto it = open_.find(number);
  if (it == open_.end()) return;
  Version version = std::move(it->second);
  open_.erase(it);
  version.lease_end = absl::InfiniteFuture();
  auto [published, inserted] =
      published_.insert_or_assign(number, std::move(version));
  RegisterPublishedLocked(number, VersionId(tensor_id_, number),
                          published->second);
  latest_ = std::max(latest_, number);
  TrimLocked(&freed);
}

void VersionSet::Abort(int64_t number) {
  Freed freed;
  absl::MutexLock lock(&mu_);
  auto it = open_.find(number);
  if (it == open_.end()) return;
  freed.versions.push_back(std::move(it->second));
  open_.erase(it);
  KeepSpareLocked(&freed);
}

void VersionSet::Pin(const std::string& pin, int64_t number, absl::Time until,
                     absl::Duration renewal) {
  absl::MutexLock lock(&mu_);
  pins_[pin] = PinEntry{number, until, std::max(renewal, absl::ZeroDuration())};
}

namespace {

// Renews the lease of `map`'s entry `key` (its end: `end`), when its holder
// renews it; false when there is no such entry.
template <typename Map, typename Key, typename End>
bool RenewIn(Map& map, const Key& key, absl::Time now, End end) {
  auto it = map.find(key);
  if (it == map.end()) return false;
  if (it->second.renewal > absl::ZeroDuration()) {
    absl::Time& ends = end(it->second);
    ends = std::max(ends, now + it->second.renewal);
  }
  return true;
}

}  // namespace

bool VersionSet::Renew(int64_t number, absl::Time now) {
  absl::MutexLock lock(&mu_);
  return RenewIn(open_, number, now, [](Version& version) -> absl::Time& {
    return version.lease_end;
  });
}

bool VersionSet::RenewPin(const std::string& pin, absl::Time now) {
  absl::MutexLock lock(&mu_);
  return RenewIn(pins_, pin, now,
                 [](PinEntry& entry) -> absl::Time& { return entry.until; });
}

void VersionSet::Postpone(absl::Duration stalled) {
  absl::MutexLock lock(&mu_);
  for (auto& [number, version] : open_) {
    if (version.renewal > absl::ZeroDuration()) version.lease_end += stalled;
  }
  for (auto& [pin, entry] : pins_) {
    if (entry.renewal > absl::ZeroDuration()) entry.until += stalled;
  }
}

std::vector<VersionSet::PinState> VersionSet::Pins() const {
  absl::MutexLock lock(&mu_);
  std::vector<PinState> pins;
  for (const auto& [id, entry] : pins_) {
    pins.push_back(PinState{id, entry.number, entry.until, entry.renewal});
  }
  return pins;
}

bool VersionSet::Unpin(const std::string& pin) {
  Freed freed;
  absl::MutexLock lock(&mu_);
  if (pins_.erase(pin) == 0) return false;
  TrimLocked(&freed);
  return true;
}

void VersionSet::Expire(absl::Time now, bool renewed) {
  Freed freed;
  absl::MutexLock lock(&mu_);
  // Called for every versioned tensor every lease tick: nothing more is
  // done for one whose leases all run on and that nothing added to since
  // it was trimmed.
  bool ended = false;
  for (auto it = pins_.begin(); it != pins_.end();) {
    if (it->second.until <= now &&
        (renewed || it->second.renewal == absl::ZeroDuration())) {
      it = pins_.erase(it);
      ended = true;
    } else {
      ++it;
    }
  }
  for (auto it = open_.begin(); it != open_.end();) {
    if (it->second.lease_end <= now && !it->second.claimed &&
        (renewed || it->second.renewal == absl::ZeroDuration())) {
      freed.versions.push_back(std::move(it->second));
      it = open_.erase(it);
      ended = true;
    } else {
      ++it;
    }
  }
  if (ended || untrimmed_) TrimLocked(&freed);
}

void VersionSet::TrimLocked(Freed* freed) {
  untrimmed_ = false;
  // The kept newest, by number, stay; so does every pinned one.
  int64_t keep_from = latest_;
  int count = 0;
  for (auto it = published_.rbegin(); it != published_.rend(); ++it) {
    if (++count > kept_) break;
    keep_from = it->first;
  }
  for (auto it = published_.begin(); it != published_.end();) {
    const int64_t number = it->first;
    const bool pinned = std::any_of(
        pins_.begin(), pins_.end(),
        [&](const auto& pin) { return pin.second.number == number; });
    if (number >= keep_from || number == latest_ || pinned) {
      ++it;
      continue;
    }
    rank_->registry().ForgetVersion(tensor_id_, number);
    rank_->registry().ForgetVersion(ReplicaTensorId(tensor_id_), number);
    freed->versions.push_back(std::move(it->second));
    it = published_.erase(it);
  }
  KeepSpareLocked(freed);
}

void VersionSet::KeepSpareLocked(Freed* freed) {
  for (auto it = freed->versions.rbegin(); it != freed->versions.rend(); ++it) {
    Version& version = *it;
    if (version.copies != nullptr || !version.held.budget()) continue;
    const std::vector<Shard>& shards = version.tensor.local_shards();
    const bool host =
        !shards.empty() &&
        std::all_of(shards.begin(), shards.end(), [](const Shard& s) {
          const auto& storage = s.tensor.storage();
          return storage != nullptr && storage->data() != nullptr &&
                 storage->device().is_cpu() && storage->reusable();
        });
    if (!host) continue;
    // The older spare goes; this version's registration goes with the
    // version when `freed` is destroyed, its shards stay here.
    freed->spare = std::move(spare_);
    spare_ = Spare{shards, std::move(version.held)};
    AddToBudgetLocked(spare_->held);
    return;
  }
}

std::optional<VersionSet::Spare> VersionSet::PopSpare() {
  absl::MutexLock lock(&mu_);
  return std::exchange(spare_, std::nullopt);
}

std::optional<VersionSet::Spare> VersionSet::TakeSpare() {
  std::optional<Spare> spare = PopSpare();
  if (!spare.has_value()) return std::nullopt;
  // Only this spare may hold the memory: a fetch or a lease of the freed
  // version still running holds it too (the registry no longer hands it
  // out, so no new holder can appear).
  for (const Shard& shard : spare->shards) {
    const auto& storage = shard.tensor.storage();
    if (storage.use_count() != 1 || !storage->reusable()) {
      return std::nullopt;  // Freed here.
    }
  }
  // The last other holder's accesses happen before the new writes.
  std::atomic_thread_fence(std::memory_order_acquire);
  return spare;
}

int64_t VersionSet::Reclaim() {
  const std::optional<Spare> spare = PopSpare();  // Freed on return.
  return spare.has_value() ? spare->held.bytes() : 0;
}

int64_t VersionSet::KeptBytes() const {
  absl::MutexLock lock(&mu_);
  return spare_.has_value() ? spare_->held.bytes() : 0;
}

std::vector<MemoryBudget::Reclaimable::Leased> VersionSet::LeasedNow() const {
  absl::MutexLock lock(&mu_);
  std::vector<Leased> leased;
  for (const auto& [number, version] : open_) {
    leased.push_back({absl::StrCat(name_, "@", number), version.held.bytes(),
                      version.lease_end});
  }
  return leased;
}

std::string VersionSet::KeptListLocked() const {
  std::vector<int64_t> kept;
  for (const auto& [number, version] : published_) kept.push_back(number);
  return absl::StrJoin(kept, ", ");
}

void VersionSet::Describe(v1::TensorInfo* info) const {
  absl::MutexLock lock(&mu_);
  info->set_versions_kept(kept_);
  info->set_version(latest_);
  info->set_next_version(next_);
  info->clear_kept_versions();
  info->clear_pinned_versions();
  info->clear_open_versions();
  for (const auto& [number, version] : published_) {
    info->add_kept_versions(number);
  }
  std::vector<int64_t> pinned;
  for (const auto& [pin, entry] : pins_) pinned.push_back(entry.number);
  std::sort(pinned.begin(), pinned.end());
  pinned.erase(std::unique(pinned.begin(), pinned.end()), pinned.end());
  for (int64_t number : pinned) info->add_pinned_versions(number);
  for (const auto& [number, version] : open_) info->add_open_versions(number);
}

}  // namespace tessera::control_internal
