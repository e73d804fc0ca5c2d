// OutputFile: a file a user named to receive a result (`tessera fetch
// -o PATH`, `tessera read -o PATH`, a daemon's --address-file), written as
// a shell's `>` would treat PATH, but atomically where PATH is a file:
//
//   - "-": this process's standard output, written in place;
//   - a regular file, a name not yet taken, or a symbolic link to either:
//     replaced (or made) atomically (AtomicFile, io/file.h), through the
//     link (the file it names is written, the link stays);
//   - a character device, a FIFO (/dev/null, /dev/stdout, a named pipe):
//     written in place, never replaced. A FIFO no process reads is refused
//     at Open ("no process has <path> open for reading"), not waited for;
//   - a directory or a socket: INVALID_ARGUMENT at Open, before anything is
//     written ("<path> is a directory: name a file in it").
//
// Why: renaming a temporary file over the path, as every output did,
// replaced /dev/null or /dev/full with a regular file when run as root
// (`tessera fetch w -o /dev/null`), for every process of the host. Open
// classifies the path once, so a caller can open before the work that
// produces the bytes and fail fast: a file's directory must exist then,
// but its temporary file is made only at the first Append, so that a
// process killed during that work (Ctrl-C of a long fetch) leaves none.
//
// Errors are ErrnoError values naming the path ("write /dev/full: No space
// left on device"). A replaced file that is not committed is removed when
// the OutputFile dies; bytes written in place stay written.
//
// Thread-compatible: an OutputFile belongs to one thread at a time.
#ifndef TESSERA_IO_OUTPUT_FILE_H_
#define TESSERA_IO_OUTPUT_FILE_H_

#include <sys/types.h>

#include <cstddef>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "io/file.h"
#include "io/unique_fd.h"

namespace tessera {

class OutputFile {
 public:
  // How `path` is written.
  enum class Kind { kReplaced, kInPlace, kStandardOutput };

  // Classifies `path` (above) and opens it: the device or FIFO itself; for
  // a replaced file, checks its directory exists (the temporary file,
  // created with `mode`, comes at the first Append).
  static absl::StatusOr<OutputFile> Open(const std::string& path,
                                         mode_t mode = 0644);
  OutputFile(OutputFile&& other) noexcept = default;
  OutputFile& operator=(OutputFile&&) = delete;
  ~OutputFile() = default;

  Kind kind() const { return kind_; }
  const std::string& path() const { return path_; }

  // Writes `size` bytes after those written before.
  absl::Status Append(const void* data, size_t size);
  // A replaced file: fsync, rename over the path (AtomicFile::Commit). In
  // place: nothing more to do (the bytes were written by Append). Once.
  absl::Status Commit();

 private:
  OutputFile(std::string path, Kind kind, std::string replaced, mode_t mode,
             UniqueFd fd)
      : path_(std::move(path)),
        kind_(kind),
        replaced_(std::move(replaced)),
        mode_(mode),
        fd_(std::move(fd)) {}
  // A kReplaced output of the file `path` names (links followed), once
  // its directory is checked.
  static absl::StatusOr<OutputFile> Replacing(const std::string& path,
                                              mode_t mode);
  // kReplaced: the temporary file, made at the first Append.
  absl::Status MakeTemporary();

  std::string path_;
  Kind kind_;
  std::string replaced_;  // kReplaced: the file replaced (links followed)
  mode_t mode_;
  std::optional<AtomicFile> atomic_;  // kReplaced, once made
  UniqueFd fd_;                       // kInPlace
  bool committed_ = false;
};

// Writes `contents` to `path` through an OutputFile.
absl::Status WriteOutputFile(const std::string& path,
                             absl::string_view contents, mode_t mode = 0644);

// Removes `path` if it is a regular file (not through a symbolic link);
// leaves a device, a FIFO, a directory or a link alone. OK when nothing is
// there. For files a process writes and removes again (a daemon's address
// file): `--address-file /dev/stdout` must never unlink a device node.
absl::Status RemoveOutputFile(const std::string& path);

}  // namespace tessera

#endif  // TESSERA_IO_OUTPUT_FILE_H_
