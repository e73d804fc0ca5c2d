#include "io/file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "io/errno.h"

namespace tessera {
namespace {

constexpr absl::string_view kTempMarker = ".tmp.";

// The pipe SpliceWriteAll asks for (the default limit of an unprivileged
// user, /proc/sys/fs/pipe-max-size), and the least it moves bytes through:
// a user over its pipe quota gets pipes of one page, through which each
// page would cost two system calls.
constexpr int kSplicePipeBytes = 1 << 20;
constexpr int kMinSplicePipeBytes = 64 << 10;

// Moves what it can of [data, data + size) into `fd` at `offset` through a
// pipe of its own; returns how many bytes reached the file, from the
// first, and stops at the first refusal (the caller writes the rest).
size_t SpliceWhatItCan(int fd, const char* data, size_t size, int64_t offset) {
  int ends[2];
  if (::pipe2(ends, O_CLOEXEC) != 0) return 0;
  const UniqueFd read_end(ends[0]);
  const UniqueFd write_end(ends[1]);
  int capacity = ::fcntl(write_end.get(), F_SETPIPE_SZ, kSplicePipeBytes);
  if (capacity < 0) capacity = ::fcntl(write_end.get(), F_GETPIPE_SZ);
  if (capacity < kMinSplicePipeBytes) return 0;
  size_t done = 0;
  while (done < size) {
    iovec from{const_cast<char*>(data + done),
               std::min(size - done, static_cast<size_t>(capacity))};
    const ssize_t pinned = ::vmsplice(write_end.get(), &from, 1, 0);
    if (pinned < 0 && errno == EINTR) continue;
    if (pinned <= 0) return done;
    // Whatever of these bytes stays in the pipe on a refusal is dropped
    // with the pipe; the caller writes it again.
    for (size_t left = static_cast<size_t>(pinned); left > 0;) {
      loff_t at = static_cast<loff_t>(offset) + static_cast<loff_t>(done);
      const ssize_t moved = ::splice(read_end.get(), nullptr, fd, &at, left, 0);
      if (moved < 0 && errno == EINTR) continue;
      if (moved <= 0) return done;
      done += static_cast<size_t>(moved);
      left -= static_cast<size_t>(moved);
    }
  }
  return done;
}

}  // namespace

std::string DirectoryOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

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

absl::Status SpliceWriteAll(int fd, const void* data, size_t size,
                            int64_t offset, absl::string_view name) {
  const char* in = static_cast<const char*>(data);
  const size_t spliced =
      size >= kMinSpliceWriteBytes ? SpliceWhatItCan(fd, in, size, offset) : 0;
  return PwriteAll(fd, in + spliced, size - spliced,
                   offset + static_cast<int64_t>(spliced), name);
}

namespace {

// KernelFirstReadsAreDear's measurement: 64 KiB of memory this process
// just wrote, written to a pipe (the kernel's first read of its pages)
// and, drained, again (the best of three later reads). False where no
// pipe or memory is to be had.
bool MeasureKernelFirstReads() {
  constexpr size_t kBytes = size_t{64} << 10;
  int ends[2];
  if (::pipe2(ends, O_CLOEXEC) != 0) return false;
  const UniqueFd read_end(ends[0]);
  const UniqueFd write_end(ends[1]);
  // Pages of their own, never read by the kernel (heap memory may have
  // been).
  void* const memory = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) return false;
  std::memset(memory, 1, kBytes);
  std::vector<char> drained(kBytes);
  using Clock = std::chrono::steady_clock;
  // One pass: written whole and read back whole, or nothing to compare.
  auto pass = [&]() -> std::optional<Clock::duration> {
    const Clock::time_point start = Clock::now();
    if (::write(write_end.get(), memory, kBytes) !=
        static_cast<ssize_t>(kBytes)) {
      return std::nullopt;
    }
    const Clock::duration took = Clock::now() - start;
    if (::read(read_end.get(), drained.data(), kBytes) !=
        static_cast<ssize_t>(kBytes)) {
      return std::nullopt;
    }
    return took;
  };
  bool dear = false;
  if (::fcntl(write_end.get(), F_SETPIPE_SZ, static_cast<int>(kBytes)) >=
      static_cast<int>(kBytes)) {
    const std::optional<Clock::duration> first = pass();
    std::optional<Clock::duration> again;
    for (int i = 0; i < 3 && first.has_value(); ++i) {
      const std::optional<Clock::duration> next = pass();
      if (!next.has_value()) break;
      if (!again.has_value() || *next < *again) again = next;
    }
    dear = first.has_value() && again.has_value() &&
           *first > kDearFirstReadRatio * *again;
  }
  ::munmap(memory, kBytes);
  return dear;
}

}  // namespace

bool KernelFirstReadsAreDear() {
  static const bool dear = MeasureKernelFirstReads();
  return dear;
}

absl::Status MemoryWriteAll(int fd, const void* data, size_t size,
                            int64_t offset, absl::string_view name) {
  if (size >= kMinSpliceWriteBytes && KernelFirstReadsAreDear()) {
    return SpliceWriteAll(fd, data, size, offset, name);
  }
  return PwriteAll(fd, data, size, offset, name);
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
  absl::Status written =
      MemoryWriteAll(fd_.get(), data, size, size_, temp_path_);
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

}  // namespace tessera
