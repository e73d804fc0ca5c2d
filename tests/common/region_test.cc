// Regions (common/region.h): validation against an extent, intersections
// with shards, views.
#include "common/region.h"

#include <cstdint>
#include <limits>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/shard_box.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

using ::tessera::testing::ShardBox;

TEST(ValidateRegionTest, AcceptsBoxesInsideTheExtent) {
  EXPECT_OK(ValidateRegion({0, 0}, {10, 20}, {10, 20}, "tensor w", "tensor"));
  EXPECT_OK(ValidateRegion({9, 19}, {1, 1}, {10, 20}, "tensor w", "tensor"));
  // Empty boxes may start at the end, as a Narrow may.
  EXPECT_OK(ValidateRegion({10, 0}, {0, 20}, {10, 20}, "tensor w", "tensor"));
  EXPECT_OK(ValidateRegion({}, {}, {}, "tensor s", "tensor"));
}

TEST(ValidateRegionTest, NamesWhatIsWrong) {
  EXPECT_THAT(
      ValidateRegion({0, 5}, {10, 16}, {10, 20}, "shard 2 of tensor t",
                     "shard"),
      StatusIs(absl::StatusCode::kOutOfRange,
               "region offsets [0, 5] sizes [10, 16] of shard 2 of tensor t "
               "leaves the shard (sizes [10, 20])"));
  EXPECT_THAT(ValidateRegion({11, 0}, {0, 0}, {10, 20}, "tensor w", "tensor"),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("leaves")));
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  EXPECT_THAT(ValidateRegion({5, 0}, {kMax, 1}, {10, 20}, "tensor w", "tensor"),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("leaves")));
  EXPECT_THAT(ValidateRegion({0}, {1, 1}, {10, 20}, "tensor w", "tensor"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "region of tensor w: 1 offsets and 2 sizes for a tensor "
                       "of 2 dimensions"));
  EXPECT_THAT(ValidateRegion({0, -1}, {1, 1}, {10, 20}, "tensor w", "tensor"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("negative offsets or sizes (offsets [0, -1], "
                                 "sizes [1, 1])")));
  EXPECT_THAT(
      ValidateRegion({0, 0}, {1, -1}, {10, 20}, "tensor w", "tensor"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("negative")));
}

TEST(IntersectTest, CommonBoxOrNothing) {
  const std::optional<ShardMetadata> common =
      Intersect(ShardBox({0, 5}, {10, 10}), ShardBox({4, 0}, {10, 8}));
  ASSERT_TRUE(common.has_value());
  EXPECT_THAT(common->shard_offsets(), ElementsAre(4, 5));
  EXPECT_THAT(common->shard_sizes(), ElementsAre(6, 3));
  EXPECT_FALSE(common->placement().has_value());
  // Touching boxes share no element; nor does an empty one.
  EXPECT_FALSE(Intersect(ShardBox({0, 0}, {5, 5}), ShardBox({5, 0}, {5, 5}))
                   .has_value());
  EXPECT_FALSE(Intersect(ShardBox({0, 0}, {0, 5}), ShardBox({0, 0}, {5, 5}))
                   .has_value());
  EXPECT_FALSE(
      Intersect(ShardBox({0}, {5}), ShardBox({0, 0}, {5, 5})).has_value());
}

TEST(OverlapsTest, ListsEveryShardTheRegionTouches) {
  const std::vector<ShardMetadata> grid = {
      ShardBox({0, 0}, {5, 5}), ShardBox({0, 5}, {5, 5}),
      ShardBox({5, 0}, {5, 5}), ShardBox({5, 5}, {5, 5})};
  const std::vector<RegionOverlap> overlaps =
      Overlaps(grid, ShardBox({4, 2}, {2, 2}));
  ASSERT_EQ(overlaps.size(), 2u);
  EXPECT_EQ(overlaps[0].shard, 0u);
  EXPECT_EQ(overlaps[0].box, ShardBox({4, 2}, {1, 2}));
  EXPECT_EQ(overlaps[1].shard, 2u);
  EXPECT_EQ(overlaps[1].box, ShardBox({5, 2}, {1, 2}));
  EXPECT_EQ(Overlaps(grid, ShardBox({0, 0}, {10, 10})).size(), 4u);
  EXPECT_TRUE(Overlaps(grid, ShardBox({3, 3}, {0, 4})).empty());
  EXPECT_THAT(OffsetsWithin({5, 2}, {5, 0}), ElementsAre(0, 2));
}

TEST(RegionViewTest, NarrowsEveryDimension) {
  ASSERT_OK_AND_ASSIGN(
      Tensor tensor,
      Tensor::FromVector<int32_t>(
          std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {3, 4}));
  ASSERT_OK_AND_ASSIGN(Tensor view, RegionView(tensor, {1, 1}, {2, 2}));
  ASSERT_OK_AND_ASSIGN(
      Tensor expected,
      Tensor::FromVector<int32_t>(std::vector<int32_t>{5, 6, 9, 10}, {2, 2}));
  EXPECT_TRUE(Equal(view, expected));
  EXPECT_EQ(view.storage(), tensor.storage());
  EXPECT_THAT(
      RegionView(tensor, {1}, {2, 2}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1 offsets")));
  EXPECT_THAT(
      RegionView(tensor, {-1, 0}, {1, 1}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("negative")));
  EXPECT_THAT(RegionView(tensor, {2, 0}, {2, 1}),
              StatusIs(absl::StatusCode::kOutOfRange, ::testing::_));
}

}  // namespace
}  // namespace tessera
