// Validation of shard layouts, in O(n log n) for n shards (sort and sweep,
// never pairwise), so layouts of millions of shards check in well under a
// second.
//
// Exactness: shards that differ along at most two dimensions (every chunk
// spec, every 2-d grid, any N-d tensor cut along <= 2 dims) are checked by
// an exact sweep in O(n log n). Layouts cut along three or more dimensions
// are swept along the two most varied dimensions and the remaining ones are
// compared among the boxes active in the sweep: still exact, and O(n log n)
// unless many boxes share the same extent in those two dimensions.
//
// Empty shards (any size 0) hold no elements: they never overlap anything
// and may sit anywhere, even past the end of the tensor (torch.chunk puts
// trailing empty chunks there).
//
// Pure functions; thread-safe.
#ifndef TESSERA_COMMON_SHARD_LAYOUT_H_
#define TESSERA_COMMON_SHARD_LAYOUT_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/shard_metadata.h"

namespace tessera {

// OK when no two non-empty shards share an element. INVALID_ARGUMENT
// "Shards ShardMetadata(...) and ShardMetadata(...) overlap" naming one
// overlapping pair otherwise. Shards must all have the same rank.
absl::Status ValidateNonOverlappingShards(
    absl::Span<const ShardMetadata> shards);

// The same sweep, answering with the positions in `shards` (first <
// second) of one pair of non-empty shards that share an element, or
// nullopt when none do; for a caller that names the pair its own way
// (WriteMany names the boxes of its list). INVALID_ARGUMENT when the
// shards' ranks differ.
absl::StatusOr<std::optional<std::pair<size_t, size_t>>> FindOverlappingShards(
    absl::Span<const ShardMetadata> shards);

// PyTorch's check_tensor: every non-empty shard lies inside a tensor of
// `tensor_sizes`, and the shards' total volume equals the tensor's.
// INVALID_ARGUMENT with PyTorch's wording:
//  - "Rank of tensor is 2, but shards rank is 3";
//  - "Shard offset 8 and length 4 exceeds tensor dim: 10 for shard
//    ShardMetadata(...)";
//  - "Total volume of shards: 90 does not match tensor volume: 100, in
//    other words all the individual shards do not cover the entire tensor",
//    followed, when the shards do not overlap, by one box no shard covers:
//    "; not covered: offsets [9, 0] sizes [1, 10]".
// Does not check for overlaps; call ValidateNonOverlappingShards first.
absl::Status CheckTensor(absl::Span<const ShardMetadata> shards,
                         absl::Span<const int64_t> tensor_sizes);

// Both checks: the shards tile the tensor exactly.
absl::Status ValidateShardLayout(absl::Span<const ShardMetadata> shards,
                                 absl::Span<const int64_t> tensor_sizes);

}  // namespace tessera

#endif  // TESSERA_COMMON_SHARD_LAYOUT_H_
