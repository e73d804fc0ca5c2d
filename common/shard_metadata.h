// ShardMetadata: one shard's box in the global tensor and its placement;
// Shard: a local tensor together with its metadata.
//
// Value types; thread-compatible (const methods may run concurrently).
#ifndef TESSERA_COMMON_SHARD_METADATA_H_
#define TESSERA_COMMON_SHARD_METADATA_H_

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/device.h"
#include "common/tensor/tensor.h"

namespace tessera {

class ShardMetadata {
 public:
  // Validates PyTorch's invariants: as many offsets as sizes, all >= 0.
  // INVALID_ARGUMENT ("shard_offsets should be >=0", ...) otherwise.
  static absl::StatusOr<ShardMetadata> Create(
      absl::Span<const int64_t> offsets, absl::Span<const int64_t> sizes,
      std::optional<RemoteDevice> placement = std::nullopt);
  // Same, parsing the placement text ("rank:0/cuda:0").
  static absl::StatusOr<ShardMetadata> Create(absl::Span<const int64_t> offsets,
                                              absl::Span<const int64_t> sizes,
                                              absl::string_view placement);

  // Views of the metadata's own storage: valid while it lives, unchanged.
  absl::Span<const int64_t> shard_offsets() const { return offsets_; }
  absl::Span<const int64_t> shard_sizes() const { return sizes_; }
  // Absent until the shard is placed; see ParseAndValidateRemoteDevice.
  const std::optional<RemoteDevice>& placement() const { return placement_; }
  void set_placement(std::optional<RemoteDevice> placement) {
    placement_ = std::move(placement);
  }
  int64_t dim() const { return static_cast<int64_t>(sizes_.size()); }
  // Number of elements; 0 for an empty shard. Saturates at INT64_MAX.
  int64_t numel() const;

  // "ShardMetadata(shard_offsets=[0, 5], shard_sizes=[5, 5],
  // placement=rank:1/cuda:1)", as PyTorch prints it.
  std::string ToString() const;

  friend bool operator==(const ShardMetadata& a, const ShardMetadata& b) {
    return a.offsets_ == b.offsets_ && a.sizes_ == b.sizes_ &&
           a.placement_ == b.placement_;
  }
  friend bool operator!=(const ShardMetadata& a, const ShardMetadata& b) {
    return !(a == b);
  }

 private:
  // Up to two dimensions (matrices, the usual case at a million shards)
  // are held inline: no allocation per shard, 64 bytes less than vectors.
  using Dims = absl::InlinedVector<int64_t, 2>;

  ShardMetadata(absl::Span<const int64_t> offsets,
                absl::Span<const int64_t> sizes,
                std::optional<RemoteDevice> placement)
      : offsets_(offsets.begin(), offsets.end()),
        sizes_(sizes.begin(), sizes.end()),
        placement_(std::move(placement)) {}

  Dims offsets_;
  Dims sizes_;
  std::optional<RemoteDevice> placement_;
};

std::ostream& operator<<(std::ostream& os, const ShardMetadata& metadata);

// A shard held locally: its tensor and where it sits in the global tensor.
struct Shard {
  Tensor tensor;
  ShardMetadata metadata;

  // PyTorch's Shard(tensor, metadata) checks: INVALID_ARGUMENT "Shard tensor
  // size does not match with metadata.shard_lengths!..." and "Local shard
  // tensor device does not match with local Shard's placement!...".
  static absl::StatusOr<Shard> Create(Tensor tensor, ShardMetadata metadata);
  // Shard.from_tensor_and_offsets: metadata from the tensor's sizes, the
  // given offsets, and placement "rank:<rank>/<tensor's device>".
  static absl::StatusOr<Shard> FromTensorAndOffsets(
      Tensor tensor, std::vector<int64_t> offsets, int rank);
  // The checks of Create, for a Shard built field by field.
  absl::Status Validate() const;
};

// Resolves worker names ("worker2") to global ranks; provided by the RPC
// layer once it is initialised.
class WorkerResolver {
 public:
  virtual ~WorkerResolver() = default;
  // The rank of `worker_name`, or nullopt when no such worker exists.
  virtual std::optional<int> RankOf(absl::string_view worker_name) const = 0;
};

// PyTorch's _parse_and_validate_remote_device: the (global rank, device) a
// placement refers to, checked against the global ranks of a process group.
//  - no placement: INVALID_ARGUMENT "remote device is None";
//  - a rank outside `group_ranks` (unless `rank_in_group` is false, i.e.
//    the caller is not a member and cannot judge): INVALID_ARGUMENT "Global
//    rank 5 does not exist in input process group: [0, 1, 2, 3]";
//  - a worker name without a resolver: FAILED_PRECONDITION "RPC framework
//    needs to be initialized for using worker names: <name>";
//  - an unknown worker: INVALID_ARGUMENT "Invalid worker name: <name>".
absl::StatusOr<std::pair<int, Device>> ParseAndValidateRemoteDevice(
    absl::Span<const int> group_ranks,
    const std::optional<RemoteDevice>& placement,
    const WorkerResolver* resolver = nullptr, bool rank_in_group = true);

}  // namespace tessera

#endif  // TESSERA_COMMON_SHARD_METADATA_H_
