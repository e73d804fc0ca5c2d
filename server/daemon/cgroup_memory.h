// The memory limit of this process's own cgroup, cgroup v1 or v2, for the
// daemon's default memory budget (memory_budget.h): a daemon started
// under a limit (a systemd unit, a Kubernetes pod, a Slurm task/cgroup
// job, a `docker run --memory`) must refuse what does not fit rather than
// be OOM-killed.
//
// Where: /proc/self/cgroup names the process's cgroup in each hierarchy,
// v1 "N:controllers:/path" (the line whose controllers include `memory`)
// and v2 "0::/path". /proc/self/mountinfo says where each hierarchy is
// mounted (the v1 mount whose super options include `memory`; the
// cgroup2 mount, used only when its cgroup.controllers lists `memory`)
// and which cgroup its root is. The process's cgroup directory is the
// mount point plus the path below the mount's root. Inside a container
// the path may not exist under the mount (a private cgroup namespace, or
// a host path under a mount that already is the container's cgroup):
// then the longest trailing part of the path that does exist is taken,
// else the mount point itself.
//
// What: the kernel charges every ancestor too, so the limit is the
// smallest over the cgroup and its ancestors up to the mount point: v1
// memory.limit_in_bytes (no limit is a huge page-rounded number, taken as
// none from 2^62 bytes up), v2 memory.max and memory.high ("max": none;
// beyond memory.high the kernel throttles the process to a crawl, so it
// counts as a limit too). Where both v1 and v2 apply, the smaller.
// memory.memsw (memory plus swap) is never smaller, so it is not read.
//
// Failures: none are errors. A file that is missing, unreadable or not a
// number sets no limit at its level; no hierarchy with memory, no limit
// (bytes 0). Several daemons inside one limit each see all of it: they
// need --memory-limit (docs/guide.md).
//
// Every path is read under `root` ("" for the real file system), so that
// tests build a fake /proc and /sys in a temporary directory.
//
// Thread-safety: the functions keep no state.
#ifndef TESSERA_SERVER_DAEMON_CGROUP_MEMORY_H_
#define TESSERA_SERVER_DAEMON_CGROUP_MEMORY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace tessera {

// This process's cgroup paths, as /proc/self/cgroup writes them.
struct ProcCgroups {
  std::optional<std::string> v1_memory;  // of "N:...memory...:/path"
  std::optional<std::string> v2;         // of "0::/path"
};
ProcCgroups ParseProcCgroups(absl::string_view text);

// A hierarchy with the memory controller that this process is in.
struct MemoryCgroup {
  int version = 0;          // 1 or 2
  std::string mount_point;  // the hierarchy's mount, `root` prefixed
  std::string dir;          // this process's cgroup: mount_point or below
  std::string path;         // as /proc/self/cgroup names it
};
// v1 first, then v2; empty when there is none (no /proc, no cgroup mount,
// or cgroup2 without the memory controller).
std::vector<MemoryCgroup> FindMemoryCgroups(const std::string& root = "");

struct CgroupLimit {
  int64_t bytes = 0;  // 0: no limit
  // The file that sets it ("/sys/fs/cgroup/memory/a/memory.limit_in_bytes"),
  // `root` prefixed; empty without a limit.
  std::string file;
  int version = 0;  // of that file's hierarchy
};
// The most restrictive limit over this process's memory cgroups and their
// ancestors, as described above.
CgroupLimit ReadCgroupMemoryLimit(const std::string& root = "");

}  // namespace tessera

#endif  // TESSERA_SERVER_DAEMON_CGROUP_MEMORY_H_
