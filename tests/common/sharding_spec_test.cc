#include "common/sharding_spec.h"

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/int_math.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::string> CudaPlacements(int n) {
  std::vector<std::string> placements;
  for (int r = 0; r < n; ++r) {
    placements.push_back("rank:" + std::to_string(r % 4) +
                         "/cuda:" + std::to_string(r % 4));
  }
  return placements;
}

ShardedTensorMetadata Build(int64_t dim, const std::vector<std::string>& p,
                            std::vector<int64_t> sizes) {
  absl::StatusOr<ChunkShardingSpec> spec = ChunkShardingSpec::Create(dim, p);
  EXPECT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<ShardedTensorMetadata> metadata = spec->BuildMetadata(sizes);
  EXPECT_TRUE(metadata.ok()) << metadata.status();
  return *metadata;
}

std::vector<int64_t> DimSizes(const ShardedTensorMetadata& m, size_t d) {
  std::vector<int64_t> out;
  for (const ShardMetadata& s : m.shards_metadata)
    out.push_back(s.shard_sizes()[d]);
  return out;
}

std::vector<int64_t> DimOffsets(const ShardedTensorMetadata& m, size_t d) {
  std::vector<int64_t> out;
  for (const ShardMetadata& s : m.shards_metadata) {
    out.push_back(s.shard_offsets()[d]);
  }
  return out;
}

// torch.chunk semantics: 10 over 4 -> 3,3,3,1; 9 -> 3,3,3,0; 2 -> 1,1,0,0.
TEST(TestChunkShardingSpec, ChunkSizesFollowTorchChunk) {
  EXPECT_THAT(DimSizes(Build(0, CudaPlacements(4), {10, 20}), 0),
              ElementsAre(3, 3, 3, 1));
  EXPECT_THAT(DimSizes(Build(0, CudaPlacements(4), {9, 12}), 0),
              ElementsAre(3, 3, 3, 0));
  EXPECT_THAT(DimSizes(Build(0, CudaPlacements(4), {0, 12}), 0),
              ElementsAre(0, 0, 0, 0));
  EXPECT_THAT(DimSizes(Build(0, CudaPlacements(3), {1, 1}), 0),
              ElementsAre(1, 0, 0));
}

// Sizes near int64's limit (a client may send any) chunk without
// overflowing: the pieces still tile the dimension exactly.
TEST(TestChunkShardingSpec, ChunkingNeverOverflowsAtInt64Limits) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  for (int64_t dim_size : {kMax, kMax - 1, kMax / 2 + 1, int64_t{1} << 62}) {
    for (int chunks : {1, 2, 3, 4, 7}) {
      SCOPED_TRACE(absl::StrCat(dim_size, " into ", chunks));
      const ShardedTensorMetadata m =
          Build(0, CudaPlacements(chunks), {dim_size, 0});
      int64_t next = 0;
      for (const ShardMetadata& shard : m.shards_metadata) {
        if (shard.shard_sizes()[0] == 0) continue;
        EXPECT_EQ(next, shard.shard_offsets()[0]);
        ASSERT_LE(shard.shard_sizes()[0], dim_size - next);
        next += shard.shard_sizes()[0];
      }
      EXPECT_EQ(dim_size, next);
    }
  }
  EXPECT_EQ(1, CeilDiv(kMax, kMax));
  EXPECT_EQ(2, CeilDiv(kMax, kMax - 15));
  EXPECT_EQ(kMax, CeilDiv(kMax, 1));
  EXPECT_EQ(0, CeilDiv(0, kMax));
  EXPECT_EQ(kMax / 2 + 1, ChunkSplitSize(kMax, 2));
  EXPECT_EQ(kMax / 2, ChunkedDimSize(kMax, kMax / 2 + 1, 1));
  EXPECT_EQ(0, ChunkedDimSize(kMax, kMax / 2 + 1, 2));
  EXPECT_EQ(0, ChunkedDimSize(kMax, kMax, 3));
  EXPECT_EQ(0, ChunkedDimSize(0, 0, 1));
}

