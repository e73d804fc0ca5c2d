#include "common/shard_metadata.h"

#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int kGroup[] = {0, 1, 2, 3};

// Port of TestShardMetadata.test_shard_metadata_init: metadata without a
// placement is valid until a placement is needed.
TEST(TestShardMetadata, ShardMetadataInit) {
  ASSERT_OK_AND_ASSIGN(ShardMetadata md, ShardMetadata::Create({10}, {0}));
  EXPECT_FALSE(md.placement().has_value());
  EXPECT_THAT(ParseAndValidateRemoteDevice(kGroup, md.placement()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("remote device is None")));

  ASSERT_OK_AND_ASSIGN(md, ShardMetadata::Create({10}, {0}, "rank:0/cpu"));
  ASSERT_OK_AND_ASSIGN(RemoteDevice expected,
                       RemoteDevice::Parse("rank:0/cpu"));
  EXPECT_EQ(expected, md.placement());
  ASSERT_OK_AND_ASSIGN(auto rank_and_device,
                       ParseAndValidateRemoteDevice(kGroup, md.placement()));
  EXPECT_EQ(0, rank_and_device.first);
  EXPECT_EQ(Device::Cpu(), rank_and_device.second);
}

// Port of TestShardMetadata.test_create_shard_with_no_placement.
TEST(TestShardMetadata, CreateShardWithNoPlacement) {
  ASSERT_OK_AND_ASSIGN(ShardMetadata md, ShardMetadata::Create({0}, {10}));
  ASSERT_OK_AND_ASSIGN(Tensor zeros, Tensor::Zeros({10}));
  Shard shard{zeros, md};
  EXPECT_FALSE(shard.metadata.placement().has_value());
  EXPECT_EQ(10, shard.tensor.numel());
}

TEST(ShardMetadataTest, RejectsWhatPyTorchRejects) {
  EXPECT_THAT(ShardMetadata::Create({0, 0}, {5}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("should have the same number of elements, "
                                 "found 2 and 1")));
  EXPECT_THAT(ShardMetadata::Create({-1}, {5}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("shard_offsets should be >=0")));
  EXPECT_THAT(ShardMetadata::Create({0}, {-5}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("shard_sizes should be >= 0")));
  EXPECT_THAT(ShardMetadata::Create({0}, {5}, "rank:0/gpu"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("Could not parse remote_device")));
}

TEST(ShardMetadataTest, PrintsLikePyTorch) {
  ASSERT_OK_AND_ASSIGN(ShardMetadata md,
                       ShardMetadata::Create({0, 5}, {5, 5}, "rank:1/cuda:1"));
  EXPECT_EQ(
      "ShardMetadata(shard_offsets=[0, 5], shard_sizes=[5, 5], "
      "placement=rank:1/cuda:1)",
      md.ToString());
  EXPECT_EQ(25, md.numel());
  ASSERT_OK_AND_ASSIGN(ShardMetadata empty,
                       ShardMetadata::Create({3, 0}, {0, 20}));
  EXPECT_EQ(0, empty.numel());
  EXPECT_THAT(empty.ToString(), HasSubstr("placement=None"));
}

class FixedResolver : public WorkerResolver {
 public:
  std::optional<int> RankOf(absl::string_view name) const override {
    auto it = ranks_.find(std::string(name));
    if (it == ranks_.end()) return std::nullopt;
    return it->second;
  }

 private:
  std::map<std::string, int> ranks_ = {{"worker0", 0}, {"worker1", 1}};
};

// The validation half of test_invalid_sharding, test_new_group and
// TestShardedTensorSubGroupInit.test_sub_process_group_placement_validation;
// the process-group halves run in the rank runtime's tests.
TEST(ShardMetadataTest, ValidatesPlacementsAgainstTheGroup) {
  ASSERT_OK_AND_ASSIGN(RemoteDevice rank5,
                       RemoteDevice::Parse("rank:5/cuda:1"));
  EXPECT_THAT(ParseAndValidateRemoteDevice(kGroup, rank5),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("Global rank 5 does not exist in input "
                                 "process group: [0, 1, 2, 3]")));
  // A caller outside the group cannot judge its ranks and skips the check.
  EXPECT_TRUE(ParseAndValidateRemoteDevice({1, 3}, rank5, nullptr,
                                           /*rank_in_group=*/false)
                  .ok());
  for (int r : {0, 2}) {
    ASSERT_OK_AND_ASSIGN(RemoteDevice device,
                         RemoteDevice::Parse("rank:" + std::to_string(r) +
                                             "/cuda:" + std::to_string(r % 2)));
    ASSERT_OK_AND_ASSIGN(auto parsed,
                         ParseAndValidateRemoteDevice({0, 2}, device));
    EXPECT_EQ(r, parsed.first);
    EXPECT_EQ(Device::Cuda(r % 2), parsed.second);
  }

  ASSERT_OK_AND_ASSIGN(RemoteDevice worker,
                       RemoteDevice::Parse("worker1/cuda:1"));
  EXPECT_THAT(ParseAndValidateRemoteDevice(kGroup, worker),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("RPC framework needs to be initialized for "
                                 "using worker names: worker1")));
  FixedResolver resolver;
  ASSERT_OK_AND_ASSIGN(auto resolved,
                       ParseAndValidateRemoteDevice(kGroup, worker, &resolver));
  EXPECT_EQ(1, resolved.first);
  ASSERT_OK_AND_ASSIGN(RemoteDevice foo,
                       RemoteDevice::Parse("workerfoo/cuda:1"));
  EXPECT_THAT(ParseAndValidateRemoteDevice(kGroup, foo, &resolver),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("Invalid worker name: workerfoo")));
}

}  // namespace
}  // namespace tessera
