#include "common/device.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

TEST(DeviceTest, ParsesAndPrintsEveryForm) {
  for (const char* text :
       {"cpu", "cpu:0", "cuda", "cuda:0", "cuda:7", "meta"}) {
    ASSERT_OK_AND_ASSIGN(Device device, Device::Parse(text));
    EXPECT_EQ(text, device.ToString());
  }
  ASSERT_OK_AND_ASSIGN(Device cuda3, Device::Parse("cuda:3"));
  EXPECT_TRUE(cuda3.is_cuda());
  EXPECT_EQ(3, cuda3.index());
  EXPECT_EQ(Device::Cuda(3), cuda3);
  EXPECT_NE(Device::Cuda(), cuda3);
  EXPECT_EQ(Device::Cpu(), Device());
}

TEST(DeviceTest, MalformedDeviceNamesTheString) {
  for (const char* text : {"", "gpu", "cuda:", "cuda:-1", "cuda:x", "cuda:1:2",
                           "meta:0", "CPU", " cpu", "cuda:99999999999"}) {
    EXPECT_THAT(Device::Parse(text),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(std::string("Invalid device string: '") +
                                   text + "'")))
        << text;
  }
}

TEST(RemoteDeviceTest, ParsesRankWorkerAndLocalForms) {
  ASSERT_OK_AND_ASSIGN(RemoteDevice by_rank,
                       RemoteDevice::Parse("rank:3/cuda:3"));
  EXPECT_EQ(3, by_rank.rank());
  EXPECT_FALSE(by_rank.worker_name().has_value());
  EXPECT_EQ(Device::Cuda(3), by_rank.device());

  ASSERT_OK_AND_ASSIGN(RemoteDevice by_name,
                       RemoteDevice::Parse("worker2/cuda:2"));
  EXPECT_EQ("worker2", by_name.worker_name());
  EXPECT_FALSE(by_name.rank().has_value());

  ASSERT_OK_AND_ASSIGN(RemoteDevice bare_worker,
                       RemoteDevice::Parse("worker0"));
  EXPECT_EQ("worker0/cpu", bare_worker.ToString());

  ASSERT_OK_AND_ASSIGN(RemoteDevice bare_rank, RemoteDevice::Parse("rank:1"));
  EXPECT_EQ(1, bare_rank.rank());
  EXPECT_EQ("rank:1/cpu", bare_rank.ToString());

  ASSERT_OK_AND_ASSIGN(RemoteDevice local, RemoteDevice::Parse("cuda:0"));
  EXPECT_FALSE(local.rank().has_value());
  EXPECT_FALSE(local.worker_name().has_value());
  EXPECT_EQ("cuda:0", local.ToString());
}

TEST(RemoteDeviceTest, PrintingGivesBackTheSameString) {
  for (const char* text : {"rank:3/cuda:3", "worker2/cuda:2", "rank:0/cpu",
                           "rank:12/meta", "trainer-7/cuda", "cuda:1"}) {
    ASSERT_OK_AND_ASSIGN(RemoteDevice device, RemoteDevice::Parse(text));
    EXPECT_EQ(text, device.ToString());
    ASSERT_OK_AND_ASSIGN(RemoteDevice again,
                         RemoteDevice::Parse(device.ToString()));
    EXPECT_EQ(device, again);
  }
}

TEST(RemoteDeviceTest, MalformedStringsNameTheString) {
  for (const char* text :
       {"rank:0/cuda:0/x", "/cuda:0", "rank:x/cpu", "rank:-1/cpu", "rnk:0/cpu",
        "a:b:c/cpu", "rank:0/gpu"}) {
    EXPECT_THAT(RemoteDevice::Parse(text),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(std::string("Could not parse "
                                               "remote_device: ") +
                                   text)))
        << text;
  }
  EXPECT_THAT(RemoteDevice::Parse("rank:0/gpu"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("Invalid device string: 'gpu'")));
}

}  // namespace
}  // namespace tessera
