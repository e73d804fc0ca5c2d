// Lanes: how a large data-plane transfer is striped across several TCP
// connections to one peer (docs/data_plane.md, "Lanes"). One stream between
// two hosts is limited by what one connection's sender and receiver threads
// (and one flow's congestion window) manage; several connections run on
// several cores and flows. ShardClient (client/shard_client.h) cuts the box
// of a fetch or a write into parts with SplitIntoLanes, moves each part
// over a connection of its own at the same time, and the parts land in
// place in the destination (or the shard), so nothing is reassembled by a
// copy.
//
// The parts are slabs of the box's outermost dimension longer than 1: as
// every dimension before it is 1, each part of a dense run of a shard is a
// dense run too (the server sends it, or receives it, without a copy).
//
// Thread-safety: pure functions.
#ifndef TESSERA_CLIENT_LANES_H_
#define TESSERA_CLIENT_LANES_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace tessera {

// A lane of a striped transfer carries at least this many bytes: below it,
// one more connection's set-up and thread cost more than the overlap gains
// (tests/bench/wire_bench.py measures lane counts against size).
inline constexpr int64_t kMinLaneBytes = int64_t{8} << 20;
// Lanes a transfer takes at most when no count is asked for.
inline constexpr int kDefaultDataLanes = 4;
// The most lanes any setting may ask for.
inline constexpr int kMaxDataLanes = 16;

// The lanes a transfer of `bytes` takes: `requested` (0: kDefaultDataLanes;
// clamped to [1, kMaxDataLanes]), fewer when there are not kMinLaneBytes for
// each, and at least 1.
int LaneCount(int64_t bytes, int requested);

// One part of a box cut into lanes: the slab [start, start + length) of
// dimension `dim` of the box, whose offsets (in the box's frame, the shard's
// for a shard box) are `offsets`.
struct LanePart {
  int dim = 0;
  int64_t start = 0;
  int64_t length = 0;
  std::vector<int64_t> offsets;
};

// The box at `offsets` with `sizes` cut into at most `lanes` parts of
// near-equal length along its outermost dimension longer than 1 (the first
// parts one longer when it does not divide). One part, the whole box, when
// lanes <= 1, the box is empty, or no dimension is longer than 1.
std::vector<LanePart> SplitIntoLanes(absl::Span<const int64_t> offsets,
                                     absl::Span<const int64_t> sizes,
                                     int lanes);

}  // namespace tessera

#endif  // TESSERA_CLIENT_LANES_H_
