// Regions: boxes [offsets, offsets + sizes) of N-d tensors. A region read or
// write names one in global coordinates; a shard (ShardMetadata) is one; a
// region fetch names one inside a shard. These are the checks and the box
// arithmetic that every region path shares (FetchShard regions, the
// daemons' ReadRegion / WriteRegion, the client library, reshard and
// checkpoint loading).
//
// Pure functions; thread-safe.
#ifndef TESSERA_COMMON_REGION_H_
#define TESSERA_COMMON_REGION_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/shard_metadata.h"
#include "common/tensor/tensor.h"

namespace tessera {

// Checks that the region lies inside an extent of `extent` (a tensor's or
// a shard's sizes). `of` names the container ("shard 2 of tensor t",
// "tensor w") and `noun` is what it is ("shard", "tensor"):
//  - INVALID_ARGUMENT "region of shard 2 of tensor t: 1 offsets and 2 sizes
//    for a shard of 2 dimensions" when the counts differ from its rank;
//  - INVALID_ARGUMENT "region of ...: negative offsets or sizes (offsets
//    [..], sizes [..])";
//  - OUT_OF_RANGE "region offsets [0, 4] sizes [2, 9] of shard 2 of tensor t
//    leaves the shard (sizes [4, 10])" (overflow-safe).
// An empty region (a size 0) must still start inside the extent, or at its
// end, like a Narrow.
absl::Status ValidateRegion(absl::Span<const int64_t> offsets,
                            absl::Span<const int64_t> sizes,
                            absl::Span<const int64_t> extent,
                            absl::string_view of, absl::string_view noun);

// The box that `a` and `b` share, without placement; nullopt when it holds
// no element (they are disjoint or one is empty) or their ranks differ.
std::optional<ShardMetadata> Intersect(const ShardMetadata& a,
                                       const ShardMetadata& b);

// One shard's part of a region.
struct RegionOverlap {
  // Index of the shard in the list given to Overlaps.
  size_t shard = 0;
  // The common box, in global coordinates.
  ShardMetadata box;
};

// The non-empty intersections of `region` with each of `shards` (all of
// its rank), in shard order. O(number of shards).
std::vector<RegionOverlap> Overlaps(absl::Span<const ShardMetadata> shards,
                                    const ShardMetadata& region);

// `offsets` relative to `origin` (element-wise difference): where a box of
// global coordinates starts inside a shard or another box.
std::vector<int64_t> OffsetsWithin(absl::Span<const int64_t> offsets,
                                   absl::Span<const int64_t> origin);

// The view of `tensor` covering the region (a Narrow along every
// dimension; shares storage). Errors as Tensor::Narrow, plus
// INVALID_ARGUMENT when the counts differ from the tensor's rank.
absl::StatusOr<Tensor> RegionView(const Tensor& tensor,
                                  absl::Span<const int64_t> offsets,
                                  absl::Span<const int64_t> sizes);

}  // namespace tessera

#endif  // TESSERA_COMMON_REGION_H_
