#include "common/sharding_spec.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/int_math.h"
#include "common/shard_layout.h"
#include "common/status_macros.h"

namespace tessera {

// Both are written so that no intermediate value overflows, whatever the
// sizes a client sends (ceil(d / c) without d + c - 1; offsets compared by
// division rather than multiplied past d).
int64_t ChunkSplitSize(int64_t dim_size, int64_t chunks) {
  return CeilDiv(dim_size, chunks);
}

int64_t ChunkedDimSize(int64_t dim_size, int64_t split_size, int64_t index) {
  if (split_size <= 0 || index >= dim_size / split_size + 1) return 0;
  const int64_t offset = split_size * index;  // <= dim_size: cannot overflow
  return std::max<int64_t>(std::min(split_size, dim_size - offset), 0);
}

absl::StatusOr<ChunkShardingSpec> ChunkShardingSpec::Create(
    int64_t dim, std::vector<RemoteDevice> placements) {
  if (placements.empty()) {
    return absl::InvalidArgumentError(
        "ChunkShardingSpec needs at least one placement");
  }
  return ChunkShardingSpec(dim, std::move(placements));
}

absl::StatusOr<ChunkShardingSpec> ChunkShardingSpec::Create(
    int64_t dim, const std::vector<std::string>& placements) {
  std::vector<RemoteDevice> devices;
  devices.reserve(placements.size());
  for (const std::string& text : placements) {
    ASSIGN_OR_RETURN(RemoteDevice device, RemoteDevice::Parse(text));
    devices.push_back(std::move(device));
  }
  return Create(dim, std::move(devices));
}

absl::StatusOr<ChunkShardingSpec> ChunkShardingSpec::CreateNamed(
    absl::string_view dim_name, const std::vector<std::string>& placements) {
  return absl::UnimplementedError(absl::StrCat(
      "ChunkShardingSpec does not support named dimension yet! (dim='",
      dim_name, "')"));
}

absl::StatusOr<ShardedTensorMetadata> ChunkShardingSpec::BuildMetadata(
    absl::Span<const int64_t> tensor_sizes,
    const TensorProperties& properties) const {
  const int64_t rank = static_cast<int64_t>(tensor_sizes.size());
  if (dim_ >= rank || dim_ < -rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("Invalid sharding dim: ", dim_));
  }
  for (int64_t size : tensor_sizes) {
    if (size < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("Tensor sizes must be non-negative, got ", size));
    }
  }
  const size_t dim = static_cast<size_t>(dim_ < 0 ? dim_ + rank : dim_);
  const int64_t dim_size = tensor_sizes[dim];
  const int64_t chunks = static_cast<int64_t>(placements_.size());
  const int64_t split_size = ChunkSplitSize(dim_size, chunks);

  ShardedTensorMetadata metadata;
  metadata.size.assign(tensor_sizes.begin(), tensor_sizes.end());
  metadata.tensor_properties = properties;
  metadata.shards_metadata.reserve(placements_.size());
  for (int64_t i = 0; i < chunks; ++i) {
    std::vector<int64_t> offsets(tensor_sizes.size(), 0);
    std::vector<int64_t> sizes(tensor_sizes.begin(), tensor_sizes.end());
    if (__builtin_mul_overflow(split_size, i, &offsets[dim])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Cannot chunk a dimension of size ", dim_size, " into ", chunks,
          " pieces: chunk ", i, "'s offset overflows int64"));
    }
    sizes[dim] = ChunkedDimSize(dim_size, split_size, i);
    ASSIGN_OR_RETURN(ShardMetadata shard,
                     ShardMetadata::Create(std::move(offsets), std::move(sizes),
                                           placements_[i]));
    metadata.shards_metadata.push_back(std::move(shard));
  }
  return metadata;
}

absl::StatusOr<EnumerableShardingSpec> EnumerableShardingSpec::Create(
    std::vector<ShardMetadata> shards) {
  if (shards.empty()) {
    return absl::InvalidArgumentError("Empty shard list provided: []");
  }
  const int64_t rank = shards.front().dim();
  for (const ShardMetadata& shard : shards) {
    if (shard.dim() != rank) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Found inconsistent ranks for shards: ", rank, " and ", shard.dim()));
    }
  }
  RETURN_IF_ERROR(ValidateNonOverlappingShards(shards));
  return EnumerableShardingSpec(std::move(shards));
}

absl::StatusOr<EnumerableShardingSpec> EnumerableShardingSpec::CreateTiling(
    std::vector<ShardMetadata> shards, absl::Span<const int64_t> tensor_sizes) {
  if (shards.empty()) {
    return absl::InvalidArgumentError("Empty shard list provided: []");
  }
  RETURN_IF_ERROR(ValidateShardLayout(shards, tensor_sizes));
  return EnumerableShardingSpec(std::move(shards));
}

absl::StatusOr<ShardedTensorMetadata> EnumerableShardingSpec::BuildMetadata(
    absl::Span<const int64_t> tensor_sizes,
    const TensorProperties& properties) const {
  RETURN_IF_ERROR(CheckTensor(shards_, tensor_sizes));
  ShardedTensorMetadata metadata;
  metadata.shards_metadata = shards_;
  metadata.size.assign(tensor_sizes.begin(), tensor_sizes.end());
  metadata.tensor_properties = properties;
  return metadata;
}

absl::string_view ShardingSpecKind(const ShardingSpec& spec) {
  return std::holds_alternative<ChunkShardingSpec>(spec) ? "chunk"
                                                         : "enumerable";
}

absl::StatusOr<ShardedTensorMetadata> BuildMetadata(
    const ShardingSpec& spec, absl::Span<const int64_t> tensor_sizes,
    const TensorProperties& properties) {
  return std::visit(
      [&](const auto& s) { return s.BuildMetadata(tensor_sizes, properties); },
      spec);
}

}  // namespace tessera