// Metadata half of TestShardedTensorChunked.test_complete_world_size.
TEST(TestChunkShardingSpec, CompleteWorldSize) {
  for (int64_t dim : {0, -2}) {
    const ShardedTensorMetadata m = Build(dim, CudaPlacements(4), {10, 20});
    EXPECT_THAT(m.size, ElementsAre(10, 20));
    ASSERT_EQ(4u, m.shards_metadata.size());
    for (int rank = 0; rank < 4; ++rank) {
      const ShardMetadata& shard = m.shards_metadata[rank];
      EXPECT_THAT(shard.shard_offsets(), ElementsAre(rank * 3, 0));
      EXPECT_THAT(shard.shard_sizes(), ElementsAre(rank == 3 ? 1 : 3, 20));
      EXPECT_EQ(
          "rank:" + std::to_string(rank) + "/cuda:" + std::to_string(rank),
          shard.placement()->ToString());
    }
  }
}

// Metadata half of TestShardedTensorChunked.test_insufficient_sharding_dims:
// empty trailing chunks keep torch's offsets, past the end of the tensor.
TEST(TestChunkShardingSpec, InsufficientShardingDims) {
  const ShardedTensorMetadata m = Build(0, CudaPlacements(4), {2, 20});
  EXPECT_THAT(DimOffsets(m, 0), ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(DimSizes(m, 0), ElementsAre(1, 1, 0, 0));
  EXPECT_THAT(DimSizes(m, 1), ElementsAre(20, 20, 20, 20));
}

// Metadata half of TestShardTensor.test_shard_tensor_with_empty_shard.
TEST(TestChunkShardingSpec, ShardTensorWithEmptyShard) {
  const ShardedTensorMetadata m = Build(0, CudaPlacements(4), {9, 12});
  ASSERT_EQ(4u, m.shards_metadata.size());
  for (const ShardMetadata& sm : m.shards_metadata) {
    EXPECT_LE(sm.shard_offsets()[0] + sm.shard_sizes()[0], 9);
  }
  EXPECT_THAT(m.shards_metadata[3].shard_sizes(), ElementsAre(0, 12));
}

// Metadata half of TestShardedTensorChunked.test_multiple_local_shards.
TEST(TestChunkShardingSpec, MultipleLocalShards) {
  const ShardedTensorMetadata m = Build(0, CudaPlacements(8), {16, 20});
  ASSERT_EQ(8u, m.shards_metadata.size());
  for (int i = 0; i < 8; ++i) {
    EXPECT_THAT(m.shards_metadata[i].shard_offsets(), ElementsAre(i * 2, 0));
    EXPECT_THAT(m.shards_metadata[i].shard_sizes(), ElementsAre(2, 20));
    EXPECT_EQ(
        "rank:" + std::to_string(i % 4) + "/cuda:" + std::to_string(i % 4),
        m.shards_metadata[i].placement()->ToString());
  }
}

// Metadata half of TestShardedTensorChunked.test_sharding_columns.
TEST(TestChunkShardingSpec, ShardingColumns) {
  for (int64_t dim : {1, -1}) {
    const ShardedTensorMetadata m = Build(dim, CudaPlacements(4), {10, 32});
    EXPECT_THAT(DimSizes(m, 1), ElementsAre(8, 8, 8, 8));
    EXPECT_THAT(DimOffsets(m, 1), ElementsAre(0, 8, 16, 24));
    EXPECT_THAT(DimSizes(m, 0), ElementsAre(10, 10, 10, 10));
  }
}

// Metadata half of TestShardedTensorChunked.test_partial_world_size.
TEST(TestChunkShardingSpec, PartialWorldSize) {
  const ShardedTensorMetadata m =
      Build(0, {"rank:2/cuda:2", "rank:3/cuda:3"}, {10, 20});
  ASSERT_EQ(2u, m.shards_metadata.size());
  for (int i = 0; i < 2; ++i) {
    EXPECT_THAT(m.shards_metadata[i].shard_offsets(), ElementsAre(i * 5, 0));
    EXPECT_THAT(m.shards_metadata[i].shard_sizes(), ElementsAre(5, 20));
    EXPECT_EQ(
        "rank:" + std::to_string(i + 2) + "/cuda:" + std::to_string(i + 2),
        m.shards_metadata[i].placement()->ToString());
  }
}

// Metadata half of TestShardedTensorChunked.test_sharded_tensor_sizes.
TEST(TestChunkShardingSpec, ShardedTensorSizes) {
  EXPECT_THAT(Build(0, CudaPlacements(4), {10}).size, ElementsAre(10));
  EXPECT_THAT(DimSizes(Build(0, CudaPlacements(4), {10}), 0),
              ElementsAre(3, 3, 3, 1));
  const ShardedTensorMetadata three_d = Build(1, CudaPlacements(4), {2, 7, 3});
  EXPECT_THAT(DimSizes(three_d, 1), ElementsAre(2, 2, 2, 1));
  EXPECT_THAT(three_d.shards_metadata[3].shard_offsets(), ElementsAre(0, 6, 0));
}

// Spec half of TestShardedTensorChunked.test_invalid_sharding.
TEST(TestChunkShardingSpec, InvalidSharding) {
  EXPECT_THAT(ChunkShardingSpec::CreateNamed("H", {"rank:1/cuda:1"}),
              StatusIs(absl::StatusCode::kUnimplemented,
                       HasSubstr("does not support named dimension")));
  for (int64_t dim : {2, 3, 4, -3, -4, -5}) {
    ASSERT_OK_AND_ASSIGN(ChunkShardingSpec spec,
                         ChunkShardingSpec::Create(
                             dim, std::vector<std::string>{"rank:1/cuda:1"}));
    EXPECT_THAT(
        spec.BuildMetadata({10, 20}),
        StatusIs(absl::StatusCode::kInvalidArgument,
                 HasSubstr("Invalid sharding dim: " + std::to_string(dim))));
  }
  EXPECT_THAT(ChunkShardingSpec::Create(0, std::vector<std::string>{}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("at least one placement")));
  EXPECT_THAT(
      ChunkShardingSpec::Create(0, std::vector<std::string>{"rank:x/cuda:1"}),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("Could not parse remote_device: rank:x/cuda:1")));
  ASSERT_OK_AND_ASSIGN(
      ChunkShardingSpec scalar,
      ChunkShardingSpec::Create(0, std::vector<std::string>{"rank:0/cpu"}));
  EXPECT_THAT(scalar.BuildMetadata({}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("Invalid sharding dim: 0")));
}

