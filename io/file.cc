#include "io/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "io/errno.h"

namespace tessera {
namespace {

constexpr absl::string_view kTempMarker = ".tmp.";

std::string DirectoryOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

absl::StatusOr<UniqueFd> OpenFile(const std::string& path, int flags,
                                  mode_t mode) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return ErrnoError(errno, absl::StrCat("open ", path));
  return UniqueFd(fd);
}

absl::StatusOr<size_t> ReadAll(int fd, void* data, size_t size,
                               absl::string_view name) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::read(fd, static_cast<char*>(data) + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError(errno, absl::StrCat("read ", name));
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  return done;
}

absl::StatusOr<size_t> PreadAll(int fd, void* data, size_t size, int64_t offset,
                                absl::string_view name) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd, static_cast<char*>(data) + done, size - done,
                              static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError(errno, absl::StrCat("read ", name));
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  return done;
}

absl::Status PwriteAll(int fd, const void* data, size_t size, int64_t offset,
                       absl::string_view name) {
  const char* in = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::pwrite(fd, in, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError(errno, absl::StrCat("write ", name));
    in += n;
    offset += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status PwriteZeros(int fd, int64_t size, int64_t offset,
                         absl::string_view name) {
  static constexpr int64_t kBlock = int64_t{1} << 20;
  static const char* const zeros = new char[kBlock]();
  for (int64_t done = 0; done < size; done += kBlock) {
    const int64_t length = std::min(kBlock, size - done);
    absl::Status written =
        PwriteAll(fd, zeros, static_cast<size_t>(length), offset + done, name);
    if (!written.ok()) return written;
  }
  return absl::OkStatus();
}

absl::Status WriteAll(int fd, const void* data, size_t size,
                      absl::string_view name) {
  const char* in = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, in, size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError(errno, absl::StrCat("write ", name));
    in += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

std::string FileVersion(const std::string& path) {
  struct stat info;
  if (path.empty() || stat(path.c_str(), &info) != 0) return "-";
  return absl::StrCat(info.st_mtim.tv_sec, ".", info.st_mtim.tv_nsec, "/",
                      info.st_size, "/", info.st_ino);
}

bool IsExecutableFile(const std::string& path) {
  struct stat info;
  return stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode) &&
         access(path.c_str(), X_OK) == 0;
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path,
                                             size_t max_bytes) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer (regular files
  // ignore the flag). A pipe is read to its end as usual (`--token-file
  // <(...)`); one without a writer reads as empty.
  absl::StatusOr<UniqueFd> fd = OpenFile(path, O_RDONLY | O_NONBLOCK);
  if (!fd.ok()) return fd.status();
  struct stat info;
  if (::fstat(fd->get(), &info) != 0) {
    return ErrnoError(errno, absl::StrCat("stat ", path));
  }
  if (S_ISFIFO(info.st_mode)) {
    const int flags = ::fcntl(fd->get(), F_GETFL);
    if (flags < 0 || ::fcntl(fd->get(), F_SETFL, flags & ~O_NONBLOCK) != 0) {
      return ErrnoError(errno, absl::StrCat("fcntl ", path));
    }
  } else if (!S_ISREG(info.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is not a regular file or a pipe"));
  }
  std::string contents;
  char buffer[1 << 16];
  while (true) {
    absl::StatusOr<size_t> got =
        ReadAll(fd->get(), buffer, sizeof(buffer), path);
    if (!got.ok()) return got.status();
    contents.append(buffer, *got);
    if (contents.size() > max_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, " holds more than ", max_bytes, " bytes"));
    }
    if (*got < sizeof(buffer)) return contents;
  }
}

absl::StatusOr<int64_t> FileSize(int fd, absl::string_view name) {
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return ErrnoError(errno, absl::StrCat("stat ", name));
  }
  return static_cast<int64_t>(st.st_size);
}

absl::Status SyncFile(int fd, absl::string_view name) {
  if (::fsync(fd) != 0) return ErrnoError(errno, absl::StrCat("fsync ", name));
  return absl::OkStatus();
}

