#include "server/daemon/cgroup_memory.h"

#include <sys/stat.h>

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "io/file.h"
#include "io/mount_info.h"

namespace tessera {
namespace {

// From here up a limit is "none": v1 writes its "unlimited" as the
// largest page count times the page size (9223372036854771712 with 4 KiB
// pages, less with larger ones).
constexpr int64_t kNoLimit = int64_t{1} << 62;

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// The limit a cgroup file sets, or 0 ("max", missing, garbage, none).
int64_t ReadLimitFile(const std::string& file) {
  absl::StatusOr<std::string> text = ReadFileToString(file);
  if (!text.ok()) return 0;
  int64_t bytes = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &bytes) ||
      bytes <= 0 || bytes >= kNoLimit) {
    return 0;
  }
  return bytes;
}

// This process's cgroup directory under `mount` (see the header): below
// the mount point by the path relative to the mount's root, else the
// longest trailing part of it that exists, else the mount point.
std::string Locate(const std::string& root, const MountInfo& mount,
                   const std::string& path) {
  absl::string_view relative = path;
  if (mount.root != "/") {
    if (path == mount.root) {
      relative = "";
    } else if (absl::StartsWith(path, absl::StrCat(mount.root, "/"))) {
      relative.remove_prefix(mount.root.size());
    }
  }
  const std::string base = absl::StrCat(root, mount.mount_point);
  const std::vector<absl::string_view> parts =
      absl::StrSplit(relative, '/', absl::SkipEmpty());
  for (size_t k = 0; k < parts.size(); ++k) {
    const std::string candidate = absl::StrCat(
        base, "/",
        absl::StrJoin(parts.begin() + static_cast<std::ptrdiff_t>(k),
                      parts.end(), "/"));
    if (IsDirectory(candidate)) return candidate;
  }
  return base;
}

}  // namespace

ProcCgroups ParseProcCgroups(absl::string_view text) {
  ProcCgroups cgroups;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    // The path may itself hold ':'.
    const std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (fields.size() != 3) continue;
    if (fields[0] == "0" && fields[1].empty()) {
      cgroups.v2 = std::string(fields[2]);
      continue;
    }
    for (absl::string_view controller : absl::StrSplit(fields[1], ',')) {
      if (controller == "memory") cgroups.v1_memory = std::string(fields[2]);
    }
  }
  return cgroups;
}

std::vector<MemoryCgroup> FindMemoryCgroups(const std::string& root) {
  std::vector<MemoryCgroup> found;
  absl::StatusOr<std::string> text =
      ReadFileToString(absl::StrCat(root, "/proc/self/cgroup"));
  absl::StatusOr<std::vector<MountInfo>> mounts =
      ReadMountInfo(absl::StrCat(root, "/proc/self/mountinfo"));
  if (!text.ok() || !mounts.ok()) return found;
  const ProcCgroups cgroups = ParseProcCgroups(*text);
  if (cgroups.v1_memory.has_value()) {
    for (const MountInfo& mount : *mounts) {
      if (mount.fs_type == "cgroup" && mount.HasSuperOption("memory")) {
        found.push_back({1, absl::StrCat(root, mount.mount_point),
                         Locate(root, mount, *cgroups.v1_memory),
                         *cgroups.v1_memory});
        break;
      }
    }
  }
  if (cgroups.v2.has_value()) {
    for (const MountInfo& mount : *mounts) {
      if (mount.fs_type != "cgroup2") continue;
      const std::string controllers =
          ReadFileToString(
              absl::StrCat(root, mount.mount_point, "/cgroup.controllers"))
              .value_or("");
      const std::vector<absl::string_view> names =
          absl::StrSplit(controllers, absl::ByAnyChar(" \n"));
      if (std::find(names.begin(), names.end(), "memory") != names.end()) {
        found.push_back({2, absl::StrCat(root, mount.mount_point),
                         Locate(root, mount, *cgroups.v2), *cgroups.v2});
      }
      break;
    }
  }
  return found;
}

CgroupLimit ReadCgroupMemoryLimit(const std::string& root) {
  CgroupLimit limit;
  const auto consider = [&limit](const std::string& file, int version) {
    const int64_t bytes = ReadLimitFile(file);
    if (bytes > 0 && (limit.bytes == 0 || bytes < limit.bytes)) {
      limit = CgroupLimit{bytes, file, version};
    }
  };
  for (const MemoryCgroup& cgroup : FindMemoryCgroups(root)) {
    std::string dir = cgroup.dir;
    while (true) {
      if (cgroup.version == 1) {
        consider(absl::StrCat(dir, "/memory.limit_in_bytes"), 1);
      } else {
        consider(absl::StrCat(dir, "/memory.max"), 2);
        consider(absl::StrCat(dir, "/memory.high"), 2);
      }
      if (dir.size() <= cgroup.mount_point.size()) break;
      const size_t slash = dir.rfind('/');
      if (slash == std::string::npos || slash < cgroup.mount_point.size()) {
        break;
      }
      dir.resize(slash);
    }
  }
  return limit;
}

}  // namespace tessera
