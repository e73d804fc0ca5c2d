#include "common/shard_layout.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tessera {
namespace {

// A non-empty shard seen as a box: [lo[d], hi[d]) in every dimension.
struct Box {
  size_t index;  // Position in the caller's span, for messages.
  const ShardMetadata* shard;
  int64_t lo(size_t d) const { return shard->shard_offsets()[d]; }
  int64_t hi(size_t d) const {
    return shard->shard_offsets()[d] + shard->shard_sizes()[d];
  }
};

std::vector<Box> NonEmptyBoxes(absl::Span<const ShardMetadata> shards) {
  std::vector<Box> boxes;
  boxes.reserve(shards.size());
  for (size_t i = 0; i < shards.size(); ++i) {
    if (shards[i].numel() > 0) boxes.push_back(Box{i, &shards[i]});
  }
  return boxes;
}

bool IntervalsOverlap(int64_t lo0, int64_t hi0, int64_t lo1, int64_t hi1) {
  return lo0 < hi1 && lo1 < hi0;
}

bool BoxesOverlap(const Box& a, const Box& b, size_t rank) {
  for (size_t d = 0; d < rank; ++d) {
    if (!IntervalsOverlap(a.lo(d), a.hi(d), b.lo(d), b.hi(d))) return false;
  }
  return true;
}

// Two overlapping boxes as the positions of their shards, in order.
using ShardPair = std::pair<size_t, size_t>;

std::optional<ShardPair> Overlapping(const Box& a, const Box& b) {
  return a.index < b.index ? ShardPair{a.index, b.index}
                           : ShardPair{b.index, a.index};
}

// The dimensions along which the boxes do not all share one interval, most
// varied first. Variety is estimated from the distinct start offsets of an
// evenly spread sample, which is all the ordering needs (it only decides
// which dimension the sweep runs along).
std::vector<size_t> VaryingDims(const std::vector<Box>& boxes, size_t rank) {
  constexpr size_t kSample = 1 << 14;
  const size_t step = std::max<size_t>(1, boxes.size() / kSample);
  std::vector<std::pair<size_t, size_t>> distinct;  // (count, dim)
  std::vector<int64_t> starts;
  for (size_t d = 0; d < rank; ++d) {
    bool varies = false;
    for (const Box& box : boxes) {
      if (box.lo(d) != boxes[0].lo(d) || box.hi(d) != boxes[0].hi(d)) {
        varies = true;
        break;
      }
    }
    if (!varies) continue;
    starts.clear();
    for (size_t i = 0; i < boxes.size(); i += step) {
      starts.push_back(boxes[i].lo(d));
    }
    std::sort(starts.begin(), starts.end());
    const size_t count =
        std::unique(starts.begin(), starts.end()) - starts.begin();
    distinct.emplace_back(count, d);
  }
  std::stable_sort(
      distinct.begin(), distinct.end(),
      [](const auto& x, const auto& y) { return x.first > y.first; });
  std::vector<size_t> dims;
  for (const auto& [count, d] : distinct) dims.push_back(d);
  return dims;
}

// The boxes' extents along the sweep dimension `a` (and, where used, `b`),
// copied into one flat array sorted by start along `a`, so the sweep reads
// memory in order instead of chasing each shard's vectors.
struct Slab {
  int64_t a_lo, a_hi, b_lo, b_hi;
  uint32_t box;  // Position in the boxes vector.
};

std::vector<Slab> SortedSlabs(const std::vector<Box>& boxes, size_t a,
                              size_t b) {
  std::vector<Slab> slabs(boxes.size());
  for (size_t i = 0; i < boxes.size(); ++i) {
    slabs[i] = Slab{boxes[i].lo(a), boxes[i].hi(a), boxes[i].lo(b),
                    boxes[i].hi(b), static_cast<uint32_t>(i)};
  }
  std::sort(slabs.begin(), slabs.end(), [](const Slab& x, const Slab& y) {
    return x.a_lo < y.a_lo || (x.a_lo == y.a_lo && x.b_lo < y.b_lo);
  });
  return slabs;
}

// Active slabs of a sweep, retired once the sweep passes their end.
class ActiveEnds {
 public:
  void Add(int64_t end, size_t slab) {
    heap_.emplace_back(end, slab);
    std::push_heap(heap_.begin(), heap_.end(), std::greater<>());
  }
  // Calls retire(slab) for every slab ending at or before `position`.
  template <typename Retire>
  void RetireUntil(int64_t position, Retire&& retire) {
    while (!heap_.empty() && heap_.front().first <= position) {
      retire(heap_.front().second);
      std::pop_heap(heap_.begin(), heap_.end(), std::greater<>());
      heap_.pop_back();
    }
  }