absl::Status SyncDirectory(const std::string& dir) {
  absl::StatusOr<UniqueFd> fd = OpenFile(dir, O_RDONLY | O_DIRECTORY);
  if (!fd.ok()) return fd.status();
  return SyncFile(fd->get(), dir);
}

absl::StatusOr<AtomicFile> AtomicFile::Create(const std::string& path,
                                              mode_t mode) {
  const size_t slash = path.rfind('/');
  absl::StatusOr<Directory> dir = Directory::Open(DirectoryOf(path));
  if (!dir.ok()) return dir.status();
  return CreateIn(
      *dir, slash == std::string::npos ? path : path.substr(slash + 1), mode);
}

absl::StatusOr<AtomicFile> AtomicFile::CreateIn(const Directory& dir,
                                                std::string name, mode_t mode) {
  static std::atomic<uint64_t> counter{0};
  if (absl::Status ok = CheckSingleComponent(name); !ok.ok()) return ok;
  std::string temp_name =
      absl::StrCat(name, kTempMarker, ::getpid(), ".", counter.fetch_add(1));
  absl::StatusOr<UniqueFd> fd =
      dir.OpenFile(temp_name, O_WRONLY | O_CREAT | O_EXCL, mode);
  if (!fd.ok()) return fd.status();
  return AtomicFile(dir, std::move(name), std::move(temp_name), *std::move(fd));
}

AtomicFile::AtomicFile(Directory dir, std::string name, std::string temp_name,
                       UniqueFd fd)
    : dir_(std::move(dir)),
      name_(std::move(name)),
      temp_name_(std::move(temp_name)),
      path_(dir_.PathOf(name_)),
      temp_path_(dir_.PathOf(temp_name_)),
      fd_(std::move(fd)) {}

AtomicFile::AtomicFile(AtomicFile&& other) noexcept
    : dir_(other.dir_),
      name_(std::move(other.name_)),
      temp_name_(std::move(other.temp_name_)),
      path_(std::move(other.path_)),
      temp_path_(std::move(other.temp_path_)),
      fd_(std::move(other.fd_)),
      size_(other.size_),
      committed_(std::exchange(other.committed_, true)) {}

AtomicFile::~AtomicFile() {
  if (!committed_) dir_.Remove(temp_name_).IgnoreError();
}

absl::Status AtomicFile::Append(const void* data, size_t size) {
  absl::Status written = WriteAll(fd_.get(), data, size, temp_path_);
  if (!written.ok()) return written;
  size_ += static_cast<int64_t>(size);
  return absl::OkStatus();
}

absl::Status AtomicFile::Commit() {
  if (committed_ || !fd_.valid()) {
    return absl::FailedPreconditionError(
        absl::StrCat("AtomicFile ", path_, ": committed already"));
  }
  absl::Status status = SyncFile(fd_.get(), temp_path_);
  if (!status.ok()) return status;
  status = fd_.Close(absl::StrCat("close ", temp_path_));
  if (!status.ok()) return status;
  status = dir_.Rename(temp_name_, name_);
  if (!status.ok()) return status;
  committed_ = true;
  return dir_.Sync();
}

absl::string_view AtomicFileTarget(absl::string_view name) {
  // "<target>.tmp.<pid>.<n>": digits, a dot, digits after the marker.
  const size_t marker = name.rfind(kTempMarker);
  if (marker == absl::string_view::npos || marker == 0) return name;
  const absl::string_view rest = name.substr(marker + kTempMarker.size());
  const size_t dot = rest.find('.');
  if (dot == absl::string_view::npos || dot == 0 || dot + 1 == rest.size()) {
    return name;
  }
  for (size_t i = 0; i < rest.size(); ++i) {
    if (i != dot && !absl::ascii_isdigit(static_cast<unsigned char>(rest[i]))) {
      return name;
    }
  }
  return name.substr(0, marker);
}

absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view contents, mode_t mode) {
  absl::StatusOr<AtomicFile> file = AtomicFile::Create(path, mode);
  if (!file.ok()) return file.status();
  absl::Status status = file->Append(contents.data(), contents.size());
  if (!status.ok()) return status;
  return file->Commit();
}

}  // namespace tessera
