#include "server/daemon/tensor_table.h"

#include <algorithm>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/proto_convert.h"
#include "common/status_macros.h"
#include "common/tensor_name.h"
#include "wire/version_id.h"

namespace tessera::control_internal {

int64_t EntryMetadataBytes(size_t shards) {
  return kTensorMetadataBytes +
         static_cast<int64_t>(std::min<size_t>(shards, size_t{1} << 40)) *
             kShardMetadataBytes;
}

int64_t VersionMetadataBytes(size_t shards) {
  return static_cast<int64_t>(std::min<size_t>(shards, size_t{1} << 40)) *
         kVersionShardMetadataBytes;
}

absl::Status UnknownTensor(absl::string_view name) {
  return absl::NotFoundError(
      absl::StrCat("no tensor named \"", ShownName(name), "\""));
}

absl::Status DegradedError(const v1::TensorInfo& info) {
  std::vector<std::string> lost;
  std::set<int> owners;
  for (int shard : info.lost_shards()) {
    lost.push_back(absl::StrCat(shard));
    if (shard >= 0 && shard < info.shard_ranks_size()) {
      owners.insert(info.shard_ranks(shard));
    }
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "tensor ", info.name(), " is degraded: shards [",
      absl::StrJoin(lost, ", "), "] were lost when rank",
      owners.size() == 1 ? " " : "s ", absl::StrJoin(owners, ", "),
      " restarted; delete it, or load it from a checkpoint with replace"));
}

absl::Status RefillingError(int rank, const std::string& name,
                            const TableEntry& entry) {
  if (!entry.refill_error.empty()) {
    return absl::UnavailableError(absl::StrCat(
        "tensor ", name, ": rank ", rank,
        " restarted and could not refill its shards from their replicas (",
        entry.refill_error,
        "); load it from a checkpoint (with replace) or "
        "delete it"));
  }
  return absl::UnavailableError(absl::StrCat(
      "tensor ", name, ": rank ", rank,
      " restarted and is refilling its shards from their replicas; retry "
      "once it is done"));
}

absl::StatusOr<v1::TensorInfo> TensorInfoOf(const Rank& rank,
                                            const std::string& name,
                                            const ShardedTensor& tensor) {
  v1::TensorInfo info;
  info.set_name(name);
  info.set_tensor_id(tensor.tensor_id());
  *info.mutable_metadata() = ToProto(tensor.metadata());
  for (const ShardMetadata& shard : tensor.metadata().shards_metadata) {
    ASSIGN_OR_RETURN(auto placement, ParseAndValidateRemoteDevice(
                                         tensor.process_group()->global_ranks(),
                                         shard.placement(), &rank));
    info.add_shard_ranks(placement.first);
  }
  return info;
}

bool TensorTable::Holds(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  return entries_.count(name) > 0;
}

absl::StatusOr<ShardedTensor> TensorTable::Lookup(
    const std::string& name) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(name);
  if (it == entries_.end()) return UnknownTensor(name);
  if (it->second.info.lost_shards_size() > 0) {
    return DegradedError(it->second.info);
  }
  if (!it->second.tensor.has_value()) {
    return RefillingError(rank_, name, it->second);
  }
  return *it->second.tensor;
}

absl::StatusOr<v1::TensorInfo> TensorTable::Info(
    const std::string& name) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(name);
  if (it == entries_.end()) return UnknownTensor(name);
  v1::TensorInfo info = it->second.info;
  if (it->second.versions != nullptr) it->second.versions->Describe(&info);
  return info;
}

absl::StatusOr<v1::TensorInfo> TensorTable::Describe(
    const std::string& name) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(name);
  if (it == entries_.end()) return UnknownTensor(name);
  return InfoWithState(it->second);
}

v1::ListTensorsResponse TensorTable::List(const std::vector<std::string>& names,
                                          const std::string& after,
                                          int64_t page_bytes) const {
  v1::ListTensorsResponse response;
  int64_t bytes = 0;
  // Adds `entry`; false, with `more` set, when the page is full already.
  const auto add = [&](const TableEntry& entry) {
    if (page_bytes > 0 && bytes >= page_bytes) {
      response.set_more(true);
      return false;
    }
    v1::TensorInfo* info = response.add_tensors();
    *info = InfoWithState(entry);
    if (page_bytes > 0) bytes += static_cast<int64_t>(info->ByteSizeLong());
    return true;
  };
  absl::MutexLock lock(&mu_);
  if (names.empty()) {
    auto it = after.empty() ? entries_.begin() : entries_.upper_bound(after);
    for (; it != entries_.end() && add(it->second); ++it) {
    }
    return response;
  }
  std::set<std::string> wanted(names.begin(), names.end());  // sorted, once
  auto name = after.empty() ? wanted.begin() : wanted.upper_bound(after);
  for (; name != wanted.end(); ++name) {
    auto it = entries_.find(*name);
    if (it != entries_.end() && !add(it->second)) break;
  }
  return response;
}

