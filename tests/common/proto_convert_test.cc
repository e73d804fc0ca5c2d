#include "common/proto_convert.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

TEST(ProtoConvertTest, DTypesMapOneToOne) {
  for (DType dtype : kAllDTypes) {
    ASSERT_OK_AND_ASSIGN(DType back, FromProto(ToProto(dtype)));
    EXPECT_EQ(dtype, back) << DTypeName(dtype);
  }
  EXPECT_THAT(FromProto(v1::DTYPE_UNSPECIFIED),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("unspecified dtype")));
  EXPECT_THAT(FromProto(static_cast<v1::DType>(99)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("99")));
}

TEST(ProtoConvertTest, RemoteDevicesRoundTrip) {
  for (const char* text : {"rank:0/cpu", "rank:3/cuda:3", "worker2/cuda:2",
                           "cuda:1", "cuda", "rank:1/meta"}) {
    ASSERT_OK_AND_ASSIGN(RemoteDevice device, RemoteDevice::Parse(text));
    const v1::RemoteDevice proto = ToProto(device);
    ASSERT_OK_AND_ASSIGN(RemoteDevice back, FromProto(proto));
    EXPECT_EQ(device, back) << text;
  }
  ASSERT_OK_AND_ASSIGN(RemoteDevice rank0, RemoteDevice::Parse("rank:0/cpu"));
  EXPECT_EQ(v1::RemoteDevice::kRank, ToProto(rank0).owner_case())
      << "rank 0 must stay distinguishable from no owner";
}

TEST(ProtoConvertTest, MalformedMessagesNameTheField) {
  v1::RemoteDevice device;
  EXPECT_THAT(FromProto(device), StatusIs(absl::StatusCode::kInvalidArgument,
                                          HasSubstr("device: missing")));
  device.mutable_device()->set_type(v1::DEVICE_TYPE_CUDA);
  device.mutable_device()->set_index(-2);
  EXPECT_THAT(FromProto(device), StatusIs(absl::StatusCode::kInvalidArgument,
                                          HasSubstr("device.index")));
  device.mutable_device()->set_index(0);
  device.set_rank(-1);
  EXPECT_THAT(FromProto(device), StatusIs(absl::StatusCode::kInvalidArgument,
                                          HasSubstr("rank: must be >= 0")));
  device.set_worker_name("a/b");
  EXPECT_THAT(FromProto(device), StatusIs(absl::StatusCode::kInvalidArgument,
                                          HasSubstr("worker_name")));

  v1::ShardedTensorMetadata metadata;
  metadata.add_size(10);
  metadata.mutable_tensor_properties()->set_dtype(v1::DTYPE_FLOAT32);
  metadata.mutable_tensor_properties()->set_layout(v1::LAYOUT_STRIDED);
  metadata.mutable_tensor_properties()->set_memory_format(
      v1::MEMORY_FORMAT_CONTIGUOUS);
  ASSERT_OK_AND_ASSIGN(ShardedTensorMetadata ok, FromProto(metadata));
  EXPECT_EQ(std::vector<int64_t>{10}, ok.size);

  v1::ShardMetadata* shard = metadata.add_shards_metadata();
  shard->add_shard_offsets(0);
  shard->add_shard_sizes(-4);
  EXPECT_THAT(FromProto(metadata), StatusIs(absl::StatusCode::kInvalidArgument,
                                            HasSubstr("shards_metadata[0].")));
  shard->set_shard_sizes(0, 4);
  shard->add_shard_sizes(1);
  EXPECT_THAT(FromProto(metadata),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("same number of elements")));

  metadata.set_size(0, -10);
  EXPECT_THAT(FromProto(metadata), StatusIs(absl::StatusCode::kInvalidArgument,
                                            HasSubstr("size: must be >= 0")));
  metadata.set_size(0, 10);
  metadata.mutable_tensor_properties()->set_layout(v1::LAYOUT_UNSPECIFIED);
  EXPECT_THAT(FromProto(metadata),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tensor_properties.layout")));
}

TEST(ProtoConvertTest, ShardingSpecsRoundTrip) {
  ASSERT_OK_AND_ASSIGN(
      ChunkShardingSpec chunk,
      ChunkShardingSpec::Create(
          -1, std::vector<std::string>{"rank:0/cpu", "worker1/cuda:1"}));
  ASSERT_OK_AND_ASSIGN(ShardingSpec chunk_back,
                       FromProto(ToProto(ShardingSpec(chunk))));
  EXPECT_EQ(ShardingSpec(chunk), chunk_back);

  ASSERT_OK_AND_ASSIGN(
      EnumerableShardingSpec enumerable,
      EnumerableShardingSpec::Create(
          {*ShardMetadata::Create({0, 0}, {2, 4}, "rank:0/cpu"),
           *ShardMetadata::Create({2, 0}, {2, 4}, "rank:1/cpu")}));
  ASSERT_OK_AND_ASSIGN(ShardingSpec enumerable_back,
                       FromProto(ToProto(ShardingSpec(enumerable))));
  EXPECT_EQ(ShardingSpec(enumerable), enumerable_back);
}

TEST(ProtoConvertTest, ShardingSpecsAreValidatedOnArrival) {
  v1::ShardingSpec spec;
  EXPECT_THAT(FromProto(spec), StatusIs(absl::StatusCode::kInvalidArgument,
                                        HasSubstr("spec: missing")));
  spec.mutable_chunk()->set_dim_name("H");
  EXPECT_THAT(FromProto(spec),
              StatusIs(absl::StatusCode::kUnimplemented,
                       HasSubstr("does not support named dimension")));
  spec.mutable_chunk()->set_dim_index(0);
  EXPECT_THAT(FromProto(spec), StatusIs(absl::StatusCode::kInvalidArgument,
                                        HasSubstr("at least one placement")));

  // Overlapping shards sent by a peer are refused like local ones.
  v1::EnumerableShardingSpec* enumerable = spec.mutable_enumerable();
  for (int i = 0; i < 2; ++i) {
    v1::ShardMetadata* shard = enumerable->add_shards();
    shard->add_shard_offsets(i * 3);
    shard->add_shard_sizes(5);
  }
  EXPECT_THAT(FromProto(spec), StatusIs(absl::StatusCode::kInvalidArgument,
                                        HasSubstr("overlap")));
}

}  // namespace
}  // namespace tessera
