#include "common/shard_layout.h"

#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/shard_box.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::IsOkAndHolds;
using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

using Dims = std::vector<int64_t>;

using ::tessera::testing::ShardBox;

TEST(ShardLayoutTest, EmptyShardsMayBeAnywhere) {
  // torch.chunk's 2 rows over 4 placements: offsets 0,1,2,3, sizes 1,1,0,0.
  const std::vector<ShardMetadata> shards = {
      ShardBox({0, 0}, {1, 20}), ShardBox({1, 0}, {1, 20}),
      ShardBox({2, 0}, {0, 20}), ShardBox({3, 0}, {0, 20})};
  EXPECT_THAT(ValidateShardLayout(shards, {2, 20}), IsOk());
  // Empty shards stacked on top of real ones overlap nothing.
  EXPECT_THAT(ValidateNonOverlappingShards(
                  {ShardBox({0}, {5}), ShardBox({2}, {0}), ShardBox({2}, {0})}),
              IsOk());
}

TEST(ShardLayoutTest, OverlapNamesBothShardsInInputOrder) {
  const std::vector<ShardMetadata> shards = {
      ShardBox({0, 5}, {5, 5}), ShardBox({0, 0}, {6, 6}),
      ShardBox({5, 0}, {5, 5}), ShardBox({5, 5}, {5, 5})};
  EXPECT_THAT(
      ValidateNonOverlappingShards(shards),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("Shards ShardMetadata(shard_offsets=[0, 5], "
                         "shard_sizes=[5, 5], placement=None) and "
                         "ShardMetadata(shard_offsets=[0, 0], shard_sizes=[6, "
                         "6], placement=None) overlap")));
  EXPECT_THAT(
      ValidateNonOverlappingShards(
          {ShardBox({1, 1}, {2, 2}), ShardBox({1, 1}, {2, 2})}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("overlap")));
  EXPECT_THAT(
      ValidateNonOverlappingShards({ShardBox({}, {}), ShardBox({}, {})}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("overlap")));
}

TEST(ShardLayoutTest, FindOverlappingShardsGivesThePairsPositions) {
  // One pair per kind of sweep: along 1, 2 and 3 varying dimensions, and
  // every box the same box; empty shards between them are skipped.
  using Pair = std::optional<std::pair<size_t, size_t>>;
  EXPECT_THAT(FindOverlappingShards({ShardBox({0}, {4}), ShardBox({2}, {0}),
                                     ShardBox({4}, {4}), ShardBox({7}, {2})}),
              IsOkAndHolds(Pair({2, 3})));
  EXPECT_THAT(FindOverlappingShards(
                  {ShardBox({0, 5}, {5, 5}), ShardBox({5, 0}, {5, 5}),
                   ShardBox({0, 0}, {5, 5}), ShardBox({4, 4}, {1, 1})}),
              IsOkAndHolds(Pair({2, 3})));
  EXPECT_THAT(FindOverlappingShards({ShardBox({0, 0, 0}, {2, 2, 2}),
                                     ShardBox({2, 2, 2}, {2, 2, 2}),
                                     ShardBox({1, 1, 1}, {1, 1, 1})}),
              IsOkAndHolds(Pair({0, 2})));
  EXPECT_THAT(FindOverlappingShards(
                  {ShardBox({1, 1}, {2, 2}), ShardBox({1, 1}, {2, 2})}),
              IsOkAndHolds(Pair({0, 1})));
  EXPECT_THAT(FindOverlappingShards(
                  {ShardBox({0, 0}, {5, 5}), ShardBox({5, 5}, {5, 5})}),
              IsOkAndHolds(Pair()));
  EXPECT_THAT(FindOverlappingShards({}), IsOkAndHolds(Pair()));
  EXPECT_THAT(
      FindOverlappingShards({ShardBox({0}, {4}), ShardBox({0, 0}, {1, 1})}),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("inconsistent ranks")));
}

TEST(ShardLayoutTest, TouchingShardsDoNotOverlap) {
  EXPECT_THAT(
      ValidateNonOverlappingShards({ShardBox({0}, {5}), ShardBox({5}, {5})}),
      IsOk());
  EXPECT_THAT(ValidateNonOverlappingShards(
                  {ShardBox({0, 0}, {5, 5}), ShardBox({5, 5}, {5, 5})}),
              IsOk());
}

TEST(ShardLayoutTest, VolumeMismatchPointsAtTheGap) {
  // Rank 0's shard shrank to 4x4 in a 2x2 grid of 5x5 shards.
  const std::vector<ShardMetadata> gaps = {
      ShardBox({0, 0}, {4, 4}), ShardBox({0, 5}, {5, 5}),
      ShardBox({5, 0}, {5, 5}), ShardBox({5, 5}, {5, 5})};
  EXPECT_THAT(
      CheckTensor(gaps, {10, 10}),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("Total volume of shards: 91 does not match tensor "
                         "volume: 100, in other words all the individual "
                         "shards do not cover the entire tensor; not covered: "
                         "offsets [0, 4] sizes [4, 1]")));
  // A row-sharded 1-d layout missing its last rows.
  EXPECT_THAT(
      CheckTensor({ShardBox({0, 0}, {3, 20}), ShardBox({3, 0}, {3, 20})},
                  {10, 20}),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("not covered: offsets [6, 0] sizes [4, 20]")));
  // Every shard covers only the left half.
  EXPECT_THAT(CheckTensor({ShardBox({0, 0}, {5, 3}), ShardBox({5, 0}, {5, 3})},
                          {10, 6}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("not covered: offsets [0, 3] sizes [10, 3]")));
  EXPECT_THAT(CheckTensor({}, {2, 2}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("not covered: offsets [0, 0] sizes [2, 2]")));
  EXPECT_THAT(CheckTensor({}, {0, 2}), IsOk());
}

