#include "tests/testing/test_cgroup.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "io/file.h"
#include "server/daemon/cgroup_memory.h"

namespace tessera::testing {
namespace {

absl::Status WriteCgroupFile(const std::string& path, absl::string_view text) {
  absl::StatusOr<UniqueFd> fd = OpenFile(path, O_WRONLY);
  if (!fd.ok()) return fd.status();
  // One write(2): the kernel takes a cgroup file's value in one piece.
  const ssize_t n = ::write(fd->get(), text.data(), text.size());
  if (n != static_cast<ssize_t>(text.size())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "write \"", text, "\" to ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

// The value of `key` in a "key value" per line file (memory.events,
// memory.oom_control).
absl::StatusOr<int64_t> KeyedValue(const std::string& path,
                                   absl::string_view key) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) return text.status();
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    if (absl::ConsumePrefix(&line, key) && absl::ConsumePrefix(&line, " ")) {
      int64_t value = 0;
      if (absl::SimpleAtoi(line, &value)) return value;
    }
  }
  return absl::NotFoundError(absl::StrCat("no \"", key, "\" in ", path));
}

}  // namespace

absl::StatusOr<std::unique_ptr<TestCgroup>> TestCgroup::Create(
    int version, absl::string_view name, int64_t limit_bytes) {
  if (geteuid() != 0) {
    return absl::FailedPreconditionError(
        "making a cgroup needs root; this test runs as another user");
  }
  const MemoryCgroup* own = nullptr;
  const std::vector<MemoryCgroup> cgroups = FindMemoryCgroups();
  for (const MemoryCgroup& cgroup : cgroups) {
    if (cgroup.version == version) own = &cgroup;
  }
  if (own == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this host has no cgroup v", version,
        " hierarchy with the memory controller that this process is in (",
        version == 2 ? "the cgroup2 mount lacks memory in cgroup.controllers, "
                       "or there is none: memory is on the v1 hierarchy"
                     : "no cgroup v1 mount with the memory controller",
        ")"));
  }
  if (version == 2) {
    // The parent must hand memory down to its children.
    const std::string subtree = own->dir + "/cgroup.subtree_control";
    const std::string enabled = ReadFileToString(subtree).value_or("");
    if (enabled.find("memory") == std::string::npos) {
      const absl::Status status = WriteCgroupFile(subtree, "+memory");
      if (!status.ok()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "cannot enable the memory controller for children of ", own->dir,
            " (cgroup v2 allows it only in a cgroup without processes of its "
            "own): ",
            status.message()));
      }
    }
  }
  const std::string dir = absl::StrCat(own->dir, "/", name);
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::FailedPreconditionError(
        absl::StrCat("mkdir ", dir, ": ", std::strerror(errno)));
  }
  std::unique_ptr<TestCgroup> cgroup(new TestCgroup(version, dir, own->dir));
  absl::Status limited =
      WriteCgroupFile(cgroup->limit_file(), absl::StrCat(limit_bytes));
  if (limited.ok() && version == 2) {
    // Swap would slow a process down instead of it meeting the limit.
    const std::string swap = dir + "/memory.swap.max";
    if (::access(swap.c_str(), F_OK) == 0) {
      limited = WriteCgroupFile(swap, "0");
    }
  }
  if (!limited.ok()) {
    return absl::FailedPreconditionError(limited.message());
  }
  return cgroup;
}

std::string TestCgroup::limit_file() const {
  return dir_ + (version_ == 1 ? "/memory.limit_in_bytes" : "/memory.max");
}

absl::StatusOr<int64_t> TestCgroup::OomKills() const {
  return version_ == 1 ? KeyedValue(dir_ + "/memory.oom_control", "oom_kill")
                       : KeyedValue(dir_ + "/memory.events", "oom_kill");
}

TestCgroup::~TestCgroup() {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (::rmdir(dir_.c_str()) != 0) {
    if (errno != EBUSY) return;
    if (absl::Now() > deadline) {
      // Whatever is still in it goes back to the parent.
      const std::string procs = ReadFileToString(procs_file()).value_or("");
      for (absl::string_view pid :
           absl::StrSplit(procs, '\n', absl::SkipEmpty())) {
        (void)WriteCgroupFile(parent_ + "/cgroup.procs", pid);
      }
      ::rmdir(dir_.c_str());
      return;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
}

}  // namespace tessera::testing
