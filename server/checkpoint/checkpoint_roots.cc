#include "server/checkpoint/checkpoint_roots.h"

#include <stdlib.h>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <memory>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "io/errno.h"

namespace tessera {
namespace {

constexpr char kNoRoots[] =
    "checkpoints are disabled on this daemon: start tessera-server with "
    "--checkpoint-root DIR (repeatable) to allow save and load under DIR";

// The components of `path`, without empty ones and ".".
std::vector<absl::string_view> Components(absl::string_view path) {
  std::vector<absl::string_view> parts;
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    if (!part.empty() && part != ".") parts.push_back(part);
  }
  return parts;
}

}  // namespace

absl::StatusOr<CheckpointRoots> CheckpointRoots::Open(
    const std::vector<std::string>& paths) {
  std::vector<Root> roots;
  for (const std::string& path : paths) {
    absl::StatusOr<Directory> dir =
        Directory::Open(path, /*create=*/true, 0750);
    if (!dir.ok()) return Annotate(dir.status(), "checkpoint root");
    std::unique_ptr<char, decltype(&free)> real(realpath(path.c_str(), nullptr),
                                                &free);
    if (real == nullptr) {
      return Annotate(ErrnoError(errno, absl::StrCat("realpath ", path)),
                      "checkpoint root");
    }
    std::string given = path;
    if (given.front() != '/') {
      std::unique_ptr<char, decltype(&free)> cwd(getcwd(nullptr, 0), &free);
      if (cwd != nullptr) given = absl::StrCat(cwd.get(), "/", path);
    }
    roots.push_back(Root{std::move(given), real.get(), *std::move(dir)});
  }
  return CheckpointRoots(std::move(roots));
}

std::vector<std::string> CheckpointRoots::paths() const {
  std::vector<std::string> paths;
  for (const Root& root : roots_) paths.push_back(root.real_path);
  return paths;
}

absl::StatusOr<Directory> CheckpointRoots::Resolve(
    absl::string_view request_path, bool create) const {
  if (roots_.empty()) return absl::FailedPreconditionError(kNoRoots);
  if (request_path.empty()) {
    return absl::InvalidArgumentError("a checkpoint path is required");
  }
  if (absl::StrContains(request_path, '\0')) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint path \"", absl::CHexEscape(request_path),
                     "\" holds a NUL byte"));
  }
  const std::vector<absl::string_view> parts = Components(request_path);
  for (absl::string_view part : parts) {
    if (part == "..") {
      return absl::PermissionDeniedError(
          absl::StrCat("checkpoint path \"", request_path,
                       "\" may not contain \"..\": checkpoints stay inside "
                       "the daemon's checkpoint roots (",
                       absl::StrJoin(paths(), ", "), ")"));
    }
  }
  const Root* root = &roots_.front();
  size_t skip = 0;
  if (absl::StartsWith(request_path, "/")) {
    root = nullptr;
    for (const Root& candidate : roots_) {
      for (const std::string* path :
           {&candidate.real_path, &candidate.given_path}) {
        const std::vector<absl::string_view> prefix = Components(*path);
        // A root path with ".." (as configured) matches nothing.
        if (root == nullptr && prefix.size() <= parts.size() &&
            std::find(prefix.begin(), prefix.end(), "..") == prefix.end() &&
            std::equal(prefix.begin(), prefix.end(), parts.begin())) {
          root = &candidate;
          skip = prefix.size();
        }
      }
    }
    if (root == nullptr) {
      return absl::PermissionDeniedError(absl::StrCat(
          "checkpoint path ", request_path,
          " is outside the daemon's checkpoint roots (",
          absl::StrJoin(paths(), ", "),
          "); give a path inside one, or one relative to the first"));
    }
  }
  const std::string rest =
      absl::StrJoin(parts.begin() + skip, parts.end(), "/");
  absl::StatusOr<Directory> dir = root->dir.OpenBeneath(rest, create);
  if (!dir.ok()) return Annotate(dir.status(), "checkpoint");
  return dir;
}

}  // namespace tessera
