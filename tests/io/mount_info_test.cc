// ParseMountInfo (io/mount_info.h) on lines as the kernel writes them:
// optional fields, octal escapes in paths, super options; malformed lines
// are refused naming the line. ReadMountInfo reads this process's table.
#include "io/mount_info.h"

#include <algorithm>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(MountInfoTest, ParsesTheKernelsLines) {
  ASSERT_OK_AND_ASSIGN(
      const std::vector<MountInfo> mounts,
      ParseMountInfo(
          "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
          "35 31 0:32 /process_api /sys/fs/cgroup/memory rw,relatime shared:9 "
          "master:2 - cgroup cgroup rw,memory\n"
          "\n"
          "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 "
          "rw,nsdelegate\n"
          "50 23 8:1 /a\\040dir /mnt/with\\040space\\134x rw - ext4 /dev/sda1 "
          "rw\n"));
  ASSERT_EQ(mounts.size(), 4u);
  EXPECT_EQ(mounts[0].id, 31);
  EXPECT_EQ(mounts[0].parent_id, 23);
  EXPECT_EQ(mounts[0].fs_type, "tmpfs");
  EXPECT_EQ(mounts[1].root, "/process_api");
  EXPECT_EQ(mounts[1].mount_point, "/sys/fs/cgroup/memory");
  EXPECT_EQ(mounts[1].fs_type, "cgroup");
  EXPECT_THAT(mounts[1].super_options, ElementsAre("rw", "memory"));
  EXPECT_TRUE(mounts[1].HasSuperOption("memory"));
  EXPECT_FALSE(mounts[1].HasSuperOption("mem"));
  EXPECT_EQ(mounts[2].fs_type, "cgroup2");
  EXPECT_FALSE(mounts[2].HasSuperOption("memory"));
  EXPECT_EQ(mounts[3].root, "/a dir");
  EXPECT_EQ(mounts[3].mount_point, "/mnt/with space\\x");
  EXPECT_EQ(mounts[3].source, "/dev/sda1");
}

TEST(MountInfoTest, RefusesMalformedLinesNamingThem) {
  EXPECT_THAT(ParseMountInfo("31 23 0:28 / /sys rw tmpfs tmpfs rw\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("mountinfo line 1")));
  EXPECT_THAT(ParseMountInfo("1 0 0:1 / / rw - ext4 /dev/a rw\n31 23 - x\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("line 2 (\"31 23 - x\"): too few fields")));
  EXPECT_THAT(
      ParseMountInfo("a b 0:1 / / rw - ext4 /dev/a rw\n"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not numbers")));
}

TEST(MountInfoTest, ReadsThisProcesssTable) {
  ASSERT_OK_AND_ASSIGN(const std::vector<MountInfo> mounts, ReadMountInfo());
  // Every Linux process has its root and /proc mounted.
  EXPECT_TRUE(std::any_of(mounts.begin(), mounts.end(), [](const MountInfo& m) {
    return m.mount_point == "/";
  }));
  EXPECT_TRUE(std::any_of(mounts.begin(), mounts.end(), [](const MountInfo& m) {
    return m.fs_type == "proc";
  }));
  EXPECT_THAT(ReadMountInfo("/nonexistent/mountinfo"),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("/nonexistent/mountinfo")));
}

}  // namespace
}  // namespace tessera
