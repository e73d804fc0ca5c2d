// The read planner (PlanPieces, client/read_plan.h) on metadata alone:
// pieces of chunked and uneven layouts, fused sources, and refusals.
#include <vector>

#include "client/read_plan.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

PlannedTensor Tensor2d(std::vector<int64_t> sizes,
                       std::vector<std::vector<int64_t>> boxes) {
  PlannedTensor tensor;
  tensor.name = "t";
  tensor.sizes = std::move(sizes);
  for (const auto& b : boxes) {
    tensor.shards.push_back(*ShardMetadata::Create({b[0], b[1]}, {b[2], b[3]}));
  }
  return tensor;
}

PlanTarget Target(std::vector<PlanSource> sources,
                  std::vector<int64_t> out_sizes,
                  DType dtype = DType::kFloat32) {
  PlanTarget target;
  target.sources = std::move(sources);
  target.out_sizes = std::move(out_sizes);
  target.out_dtype = dtype;
  return target;
}

std::vector<int64_t> V(const PlanDims& dims) {
  return {dims.begin(), dims.end()};
}

TEST(PlanPiecesTest, AColumnHalfOfRowChunksIsOnePiecePerChunk) {
  // Rows 0-4, 4-8, 8-10 (uneven last chunk).
  const PlannedTensor t =
      Tensor2d({10, 6}, {{0, 0, 4, 6}, {4, 0, 4, 6}, {8, 0, 2, 6}});
  ASSERT_OK_AND_ASSIGN(
      const std::vector<PlanPiece> pieces,
      PlanPieces({t}, {Target({{0, {0, 3}, {10, 3}, {}}}, {10, 3})}));
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_THAT(V(pieces[1].offsets_in_shard), ElementsAre(0, 3));
  EXPECT_THAT(V(pieces[1].out_offsets), ElementsAre(4, 0));
  EXPECT_THAT(V(pieces[1].sizes), ElementsAre(4, 3));
  EXPECT_EQ(pieces[1].shard, 1u);
  EXPECT_THAT(V(pieces[2].sizes), ElementsAre(2, 3));
  int64_t bytes = 0;
  for (const PlanPiece& p : pieces) bytes += p.bytes;
  EXPECT_EQ(bytes, 10 * 3 * 4);
}

TEST(PlanPiecesTest, FusedSourcesLandAtTheirOutOffsetsAndCastsAreKept) {
  const PlannedTensor q = Tensor2d({4, 4}, {{0, 0, 4, 4}});
  PlannedTensor k = Tensor2d({4, 4}, {{0, 0, 2, 4}, {2, 0, 2, 4}});
  ASSERT_OK_AND_ASSIGN(const std::vector<PlanPiece> pieces,
                       PlanPieces({q, k}, {Target({{0, {0, 2}, {4, 2}, {0, 0}},
                                                   {1, {0, 2}, {4, 2}, {4, 0}}},
                                                  {8, 2}, DType::kBFloat16)}));
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0].tensor, 0u);
  EXPECT_THAT(V(pieces[2].out_offsets), ElementsAre(6, 0));
  EXPECT_THAT(V(pieces[2].offsets_in_shard), ElementsAre(0, 2));
  EXPECT_EQ(pieces[2].bytes, 2 * 2 * 4);  // float32, the tensor's dtype.
}

TEST(PlanPiecesTest, RefusalsNameWhatIsWrong) {
  const PlannedTensor t = Tensor2d({4, 4}, {{0, 0, 4, 4}});
  EXPECT_THAT(PlanPieces({t}, {Target({{0, {2, 0}, {4, 4}, {}}}, {4, 4})}),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("tensor t")));
  EXPECT_THAT(PlanPieces({t}, {Target({{0, {0, 0}, {4, 4}, {1, 0}}}, {4, 4})}),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("out")));
  EXPECT_THAT(
      PlanPieces({t}, {Target({{0, {0, 0}, {2, 4}, {0, 0}},
                               {0, {2, 0}, {2, 4}, {1, 0}}},
                              {4, 4})}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("overlap")));
  EXPECT_THAT(PlanPieces({t}, {Target({{0, {0, 0}, {4, 4}, {}}}, {4, 4},
                                      DType::kInt64)}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("only floating types")));
  EXPECT_THAT(PlanPieces({t}, {Target({{0, {0, 0}, {4, 4}, {}}}, {4, 4, 1})}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dims")));
  EXPECT_THAT(
      PlanPieces({t}, {Target({{3, {0, 0}, {4, 4}, {}}}, {4, 4})}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no tensor")));
}

TEST(PlanPiecesTest, CastsAllowedBetweenFloatingTypesOnly) {
  EXPECT_TRUE(PlanCastAllowed(DType::kFloat32, DType::kBFloat16));
  EXPECT_TRUE(PlanCastAllowed(DType::kBFloat16, DType::kFloat32));
  EXPECT_TRUE(PlanCastAllowed(DType::kFloat16, DType::kFloat64));
  EXPECT_TRUE(PlanCastAllowed(DType::kInt32, DType::kInt32));
  EXPECT_FALSE(PlanCastAllowed(DType::kInt32, DType::kFloat32));
  EXPECT_FALSE(PlanCastAllowed(DType::kFloat32, DType::kInt8));
}

}  // namespace
}  // namespace tessera
