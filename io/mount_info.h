// The mount table as a process sees it: /proc/<pid>/mountinfo parsed
// (proc(5)), so that callers find a file system by its type and options
// (the cgroup v1 hierarchy with the memory controller, the cgroup2 mount)
// instead of assuming where it is mounted.
//
// Each line is "id parent major:minor root mount_point mount_options
// [optional fields...] - fs_type source super_options"; the path fields
// have space, tab, newline and backslash escaped as \ooo octal, which
// parsing undoes. `root` is the directory of the file system that is
// mounted (for a cgroup mount: the cgroup, relative to the reader's cgroup
// namespace, that appears at `mount_point`).
//
// Errors: ParseMountInfo is INVALID_ARGUMENT naming the line for a line
// without the " - " separator or with too few fields; ReadMountInfo adds
// the file's read errors (io/file.h). Nothing here throws or aborts.
//
// Thread-safety: the functions keep no state.
#ifndef TESSERA_IO_MOUNT_INFO_H_
#define TESSERA_IO_MOUNT_INFO_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tessera {

struct MountInfo {
  int id = 0;
  int parent_id = 0;
  std::string root;
  std::string mount_point;
  std::string fs_type;  // "cgroup", "cgroup2", "ext4"...
  std::string source;
  // The file system's own options, split at commas ("rw", "memory"...).
  std::vector<std::string> super_options;

  bool HasSuperOption(absl::string_view option) const;
};

// The entries of a mountinfo text, in its order; blank lines are skipped.
absl::StatusOr<std::vector<MountInfo>> ParseMountInfo(absl::string_view text);

// ParseMountInfo of the file at `path`.
absl::StatusOr<std::vector<MountInfo>> ReadMountInfo(
    const std::string& path = "/proc/self/mountinfo");

}  // namespace tessera

#endif  // TESSERA_IO_MOUNT_INFO_H_
