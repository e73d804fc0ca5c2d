// Temporary directories and file modes for tests: ScopedTempDir makes a
// fresh directory under /tmp (mkdtemp) and removes it, with all it holds,
// when it goes out of scope; FileMode(path) is a file's permission bits as
// "0700"-style octal, or "missing" when it cannot be stat'ed.
// Header-only.
#ifndef TESSERA_TESTS_TESTING_TEMP_DIR_H_
#define TESSERA_TESTS_TESTING_TEMP_DIR_H_

#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <string>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace tessera::testing {

class ScopedTempDir {
 public:
  // /tmp/PREFIX-XXXXXX; path() is empty (and ok() false) when mkdtemp
  // failed.
  explicit ScopedTempDir(absl::string_view prefix = "tessera-test") {
    std::string dir = absl::StrCat("/tmp/", prefix, "-XXXXXX");
    if (mkdtemp(dir.data()) != nullptr) path_ = std::move(dir);
  }
  ~ScopedTempDir() {
    if (path_.empty()) return;
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;

  bool ok() const { return !path_.empty(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The permission bits of `path` ("0600"), or "missing".
inline std::string FileMode(const std::string& path) {
  struct stat info;
  if (stat(path.c_str(), &info) != 0) return "missing";
  return absl::StrFormat("%04o", info.st_mode & 0777);
}

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TESTING_TEMP_DIR_H_