TEST(TestChunkShardingSpec, PropertiesTravelWithTheMetadata) {
  ASSERT_OK_AND_ASSIGN(
      ChunkShardingSpec spec,
      ChunkShardingSpec::Create(0, std::vector<std::string>{"rank:0/cpu"}));
  TensorProperties properties;
  properties.dtype = DType::kFloat64;
  properties.requires_grad = true;
  ASSERT_OK_AND_ASSIGN(ShardedTensorMetadata m,
                       spec.BuildMetadata({4, 4}, properties));
  EXPECT_EQ(properties, m.tensor_properties);
  EXPECT_EQ("chunk", ShardingSpecKind(spec));
}

std::vector<ShardMetadata> Shards(
    const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>&
        boxes) {
  std::vector<ShardMetadata> shards;
  for (size_t i = 0; i < boxes.size(); ++i) {
    shards.push_back(*ShardMetadata::Create(
        boxes[i].first, boxes[i].second,
        "rank:" + std::to_string(i) + "/cuda:" + std::to_string(i)));
  }
  return shards;
}

// Metadata half of TestShardedTensorEnumerable.test_grid_sharding.
TEST(TestEnumerableShardingSpec, GridSharding) {
  ASSERT_OK_AND_ASSIGN(
      EnumerableShardingSpec spec,
      EnumerableShardingSpec::Create(Shards({{{0, 0}, {5, 5}},
                                             {{0, 5}, {5, 5}},
                                             {{5, 0}, {5, 5}},
                                             {{5, 5}, {5, 5}}})));
  ASSERT_OK_AND_ASSIGN(ShardedTensorMetadata m, spec.BuildMetadata({10, 10}));
  ASSERT_EQ(4u, m.shards_metadata.size());
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_THAT(m.shards_metadata[rank].shard_offsets(),
                ElementsAre(rank / 2 * 5, rank % 2 * 5));
    EXPECT_THAT(m.shards_metadata[rank].shard_sizes(), ElementsAre(5, 5));
  }
  EXPECT_EQ("enumerable", ShardingSpecKind(spec));
}