 private:
  std::vector<std::pair<int64_t, size_t>> heap_;
};

// Exact overlap check for boxes varying along one dimension `a`.
std::optional<ShardPair> FindOverlap1D(const std::vector<Box>& boxes,
                                       size_t a) {
  const std::vector<Slab> slabs = SortedSlabs(boxes, a, a);
  size_t reach = 0;  // Slab reaching furthest along a so far.
  for (size_t i = 1; i < slabs.size(); ++i) {
    if (slabs[reach].a_hi > slabs[i].a_lo) {
      return Overlapping(boxes[slabs[reach].box], boxes[slabs[i].box]);
    }
    if (slabs[i].a_hi > slabs[reach].a_hi) reach = i;
  }
  return std::nullopt;
}

// Exact overlap check for boxes varying along two dimensions: boxes active
// at a sweep position along `a` must have disjoint extents along `b`, so
// they are kept ordered by start along b and only the neighbours of a new
// box are compared with it.
std::optional<ShardPair> FindOverlap2D(const std::vector<Box>& boxes, size_t a,
                                       size_t b) {
  const std::vector<Slab> slabs = SortedSlabs(boxes, a, b);
  absl::btree_map<int64_t, uint32_t> active;  // Start along b -> slab.
  ActiveEnds ends;
  for (size_t i = 0; i < slabs.size(); ++i) {
    const Slab& slab = slabs[i];
    ends.RetireUntil(slab.a_lo, [&](size_t j) { active.erase(slabs[j].b_lo); });
    auto next = active.lower_bound(slab.b_lo);
    if (next != active.end() && next->first < slab.b_hi) {
      return Overlapping(boxes[slabs[next->second].box], boxes[slab.box]);
    }
    if (next != active.begin()) {
      auto prev = std::prev(next);
      if (slabs[prev->second].b_hi > slab.b_lo) {
        return Overlapping(boxes[slabs[prev->second].box], boxes[slab.box]);
      }
    }
    active.emplace_hint(next, slab.b_lo, static_cast<uint32_t>(i));
    ends.Add(slab.a_hi, i);
  }
  return std::nullopt;
}

// Boxes varying along three or more dimensions: sweep along `a`; active
// boxes are grouped by their exact extent along `b`, and each group keeps
// its boxes ordered by start along `c`. A new box is compared only with
// groups and entries whose start lies within the longest active extent of
// its own, which for grid-like layouts is a constant number.
std::optional<ShardPair> FindOverlapND(const std::vector<Box>& boxes,
                                       const std::vector<size_t>& dims,
                                       size_t rank) {
  const size_t a = dims[0], b = dims[1], c = dims[2];
  struct Group {
    absl::btree_multimap<int64_t, uint32_t> by_c;  // Start along c -> slab.
    int64_t longest_c = 0;
  };
  using Extent = std::pair<int64_t, int64_t>;  // [lo, hi) along b.
  absl::btree_map<Extent, Group> groups;
  int64_t longest_b = 0;
  const std::vector<Slab> slabs = SortedSlabs(boxes, a, b);
  ActiveEnds ends;
  for (size_t i = 0; i < slabs.size(); ++i) {
    const Slab& slab = slabs[i];
    const Box& box = boxes[slab.box];
    ends.RetireUntil(slab.a_lo, [&](size_t j) {
      auto group = groups.find({slabs[j].b_lo, slabs[j].b_hi});
      auto range = group->second.by_c.equal_range(boxes[slabs[j].box].lo(c));
      for (auto it = range.first; it != range.second; ++it) {
        if (it->second == j) {
          group->second.by_c.erase(it);
          break;
        }
      }
      if (group->second.by_c.empty()) groups.erase(group);
    });
    auto g = groups.lower_bound(
        {slab.b_lo - longest_b + 1, std::numeric_limits<int64_t>::min()});
    for (; g != groups.end() && g->first.first < slab.b_hi; ++g) {
      if (g->first.second <= slab.b_lo) continue;
      const Group& group = g->second;
      auto e = group.by_c.lower_bound(box.lo(c) - group.longest_c + 1);
      for (; e != group.by_c.end() && e->first < box.hi(c); ++e) {
        const Box& other = boxes[slabs[e->second].box];
        if (BoxesOverlap(other, box, rank)) return Overlapping(other, box);
      }
    }
    Group& group = groups[{slab.b_lo, slab.b_hi}];
    group.by_c.emplace(box.lo(c), static_cast<uint32_t>(i));
    group.longest_c = std::max(group.longest_c, box.hi(c) - box.lo(c));
    longest_b = std::max(longest_b, slab.b_hi - slab.b_lo);
    ends.Add(slab.a_hi, i);
  }
  return std::nullopt;
}

std::string BoxText(const std::vector<int64_t>& offsets,
                    const std::vector<int64_t>& sizes) {
  return absl::StrCat("offsets [", absl::StrJoin(offsets, ", "), "] sizes [",
                      absl::StrJoin(sizes, ", "), "]");
}

// Finds one box of the tensor no shard covers, for layouts varying along at
// most two dimensions; nullopt when there is none or the layout is too
// irregular to locate one cheaply. Boxes must lie inside the tensor.
std::optional<std::string> FindUncovered(const std::vector<Box>& boxes,
                                         absl::Span<const int64_t> dims) {
  const size_t rank = dims.size();
  std::vector<int64_t> offsets(rank, 0);
  std::vector<int64_t> sizes(dims.begin(), dims.end());
  if (boxes.empty()) return BoxText(offsets, sizes);

  const std::vector<size_t> varying = VaryingDims(boxes, rank);
  // A dimension every box spans identically but not fully leaves a slab.
  for (size_t d = 0; d < rank; ++d) {
    if (std::find(varying.begin(), varying.end(), d) != varying.end()) continue;
    if (boxes[0].lo(d) > 0) {
      sizes[d] = boxes[0].lo(d);
      return BoxText(offsets, sizes);
    }
    if (boxes[0].hi(d) < dims[d]) {
      offsets[d] = boxes[0].hi(d);
      sizes[d] = dims[d] - boxes[0].hi(d);
      return BoxText(offsets, sizes);
    }
  }
  if (varying.empty() || varying.size() > 2) return std::nullopt;

  const size_t a = varying[0];
  // Gap along b among `active` (start -> end), or nullopt when covered.
  auto gap_in = [&](const std::multimap<int64_t, int64_t>& active,
                    size_t b) -> std::optional<std::pair<int64_t, int64_t>> {
    int64_t cursor = 0;
    for (const auto& [lo, hi] : active) {
      if (lo > cursor) return std::make_pair(cursor, lo);
      cursor = std::max(cursor, hi);
    }
    if (cursor < dims[b]) return std::make_pair(cursor, dims[b]);
    return std::nullopt;
  };
  auto report = [&](int64_t a_lo, int64_t a_hi, std::optional<size_t> b,
                    std::pair<int64_t, int64_t> b_gap) {
    offsets[a] = a_lo;
    sizes[a] = a_hi - a_lo;
    if (b.has_value()) {
      offsets[*b] = b_gap.first;
      sizes[*b] = b_gap.second - b_gap.first;
    }
    return BoxText(offsets, sizes);
  };

  if (varying.size() == 1) {
    std::multimap<int64_t, int64_t> extents;
    for (const Box& box : boxes) extents.emplace(box.lo(a), box.hi(a));
    auto gap = gap_in(extents, a);
    if (!gap.has_value()) return std::nullopt;
    return report(gap->first, gap->second, std::nullopt, {});
  }

  // Two varying dimensions: in every stretch between consecutive event
  // positions along a, the active extents along b must add up to the full
  // dimension; a stretch where they do not has a gap.
  const size_t b = varying[1];
  const std::vector<Slab> slabs = SortedSlabs(boxes, a, b);
  std::multimap<int64_t, int64_t> active;  // Start along b -> end.
  ActiveEnds ends;
  int64_t covered = 0;
  int64_t position = 0;
  auto retire = [&](size_t j) {
    auto range = active.equal_range(slabs[j].b_lo);
    for (auto it = range.first; it != range.second; ++it) {
      if (it->second == slabs[j].b_hi) {
        active.erase(it);
        break;
      }
    }
    covered -= slabs[j].b_hi - slabs[j].b_lo;
  };
  std::vector<int64_t> stops;
  for (const Slab& slab : slabs) {
    stops.push_back(slab.a_lo);
    stops.push_back(slab.a_hi);
  }
  stops.push_back(dims[a]);
  std::sort(stops.begin(), stops.end());
  stops.erase(std::unique(stops.begin(), stops.end()), stops.end());
  size_t next = 0;
  for (int64_t stop : stops) {
    if (stop > position && covered < dims[b]) {
      if (auto gap = gap_in(active, b)) {
        return report(position, stop, b, *gap);
      }
    }
    ends.RetireUntil(stop, retire);
    for (; next < slabs.size() && slabs[next].a_lo == stop; ++next) {
      active.emplace(slabs[next].b_lo, slabs[next].b_hi);
      covered += slabs[next].b_hi - slabs[next].b_lo;
      ends.Add(slabs[next].a_hi, next);
    }
    position = stop;
  }
  return std::nullopt;
}

// FindOverlappingShards on the non-empty `boxes` of `shards`.
absl::StatusOr<std::optional<ShardPair>> FindOverlap(
    absl::Span<const ShardMetadata> shards, const std::vector<Box>& boxes) {
  if (shards.empty()) return std::nullopt;
  const int64_t rank = shards[0].dim();
  for (const ShardMetadata& shard : shards) {
    if (shard.dim() != rank) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Found inconsistent ranks for shards: ", rank, " and ", shard.dim()));
    }
  }
  if (boxes.size() < 2) return std::nullopt;
  const std::vector<size_t> dims = VaryingDims(boxes, rank);
  switch (dims.size()) {
    case 0:  // Every box is the same box.
      return Overlapping(boxes[0], boxes[1]);
    case 1:
      return FindOverlap1D(boxes, dims[0]);
    case 2:
      return FindOverlap2D(boxes, dims[0], dims[1]);
    default:
      return FindOverlapND(boxes, dims, rank);
  }
}

