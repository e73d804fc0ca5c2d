#include "io/read_spin.h"

#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "io/unique_fd.h"
#include "io/unix_socket.h"

namespace tessera {
namespace {

// One wait of `length`, recorded in the process's score.
void Wait(std::chrono::microseconds length) {
  ReadSpin wait;
  wait.Poll(/*small=*/true);
  if (length.count() > 0) std::this_thread::sleep_for(length);
  wait.Got();
}

// Drives the process's score to the bottom (every wait long), then back
// up (every wait short).
TEST(ReadSpinTest, PollsOnlyWhileRecentWaitsWereShort) {
  for (int i = 0; i < 8; ++i) Wait(std::chrono::microseconds(500));
  {
    ReadSpin wait;
    EXPECT_FALSE(wait.Poll(/*small=*/true));  // Blocks at once.
  }
  // More than enough short waits to lift it, should one be preempted.
  for (int i = 0; i < 16; ++i) Wait(std::chrono::microseconds(0));
  ReadSpin wait;
  EXPECT_TRUE(wait.Poll(/*small=*/true));
  // Only for a moment: then it blocks.
  std::this_thread::sleep_for(ReadSpin::kReadSpin + ReadSpin::kReadSpin);
  EXPECT_FALSE(wait.Poll(/*small=*/true));
  wait.Got();
  // A wait for many bytes never polls.
  ReadSpin bulk;
  EXPECT_FALSE(bulk.Poll(/*small=*/false));
}

// A local message that comes while the reader polls, and one that comes
// after it blocked, both arrive, polled for or not; a deadline still ends
// the wait.
TEST(ReadSpinTest, LocalMessagesArriveWhetherPolledOrBlocked) {
  int pair[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair), 0);
  UniqueFd reader(pair[0]);
  UniqueFd writer(pair[1]);
  for (const bool poll : {true, false}) {
    for (const auto delay :
         {std::chrono::microseconds(20), std::chrono::microseconds(20000)}) {
      std::thread send([&] {
        std::this_thread::sleep_for(delay);
        EXPECT_TRUE(SendLocalMessage(writer.get(), "hello",
                                     absl::Now() + absl::Seconds(10))
                        .ok());
      });
      absl::StatusOr<std::string> got = ReceiveLocalMessage(
          reader.get(), absl::Now() + absl::Seconds(10), nullptr, poll);
      send.join();
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(*got, "hello");
    }
    const absl::Time start = absl::Now();
    absl::StatusOr<std::string> none = ReceiveLocalMessage(
        reader.get(), start + absl::Milliseconds(50), nullptr, poll);
    EXPECT_EQ(none.status().code(), absl::StatusCode::kDeadlineExceeded)
        << none.status();
    EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  }
}

}  // namespace
}  // namespace tessera
