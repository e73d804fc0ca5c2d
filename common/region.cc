#include "common/region.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace tessera {

absl::Status ValidateRegion(absl::Span<const int64_t> offsets,
                            absl::Span<const int64_t> sizes,
                            absl::Span<const int64_t> extent,
                            absl::string_view of, absl::string_view noun) {
  if (offsets.size() != extent.size() || sizes.size() != extent.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "region of ", of, ": ", offsets.size(), " offsets and ", sizes.size(),
        " sizes for a ", noun, " of ", extent.size(), " dimensions"));
  }
  const auto negative = [](int64_t v) { return v < 0; };
  if (std::any_of(offsets.begin(), offsets.end(), negative) ||
      std::any_of(sizes.begin(), sizes.end(), negative)) {
    return absl::InvalidArgumentError(
        absl::StrCat("region of ", of, ": negative offsets or sizes (offsets [",
                     absl::StrJoin(offsets, ", "), "], sizes [",
                     absl::StrJoin(sizes, ", "), "])"));
  }
  for (size_t d = 0; d < extent.size(); ++d) {
    // offsets[d] + sizes[d] <= extent[d], without overflowing.
    if (offsets[d] > extent[d] || sizes[d] > extent[d] - offsets[d]) {
      return absl::OutOfRangeError(absl::StrCat(
          "region offsets [", absl::StrJoin(offsets, ", "), "] sizes [",
          absl::StrJoin(sizes, ", "), "] of ", of, " leaves the ", noun,
          " (sizes [", absl::StrJoin(extent, ", "), "])"));
    }
  }
  return absl::OkStatus();
}

std::optional<ShardMetadata> Intersect(const ShardMetadata& a,
                                       const ShardMetadata& b) {
  if (a.dim() != b.dim()) return std::nullopt;
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
  for (int64_t d = 0; d < a.dim(); ++d) {
    const int64_t lo = std::max(a.shard_offsets()[d], b.shard_offsets()[d]);
    const int64_t hi = std::min(a.shard_offsets()[d] + a.shard_sizes()[d],
                                b.shard_offsets()[d] + b.shard_sizes()[d]);
    if (hi <= lo) return std::nullopt;
    offsets.push_back(lo);
    sizes.push_back(hi - lo);
  }
  absl::StatusOr<ShardMetadata> box =
      ShardMetadata::Create(std::move(offsets), std::move(sizes));
  if (!box.ok()) return std::nullopt;
  return *std::move(box);
}

std::vector<RegionOverlap> Overlaps(absl::Span<const ShardMetadata> shards,
                                    const ShardMetadata& region) {
  std::vector<RegionOverlap> overlaps;
  for (size_t i = 0; i < shards.size(); ++i) {
    std::optional<ShardMetadata> box = Intersect(shards[i], region);
    if (box.has_value()) overlaps.push_back({i, *std::move(box)});
  }
  return overlaps;
}

std::vector<int64_t> OffsetsWithin(absl::Span<const int64_t> offsets,
                                   absl::Span<const int64_t> origin) {
  std::vector<int64_t> out(offsets.begin(), offsets.end());
  for (size_t d = 0; d < out.size() && d < origin.size(); ++d) {
    out[d] -= origin[d];
  }
  return out;
}

absl::StatusOr<Tensor> RegionView(const Tensor& tensor,
                                  absl::Span<const int64_t> offsets,
                                  absl::Span<const int64_t> sizes) {
  if (static_cast<int64_t>(offsets.size()) != tensor.dim() ||
      static_cast<int64_t>(sizes.size()) != tensor.dim()) {
    return absl::InvalidArgumentError(
        absl::StrCat("region of ", offsets.size(), " offsets and ",
                     sizes.size(), " sizes for ", tensor.DebugString()));
  }
  Tensor view = tensor;
  for (size_t d = 0; d < offsets.size(); ++d) {
    if (offsets[d] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("region offsets [", absl::StrJoin(offsets, ", "),
                       "] hold a negative offset"));
    }
    ASSIGN_OR_RETURN(
        view, view.Narrow(static_cast<int64_t>(d), offsets[d], sizes[d]));
  }
  return view;
}

}  // namespace tessera
