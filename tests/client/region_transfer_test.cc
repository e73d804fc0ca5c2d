// ForEachRegionPiece (client/region_transfer.h): the fan-out every region
// read and write goes through, on the client and on the daemons.
#include "client/region_transfer.h"

#include <algorithm>
#include <functional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/shard_metadata.h"
#include "common/tensor/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

// A 10x10 tensor as a 2x2 grid of 5x5 shards, in row-major shard order.
std::vector<ShardMetadata> Grid() {
  std::vector<ShardMetadata> shards;
  for (int64_t row : {0, 5}) {
    for (int64_t col : {0, 5}) {
      shards.push_back(*ShardMetadata::Create({row, col}, {5, 5}));
    }
  }
  return shards;
}

struct Seen {
  Seen(size_t shard, absl::Span<const int64_t> box_offsets,
       absl::Span<const int64_t> box_sizes,
       std::vector<int64_t> offsets_in_shard)
      : shard(shard),
        box_offsets(box_offsets.begin(), box_offsets.end()),
        box_sizes(box_sizes.begin(), box_sizes.end()),
        offsets_in_shard(std::move(offsets_in_shard)) {}
  size_t shard;
  std::vector<int64_t> box_offsets;
  std::vector<int64_t> box_sizes;
  std::vector<int64_t> offsets_in_shard;
};

class RegionPieceTest : public ::testing::TestWithParam<int> {};

