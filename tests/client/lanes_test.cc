#include "client/lanes.h"

#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::ElementsAre;

TEST(LaneCountTest, OneLanePerMinimumUpToTheAskedCount) {
  EXPECT_EQ(LaneCount(0, 0), 1);
  EXPECT_EQ(LaneCount(4096, 8), 1);
  EXPECT_EQ(LaneCount(2 * kMinLaneBytes - 1, 0), 1);
  EXPECT_EQ(LaneCount(2 * kMinLaneBytes, 0), 2);
  EXPECT_EQ(LaneCount(100 * kMinLaneBytes, 0), kDefaultDataLanes);
  EXPECT_EQ(LaneCount(100 * kMinLaneBytes, 1), 1);
  EXPECT_EQ(LaneCount(100 * kMinLaneBytes, 7), 7);
  EXPECT_EQ(LaneCount(100 * kMinLaneBytes, 1000), kMaxDataLanes);
  EXPECT_EQ(LaneCount(100 * kMinLaneBytes, -3), kDefaultDataLanes);
}

TEST(SplitIntoLanesTest, SlabsOfTheOutermostDimensionLongerThanOne) {
  // 10 rows in 3 lanes: 4, 3, 3, at the box's own offsets.
  const std::vector<LanePart> rows = SplitIntoLanes({5, 2}, {10, 7}, 3);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].dim, 0);
  EXPECT_EQ(rows[0].start, 0);
  EXPECT_EQ(rows[0].length, 4);
  EXPECT_THAT(rows[0].offsets, ElementsAre(5, 2));
  EXPECT_EQ(rows[1].start, 4);
  EXPECT_EQ(rows[1].length, 3);
  EXPECT_THAT(rows[1].offsets, ElementsAre(9, 2));
  EXPECT_EQ(rows[2].start, 7);
  EXPECT_EQ(rows[2].length, 3);
  EXPECT_THAT(rows[2].offsets, ElementsAre(12, 2));
  // Leading dimensions of 1 are passed over, so each part stays one dense
  // run of a dense box.
  const std::vector<LanePart> inner = SplitIntoLanes({0, 3, 0}, {1, 8, 5}, 4);
  ASSERT_EQ(inner.size(), 4u);
  for (size_t i = 0; i < inner.size(); ++i) {
    EXPECT_EQ(inner[i].dim, 1);
    EXPECT_EQ(inner[i].length, 2);
    EXPECT_THAT(inner[i].offsets,
                ElementsAre(0, 3 + 2 * static_cast<int64_t>(i), 0));
  }
  // No more parts than entries.
  EXPECT_EQ(SplitIntoLanes({0, 0}, {2, 1000}, 8).size(), 2u);
}

TEST(SplitIntoLanesTest, OnePartWhenThereIsNothingToSplit) {
  for (const auto& [sizes, lanes] :
       std::vector<std::pair<std::vector<int64_t>, int>>{{{10, 10}, 1},
                                                         {{10, 10}, 0},
                                                         {{1, 1, 1}, 4},
                                                         {{0, 50}, 4},
                                                         {{}, 4}}) {
    const std::vector<int64_t> offsets(sizes.size(), 1);
    const std::vector<LanePart> parts = SplitIntoLanes(offsets, sizes, lanes);
    ASSERT_EQ(parts.size(), 1u);
    EXPECT_EQ(parts[0].offsets, offsets);
    EXPECT_EQ(parts[0].start, 0);
  }
}

}  // namespace
}  // namespace tessera
