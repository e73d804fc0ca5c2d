// Files only their owner may touch: a private directory and a file written
// once, for secrets kept per user (wire/user_token.h's token file).
//
// EnsureOwnerOnlyDirectory makes `dir` (mode 0700) when it is missing and
// then requires it to be a directory owned by this process's effective
// user that no one else may write to (group or other write bits, which
// would let another user swap the file inside). CheckOwnerOnlyFile
// requires an open file to be a regular file of this user with no group or
// other permission bits. PublishFileOnce writes `contents` to a temporary
// file (O_EXCL, `mode`), syncs it and links it to `path` only if `path`
// does not exist yet: of processes racing to create the same file, exactly
// one wins and every one then reads the winner's bytes.
//
// Errors are ErrnoError values naming the path (io/errno.h), or
// FAILED_PRECONDITION naming the owner or mode that is wrong and how to
// fix it. Symbolic links are not followed for the file (O_NOFOLLOW).
//
// Thread-compatible: no state is kept.
#ifndef TESSERA_IO_OWNER_ONLY_H_
#define TESSERA_IO_OWNER_ONLY_H_

#include <sys/types.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tessera {

// `dir` exists (made with 0700 when missing; its parent must exist), is a
// directory of this user, and is writable by this user alone.
absl::Status EnsureOwnerOnlyDirectory(const std::string& dir);

// OK when `fd` (opened from `name`) is a regular file owned by this user
// with no group or other permissions.
absl::Status CheckOwnerOnlyFile(int fd, absl::string_view name);

// Creates `path` holding `contents` with `mode` unless it exists. True when
// this call created it, false when the file was already there (its bytes
// are left alone).
absl::StatusOr<bool> PublishFileOnce(const std::string& path,
                                     absl::string_view contents,
                                     mode_t mode = 0600);

}  // namespace tessera

#endif  // TESSERA_IO_OWNER_ONLY_H_
