// Files, written once for every caller: whole reads and writes that retry
// EINTR and short transfers, and atomic replacement.
//
// Errors are ErrnoError values (io/errno.h) whose context names the file
// ("write <path>: No space left on device"); callers add what they were
// doing. Nothing here throws or aborts.
//
// Thread-compatible: the functions keep no state; an AtomicFile belongs to
// one thread at a time.
#ifndef TESSERA_IO_FILE_H_
#define TESSERA_IO_FILE_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "io/directory.h"
#include "io/unique_fd.h"

namespace tessera {

// The directory part of `path` ("a/b" -> "a", "/b" -> "/", "b" -> ".").
std::string DirectoryOf(const std::string& path);

// open(2) with O_CLOEXEC added, retrying EINTR. Error context: "open <path>".
absl::StatusOr<UniqueFd> OpenFile(const std::string& path, int flags,
                                  mode_t mode = 0644);

// Reads up to `size` bytes; fewer only when the file ends first. Error
// context: "read <name>".
absl::StatusOr<size_t> ReadAll(int fd, void* data, size_t size,
                               absl::string_view name);
// The same at `offset` (pread(2); the file position is unchanged).
absl::StatusOr<size_t> PreadAll(int fd, void* data, size_t size, int64_t offset,
                                absl::string_view name);
// Writes all `size` bytes at `offset` (pwrite(2)). Error context:
// "write <name>".
absl::Status PwriteAll(int fd, const void* data, size_t size, int64_t offset,
                       absl::string_view name);
// Writes all `size` bytes of this process's memory at `data` into `fd` at
// `offset`, as PwriteAll does, but through a pipe (vmsplice(2), then
// splice(2)): the kernel then reads the bytes through its own mapping of
// their pages instead of through this process's addresses. On a VM whose
// hypervisor shadows page tables, the kernel's first read of a user page
// costs a fault of its own, as much as the copy of several: 128 MiB from
// memory just written took 280-318 ms by pwrite and 36-60 ms through the
// pipe on a 2-core one (from memory the kernel had read before: 40-60 ms
// against 51-55). `fd` must take splice (a memory file, a regular file
// not opened O_APPEND). Fewer than kMinSpliceWriteBytes, and whatever the
// pipe's way cannot move (no pipe to be had, or one the user's pipe quota
// keeps small; a kernel or a seccomp filter without vmsplice; memory that
// cannot be pinned, such as a device's mapping), go by pwrite, which also
// reports the errors, as PwriteAll does: "write <name>". Like pwrite,
// reads `data` while it runs: the caller keeps it unchanged meanwhile.
inline constexpr size_t kMinSpliceWriteBytes = size_t{64} << 10;
absl::Status SpliceWriteAll(int fd, const void* data, size_t size,
                            int64_t offset, absl::string_view name);
// Whether this host's kernel pays far more for its first read of a page
// this process wrote than for later reads: kDearFirstReadRatio times or
// more. So it is on a VM whose hypervisor shadows page tables (on a
// 2-core one 64 KiB took 67-134 us the first time and 3 us later: 17-36
// times); on hardware the two are close. Measured once per process, on
// first use (64 KiB of fresh memory written to a pipe four times, about
// 0.2 ms there); false when the measurement cannot be made. Thread-safe.
inline constexpr int kDearFirstReadRatio = 4;
bool KernelFirstReadsAreDear();
// Writes all `size` bytes of this process's memory at `data` into `fd`
// at `offset`: through a pipe (SpliceWriteAll) where the kernel's first
// reads are dear (KernelFirstReadsAreDear) and the bytes are
// kMinSpliceWriteBytes or more, else by pwrite (PwriteAll). Where first
// reads are dear, the pipe's way costs a little more than pwrite from
// memory the kernel read before and far less from memory it never read (a
// 112 MiB state dict published to 4 daemons: 0.062-0.065 s against
// 0.053-0.058 by pwrite once read, 0.135-0.149 s against 0.236-0.243 just
// built); elsewhere it would only cost more. Errors as
// PwriteAll's.
absl::Status MemoryWriteAll(int fd, const void* data, size_t size,
                            int64_t offset, absl::string_view name);
// Writes `size` zero bytes at `offset` (pwrite(2) from a block of zeros
// of its own). Into a memory file this copies through the kernel's own
// mapping: the caller's page tables stay as they were, which is what a
// mapping of the file never touched before would cost to fill (daemons
// zeroing reused shard memory: server/daemon/control_ops.cc). Error
// context: "write <name>".
absl::Status PwriteZeros(int fd, int64_t size, int64_t offset,
                         absl::string_view name);
// Writes all `size` bytes. Error context: "write <name>".
absl::Status WriteAll(int fd, const void* data, size_t size,
                      absl::string_view name);
// The whole file at `path` (settings, tokens, PEM, specs, /proc and
// cgroup files), at most `max_bytes` bytes: a regular file or a pipe (read
// to its end; a FIFO nobody writes to reads as empty, without waiting for
// a writer to open it). A device such as /dev/zero, which never ends, or a
// directory is INVALID_ARGUMENT before a byte is read ("<path> is not a
// regular file or a pipe"); so is more than `max_bytes` ("<path> holds
// more than N bytes"). Error contexts: "open <path>", "read <path>".
inline constexpr size_t kMaxReadFileBytes = size_t{16} << 20;
absl::StatusOr<std::string> ReadFileToString(
    const std::string& path, size_t max_bytes = kMaxReadFileBytes);
// What changes when the file at `path` is rewritten or replaced (its
// modification time, size and inode), to notice a rotation cheaply; "-"
// when it cannot be stat'ed.
std::string FileVersion(const std::string& path);
// Whether `path` is a regular file this process may execute.
bool IsExecutableFile(const std::string& path);
// fstat's size. Error context: "stat <name>".
absl::StatusOr<int64_t> FileSize(int fd, absl::string_view name);
// fsync(2). Error context: "fsync <name>".
absl::Status SyncFile(int fd, absl::string_view name);
// Makes creations, renames and removals in `dir` durable.
absl::Status SyncDirectory(const std::string& dir);

// A file that replaces `path` atomically: written under a temporary name
// beside it ("<path>.tmp.<pid>.<n>", created O_EXCL|O_NOFOLLOW, so it can
// neither clobber nor follow anything already there), then Commit()
// fsyncs it, renames it over `path` and fsyncs the directory: a crash
// leaves the old file or the complete new one, never a mix. The temporary
// file is removed when the object dies uncommitted.
class AtomicFile {
 public:
  static absl::StatusOr<AtomicFile> Create(const std::string& path,
                                           mode_t mode = 0644);
  // The same for the file `name` (one component) of `dir`: every step is
  // relative to the held directory and follows no symbolic link.
  static absl::StatusOr<AtomicFile> CreateIn(const Directory& dir,
                                             std::string name,
                                             mode_t mode = 0644);
  AtomicFile(AtomicFile&& other) noexcept;
  AtomicFile& operator=(AtomicFile&&) = delete;
  ~AtomicFile();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_path_; }
  const std::string& name() const { return name_; }
  const std::string& temp_name() const { return temp_name_; }
  int64_t size() const { return size_; }

  // Writes `size` bytes at the end of what was appended (MemoryWriteAll:
  // a checkpoint of shards just written, whose pages the daemon's kernel
  // never read, goes through a pipe where that is dear: a 256 MiB save took
  // 0.41-0.77 s instead of 0.93-1.11 on a 2-core VM).
  absl::Status Append(const void* data, size_t size);
  // fsync, close, rename over path(), fsync the directory. Once.
  absl::Status Commit();

 private:
  AtomicFile(Directory dir, std::string name, std::string temp_name,
             UniqueFd fd);

  Directory dir_;
  std::string name_;
  std::string temp_name_;
  std::string path_;
  std::string temp_path_;
  UniqueFd fd_;
  int64_t size_ = 0;
  bool committed_ = false;
};

// For a directory entry: the file an AtomicFile's temporary `name` would
// have replaced ("w.npy.tmp.12.3" -> "w.npy"), or `name` itself when it is
// not such a temporary file.
absl::string_view AtomicFileTarget(absl::string_view name);

}  // namespace tessera

#endif  // TESSERA_IO_FILE_H_
