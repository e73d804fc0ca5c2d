// UniqueFd: an owned file descriptor, closed when the owner dies.
//
// The one owned-descriptor type of Tessera: sockets, files, memory files
// and descriptors received over a Unix socket are all held in one. Close()
// closes early and reports close(2)'s error (a deferred write error of a
// file system), which the destructor has to drop.
//
// Thread-compatible: one thread at a time per UniqueFd. Moving from it
// leaves it empty (get() == -1).
#ifndef TESSERA_IO_UNIQUE_FD_H_
#define TESSERA_IO_UNIQUE_FD_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tessera {

class UniqueFd {
 public:
  UniqueFd() = default;
  // Takes ownership of `fd` (-1: empty).
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Gives the descriptor up without closing it.
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  // Closes the descriptor held (errors ignored) and holds `fd` instead.
  void reset(int fd = -1);
  // Closes now; close(2)'s error as ErrnoError(errno, context). Empty
  // afterwards either way.
  absl::Status Close(absl::string_view context);

 private:
  int fd_ = -1;
};

}  // namespace tessera

#endif  // TESSERA_IO_UNIQUE_FD_H_
