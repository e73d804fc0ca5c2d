#include "io/output_file.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "io/errno.h"

namespace tessera {
namespace {

// A FIFO or device opened for writing in place. O_NONBLOCK at open: a FIFO
// nobody reads then fails with ENXIO instead of blocking the caller until
// a reader comes; the writes block as a shell's would.
absl::StatusOr<UniqueFd> OpenInPlace(const std::string& path) {
  int fd;
  do {
    fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_NONBLOCK | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0 && errno == ENXIO) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no process has ", path,
        " open for reading (a FIFO is written only while something reads "
        "it)"));
  }
  if (fd < 0) return ErrnoError(errno, absl::StrCat("open ", path));
  UniqueFd owned(fd);
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) < 0) {
    return ErrnoError(errno, absl::StrCat("fcntl ", path));
  }
  return owned;
}

// Symbolic links followed at most, as the kernel does (ELOOP beyond).
constexpr int kMaxLinkHops = 40;

// Where the symbolic link `path` points (relative to its directory when
// the link is relative); nullopt when `path` is no link (or is missing).
absl::StatusOr<std::optional<std::string>> NextHop(const std::string& path) {
  struct stat entry;
  if (::lstat(path.c_str(), &entry) != 0 || !S_ISLNK(entry.st_mode)) {
    return std::nullopt;
  }
  char buffer[PATH_MAX];
  const ssize_t n = ::readlink(path.c_str(), buffer, sizeof(buffer));
  if (n < 0) return ErrnoError(errno, absl::StrCat("readlink ", path));
  if (n == 0 || static_cast<size_t>(n) == sizeof(buffer)) {
    return ErrnoError(ENAMETOOLONG, absl::StrCat("readlink ", path));
  }
  std::string link(buffer, static_cast<size_t>(n));
  const size_t slash = path.rfind('/');
  if (link.front() == '/' || slash == std::string::npos) return link;
  return absl::StrCat(path.substr(0, slash + 1), link);
}

// Whether `path` reaches its file through one of this process's open
// descriptors (/dev/stdout, /dev/fd/N, /proc/self/fd/N): then it is
// written in place, at the end of the descriptor's file, as writing to
// the descriptor would, never replaced under whoever holds it open.
bool ThroughDescriptorLink(std::string path) {
  for (int hops = 0; hops <= kMaxLinkHops; ++hops) {
    if (absl::StartsWith(path, "/proc/") ||
        absl::StartsWith(path, "/dev/fd/")) {
      return true;
    }
    absl::StatusOr<std::optional<std::string>> next = NextHop(path);
    if (!next.ok() || !next->has_value()) return false;
    path = **std::move(next);
  }
  return false;
}

// The path that `path` names once its symbolic links are followed (its
// final target may not exist yet): `path` itself when it is no link.
absl::StatusOr<std::string> LinkTarget(std::string path) {
  for (int hops = 0; hops <= kMaxLinkHops; ++hops) {
    absl::StatusOr<std::optional<std::string>> next = NextHop(path);
    if (!next.ok()) return next.status();
    if (!next->has_value()) return path;
    path = **std::move(next);
  }
  return ErrnoError(ELOOP, absl::StrCat("stat ", path));
}

}  // namespace

absl::StatusOr<OutputFile> OutputFile::Open(const std::string& path,
                                            mode_t mode) {
  if (path == "-") {
    return OutputFile(path, Kind::kStandardOutput, "", 0, UniqueFd());
  }
  if (path.empty()) {
    return absl::InvalidArgumentError("the output path is empty");
  }
  struct stat target;
  if (::stat(path.c_str(), &target) != 0) {
    if (errno != ENOENT) return ErrnoError(errno, absl::StrCat("stat ", path));
    // Nothing there, or links to nothing: the file they name is made.
    return Replacing(path, mode);
  }
  if (S_ISDIR(target.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is a directory: name a file in it"));
  }
  if (S_ISSOCK(target.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is a socket, not a file"));
  }
  if (!S_ISREG(target.st_mode) || ThroughDescriptorLink(path)) {
    absl::StatusOr<UniqueFd> fd = OpenInPlace(path);
    if (!fd.ok()) return fd.status();
    return OutputFile(path, Kind::kInPlace, "", 0, *std::move(fd));
  }
  // A regular file, perhaps through links.
  return Replacing(path, mode);
}

absl::StatusOr<OutputFile> OutputFile::Replacing(const std::string& path,
                                                 mode_t mode) {
  // Through links, the file they name is replaced, not the link.
  absl::StatusOr<std::string> replaced = LinkTarget(path);
  if (!replaced.ok()) return replaced.status();
  const std::string dir = DirectoryOf(*replaced);
  struct stat entry;
  if (::stat(dir.c_str(), &entry) != 0) {
    return ErrnoError(errno, absl::StrCat("open directory ", dir));
  }
  if (!S_ISDIR(entry.st_mode)) {
    return ErrnoError(ENOTDIR, absl::StrCat("open directory ", dir));
  }
  return OutputFile(path, Kind::kReplaced, *std::move(replaced), mode,
                    UniqueFd());
}

absl::Status OutputFile::MakeTemporary() {
  if (atomic_.has_value()) return absl::OkStatus();
  absl::StatusOr<AtomicFile> file = AtomicFile::Create(replaced_, mode_);
  if (!file.ok()) return file.status();
  atomic_.emplace(*std::move(file));
  return absl::OkStatus();
}

absl::Status OutputFile::Append(const void* data, size_t size) {
  if (committed_) {
    return absl::FailedPreconditionError(
        absl::StrCat("output ", path_, ": committed already"));
  }
  switch (kind_) {
    case Kind::kReplaced: {
      absl::Status made = MakeTemporary();
      if (!made.ok()) return made;
      return atomic_->Append(data, size);
    }
    case Kind::kInPlace:
      return WriteAll(fd_.get(), data, size, path_);
    case Kind::kStandardOutput:
      return WriteAll(STDOUT_FILENO, data, size, "standard output");
  }
  return absl::InternalError("unknown output kind");
}

absl::Status OutputFile::Commit() {
  if (committed_) {
    return absl::FailedPreconditionError(
        absl::StrCat("output ", path_, ": committed already"));
  }
  committed_ = true;
  switch (kind_) {
    case Kind::kReplaced: {
      absl::Status made = MakeTemporary();  // Nothing appended: empty.
      if (!made.ok()) return made;
      return atomic_->Commit();
    }
    case Kind::kInPlace:
      return fd_.Close(absl::StrCat("close ", path_));
    case Kind::kStandardOutput:
      return absl::OkStatus();
  }
  return absl::InternalError("unknown output kind");
}

absl::Status WriteOutputFile(const std::string& path,
                             absl::string_view contents, mode_t mode) {
  absl::StatusOr<OutputFile> file = OutputFile::Open(path, mode);
  if (!file.ok()) return file.status();
  absl::Status written = file->Append(contents.data(), contents.size());
  if (!written.ok()) return written;
  return file->Commit();
}

absl::Status RemoveOutputFile(const std::string& path) {
  struct stat entry;
  if (::lstat(path.c_str(), &entry) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoError(errno, absl::StrCat("stat ", path));
  }
  if (!S_ISREG(entry.st_mode)) return absl::OkStatus();
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoError(errno, absl::StrCat("remove ", path));
  }
  return absl::OkStatus();
}

}  // namespace tessera
