#include "common/sharded_tensor_metadata.h"

#include <string>
#include <vector>

#include "common/proto_convert.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

std::vector<ShardMetadata> GridShards() {
  std::vector<ShardMetadata> shards;
  const int64_t offsets[4][2] = {{0, 0}, {0, 5}, {5, 0}, {5, 5}};
  for (int r = 0; r < 4; ++r) {
    shards.push_back(*ShardMetadata::Create(
        {offsets[r][0], offsets[r][1]}, {5, 5},
        "rank:" + std::to_string(r) + "/cuda:" + std::to_string(r)));
  }
  return shards;
}

// Port of TestShardedTensorMetadata.test_serialize_and_deserialize: every
// combination of dtype x layout x requires_grad x memory_format x
// pin_memory survives serialization (protobuf here, pickle there).
TEST(TestShardedTensorMetadata, SerializeAndDeserialize) {
  const std::vector<ShardMetadata> shards = GridShards();
  int combinations = 0;
  for (DType dtype : kAllDTypes) {
    for (Layout layout : {Layout::kStrided, Layout::kSparseCoo}) {
      for (bool requires_grad : {true, false}) {
        for (MemoryFormat memory_format :
             {MemoryFormat::kContiguous, MemoryFormat::kChannelsLast,
              MemoryFormat::kPreserve}) {
          for (bool pin_memory : {true, false}) {
            const ShardedTensorMetadata expected{
                shards,
                {10, 10},
                TensorProperties{dtype, layout, requires_grad, memory_format,
                                 pin_memory}};
            const std::string bytes = SerializeMetadata(expected);
            ASSERT_OK_AND_ASSIGN(ShardedTensorMetadata actual,
                                 DeserializeMetadata(bytes));
            EXPECT_EQ(expected, actual) << expected;
            ++combinations;
          }
        }
      }
    }
  }
  EXPECT_EQ(12 * 2 * 2 * 3 * 2, combinations);
}

TEST(ShardedTensorMetadataTest, EqualityLooksAtEveryField) {
  const ShardedTensorMetadata base{GridShards(), {10, 10}, {}};
  ShardedTensorMetadata other = base;
  EXPECT_EQ(base, other);
  other.size = {10, 11};
  EXPECT_NE(base, other);
  other = base;
  other.tensor_properties.pin_memory = true;
  EXPECT_NE(base, other);
  other = base;
  other.shards_metadata[3].set_placement(std::nullopt);
  EXPECT_NE(base, other);
}

TEST(ShardedTensorMetadataTest, PrintsShardsSizeAndProperties) {
  const ShardedTensorMetadata metadata{{GridShards()[0]}, {10, 10}, {}};
  EXPECT_EQ(
      "ShardedTensorMetadata(shards_metadata=[ShardMetadata(shard_offsets=[0, "
      "0], shard_sizes=[5, 5], placement=rank:0/cuda:0)], size=[10, 10], "
      "tensor_properties=TensorProperties(dtype=torch.float32, "
      "layout=torch.strided, requires_grad=False, "
      "memory_format=torch.contiguous_format, pin_memory=False))",
      metadata.ToString());
}

TEST(ShardedTensorMetadataTest, MalformedBytesAreRejected) {
  EXPECT_THAT(DeserializeMetadata("\xff\xff\xff garbage"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("Malformed ShardedTensorMetadata")));
  // Valid protobuf, but no tensor properties: a peer's bug, not a crash.
  EXPECT_THAT(DeserializeMetadata(""),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tensor_properties: missing")));
}

}  // namespace
}  // namespace tessera
