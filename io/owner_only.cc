#include "io/owner_only.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "io/errno.h"
#include "io/file.h"

namespace tessera {

namespace {

std::string Mode(mode_t mode) {
  return absl::StrFormat("%04o", static_cast<unsigned>(mode & 07777));
}

}  // namespace

absl::Status EnsureOwnerOnlyDirectory(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return ErrnoError(errno, absl::StrCat("mkdir ", dir));
  }
  struct stat info;
  if (::stat(dir.c_str(), &info) != 0) {
    return ErrnoError(errno, absl::StrCat("stat ", dir));
  }
  if (!S_ISDIR(info.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir, " is not a directory"));
  }
  if (info.st_uid != ::geteuid()) {
    return absl::FailedPreconditionError(absl::StrCat(
        dir, " belongs to uid ", info.st_uid, ", not to this user (uid ",
        ::geteuid(), "): another user could replace what it holds"));
  }
  if ((info.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        dir, " has mode ", Mode(info.st_mode),
        ": others may write to it and replace what it holds (chmod 700 ", dir,
        ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckOwnerOnlyFile(int fd, absl::string_view name) {
  struct stat info;
  if (::fstat(fd, &info) != 0) {
    return ErrnoError(errno, absl::StrCat("stat ", name));
  }
  if (!S_ISREG(info.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, " is not a regular file"));
  }
  if (info.st_uid != ::geteuid()) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, " belongs to uid ", info.st_uid,
                     ", not to this user (uid ", ::geteuid(), ")"));
  }
  if ((info.st_mode & 077) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, " has mode ", Mode(info.st_mode),
                     ": others may read or change it (chmod 600 ", name, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> PublishFileOnce(const std::string& path,
                                     absl::string_view contents, mode_t mode) {
  std::random_device random;
  const std::string temp = absl::StrFormat("%s.%d.%08x.tmp", path, ::getpid(),
                                           static_cast<unsigned>(random()));
  {
    absl::StatusOr<UniqueFd> fd =
        OpenFile(temp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, mode);
    if (!fd.ok()) return fd.status();
    // The mode of a new file is cut by the umask: set it exactly.
    if (::fchmod(fd->get(), mode) != 0) {
      const int error = errno;
      ::unlink(temp.c_str());
      return ErrnoError(error, absl::StrCat("chmod ", temp));
    }
    absl::Status written =
        WriteAll(fd->get(), contents.data(), contents.size(), temp);
    if (written.ok()) written = SyncFile(fd->get(), temp);
    if (!written.ok()) {
      ::unlink(temp.c_str());
      return written;
    }
  }
  // link(2) never replaces: the first process to link wins.
  const int linked = ::link(temp.c_str(), path.c_str());
  const int error = errno;
  ::unlink(temp.c_str());
  if (linked != 0) {
    if (error == EEXIST) return false;
    return ErrnoError(error, absl::StrCat("link ", temp, " to ", path));
  }
  const size_t slash = path.rfind('/');
  absl::Status synced =
      SyncDirectory(slash == std::string::npos ? "." : path.substr(0, slash));
  if (!synced.ok()) return synced;
  return true;
}

}  // namespace tessera
