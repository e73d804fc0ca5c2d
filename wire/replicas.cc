#include "wire/replicas.h"

#include <algorithm>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "wire/version_id.h"

namespace tessera {

std::string ReplicaTensorId(absl::string_view tensor_id) {
  if (const int64_t number = VersionNumber(tensor_id); number >= 1) {
    return VersionId(absl::StrCat(VersionBase(tensor_id), "/replicas"), number);
  }
  if (const std::optional<AtLeast> at_least = ParseAtLeast(tensor_id)) {
    return AtLeastId(absl::StrCat(at_least->latest_id, "/replicas"),
                     at_least->number);
  }
  return absl::StrCat(tensor_id, "/replicas");
}

absl::StatusOr<std::vector<std::vector<int>>> PlaceReplicas(
    absl::Span<const int> owners, int replicas,
    absl::Span<const std::string> hosts) {
  const int world = static_cast<int>(hosts.size());
  if (replicas < 1 || replicas > world) {
    return absl::InvalidArgumentError(
        absl::StrCat("replicas must be between 1 and the ", world,
                     " daemons of the cluster, not ", replicas));
  }
  std::vector<std::vector<int>> placed;
  placed.reserve(owners.size());
  for (const int owner : owners) {
    if (owner < 0 || owner >= world) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shard owner ", owner, " is not a rank of the ", world, " daemons"));
    }
    std::vector<int> others;
    std::vector<int> same_host;
    for (int step = 1; step < world; ++step) {
      const int r = (owner + step) % world;
      (hosts[r] == hosts[owner] ? same_host : others).push_back(r);
    }
    others.insert(others.end(), same_host.begin(), same_host.end());
    others.resize(static_cast<size_t>(replicas - 1));
    placed.push_back(std::move(others));
  }
  return placed;
}

std::vector<int> HoldersOf(const v1::TensorInfo& info, int shard) {
  std::vector<int> holders;
  if (shard < 0 || shard >= info.shard_ranks_size()) return holders;
  holders.push_back(info.shard_ranks(shard));
  if (shard < info.replicas_size()) {
    const auto& ranks = info.replicas(shard).ranks();
    holders.insert(holders.end(), ranks.begin(), ranks.end());
  }
  return holders;
}

int CopiesOf(const v1::TensorInfo& info) {
  return info.replicas_size() == 0 ? 1 : 1 + info.replicas(0).ranks_size();
}

}  // namespace tessera
