// The cgroup memory limit (server/daemon/cgroup_memory.h) over fake /proc
// and /sys trees in a temporary directory: the process's own cgroup, v1 and
// v2, found through /proc/self/cgroup and /proc/self/mountinfo wherever
// the hierarchy is mounted; the smallest limit of it and its ancestors
// (never a sibling's, never only the root's); memory.high; namespaced
// containers whose path does not exist under the mount. Daemons under
// real cgroups: tests/integration/cgroup_budget_test.cc.
#include "server/daemon/cgroup_memory.h"

#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::Optional;

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr char kV1Unlimited[] = "9223372036854771712\n";

// A file system root of its own: /proc/self and /sys/fs/cgroup as a test
// writes them.
class FakeRoot {
 public:
  FakeRoot() {
    char dir[] = "/tmp/tessera_cgroup_XXXXXX";
    EXPECT_NE(mkdtemp(dir), nullptr);
    root_ = dir;
  }
  ~FakeRoot() { std::filesystem::remove_all(root_); }

  const std::string& root() const { return root_; }

  void Write(const std::string& path, const std::string& text) const {
    const std::filesystem::path file = root_ + path;
    std::filesystem::create_directories(file.parent_path());
    std::ofstream(file) << text;
  }
  void Mkdir(const std::string& path) const {
    std::filesystem::create_directories(root_ + path);
  }
  // A cgroup v1 memory hierarchy at `mount_point` whose root is `root`, and
  // an empty cgroup2 one (hugetlb only), as on a hybrid host.
  void MountV1(const std::string& mount_point,
               const std::string& root = "/") const {
    Write("/proc/self/mountinfo",
          absl::StrCat(
              "23 1 0:21 / /sys rw - sysfs sysfs rw\n"
              "35 31 0:32 ",
              root, " ", mount_point,
              " rw,relatime shared:9 - cgroup cgroup rw,memory\n"
              "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"));
    Write("/sys/fs/cgroup/unified/cgroup.controllers", "hugetlb\n");
  }
  void MountV2(const std::string& mount_point, const std::string& controllers,
               const std::string& root = "/") const {
    Write("/proc/self/mountinfo",
          absl::StrCat("23 1 0:21 / /sys rw - sysfs sysfs rw\n"
                       "30 23 0:26 ",
                       root, " ", mount_point,
                       " rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"));
    Write(absl::StrCat(mount_point, "/cgroup.controllers"), controllers);
  }

 private:
  std::string root_;
};

// `fake` has one memory cgroup, at `dir` below its root, limited to `bytes`.
void ExpectOneCgroup(const FakeRoot& fake, const std::string& dir,
                     int64_t bytes) {
  const std::vector<MemoryCgroup> found = FindMemoryCgroups(fake.root());
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].dir, fake.root() + dir);
  EXPECT_EQ(ReadCgroupMemoryLimit(fake.root()).bytes, bytes);
}

TEST(CgroupMemoryTest, ParsesProcSelfCgroup) {
  ProcCgroups v1 = ParseProcCgroups(
      "9:name=systemd:/\n4:memory:/process_api/abc\n1:cpu:/\n0::/\n");
  EXPECT_THAT(v1.v1_memory, Optional(std::string("/process_api/abc")));
  EXPECT_THAT(v1.v2, Optional(std::string("/")));
  ProcCgroups joined = ParseProcCgroups("3:cpu,memory:/a:b\n");
  EXPECT_THAT(joined.v1_memory, Optional(std::string("/a:b")));
  EXPECT_FALSE(joined.v2.has_value());
  ProcCgroups v2 = ParseProcCgroups("0::/user.slice/x.service\n");
  EXPECT_FALSE(v2.v1_memory.has_value());
  EXPECT_THAT(v2.v2, Optional(std::string("/user.slice/x.service")));
  ProcCgroups none = ParseProcCgroups("garbage\n7:memoryless:/x\n");
  EXPECT_FALSE(none.v1_memory.has_value());
  EXPECT_FALSE(none.v2.has_value());
}