// Metadata half of TestShardedTensorEnumerable.test_uneven_shards.
TEST(TestEnumerableShardingSpec, UnevenShards) {
  ASSERT_OK_AND_ASSIGN(
      EnumerableShardingSpec spec,
      EnumerableShardingSpec::Create(Shards({{{0, 0}, {2, 4}},
                                             {{0, 4}, {4, 2}},
                                             {{2, 0}, {4, 4}},
                                             {{4, 4}, {2, 2}}})));
  ASSERT_OK_AND_ASSIGN(ShardedTensorMetadata m, spec.BuildMetadata({6, 6}));
  EXPECT_THAT(m.shards_metadata[1].shard_offsets(), ElementsAre(0, 4));
  EXPECT_THAT(m.shards_metadata[1].shard_sizes(), ElementsAre(4, 2));
  EXPECT_THAT(m.shards_metadata[3].shard_offsets(), ElementsAre(4, 4));
}

// Layout half of test_init_from_local_shards_invalid_shards_overlap: rank
// 0's shard grows to 6x6.
TEST(TestEnumerableShardingSpec, InvalidShardsOverlap) {
  EXPECT_THAT(
      EnumerableShardingSpec::Create(Shards({{{0, 0}, {6, 6}},
                                             {{0, 5}, {5, 5}},
                                             {{5, 0}, {5, 5}},
                                             {{5, 5}, {5, 5}}})),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("overlap")));
}

// Layout half of test_init_from_local_shards_invalid_shards_gaps: rank 0's
// shard shrinks to 4x4.
TEST(TestEnumerableShardingSpec, InvalidShardsGaps) {
  ASSERT_OK_AND_ASSIGN(
      EnumerableShardingSpec spec,
      EnumerableShardingSpec::Create(Shards({{{0, 0}, {4, 4}},
                                             {{0, 5}, {5, 5}},
                                             {{5, 0}, {5, 5}},
                                             {{5, 5}, {5, 5}}})));
  EXPECT_THAT(spec.BuildMetadata({10, 10}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("does not match tensor volume")));
}

TEST(TestEnumerableShardingSpec, ConstructionErrors) {
  EXPECT_THAT(EnumerableShardingSpec::Create({}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("Empty shard list provided")));
  EXPECT_THAT(
      EnumerableShardingSpec::Create(
          Shards({{{0, 0}, {5, 5}}, {{5, 0, 0}, {5, 5, 5}}})),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("Found inconsistent ranks for shards: 2 and 3")));
  ASSERT_OK_AND_ASSIGN(
      EnumerableShardingSpec spec,
      EnumerableShardingSpec::Create(Shards({{{0, 0}, {5, 5}}})));
  EXPECT_THAT(spec.BuildMetadata({5, 5, 5}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("Rank of tensor is 3, but shards rank is 2")));
  EXPECT_THAT(spec.BuildMetadata({4, 5}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("Shard offset 0 and length 5 exceeds tensor "
                                 "dim: 4 for shard ShardMetadata(")));
}

}  // namespace
}  // namespace tessera
