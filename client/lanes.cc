#include "client/lanes.h"

#include <algorithm>

namespace tessera {

int LaneCount(int64_t bytes, int requested) {
  const int wanted = std::clamp(requested <= 0 ? kDefaultDataLanes : requested,
                                1, kMaxDataLanes);
  const int64_t fit = std::max<int64_t>(1, bytes / kMinLaneBytes);
  return static_cast<int>(std::min<int64_t>(wanted, fit));
}

std::vector<LanePart> SplitIntoLanes(absl::Span<const int64_t> offsets,
                                     absl::Span<const int64_t> sizes,
                                     int lanes) {
  const std::vector<int64_t> origin(offsets.begin(), offsets.end());
  int dim = -1;
  bool empty = false;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 0) empty = true;
    if (dim < 0 && sizes[d] > 1) dim = static_cast<int>(d);
  }
  if (lanes <= 1 || empty || dim < 0) {
    return {LanePart{0, 0, sizes.empty() ? 0 : sizes[0], origin}};
  }
  const int64_t length = sizes[dim];
  const int64_t parts = std::min<int64_t>(lanes, length);
  std::vector<LanePart> split;
  split.reserve(static_cast<size_t>(parts));
  int64_t start = 0;
  for (int64_t i = 0; i < parts; ++i) {
    const int64_t part = length / parts + (i < length % parts ? 1 : 0);
    LanePart lane{dim, start, part, origin};
    lane.offsets[dim] += start;
    split.push_back(std::move(lane));
    start += part;
  }
  return split;
}

}  // namespace tessera