TEST(CgroupMemoryTest, V1TakesTheOwnCgroupsSmallestAncestorNotTheRoot) {
  // The issue: a daemon in a 768 MiB cgroup read the root's file.
  FakeRoot fake;
  fake.Write("/proc/self/cgroup",
             "4:memory:/slurm/job_7/step_0/task_1\n0::/\n");
  const std::string mount = "/sys/fs/cgroup/memory";
  fake.MountV1(mount);
  fake.Write(mount + "/memory.limit_in_bytes", kV1Unlimited);
  fake.Write(mount + "/slurm/memory.limit_in_bytes", kV1Unlimited);
  fake.Write(mount + "/slurm/job_7/memory.limit_in_bytes",
             absl::StrCat(1024 * kMiB, "\n"));
  fake.Write(mount + "/slurm/job_7/step_0/memory.limit_in_bytes",
             absl::StrCat(768 * kMiB, "\n"));
  fake.Write(mount + "/slurm/job_7/step_0/task_1/memory.limit_in_bytes",
             kV1Unlimited);
  // A sibling's smaller limit is not this process's.
  fake.Write(mount + "/slurm/job_7/step_1/memory.limit_in_bytes",
             absl::StrCat(kMiB, "\n"));

  const std::vector<MemoryCgroup> found = FindMemoryCgroups(fake.root());
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].version, 1);
  EXPECT_EQ(found[0].mount_point, fake.root() + mount);
  EXPECT_EQ(found[0].dir, fake.root() + mount + "/slurm/job_7/step_0/task_1");
  const CgroupLimit limit = ReadCgroupMemoryLimit(fake.root());
  EXPECT_EQ(limit.bytes, 768 * kMiB);
  EXPECT_EQ(limit.version, 1);
  EXPECT_EQ(limit.file,
            fake.root() + mount + "/slurm/job_7/step_0/memory.limit_in_bytes");
}

TEST(CgroupMemoryTest, V1WithoutAnyLimitIsNone) {
  FakeRoot fake;
  fake.Write("/proc/self/cgroup", "4:memory:/a\n0::/\n");
  fake.MountV1("/cg/mem");
  fake.Write("/cg/mem/memory.limit_in_bytes", kV1Unlimited);
  fake.Write("/cg/mem/a/memory.limit_in_bytes", "9223372036854710272\n");
  EXPECT_EQ(FindMemoryCgroups(fake.root()).size(), 1u);
  const CgroupLimit limit = ReadCgroupMemoryLimit(fake.root());
  EXPECT_EQ(limit.bytes, 0);
  EXPECT_EQ(limit.file, "");
}

TEST(CgroupMemoryTest, V2TakesMemoryMaxOrHighWhicheverIsSmaller) {
  FakeRoot fake;
  fake.Write("/proc/self/cgroup", "0::/system.slice/tessera@0.service\n");
  fake.MountV2("/sys/fs/cgroup", "cpuset cpu io memory pids\n");
  const std::string unit = "/sys/fs/cgroup/system.slice/tessera@0.service";
  fake.Write("/sys/fs/cgroup/system.slice/memory.max", "max\n");
  fake.Write("/sys/fs/cgroup/system.slice/memory.high", "max\n");
  fake.Write(unit + "/memory.max", absl::StrCat(2048 * kMiB, "\n"));
  fake.Write(unit + "/memory.high", "max\n");
  CgroupLimit limit = ReadCgroupMemoryLimit(fake.root());
  EXPECT_EQ(limit.bytes, 2048 * kMiB);
  EXPECT_EQ(limit.version, 2);
  EXPECT_EQ(limit.file, fake.root() + unit + "/memory.max");

  fake.Write(unit + "/memory.high", absl::StrCat(1536 * kMiB, "\n"));
  limit = ReadCgroupMemoryLimit(fake.root());
  EXPECT_EQ(limit.bytes, 1536 * kMiB);
  EXPECT_EQ(limit.file, fake.root() + unit + "/memory.high");

  // The slice above it, smaller still.
  fake.Write("/sys/fs/cgroup/system.slice/memory.max",
             absl::StrCat(1024 * kMiB, "\n"));
  limit = ReadCgroupMemoryLimit(fake.root());
  EXPECT_EQ(limit.bytes, 1024 * kMiB);
  EXPECT_EQ(limit.file, fake.root() + "/sys/fs/cgroup/system.slice/memory.max");
}

TEST(CgroupMemoryTest, V2WithoutTheMemoryControllerIsNoLimit) {
  FakeRoot fake;
  fake.Write("/proc/self/cgroup", "0::/a\n");
  fake.MountV2("/sys/fs/cgroup", "cpu pids\n");
  fake.Write("/sys/fs/cgroup/a/memory.max", absl::StrCat(kMiB, "\n"));
  EXPECT_TRUE(FindMemoryCgroups(fake.root()).empty());
  EXPECT_EQ(ReadCgroupMemoryLimit(fake.root()).bytes, 0);
}

