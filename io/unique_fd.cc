#include "io/unique_fd.h"

#include <unistd.h>

#include <cerrno>

#include "io/errno.h"

namespace tessera {

void UniqueFd::reset(int fd) {
  // close(2) releases the descriptor even when it fails (EINTR included on
  // Linux), so it is never retried.
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

absl::Status UniqueFd::Close(absl::string_view context) {
  if (fd_ < 0) return absl::OkStatus();
  const int result = ::close(release());
  if (result != 0) return ErrnoError(errno, context);
  return absl::OkStatus();
}

}  // namespace tessera
