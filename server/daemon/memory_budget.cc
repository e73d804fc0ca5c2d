#include "server/daemon/memory_budget.h"

#include <unistd.h>

#include <algorithm>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/daemon/cgroup_memory.h"
#include "server/metrics/metrics.h"

namespace tessera {
namespace {

// " (1.5 GiB)" for a size of a GiB or more, for messages.
std::string InGiB(int64_t bytes) {
  if (bytes < (int64_t{1} << 30)) return "";
  return absl::StrCat(" (", bytes / static_cast<double>(int64_t{1} << 30),
                      " GiB)");
}

}  // namespace

void MemoryBudget::Reservation::Release() {
  if (budget_ != nullptr && bytes_ > 0) {
    budget_->used_.fetch_sub(bytes_, std::memory_order_relaxed);
  }
  bytes_ = 0;
  budget_.reset();
}

std::shared_ptr<MemoryBudget> MemoryBudget::Create(int64_t limit,
                                                   std::string source) {
  return std::shared_ptr<MemoryBudget>(
      new MemoryBudget(std::max<int64_t>(limit, 0), std::move(source)));
}

bool MemoryBudget::TryReserve(int64_t bytes) {
  int64_t used = used_.load(std::memory_order_relaxed);
  do {
    if (bytes > limit_ - used) return false;
  } while (!used_.compare_exchange_weak(used, used + bytes,
                                        std::memory_order_relaxed));
  return true;
}

void MemoryBudget::AddReclaimable(std::weak_ptr<Reclaimable> reclaimable) {
  absl::MutexLock lock(&reclaimables_mu_);
  reclaimables_.erase(std::remove_if(reclaimables_.begin(), reclaimables_.end(),
                                     [](const auto& r) { return r.expired(); }),
                      reclaimables_.end());
  reclaimables_.push_back(std::move(reclaimable));
}

std::vector<std::shared_ptr<MemoryBudget::Reclaimable>>
MemoryBudget::LiveReclaimables() const {
  std::vector<std::shared_ptr<Reclaimable>> live;
  absl::MutexLock lock(&reclaimables_mu_);
  for (const auto& weak : reclaimables_) {
    if (auto r = weak.lock()) live.push_back(std::move(r));
  }
  return live;
}

int64_t MemoryBudget::kept_for_reuse() const {
  int64_t kept = 0;
  for (const auto& r : LiveReclaimables()) kept += r->KeptBytes();
  return kept;
}

absl::StatusOr<MemoryBudget::Reservation> MemoryBudget::Reserve(
    int64_t bytes, absl::string_view what) {
  if (bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": a negative size (", bytes, " bytes)"));
  }
  if (TryReserve(bytes)) return Reservation(shared_from_this(), bytes);
  // Memory kept only for reuse goes first; asked outside the lock, as
  // giving it back releases reservations.
  int64_t reclaimed = 0;
  for (const auto& r : LiveReclaimables()) reclaimed += r->Reclaim();
  if (reclaimed > 0 && TryReserve(bytes)) {
    return Reservation(shared_from_this(), bytes);
  }
  const int64_t left =
      std::max<int64_t>(limit_ - used_.load(std::memory_order_relaxed), 0);
  CountBudgetRefusal();
  return absl::ResourceExhaustedError(
      absl::StrCat(what, " needs ", bytes, " bytes of host memory",
                   InGiB(bytes), ", but this daemon has ", left, " bytes left",
                   InGiB(left), " of its ", limit_, " bytes budget",
                   InGiB(limit_), " (", source_, ")", LeasedNote()));
}

std::string MemoryBudget::LeasedNote() const {
  std::vector<Reclaimable::Leased> leased;
  for (const auto& r : LiveReclaimables()) {
    for (Reclaimable::Leased& one : r->LeasedNow()) {
      if (one.bytes > 0) leased.push_back(std::move(one));
    }
  }
  if (leased.empty()) return "";
  std::sort(leased.begin(), leased.end(),
            [](const auto& a, const auto& b) { return a.bytes > b.bytes; });
  int64_t total = 0;
  for (const auto& one : leased) total += one.bytes;
  constexpr size_t kShown = 3;
  const absl::Time now = absl::Now();
  std::string shown;
  for (size_t i = 0; i < std::min(leased.size(), kShown); ++i) {
    absl::StrAppend(
        &shown, i > 0 ? ", " : "", leased[i].label, " (", leased[i].bytes,
        " bytes, its lease ends in ",
        absl::FormatDuration(absl::Trunc(
            std::max(leased[i].lease_end - now, absl::ZeroDuration()),
            absl::Seconds(1))),
        ")");
  }
  if (leased.size() > kShown) {
    absl::StrAppend(&shown, " and ", leased.size() - kShown, " more");
  }
  return absl::StrCat(
      "; versions opened and not yet published hold ", total, " bytes of it",
      InGiB(total), ": ", shown,
      ". A writer that died holds its version until the lease ends; joining "
      "it by that id and aborting it frees it now (Python: "
      "c.join(\"",
      leased.front().label, "\").abort())");
}

MemoryBudget::Reservation MemoryBudget::Charge(int64_t bytes) {
  bytes = std::max<int64_t>(bytes, 0);
  used_.fetch_add(bytes, std::memory_order_relaxed);
  return Reservation(shared_from_this(), bytes);
}

int64_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return std::numeric_limits<int64_t>::max();
  return static_cast<int64_t>(pages) * page_size;
}

int64_t DefaultMemoryLimit(int local_world_size, std::string* source) {
  int64_t base = PhysicalMemoryBytes();
  const CgroupLimit cgroup = ReadCgroupMemoryLimit();
  if (cgroup.bytes > 0 && cgroup.bytes < base) {
    base = cgroup.bytes;
    *source = absl::StrCat("the default: the memory limit of its cgroup (",
                           cgroup.file, ": ", cgroup.bytes,
                           " bytes), less a reserve");
  } else {
    base /= std::max(local_world_size, 1);
    *source = absl::StrCat("the default: physical memory / ",
                           std::max(local_world_size, 1),
                           " daemons on this host, less a reserve");
  }
  const int64_t reserve = std::max<int64_t>(int64_t{256} << 20, base / 10);
  return std::max<int64_t>(base - reserve, base / 2);
}

}  // namespace tessera
