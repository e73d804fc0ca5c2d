#include "common/proto_convert.h"

#include <functional>
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

// The packed form ranks exchange: every kind of shard survives the trip,
// and each distinct placement is sent once.
TEST(ProtoConvertTest, PackedMetadataRoundTrips) {
  ShardedTensorMetadata metadata;
  metadata.size = {8, 6};
  metadata.tensor_properties.dtype = DType::kFloat64;
  metadata.tensor_properties.requires_grad = true;
  const auto add = [&](std::vector<int64_t> offsets, std::vector<int64_t> sizes,
                       const char* placement) {
    ASSERT_OK_AND_ASSIGN(
        ShardMetadata shard,
        placement == nullptr
            ? ShardMetadata::Create(offsets, sizes)
            : ShardMetadata::Create(offsets, sizes, placement));
    metadata.shards_metadata.push_back(shard);
  };
  add({0, 0}, {4, 6}, "rank:0/cpu");
  add({4, 0}, {2, 6}, "rank:0/cpu");
  add({6, 0}, {2, 3}, "worker2/cuda:1");
  add({6, 3}, {2, 3}, nullptr);
  add({0, 0, 0}, {1, 2, 3}, "rank:0/cpu");  // another rank: Parse allows it
  add({8, 6}, {0, 0}, "rank:1/cpu");
  const std::string bytes = SerializeMetadata(metadata);
  ASSERT_OK_AND_ASSIGN(ShardedTensorMetadata back, DeserializeMetadata(bytes));
  EXPECT_EQ(metadata, back);

  v1::PackedShardedTensorMetadata packed;
  ASSERT_TRUE(packed.ParseFromString(bytes));
  EXPECT_EQ(3, packed.placements_size());
  EXPECT_THAT(packed.placement_index(),
              ::testing::ElementsAre(1, 1, 2, 0, 1, 3));

  // In two steps, onto shards already there.
  ASSERT_OK_AND_ASSIGN(PackedMetadata parsed, PackedMetadata::Parse(bytes));
  EXPECT_EQ(6u, parsed.shard_count());
  EXPECT_TRUE(parsed.header().shards_metadata.empty());
  EXPECT_EQ(metadata.size, parsed.header().size);
  std::vector<ShardMetadata> shards = {metadata.shards_metadata.back()};
  ASSERT_OK(parsed.AppendShardsTo(&shards));
  ASSERT_EQ(7u, shards.size());
  EXPECT_EQ(metadata.shards_metadata[2], shards[3]);

  ShardedTensorMetadata empty;
  empty.tensor_properties.dtype = DType::kInt8;
  ASSERT_OK_AND_ASSIGN(ShardedTensorMetadata empty_back,
                       DeserializeMetadata(SerializeMetadata(empty)));
  EXPECT_EQ(empty, empty_back);
}

// Packed bytes from a peer are checked as a request would be: every
// inconsistency is INVALID_ARGUMENT naming its field, never a crash.
TEST(ProtoConvertTest, MalformedPackedMetadataNamesTheField) {
  EXPECT_THAT(DeserializeMetadata("\xff\xff\xff"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("PackedShardedTensorMetadata")));
  const auto good = [] {
    v1::PackedShardedTensorMetadata packed;
    packed.add_size(4);
    packed.mutable_tensor_properties()->set_dtype(v1::DTYPE_FLOAT32);
    packed.mutable_tensor_properties()->set_layout(v1::LAYOUT_STRIDED);
    packed.mutable_tensor_properties()->set_memory_format(
        v1::MEMORY_FORMAT_CONTIGUOUS);
    packed.add_shard_dims(1);
    packed.add_shard_offsets(0);
    packed.add_shard_sizes(4);
    packed.add_placement_index(1);
    v1::RemoteDevice* device = packed.add_placements();
    device->set_rank(0);
    device->mutable_device()->set_type(v1::DEVICE_TYPE_CPU);
    return packed;
  };
  const auto decode = [](const v1::PackedShardedTensorMetadata& packed) {
    return DeserializeMetadata(packed.SerializeAsString());
  };
  ASSERT_OK(decode(good()).status());
  struct Case {
    const char* field;
    std::function<void(v1::PackedShardedTensorMetadata&)> spoil;
  };
  const std::vector<Case> cases = {
      {"size", [](auto& p) { p.set_size(0, -1); }},
      {"tensor_properties", [](auto& p) { p.clear_tensor_properties(); }},
      {"tensor_properties",
       [](auto& p) {
         p.mutable_tensor_properties()->set_dtype(v1::DType(99));
       }},
      {"placement_index", [](auto& p) { p.add_placement_index(0); }},
      {"placement_index[0]", [](auto& p) { p.set_placement_index(0, 2); }},
      {"shard_offsets", [](auto& p) { p.set_shard_dims(0, 2); }},
      {"shard_offsets", [](auto& p) { p.add_shard_sizes(1); }},
      {"shard_offsets", [](auto& p) { p.set_shard_dims(0, 4294967295u); }},
      {"shards_metadata[0]", [](auto& p) { p.set_shard_offsets(0, -3); }},
      {"shards_metadata[0]", [](auto& p) { p.set_shard_sizes(0, -3); }},
      {"placements[0]", [](auto& p) { p.mutable_placements(0)->set_rank(-2); }},
      {"placements[0]",
       [](auto& p) { p.mutable_placements(0)->clear_device(); }},
  };
  for (const Case& c : cases) {
    v1::PackedShardedTensorMetadata packed = good();
    c.spoil(packed);
    EXPECT_THAT(decode(packed), StatusIs(absl::StatusCode::kInvalidArgument,
                                         HasSubstr(c.field)))
        << packed.ShortDebugString();
  }
}

}  // namespace
}  // namespace tessera
