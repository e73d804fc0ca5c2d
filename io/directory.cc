#include "io/directory.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "io/errno.h"

namespace tessera {
namespace {

int RetryOpenAt(int dir, const char* name, int flags, mode_t mode) {
  int fd;
  do {
    fd = ::openat(dir, name, flags | O_CLOEXEC, mode);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

std::shared_ptr<const UniqueFd> Share(int fd) {
  return std::make_shared<const UniqueFd>(fd);
}

}  // namespace

absl::Status CheckSingleComponent(absl::string_view name) {
  if (name.empty() || name == "." || name == ".." ||
      name.find('/') != absl::string_view::npos ||
      name.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", absl::CHexEscape(name),
                     "\" is not a file name (one path component)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Directory> Directory::Open(const std::string& path, bool create,
                                          mode_t mode) {
  if (path.empty() || path.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", absl::CHexEscape(path), "\" is not a path"));
  }
  if (create) {
    // mkdir -p: every prefix, ignoring those that exist; the open below
    // reports what is wrong with the path as a whole.
    for (size_t slash = path.find('/', 1);; slash = path.find('/', slash + 1)) {
      const std::string prefix = path.substr(0, slash);
      if (::mkdir(prefix.c_str(), mode) != 0 && errno != EEXIST) break;
      if (slash == std::string::npos) break;
    }
  }
  const int fd = RetryOpenAt(AT_FDCWD, path.c_str(), O_RDONLY | O_DIRECTORY, 0);
  if (fd < 0) return ErrnoError(errno, absl::StrCat("open directory ", path));
  return Directory(Share(fd), path);
}

absl::StatusOr<Directory> Directory::OpenBeneath(absl::string_view relative,
                                                 bool create,
                                                 mode_t mode) const {
  if (relative.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", absl::CHexEscape(relative), "\" is not a path"));
  }
  Directory at = *this;
  for (absl::string_view part : absl::StrSplit(relative, '/')) {
    if (part.empty() || part == ".") continue;
    const std::string where = at.PathOf(part);
    if (part == "..") {
      return absl::PermissionDeniedError(absl::StrCat(
          "open directory ", where, ": \"..\" may not leave ", path_));
    }
    const std::string name(part);
    if (create && ::mkdirat(at.fd(), name.c_str(), mode) != 0 &&
        errno != EEXIST) {
      return ErrnoError(errno, absl::StrCat("create directory ", where));
    }
    const int fd = RetryOpenAt(at.fd(), name.c_str(),
                               O_RDONLY | O_DIRECTORY | O_NOFOLLOW, 0);
    if (fd < 0) {
      const int err = errno;
      struct stat st;
      if ((err == ELOOP || err == ENOTDIR) &&
          ::fstatat(at.fd(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
          S_ISLNK(st.st_mode)) {
        return absl::PermissionDeniedError(absl::StrCat(
            "open directory ", where,
            ": a symbolic link, which may not be followed beneath ", path_));
      }
      return ErrnoError(err, absl::StrCat("open directory ", where));
    }
    at = Directory(Share(fd), where);
  }
  return at;
}

std::string Directory::PathOf(absl::string_view name) const {
  if (!path_.empty() && path_.back() == '/') return absl::StrCat(path_, name);
  return absl::StrCat(path_, "/", name);
}

absl::StatusOr<UniqueFd> Directory::OpenFile(absl::string_view name, int flags,
                                             mode_t mode) const {
  if (absl::Status ok = CheckSingleComponent(name); !ok.ok()) return ok;
  const std::string file(name);
  const int fd =
      RetryOpenAt(fd_->get(), file.c_str(), flags | O_NOFOLLOW, mode);
  if (fd < 0) return ErrnoError(errno, absl::StrCat("open ", PathOf(name)));
  return UniqueFd(fd);
}

absl::Status Directory::Rename(absl::string_view from,
                               absl::string_view to) const {
  if (absl::Status ok = CheckSingleComponent(from); !ok.ok()) return ok;
  if (absl::Status ok = CheckSingleComponent(to); !ok.ok()) return ok;
  const std::string a(from), b(to);
  if (::renameat(fd_->get(), a.c_str(), fd_->get(), b.c_str()) != 0) {
    return ErrnoError(errno, absl::StrCat("rename ", PathOf(from), " to ", to));
  }
  return absl::OkStatus();
}

absl::Status Directory::Remove(absl::string_view name) const {
  if (absl::Status ok = CheckSingleComponent(name); !ok.ok()) return ok;
  const std::string file(name);
  if (::unlinkat(fd_->get(), file.c_str(), 0) != 0) {
    return ErrnoError(errno, absl::StrCat("remove ", PathOf(name)));
  }
  return absl::OkStatus();
}

absl::StatusOr<Directory::Entry> Directory::Stat(absl::string_view name) const {
  if (absl::Status ok = CheckSingleComponent(name); !ok.ok()) return ok;
  const std::string file(name);
  struct stat st;
  if (::fstatat(fd_->get(), file.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    return ErrnoError(errno, absl::StrCat("stat ", PathOf(name)));
  }
  Entry entry;
  entry.name = file;
  entry.regular_file = S_ISREG(st.st_mode);
  entry.uid = st.st_uid;
  entry.mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
  return entry;
}

absl::StatusOr<std::vector<Directory::Entry>> Directory::List() const {
  // fdopendir takes its descriptor: give it a fresh one of this directory.
  const int fd = RetryOpenAt(fd_->get(), ".", O_RDONLY | O_DIRECTORY, 0);
  if (fd < 0) return ErrnoError(errno, absl::StrCat("list ", path_));
  DIR* dir = ::fdopendir(fd);
  if (dir == nullptr) {
    const int err = errno;
    ::close(fd);
    return ErrnoError(err, absl::StrCat("list ", path_));
  }
  std::vector<Entry> entries;
  int err = 0;
  for (;;) {
    errno = 0;
    const struct dirent* d = ::readdir(dir);
    if (d == nullptr) {
      err = errno;
      break;
    }
    const absl::string_view name = d->d_name;
    if (name == "." || name == "..") continue;
    absl::StatusOr<Entry> entry = Stat(name);
    if (entry.ok()) entries.push_back(*std::move(entry));
  }
  ::closedir(dir);
  if (err != 0) return ErrnoError(err, absl::StrCat("list ", path_));
  return entries;
}

absl::Status Directory::Sync() const {
  int result;
  do {
    result = ::fsync(fd_->get());
  } while (result != 0 && errno == EINTR);
  if (result != 0) return ErrnoError(errno, absl::StrCat("fsync ", path_));
  return absl::OkStatus();
}

}  // namespace tessera