TEST(ShardLayoutTest, OverlapIsReportedBeforeVolume) {
  EXPECT_THAT(
      ValidateShardLayout({ShardBox({0}, {6}), ShardBox({5}, {5})}, {10}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("overlap")));
}

TEST(ShardLayoutTest, HugeSizesDoNotOverflow) {
  const int64_t big = int64_t{1} << 40;
  EXPECT_THAT(CheckTensor({ShardBox({0, 0}, {big, big})}, {big, big}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("overflows int64")));
  EXPECT_THAT(CheckTensor({ShardBox({big}, {big})}, {big}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("exceeds tensor dim")));
}

// Reference implementation: pairwise, obviously right, test-only.
bool BruteForceOverlap(const std::vector<ShardMetadata>& shards) {
  for (size_t i = 0; i < shards.size(); ++i) {
    for (size_t j = i + 1; j < shards.size(); ++j) {
      if (shards[i].numel() == 0 || shards[j].numel() == 0) continue;
      bool overlap = true;
      for (int64_t d = 0; d < shards[i].dim(); ++d) {
        const int64_t lo_i = shards[i].shard_offsets()[d];
        const int64_t lo_j = shards[j].shard_offsets()[d];
        const int64_t hi_i = lo_i + shards[i].shard_sizes()[d];
        const int64_t hi_j = lo_j + shards[j].shard_sizes()[d];
        overlap = overlap && lo_i < hi_j && lo_j < hi_i;
      }
      if (overlap) return true;
    }
  }
  return false;
}

// Cuts `box` recursively along random dimensions: a random tiling.
void Tile(std::mt19937& rng, Dims offsets, Dims sizes, int depth,
          std::vector<ShardMetadata>* out) {
  std::uniform_int_distribution<size_t> pick_dim(0, sizes.size() - 1);
  const size_t d = pick_dim(rng);
  if (depth == 0 || sizes[d] < 2) {
    out->push_back(ShardBox(offsets, sizes));
    return;
  }
  std::uniform_int_distribution<int64_t> pick_cut(1, sizes[d] - 1);
  const int64_t cut = pick_cut(rng);
  Dims right_offsets = offsets, right_sizes = sizes;
  sizes[d] = cut;
  right_offsets[d] += cut;
  right_sizes[d] -= cut;
  Tile(rng, offsets, sizes, depth - 1, out);
  Tile(rng, right_offsets, right_sizes, depth - 1, out);
}

// The sweeps agree with the pairwise check on thousands of random layouts
// in 1 to 4 dimensions, tilings and tilings with one shard moved, grown or
// removed.
TEST(ShardLayoutTest, SweepAgreesWithPairwiseCheck) {
  std::mt19937 rng(20261122);
  int overlaps = 0, gaps = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const size_t rank = 1 + trial % 4;
    Dims tensor(rank);
    for (int64_t& s : tensor)
      s = std::uniform_int_distribution<int64_t>(1, 12)(rng);
    std::vector<ShardMetadata> shards;
    Tile(rng, Dims(rank, 0), tensor, 1 + trial % 7, &shards);
    ASSERT_THAT(ValidateShardLayout(shards, tensor), IsOk());

    std::uniform_int_distribution<size_t> pick(0, shards.size() - 1);
    const size_t victim = pick(rng);
    Dims offsets(shards[victim].shard_offsets().begin(),
                 shards[victim].shard_offsets().end());
    Dims sizes(shards[victim].shard_sizes().begin(),
               shards[victim].shard_sizes().end());
    const size_t d = std::uniform_int_distribution<size_t>(0, rank - 1)(rng);
    switch (trial % 3) {
      case 0:  // Move.
        offsets[d] = std::uniform_int_distribution<int64_t>(
            0, tensor[d] - sizes[d])(rng);
        break;
      case 1:  // Grow towards the end, staying inside the tensor.
        sizes[d] = tensor[d] - offsets[d];
        break;
      case 2:  // Remove.
        sizes[d] = 0;
        break;
    }
    shards[victim] = ShardBox(offsets, sizes);
    const bool expected = BruteForceOverlap(shards);
    const absl::Status status = ValidateNonOverlappingShards(shards);
    ASSERT_EQ(expected, !status.ok()) << "trial " << trial << ": " << status;
    overlaps += expected;
    if (!expected) {
      const absl::Status check = CheckTensor(shards, tensor);
      int64_t total = 0;
      for (const ShardMetadata& s : shards) total += s.numel();
      int64_t volume = 1;
      for (int64_t s : tensor) volume *= s;
      ASSERT_EQ(total == volume, check.ok()) << check;
      gaps += !check.ok();
    }
  }
  // The generator must exercise both outcomes, or the test proves nothing.
  EXPECT_GT(overlaps, 300);
  EXPECT_GT(gaps, 300);
}

}  // namespace
}  // namespace tessera
