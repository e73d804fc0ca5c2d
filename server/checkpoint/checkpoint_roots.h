// Where a daemon may save and load checkpoints: the directories given by
// --checkpoint-root, opened once at start. A request's path is resolved
// beneath one of them and never leaves it, so that a client (or another
// local user who can reach the daemon) cannot make the daemon read or
// write anything else on the host.
//
// Resolution: a relative path is beneath the first root; an absolute path
// must lie inside one of the roots (compared component-wise with the
// roots' paths as configured and as resolved by realpath) and is resolved
// beneath it. The rest of the path is resolved component by component from the
// held root (io/directory.h's OpenBeneath): ".." and symbolic links are
// refused, whatever the daemon's privileges, and a save creates the missing
// directories (mode 0750 & ~umask). Files inside are opened the same way
// (server/checkpoint/).
//
// Failure (absl::Status): FAILED_PRECONDITION when no root is configured
// (the message says how to enable checkpoints); INVALID_ARGUMENT for an
// empty path or one holding NUL; PERMISSION_DENIED naming the path for one
// outside every root, through "..", or through a symbolic link; errno
// codes (NOT_FOUND, ENOTDIR as FAILED_PRECONDITION, ...) naming the path.
//
// Thread-safety: immutable after Open; Resolve may be called from any
// thread.
#ifndef TESSERA_SERVER_CHECKPOINT_CHECKPOINT_ROOTS_H_
#define TESSERA_SERVER_CHECKPOINT_CHECKPOINT_ROOTS_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "io/directory.h"

namespace tessera {

class CheckpointRoots {
 public:
  // No roots: every Resolve is FAILED_PRECONDITION.
  CheckpointRoots() = default;

  // Opens (creating when missing) each root; fails naming the first that
  // cannot be opened.
  static absl::StatusOr<CheckpointRoots> Open(
      const std::vector<std::string>& paths);

  bool empty() const { return roots_.empty(); }
  // The roots' real paths, in order.
  std::vector<std::string> paths() const;

  // The checkpoint directory `request_path` names, created with `create`.
  absl::StatusOr<Directory> Resolve(absl::string_view request_path,
                                    bool create) const;

 private:
  struct Root {
    // As configured (made absolute), and with every link resolved: an
    // absolute request path may start with either.
    std::string given_path;
    std::string real_path;
    Directory dir;
  };
  explicit CheckpointRoots(std::vector<Root> roots)
      : roots_(std::move(roots)) {}

  std::vector<Root> roots_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_CHECKPOINT_CHECKPOINT_ROOTS_H_
