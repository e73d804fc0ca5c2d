#include "io/mount_info.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "io/file.h"

namespace tessera {
namespace {

// Undoes the kernel's \ooo escapes of a path field (show_mountinfo's
// mangle: space, tab, newline and backslash).
std::string Unescape(absl::string_view field) {
  std::string out;
  out.reserve(field.size());
  for (size_t i = 0; i < field.size(); ++i) {
    if (field[i] == '\\' && i + 3 < field.size()) {
      const absl::string_view digits = field.substr(i + 1, 3);
      if (std::all_of(digits.begin(), digits.end(),
                      [](char c) { return c >= '0' && c <= '7'; })) {
        out.push_back(static_cast<char>((digits[0] - '0') * 64 +
                                        (digits[1] - '0') * 8 +
                                        (digits[2] - '0')));
        i += 3;
        continue;
      }
    }
    out.push_back(field[i]);
  }
  return out;
}

}  // namespace

bool MountInfo::HasSuperOption(absl::string_view option) const {
  return std::find(super_options.begin(), super_options.end(), option) !=
         super_options.end();
}

absl::StatusOr<std::vector<MountInfo>> ParseMountInfo(absl::string_view text) {
  std::vector<MountInfo> mounts;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    if (line.empty()) continue;
    const auto malformed = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat("mountinfo line ", number, " (\"", line, "\"): ", why));
    };
    const size_t separator = line.find(" - ");
    if (separator == absl::string_view::npos) {
      return malformed("no \" - \" separator");
    }
    const std::vector<absl::string_view> before =
        absl::StrSplit(line.substr(0, separator), ' ', absl::SkipEmpty());
    const std::vector<absl::string_view> after =
        absl::StrSplit(line.substr(separator + 3), ' ', absl::SkipEmpty());
    if (before.size() < 6 || after.size() < 2) {
      return malformed("too few fields");
    }
    MountInfo mount;
    if (!absl::SimpleAtoi(before[0], &mount.id) ||
        !absl::SimpleAtoi(before[1], &mount.parent_id)) {
      return malformed("the mount ids are not numbers");
    }
    mount.root = Unescape(before[3]);
    mount.mount_point = Unescape(before[4]);
    mount.fs_type = Unescape(after[0]);
    mount.source = Unescape(after[1]);
    if (after.size() > 2) {
      for (absl::string_view option : absl::StrSplit(after[2], ',')) {
        mount.super_options.push_back(Unescape(option));
      }
    }
    mounts.push_back(std::move(mount));
  }
  return mounts;
}

absl::StatusOr<std::vector<MountInfo>> ReadMountInfo(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) return text.status();
  absl::StatusOr<std::vector<MountInfo>> mounts = ParseMountInfo(*text);
  if (!mounts.ok()) {
    return absl::Status(mounts.status().code(),
                        absl::StrCat(path, ": ", mounts.status().message()));
  }
  return mounts;
}

}  // namespace tessera