TEST_P(RegionPieceTest, EveryOverlapOnceAndEveryElementOnce) {
  const std::vector<ShardMetadata> shards = Grid();
  // Rows 3..6, columns 2..7: all four shards.
  const Tensor region =
      *Tensor::Zeros({4, 6}, TensorOptions().WithDType(DType::kInt64));
  absl::Mutex mu;
  std::vector<Seen> seen;
  ASSERT_OK(ForEachRegionPiece(
      shards, {3, 2}, region, GetParam(),
      [&](const RegionPiece& piece) -> absl::Status {
        // Each element of the piece gets 1 + the shard's index, added: a
        // piece visited twice, or pieces overlapping, would show.
        const Tensor& view = piece.view;
        for (int64_t i = 0; i < view.sizes()[0]; ++i) {
          for (int64_t j = 0; j < view.sizes()[1]; ++j) {
            int64_t* element = static_cast<int64_t*>(view.data_ptr()) +
                               i * view.strides()[0] + j * view.strides()[1];
            *element += static_cast<int64_t>(piece.shard) + 1;
          }
        }
        absl::MutexLock lock(&mu);
        seen.push_back(Seen{piece.shard, piece.box->shard_offsets(),
                            piece.box->shard_sizes(), piece.offsets_in_shard});
        return absl::OkStatus();
      }));
  std::sort(seen.begin(), seen.end(),
            [](const Seen& a, const Seen& b) { return a.shard < b.shard; });
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_EQ(seen[0].box_offsets, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(seen[0].box_sizes, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(seen[0].offsets_in_shard, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(seen[1].box_offsets, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(seen[1].box_sizes, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(seen[1].offsets_in_shard, (std::vector<int64_t>{3, 0}));
  EXPECT_EQ(seen[2].box_offsets, (std::vector<int64_t>{5, 2}));
  EXPECT_EQ(seen[2].box_sizes, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(seen[2].offsets_in_shard, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(seen[3].box_offsets, (std::vector<int64_t>{5, 5}));
  EXPECT_EQ(seen[3].box_sizes, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(seen[3].offsets_in_shard, (std::vector<int64_t>{0, 0}));
  // Every element written exactly once, by the shard that holds it.
  const int64_t* values = static_cast<const int64_t*>(region.data_ptr());
  for (int64_t i = 0; i < 4; ++i) {
    for (int64_t j = 0; j < 6; ++j) {
      const int64_t row = 3 + i, col = 2 + j;
      const int64_t shard = (row >= 5 ? 2 : 0) + (col >= 5 ? 1 : 0);
      EXPECT_EQ(values[i * 6 + j], shard + 1) << "at " << row << "," << col;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Parallelism, RegionPieceTest,
                         ::testing::Values(1, 2, 4, 16));

TEST(RegionPieceTest, ARegionInsideOneShardIsOnePiece) {
  const Tensor region =
      *Tensor::Zeros({2, 2}, TensorOptions().WithDType(DType::kFloat32));
  std::vector<size_t> shards;
  ASSERT_OK(ForEachRegionPiece(
      Grid(), {6, 7}, region, 4, [&](const RegionPiece& piece) {
        shards.push_back(piece.shard);
        EXPECT_EQ(piece.offsets_in_shard, (std::vector<int64_t>{1, 2}));
        return absl::OkStatus();
      }));
  EXPECT_THAT(shards, ElementsAre(3u));
}

TEST(RegionPieceTest, OnlyTheShardsTheRegionTouches) {
  // Rows 0..1, columns 3..6: shards 0 and 1, not the lower two.
  const Tensor region =
      *Tensor::Zeros({2, 4}, TensorOptions().WithDType(DType::kInt32));
  absl::Mutex mu;
  std::vector<Seen> seen;
  ASSERT_OK(ForEachRegionPiece(
      Grid(), {0, 3}, region, 4, [&](const RegionPiece& piece) {
        absl::MutexLock lock(&mu);
        seen.push_back(Seen{piece.shard, piece.box->shard_offsets(),
                            piece.box->shard_sizes(), piece.offsets_in_shard});
        EXPECT_EQ(piece.view.sizes(), piece.box->shard_sizes());
        return absl::OkStatus();
      }));
  std::sort(seen.begin(), seen.end(),
            [](const Seen& a, const Seen& b) { return a.shard < b.shard; });
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].shard, 0u);
  EXPECT_EQ(seen[0].box_sizes, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(seen[0].offsets_in_shard, (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(seen[1].shard, 1u);
  EXPECT_EQ(seen[1].box_offsets, (std::vector<int64_t>{0, 5}));
  EXPECT_EQ(seen[1].offsets_in_shard, (std::vector<int64_t>{0, 0}));
}

TEST(RegionPieceTest, AStridedRegionBuffer) {
  // The region (rows 3..6, columns 2..7) as the transpose of a 6x4 buffer:
  // each piece's view must address the right elements of it all the same.
  const Tensor base =
      *Tensor::Zeros({6, 4}, TensorOptions().WithDType(DType::kInt64));
  const Tensor region = *base.T();
  ASSERT_FALSE(region.is_contiguous());
  ASSERT_OK(ForEachRegionPiece(
      Grid(), {3, 2}, region, 2, [&](const RegionPiece& piece) {
        const Tensor& view = piece.view;
        for (int64_t i = 0; i < view.sizes()[0]; ++i) {
          for (int64_t j = 0; j < view.sizes()[1]; ++j) {
            // The global coordinates, encoded.
            static_cast<int64_t*>(view.data_ptr())[i * view.strides()[0] +
                                                   j * view.strides()[1]] =
                (piece.box->shard_offsets()[0] + i) * 100 +
                piece.box->shard_offsets()[1] + j;
          }
        }
        return absl::OkStatus();
      }));
  const int64_t* values = static_cast<const int64_t*>(base.data_ptr());
  for (int64_t i = 0; i < 4; ++i) {
    for (int64_t j = 0; j < 6; ++j) {
      EXPECT_EQ(values[j * 4 + i], (3 + i) * 100 + 2 + j)
          << "at " << i << "," << j;
    }
  }
}

TEST(RegionPieceTest, TheLowestFailingPieceWins) {
  const Tensor region =
      *Tensor::Zeros({10, 10}, TensorOptions().WithDType(DType::kFloat32));
  const absl::Status status = ForEachRegionPiece(
      Grid(), {0, 0}, region, 1, [](const RegionPiece& piece) -> absl::Status {
        if (piece.shard >= 1) {
          return absl::UnavailableError(
              absl::StrCat("shard ", piece.shard, " is down"));
        }
        return absl::OkStatus();
      });
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kUnavailable,
                               HasSubstr("shard 1 is down")));
}

TEST(RegionPieceTest, NoPieceStartsAfterAFailureWhenSequential) {
  const Tensor region =
      *Tensor::Zeros({10, 10}, TensorOptions().WithDType(DType::kFloat32));
  std::vector<size_t> called;
  const absl::Status status = ForEachRegionPiece(
      Grid(), {0, 0}, region, 1, [&](const RegionPiece& piece) -> absl::Status {
        called.push_back(piece.shard);
        if (piece.shard == 1) return absl::InternalError("shard 1 failed");
        return absl::OkStatus();
      });
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kInternal, "shard 1 failed"));
  EXPECT_THAT(called, ElementsAre(0u, 1u));
}

TEST(RegionPieceTest, AFailureInParallelIsReturned) {
  const Tensor region =
      *Tensor::Zeros({10, 10}, TensorOptions().WithDType(DType::kFloat32));
  for (int parallelism : {2, 4}) {
    SCOPED_TRACE(parallelism);
    const absl::Status status =
        ForEachRegionPiece(Grid(), {0, 0}, region, parallelism,
                           [](const RegionPiece& piece) -> absl::Status {
                             if (piece.shard == 2)
                               return absl::DataLossError("shard 2 is bad");
                             return absl::OkStatus();
                           });
    EXPECT_THAT(status,
                StatusIs(absl::StatusCode::kDataLoss, "shard 2 is bad"));
  }
}

TEST(RegionPieceTest, EmptyLayoutVisitsNothing) {
  const Tensor region =
      *Tensor::Zeros({1, 1}, TensorOptions().WithDType(DType::kFloat32));
  int calls = 0;
  ASSERT_OK(ForEachRegionPiece({}, {0, 0}, region, 4, [&](const RegionPiece&) {
    ++calls;
    return absl::OkStatus();
  }));
  EXPECT_EQ(calls, 0);
}

// What a ProgressCounter reported, in order.
struct Reports {
  std::function<void(int64_t, int64_t)> Fn() {
    return
        [this](int64_t done, int64_t total) { seen.emplace_back(done, total); };
  }
  std::vector<std::pair<int64_t, int64_t>> seen;
};

// A piece moved again (60 of 100 bytes, then all 100 once more, as a read
// failing over to a replica does) never reports more than the total, and
// the finished transfer ends at (total, total).
TEST(ProgressCounterTest, DoneNeverPassesTheTotal) {
  Reports reports;
  ProgressCounter progress(100, reports.Fn());
  progress.Add(60);
  progress.Add(60);
  progress.Add(40);
  progress.Finish();  // Already reported (100, 100).
  EXPECT_THAT(reports.seen,
              ElementsAre(Pair(60, 100), Pair(100, 100), Pair(100, 100)));
}

// A transfer that learns its size late (a gather's header) counts from
// there.
TEST(ProgressCounterTest, ATotalLearnedLateCountsFromThere) {
  Reports reports;
  ProgressCounter progress(0, reports.Fn());
  progress.SetTotal(10);
  progress.Add(4);
  progress.Add(6);
  progress.Finish();
  EXPECT_THAT(reports.seen, ElementsAre(Pair(4, 10), Pair(10, 10)));
}

}  // namespace
}  // namespace tessera
