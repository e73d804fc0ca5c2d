#include "common/shard_metadata.h"

#include <algorithm>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace tessera {

absl::StatusOr<ShardMetadata> ShardMetadata::Create(
    absl::Span<const int64_t> offsets, absl::Span<const int64_t> sizes,
    std::optional<RemoteDevice> placement) {
  if (offsets.size() != sizes.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard_offsets and shard_sizes should have the same number of "
        "elements, found ",
        offsets.size(), " and ", sizes.size(), " respectively"));
  }
  for (size_t i = 0; i < offsets.size(); ++i) {
    if (offsets[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("shard_offsets should be >=0, got [",
                       absl::StrJoin(offsets, ", "), "]"));
    }
    if (sizes[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("shard_sizes should be >= 0, got [",
                       absl::StrJoin(sizes, ", "), "]"));
    }
  }
  return ShardMetadata(offsets, sizes, std::move(placement));
}

absl::StatusOr<ShardMetadata> ShardMetadata::Create(
    absl::Span<const int64_t> offsets, absl::Span<const int64_t> sizes,
    absl::string_view placement) {
  ASSIGN_OR_RETURN(RemoteDevice device, RemoteDevice::Parse(placement));
  return Create(offsets, sizes, std::move(device));
}

int64_t ShardMetadata::numel() const {
  return CheckedProduct(sizes_).value_or(std::numeric_limits<int64_t>::max());
}

std::string ShardMetadata::ToString() const {
  return absl::StrCat(
      "ShardMetadata(shard_offsets=[", absl::StrJoin(offsets_, ", "),
      "], shard_sizes=[", absl::StrJoin(sizes_, ", "),
      "], placement=", placement_.has_value() ? placement_->ToString() : "None",
      ")");
}

std::ostream& operator<<(std::ostream& os, const ShardMetadata& metadata) {
  return os << metadata.ToString();
}

absl::StatusOr<std::pair<int, Device>> ParseAndValidateRemoteDevice(
    absl::Span<const int> group_ranks,
    const std::optional<RemoteDevice>& placement,
    const WorkerResolver* resolver, bool rank_in_group) {
  if (!placement.has_value()) {
    return absl::InvalidArgumentError("remote device is None");
  }
  if (placement->rank().has_value() && rank_in_group) {
    const int rank = *placement->rank();
    if (std::find(group_ranks.begin(), group_ranks.end(), rank) ==
        group_ranks.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Global rank ", rank, " does not exist in input process group: [",
          absl::StrJoin(group_ranks, ", "), "]"));
    }
  }
  if (placement->worker_name().has_value()) {
    const std::string& name = *placement->worker_name();
    if (resolver == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "RPC framework needs to be initialized for using worker names: ",
          name));
    }
    std::optional<int> rank = resolver->RankOf(name);
    if (!rank.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("Invalid worker name: ", name));
    }
    return std::make_pair(*rank, placement->device());
  }
  // A bare local device has no owner; PyTorch returns rank None. Callers
  // that need an owner treat -1 as "not placed on a rank".
  return std::make_pair(placement->rank().value_or(-1), placement->device());
}

absl::Status Shard::Validate() const {
  if (tensor.sizes() != metadata.shard_sizes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Shard tensor size does not match with metadata.shard_lengths! Found "
        "shard tensor size: [",
        absl::StrJoin(tensor.sizes(), ", "), "], metadata.shard_lengths: [",
        absl::StrJoin(metadata.shard_sizes(), ", "), "]"));
  }
  if (metadata.placement().has_value() &&
      metadata.placement()->device() != tensor.device()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Local shard tensor device does not match with local Shard's "
        "placement! Found local shard tensor device: ",
        tensor.device().ToString(), ", local shard metadata placement device: ",
        metadata.placement()->device().ToString()));
  }
  return absl::OkStatus();
}

absl::StatusOr<Shard> Shard::Create(Tensor tensor, ShardMetadata metadata) {
  Shard shard{std::move(tensor), std::move(metadata)};
  RETURN_IF_ERROR(shard.Validate());
  return shard;
}

absl::StatusOr<Shard> Shard::FromTensorAndOffsets(Tensor tensor,
                                                  std::vector<int64_t> offsets,
                                                  int rank) {
  ASSIGN_OR_RETURN(
      ShardMetadata metadata,
      ShardMetadata::Create(std::move(offsets), tensor.sizes(),
                            RemoteDevice::ForRank(rank, tensor.device())));
  return Create(std::move(tensor), std::move(metadata));
}

}  // namespace tessera
