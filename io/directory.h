// A directory held open, and every file operation made relative to it.
//
// Paths are resolved once, when a Directory is opened; afterwards files are
// opened, created, renamed and removed in it by single names (no '/', not
// "." or ".."), never following a symbolic link (O_NOFOLLOW, AT_* flags), so
// that what the directory was when it was opened is what every later call
// works in, however its path is changed meanwhile. OpenBeneath resolves a
// relative path component by component from a held directory and refuses
// "..", symbolic links and anything that is not a directory: the result
// can never lie outside the starting directory (what openat2's
// RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS promise, on every kernel, and it can
// create the missing components on the way).
//
// Errors are ErrnoError values (io/errno.h) naming the path; a name that is
// not a single component is INVALID_ARGUMENT; a ".." or a symbolic link met
// by OpenBeneath is PERMISSION_DENIED. Nothing here throws or aborts.
//
// Thread-safety: a Directory is immutable after opening; copies share one
// descriptor, closed with the last copy; every method may be called from
// any thread.
#ifndef TESSERA_IO_DIRECTORY_H_
#define TESSERA_IO_DIRECTORY_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "io/unique_fd.h"

namespace tessera {

class Directory {
 public:
  // One entry of List().
  struct Entry {
    std::string name;
    bool regular_file = false;
    uid_t uid = 0;
    int64_t mtime_ns = 0;
  };

  // Opens `path`, following symbolic links: a path its caller trusts (a
  // daemon's configuration, a library caller's argument). With `create`,
  // missing directories are created first (mode & ~umask).
  static absl::StatusOr<Directory> Open(const std::string& path,
                                        bool create = false,
                                        mode_t mode = 0755);

  // `relative` resolved beneath this directory as described above: empty
  // components and "." are skipped (an empty path is this directory),
  // ".." and symbolic links are PERMISSION_DENIED, a component that is not
  // a directory is an errno error (ENOTDIR). With `create`, missing
  // components are created with `mode` (& ~umask).
  absl::StatusOr<Directory> OpenBeneath(absl::string_view relative,
                                        bool create = false,
                                        mode_t mode = 0750) const;

  int fd() const { return fd_->get(); }
  // The path it was opened by (for messages; never used to reach it).
  const std::string& path() const { return path_; }
  // "<path>/<name>", for messages.
  std::string PathOf(absl::string_view name) const;

  // openat(2) of `name` with O_CLOEXEC | O_NOFOLLOW added.
  absl::StatusOr<UniqueFd> OpenFile(absl::string_view name, int flags,
                                    mode_t mode = 0644) const;
  // renameat(2) within this directory.
  absl::Status Rename(absl::string_view from, absl::string_view to) const;
  // unlinkat(2) of a file (never a directory); ENOENT is an error.
  absl::Status Remove(absl::string_view name) const;
  // lstat of `name`; NOT_FOUND when missing.
  absl::StatusOr<Entry> Stat(absl::string_view name) const;
  // Every entry but "." and "..", in no particular order.
  absl::StatusOr<std::vector<Entry>> List() const;
  // fsync(2) of the directory: creations, renames and removals in it are
  // durable.
  absl::Status Sync() const;

 private:
  Directory(std::shared_ptr<const UniqueFd> fd, std::string path)
      : fd_(std::move(fd)), path_(std::move(path)) {}

  std::shared_ptr<const UniqueFd> fd_;
  std::string path_;
};

// OK when `name` is a single path component: non-empty, no '/' or NUL,
// not "." or "..". INVALID_ARGUMENT naming it otherwise.
absl::Status CheckSingleComponent(absl::string_view name);

}  // namespace tessera

#endif  // TESSERA_IO_DIRECTORY_H_