TEST(CgroupMemoryTest, ContainersWhosePathIsNotUnderTheMount) {
  {
    // A private cgroup namespace whose mount is a host view: the path
    // names the host's cgroup, the mount point already is this one.
    FakeRoot fake;
    fake.Write("/proc/self/cgroup", "0::/kubepods/pod1/ctr\n");
    fake.MountV2("/sys/fs/cgroup", "memory\n");
    fake.Write("/sys/fs/cgroup/memory.max", absl::StrCat(512 * kMiB, "\n"));
    ExpectOneCgroup(fake, "/sys/fs/cgroup", 512 * kMiB);
  }
  {
    // Docker on cgroup v1 without a cgroup namespace: the mount's root is
    // the container's cgroup, which /proc/self/cgroup names in full.
    FakeRoot fake;
    fake.Write("/proc/self/cgroup", "5:memory:/docker/abc/sub\n");
    fake.MountV1("/sys/fs/cgroup/memory", "/docker/abc");
    fake.Write("/sys/fs/cgroup/memory/memory.limit_in_bytes",
               absl::StrCat(256 * kMiB, "\n"));
    fake.Write("/sys/fs/cgroup/memory/sub/memory.limit_in_bytes", kV1Unlimited);
    ExpectOneCgroup(fake, "/sys/fs/cgroup/memory/sub", 256 * kMiB);
  }
  {
    // Only the trailing part of the path exists under the mount.
    FakeRoot fake;
    fake.Write("/proc/self/cgroup", "0::/host/pod/ctr/sub\n");
    fake.MountV2("/sys/fs/cgroup", "memory\n");
    fake.Write("/sys/fs/cgroup/ctr/memory.max", absl::StrCat(300 * kMiB, "\n"));
    fake.Write("/sys/fs/cgroup/ctr/sub/memory.max", "max\n");
    ExpectOneCgroup(fake, "/sys/fs/cgroup/ctr/sub", 300 * kMiB);
  }
}

TEST(CgroupMemoryTest, BothHierarchiesTakeTheSmaller) {
  FakeRoot fake;
  fake.Write("/proc/self/cgroup", "4:memory:/a\n0::/b\n");
  fake.Write("/proc/self/mountinfo",
             "35 31 0:32 / /v1 rw - cgroup cgroup rw,memory\n"
             "41 31 0:38 / /v2 rw - cgroup2 cgroup2 rw\n");
  fake.Write("/v2/cgroup.controllers", "memory\n");
  fake.Write("/v1/a/memory.limit_in_bytes", absl::StrCat(1024 * kMiB, "\n"));
  fake.Write("/v2/b/memory.max", absl::StrCat(512 * kMiB, "\n"));
  EXPECT_EQ(FindMemoryCgroups(fake.root()).size(), 2u);
  CgroupLimit limit = ReadCgroupMemoryLimit(fake.root());
  EXPECT_EQ(limit.bytes, 512 * kMiB);
  EXPECT_EQ(limit.version, 2);
  fake.Write("/v2/b/memory.max", "max\n");
  limit = ReadCgroupMemoryLimit(fake.root());
  EXPECT_EQ(limit.bytes, 1024 * kMiB);
  EXPECT_EQ(limit.version, 1);
}

TEST(CgroupMemoryTest, MissingOrGarbledFilesSetNoLimit) {
  FakeRoot fake;
  // Nothing at all: no /proc.
  EXPECT_TRUE(FindMemoryCgroups(fake.root()).empty());
  EXPECT_EQ(ReadCgroupMemoryLimit(fake.root()).bytes, 0);
  fake.Write("/proc/self/cgroup", "0::/a\n");
  fake.MountV2("/cg", "memory\n");
  fake.Write("/cg/a/memory.max", "lots\n");
  fake.Write("/cg/a/memory.high", "-5\n");
  EXPECT_EQ(FindMemoryCgroups(fake.root()).size(), 1u);
  EXPECT_EQ(ReadCgroupMemoryLimit(fake.root()).bytes, 0);
  // An unparsable mount table: no hierarchy.
  fake.Write("/proc/self/mountinfo", "not a mount table\n");
  EXPECT_TRUE(FindMemoryCgroups(fake.root()).empty());
}

TEST(CgroupMemoryTest, ThisProcesssCgroupsExist) {
  // The real /proc and /sys: whatever this host has, each cgroup found is
  // a directory at or below its mount point, and its limit (if any) lies
  // in one of them.
  for (const MemoryCgroup& cgroup : FindMemoryCgroups()) {
    struct stat st;
    EXPECT_EQ(::stat(cgroup.dir.c_str(), &st), 0) << cgroup.dir;
    EXPECT_EQ(cgroup.dir.rfind(cgroup.mount_point, 0), 0u) << cgroup.dir;
  }
  const CgroupLimit limit = ReadCgroupMemoryLimit();
  if (limit.bytes > 0) {
    EXPECT_EQ(limit.file.rfind("/", 0), 0u);
  }
}

}  // namespace
}  // namespace tessera
