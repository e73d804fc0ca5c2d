// A real memory cgroup made for a test: a child of this process's own
// memory cgroup (server/daemon/cgroup_memory.h finds it), cgroup v1 or v2,
// with a limit, so that daemons started in it run as under a systemd unit,
// a Kubernetes pod or a Slurm task. A process joins it by writing its pid
// to procs_file() (a wrapper: `echo $$ > .../cgroup.procs; exec daemon`).
//
// Create fails with FAILED_PRECONDITION saying why when this host cannot
// have one, for the test to skip with: not root, no hierarchy of that
// version with the memory controller, a v2 parent that cannot hand the
// memory controller to a child (it holds processes itself: cgroup v2's
// "no internal processes" rule), or mkdir or the limit refused.
//
// The destructor removes the cgroup (rmdir), waiting up to 10 s for the
// processes in it to exit and then moving any left to the parent: stop
// what runs in it first (declare the cgroup before what it holds).
//
// Thread-compatible.
#ifndef TESSERA_TESTS_TESTING_TEST_CGROUP_H_
#define TESSERA_TESTS_TESTING_TEST_CGROUP_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tessera::testing {

class TestCgroup {
 public:
  // `name` (one path component, unique to the test) below this process's
  // own memory cgroup of `version` (1 or 2), limited to `limit_bytes`.
  static absl::StatusOr<std::unique_ptr<TestCgroup>> Create(
      int version, absl::string_view name, int64_t limit_bytes);

  TestCgroup(const TestCgroup&) = delete;
  TestCgroup& operator=(const TestCgroup&) = delete;
  ~TestCgroup();

  int version() const { return version_; }
  // Its directory.
  const std::string& dir() const { return dir_; }
  // The file whose limit this cgroup sets, as ReadCgroupMemoryLimit names it.
  std::string limit_file() const;
  std::string procs_file() const { return dir_ + "/cgroup.procs"; }
  // How many processes in it the kernel's OOM killer has killed (v1
  // memory.oom_control, v2 memory.events "oom_kill").
  absl::StatusOr<int64_t> OomKills() const;

 private:
  TestCgroup(int version, std::string dir, std::string parent)
      : version_(version), dir_(std::move(dir)), parent_(std::move(parent)) {}

  const int version_;
  const std::string dir_;
  const std::string parent_;
};

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TESTING_TEST_CGROUP_H_
