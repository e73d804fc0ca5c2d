// Sharding specs: how a global tensor is cut into shards.
//  - ChunkShardingSpec(dim, placements): torch.chunk along one dimension,
//    chunk i to placements[i].
//  - EnumerableShardingSpec(shards): an explicit list of boxes.
// ShardingSpec holds either. BuildMetadata turns a spec and a tensor size
// into ShardedTensorMetadata, with PyTorch's results and error messages.
//
// Value types; thread-compatible.
#ifndef TESSERA_COMMON_SHARDING_SPEC_H_
#define TESSERA_COMMON_SHARDING_SPEC_H_

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/device.h"
#include "common/shard_metadata.h"
#include "common/sharded_tensor_metadata.h"
#include "common/tensor_properties.h"

namespace tessera {

class ChunkShardingSpec {
 public:
  // `dim` may be negative (counts from the end); it is checked against the
  // tensor in BuildMetadata. At least one placement is required.
  static absl::StatusOr<ChunkShardingSpec> Create(
      int64_t dim, std::vector<RemoteDevice> placements);
  // Same, parsing each placement ("rank:0/cuda:0").
  static absl::StatusOr<ChunkShardingSpec> Create(
      int64_t dim, const std::vector<std::string>& placements);
  // A named dimension ("H"): always UNIMPLEMENTED, "ChunkShardingSpec does
  // not support named dimension yet!" (as PyTorch).
  static absl::StatusOr<ChunkShardingSpec> CreateNamed(
      absl::string_view dim_name, const std::vector<std::string>& placements);

  int64_t dim() const { return dim_; }
  const std::vector<RemoteDevice>& placements() const { return placements_; }

  // Shards of a tensor of `tensor_sizes`: chunk i is placements[i], with
  // ceil(n / k) entries of dimension dim (fewer or none at the end), at
  // offset i * ceil(n / k). INVALID_ARGUMENT "Invalid sharding dim: 2" when
  // dim is outside [-rank, rank).
  absl::StatusOr<ShardedTensorMetadata> BuildMetadata(
      absl::Span<const int64_t> tensor_sizes,
      const TensorProperties& properties = {}) const;

  friend bool operator==(const ChunkShardingSpec& a,
                         const ChunkShardingSpec& b) {
    return a.dim_ == b.dim_ && a.placements_ == b.placements_;
  }

 private:
  ChunkShardingSpec(int64_t dim, std::vector<RemoteDevice> placements)
      : dim_(dim), placements_(std::move(placements)) {}

  int64_t dim_;
  std::vector<RemoteDevice> placements_;
};

class EnumerableShardingSpec {
 public:
  // Checks the shards as PyTorch does on construction: at least one
  // ("Empty shard list provided"), all of one rank ("Found inconsistent
  // ranks for shards: 2 and 3"), none overlapping ("Shards
  // ShardMetadata(...) and ShardMetadata(...) overlap"). O(n log n).
  static absl::StatusOr<EnumerableShardingSpec> Create(
      std::vector<ShardMetadata> shards);
  // Create for shards that must tile a tensor of `tensor_sizes` exactly:
  // one sweep checks overlaps and coverage (ValidateShardLayout), so a
  // layout of a million shards is validated once rather than twice.
  static absl::StatusOr<EnumerableShardingSpec> CreateTiling(
      std::vector<ShardMetadata> shards,
      absl::Span<const int64_t> tensor_sizes);

  const std::vector<ShardMetadata>& shards() const { return shards_; }

  // The shards, after checking that they lie inside the tensor and cover
  // it exactly (see CheckTensor in shard_layout.h).
  absl::StatusOr<ShardedTensorMetadata> BuildMetadata(
      absl::Span<const int64_t> tensor_sizes,
      const TensorProperties& properties = {}) const;

  friend bool operator==(const EnumerableShardingSpec& a,
                         const EnumerableShardingSpec& b) {
    return a.shards_ == b.shards_;
  }

 private:
  explicit EnumerableShardingSpec(std::vector<ShardMetadata> shards)
      : shards_(std::move(shards)) {}

  std::vector<ShardMetadata> shards_;
};

using ShardingSpec = std::variant<ChunkShardingSpec, EnumerableShardingSpec>;

// "chunk" or "enumerable": the key custom ops register under.
absl::string_view ShardingSpecKind(const ShardingSpec& spec);

absl::StatusOr<ShardedTensorMetadata> BuildMetadata(
    const ShardingSpec& spec, absl::Span<const int64_t> tensor_sizes,
    const TensorProperties& properties = {});

// torch.chunk arithmetic: entries per chunk, and the size of chunk `index`.
int64_t ChunkSplitSize(int64_t dim_size, int64_t chunks);
int64_t ChunkedDimSize(int64_t dim_size, int64_t split_size, int64_t index);

}  // namespace tessera

#endif  // TESSERA_COMMON_SHARDING_SPEC_H_