size_t TensorTable::size() const {
  absl::MutexLock lock(&mu_);
  return entries_.size();
}

std::optional<std::string> TensorTable::NameOf(
    absl::string_view tensor_id) const {
  absl::MutexLock lock(&mu_);
  auto it = by_id_.find(tensor_id);
  if (it == by_id_.end()) return std::nullopt;
  return it->second;
}

bool TensorTable::Replicated(absl::string_view tensor_id) const {
  absl::MutexLock lock(&mu_);
  auto id = by_id_.find(tensor_id);
  if (id == by_id_.end()) return false;
  auto it = entries_.find(id->second);
  return it != entries_.end() && it->second.info.replicas_size() > 0 &&
         !Versioned(it->second.info);
}

void TensorTable::IndexLocked(const std::string& name, const TableEntry* was,
                              const TableEntry* now) {
  if (was != nullptr) {
    auto it = by_id_.find(was->info.tensor_id());
    if (it != by_id_.end() && it->second == name) by_id_.erase(it);
  }
  if (now != nullptr && !now->info.tensor_id().empty()) {
    by_id_[now->info.tensor_id()] = name;
  }
}

void TensorTable::Put(const std::string& name, TableEntry entry) {
  std::optional<TableEntry> replaced;  // Freed outside the lock.
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(name);
  if (it == entries_.end()) {
    IndexLocked(name, nullptr, &entry);
    entries_.emplace(name, std::move(entry));
    return;
  }
  IndexLocked(name, &it->second, &entry);
  replaced.emplace(std::move(it->second));
  it->second = std::move(entry);
}

std::optional<TableEntry> TensorTable::Remove(const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(name);
  if (it == entries_.end()) return std::nullopt;
  IndexLocked(name, &it->second, nullptr);
  std::optional<TableEntry> gone(std::move(it->second));
  entries_.erase(it);
  return gone;
}

absl::Status TensorTable::Update(
    const std::string& name, const std::function<void(TableEntry&)>& change) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(name);
  if (it == entries_.end()) return UnknownTensor(name);
  IndexLocked(name, &it->second, nullptr);
  change(it->second);
  IndexLocked(name, nullptr, &it->second);
  return absl::OkStatus();
}

absl::Status TensorTable::ForEach(
    const std::function<absl::Status(const std::string&, const TableEntry&)>&
        visit) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [name, entry] : entries_) {
    RETURN_IF_ERROR(visit(name, entry));
  }
  return absl::OkStatus();
}

std::vector<std::string> TensorTable::RemoveUnless(
    const std::function<bool(const std::string&, const TableEntry&)>& keep) {
  std::vector<std::string> removed;
  std::vector<TableEntry> gone;  // Freed outside the lock.
  absl::MutexLock lock(&mu_);
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (keep(it->first, it->second)) {
      ++it;
      continue;
    }
    removed.push_back(it->first);
    IndexLocked(it->first, &it->second, nullptr);
    gone.push_back(std::move(it->second));
    it = entries_.erase(it);
  }
  return removed;
}

void TensorTable::CompleteRefill(const std::string& name,
                                 const std::shared_ptr<Refill>& refill,
                                 ShardedTensor tensor,
                                 std::shared_ptr<ReplicaCopies> copies,
                                 std::shared_ptr<VersionSet> versions) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(name);
  // Deleted or replaced meanwhile: what was refilled goes with the
  // arguments, destroyed after the lock is released.
  if (it == entries_.end() || it->second.refill != refill) return;
  it->second.tensor = std::move(tensor);
  it->second.replicas = std::move(copies);
  it->second.versions = std::move(versions);
  it->second.refill.reset();
}

void TensorTable::FailRefill(const std::string& name,
                             const std::shared_ptr<Refill>& refill,
                             std::string error) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(name);
  if (it != entries_.end() && it->second.refill == refill) {
    it->second.refill_error = std::move(error);
  }
}

std::vector<std::shared_ptr<VersionSet>> TensorTable::VersionSets() const {
  std::vector<std::shared_ptr<VersionSet>> sets;
  absl::MutexLock lock(&mu_);
  sets.reserve(entries_.size());
  for (const auto& [name, entry] : entries_) {
    if (entry.versions != nullptr) sets.push_back(entry.versions);
  }
  return sets;
}

v1::TensorInfo TensorTable::InfoWithState(const TableEntry& entry) const {
  v1::TensorInfo info = entry.info;
  if (entry.versions != nullptr) entry.versions->Describe(&info);
  if (entry.refill == nullptr || entry.refill->complete()) return info;
  for (const LocalShard& local : entry.refill->own()) {
    if (local.index < info.replicas_size()) {
      info.mutable_replicas(static_cast<int>(local.index))
          ->add_refilling(rank_);
    }
  }
  if (entry.refill->copies() != nullptr) {
    for (const LocalShard& local : entry.refill->copies()->local_shards) {
      info.mutable_replicas(static_cast<int>(local.index))
          ->add_refilling(rank_);
    }
  }
  return info;
}

}  // namespace tessera::control_internal