// ValidateNonOverlappingShards on the non-empty `boxes` of `shards`.
absl::Status CheckOverlaps(absl::Span<const ShardMetadata> shards,
                           const std::vector<Box>& boxes) {
  absl::StatusOr<std::optional<ShardPair>> pair = FindOverlap(shards, boxes);
  if (!pair.ok()) return pair.status();
  if (!pair->has_value()) return absl::OkStatus();
  const auto [first, second] = **pair;
  return absl::InvalidArgumentError(
      absl::StrCat("Shards ", shards[first].ToString(), " and ",
                   shards[second].ToString(), " overlap"));
}

// CheckTensor on the non-empty `boxes` of `shards`.
absl::Status CheckBounds(absl::Span<const ShardMetadata> shards,
                         const std::vector<Box>& boxes,
                         absl::Span<const int64_t> tensor_sizes) {
  const int64_t tensor_rank = static_cast<int64_t>(tensor_sizes.size());
  for (const ShardMetadata& shard : shards) {
    if (shard.dim() != tensor_rank) {
      return absl::InvalidArgumentError(
          absl::StrCat("Rank of tensor is ", tensor_rank,
                       ", but shards rank is ", shard.dim()));
    }
  }
  for (int64_t size : tensor_sizes) {
    if (size < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("Tensor sizes must be non-negative, got [",
                       absl::StrJoin(tensor_sizes, ", "), "]"));
    }
  }
  // Sum volumes in 128 bits: each shard's volume fits in int64 once it is
  // known to lie inside a tensor whose volume does.
  __int128 total = 0;
  for (const Box& box : boxes) {
    for (size_t d = 0; d < tensor_sizes.size(); ++d) {
      const int64_t offset = box.lo(d);
      const int64_t length = box.shard->shard_sizes()[d];
      if (offset > tensor_sizes[d] - length) {
        return absl::InvalidArgumentError(
            absl::StrCat("Shard offset ", offset, " and length ", length,
                         " exceeds tensor dim: ", tensor_sizes[d],
                         " for shard ", box.shard->ToString()));
      }
    }
    total += box.shard->numel();
  }
  const std::optional<int64_t> volume = CheckedProduct(tensor_sizes);
  if (!volume.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Tensor volume overflows int64: [",
                     absl::StrJoin(tensor_sizes, ", "), "]"));
  }
  if (total == *volume) return absl::OkStatus();

  std::string message = absl::StrCat(
      "Total volume of shards: ", static_cast<int64_t>(total),
      " does not match tensor volume: ", *volume,
      ", in other words all the individual shards do not cover the entire "
      "tensor");
  if (total < *volume) {
    if (std::optional<std::string> gap = FindUncovered(boxes, tensor_sizes)) {
      absl::StrAppend(&message, "; not covered: ", *gap);
    }
  }
  return absl::InvalidArgumentError(message);
}

}  // namespace

absl::Status ValidateNonOverlappingShards(
    absl::Span<const ShardMetadata> shards) {
  return CheckOverlaps(shards, NonEmptyBoxes(shards));
}

absl::StatusOr<std::optional<std::pair<size_t, size_t>>> FindOverlappingShards(
    absl::Span<const ShardMetadata> shards) {
  return FindOverlap(shards, NonEmptyBoxes(shards));
}

absl::Status CheckTensor(absl::Span<const ShardMetadata> shards,
                         absl::Span<const int64_t> tensor_sizes) {
  return CheckBounds(shards, NonEmptyBoxes(shards), tensor_sizes);
}

absl::Status ValidateShardLayout(absl::Span<const ShardMetadata> shards,
                                 absl::Span<const int64_t> tensor_sizes) {
  const std::vector<Box> boxes = NonEmptyBoxes(shards);
  if (absl::Status status = CheckBounds(shards, boxes, tensor_sizes);
      !status.ok()) {
    // Overlaps explain a volume mismatch better than the totals do.
    absl::Status overlap = CheckOverlaps(shards, boxes);
    return overlap.ok() ? status : overlap;
  }
  return CheckOverlaps(shards, boxes);
}

}  // namespace tessera
