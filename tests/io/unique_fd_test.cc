// UniqueFd and ErrnoError (io/unique_fd.h, io/errno.h).
#include "io/unique_fd.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/errno.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

bool IsOpen(int fd) { return fcntl(fd, F_GETFD) != -1; }
// Closed as the kernel sees it: fcntl fails with EBADF (not just any error).
bool IsClosed(int fd) {
  errno = 0;
  return fcntl(fd, F_GETFD) == -1 && errno == EBADF;
}

// A fresh descriptor (one end of a pipe; the other is closed at once).
int NewFd() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return -1;
  close(fds[1]);
  return fds[0];
}

TEST(UniqueFdTest, ClosesWhenDestroyed) {
  const int fd = NewFd();
  ASSERT_GE(fd, 0);
  { UniqueFd owned(fd); }
  EXPECT_TRUE(IsClosed(fd));
}

TEST(UniqueFdTest, EmptyByDefault) {
  UniqueFd empty;
  EXPECT_FALSE(empty.valid());
  EXPECT_EQ(empty.get(), -1);
  EXPECT_THAT(empty.Close("nothing"), IsOk());
}

TEST(UniqueFdTest, ReleaseKeepsItOpen) {
  const int fd = NewFd();
  {
    UniqueFd owned(fd);
    EXPECT_EQ(owned.release(), fd);
    EXPECT_FALSE(owned.valid());
  }
  EXPECT_TRUE(IsOpen(fd));
  close(fd);
}

TEST(UniqueFdTest, ResetClosesTheOldOne) {
  const int first = NewFd();
  const int second = NewFd();
  UniqueFd owned(first);
  owned.reset(second);
  EXPECT_TRUE(IsClosed(first));
  EXPECT_TRUE(IsOpen(second));
  EXPECT_EQ(owned.get(), second);
  owned.reset();
  EXPECT_TRUE(IsClosed(second));
  EXPECT_FALSE(owned.valid());
}

TEST(UniqueFdTest, MovesOwnership) {
  const int first = NewFd();
  const int second = NewFd();
  UniqueFd a(first);
  UniqueFd b(std::move(a));
  EXPECT_FALSE(a.valid());  // NOLINT(bugprone-use-after-move): specified.
  EXPECT_EQ(b.get(), first);
  UniqueFd c(second);
  c = std::move(b);  // Closes `second`.
  EXPECT_TRUE(IsClosed(second));
  EXPECT_TRUE(IsOpen(first));
  EXPECT_EQ(c.get(), first);
  EXPECT_FALSE(b.valid());  // NOLINT(bugprone-use-after-move): specified.
  // Moving into itself (through an alias) keeps the descriptor open.
  UniqueFd& alias = c;
  c = std::move(alias);
  EXPECT_EQ(c.get(), first);
  EXPECT_TRUE(IsOpen(first));
}

TEST(UniqueFdTest, CloseClosesOnceAndThenIsANoOp) {
  const int fd = NewFd();
  UniqueFd owned(fd);
  EXPECT_OK(owned.Close("closing the pipe"));
  EXPECT_TRUE(IsClosed(fd));
  EXPECT_FALSE(owned.valid());
  EXPECT_EQ(owned.get(), -1);
  // Closing twice: the second call has nothing to close (it must not close
  // whatever now has the same number).
  const int reused = NewFd();
  EXPECT_OK(owned.Close("closing again"));
  EXPECT_TRUE(IsOpen(reused));
  close(reused);
}

TEST(UniqueFdTest, CloseReportsTheError) {
  const int fd = NewFd();
  UniqueFd owned(fd);
  close(fd);  // Behind its back: the close below gets EBADF.
  EXPECT_THAT(owned.Close("closing the pipe"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("closing the pipe: Bad file descriptor")));
  EXPECT_FALSE(owned.valid());
}

TEST(ErrnoErrorTest, CodeFollowsTheErrno) {
  EXPECT_THAT(ErrnoError(ENOENT, "open /x"),
              StatusIs(absl::StatusCode::kNotFound,
                       "open /x: No such file or directory"));
  EXPECT_THAT(ErrnoError(EACCES, "open /y"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("Permission denied")));
  EXPECT_THAT(ErrnoError(ENOSPC, "write"),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("No space left")));
  EXPECT_THAT(ErrnoError(ECONNRESET, "recv"),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("recv: ")));
}

TEST(ErrnoErrorTest, FixedCodeKeepsTheMessage) {
  EXPECT_THAT(
      ErrnoError(EINVAL, "send", absl::StatusCode::kUnavailable),
      StatusIs(absl::StatusCode::kUnavailable, "send: Invalid argument"));
  // Whatever errno would have chosen: ENOENT alone is NOT_FOUND.
  EXPECT_THAT(ErrnoError(ENOENT, "connect", absl::StatusCode::kUnavailable),
              StatusIs(absl::StatusCode::kUnavailable,
                       "connect: No such file or directory"));
}

}  // namespace
}  // namespace tessera
