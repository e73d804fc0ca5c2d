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
  EXPECT_FALSE(IsOpen(fd));
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
  EXPECT_FALSE(IsOpen(first));
  EXPECT_TRUE(IsOpen(second));
  EXPECT_EQ(owned.get(), second);
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
  EXPECT_FALSE(IsOpen(second));
  EXPECT_TRUE(IsOpen(first));
  EXPECT_EQ(c.get(), first);
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
}

}  // namespace
}  // namespace tessera
