// StallWatchdog and FetchWatched: a transfer that moves nothing for its
// patience is cancelled; one that moves bytes is left alone; the caller's
// own cancellation still reaches it and keeps its CANCELLED.
#include "client/stall_watchdog.h"

#include <memory>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

TEST(StallWatchdogTest, CancelsAQuietTransferAfterItsPatience) {
  auto cancel = std::make_shared<Cancellation>();
  const absl::Time start = absl::Now();
  auto watch = StallWatchdog::Process().Start(cancel, absl::Milliseconds(200));
  while (!cancel->cancelled() && absl::Now() - start < absl::Seconds(10)) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_TRUE(cancel->cancelled());
  EXPECT_TRUE(watch->fired());
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(200));
}

TEST(StallWatchdogTest, ProgressKeepsItAlive) {
  auto cancel = std::make_shared<Cancellation>();
  // A patience far above the 20 ms between steps, so that a loaded
  // machine's scheduling does not look like a stall.
  auto watch = StallWatchdog::Process().Start(cancel, absl::Seconds(3));
  const absl::Time start = absl::Now();
  while (absl::Now() - start < absl::Seconds(4)) {
    watch->Progress();
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_FALSE(cancel->cancelled());
  EXPECT_FALSE(watch->fired());
  // Many watches at once, ended before their patience: none fires.
  for (int i = 0; i < 100; ++i) {
    auto other = std::make_shared<Cancellation>();
    auto short_lived = StallWatchdog::Process().Start(other, absl::Seconds(5));
    EXPECT_FALSE(short_lived->fired());
  }
}

TEST(StallWatchdogTest, FetchWatchedNamesTheStall) {
  FetchOptions options;
  // A "fetch" that waits until it is cancelled, as one blocked on a
  // stalled peer is interrupted.
  const auto blocked = [](const FetchOptions& watched) {
    while (!watched.cancel->cancelled()) absl::SleepFor(absl::Milliseconds(5));
    return absl::CancelledError("interrupted");
  };
  EXPECT_THAT(FetchWatched(options, absl::Milliseconds(100), blocked),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("moved no byte for 100ms")));

  // One that moves bytes: its own status, and the caller sees the chunks.
  int64_t seen = 0;
  options.on_chunk = [&](int64_t bytes) { seen += bytes; };
  const auto moving = [](const FetchOptions& watched) {
    for (int i = 0; i < 10; ++i) {
      absl::SleepFor(absl::Milliseconds(400));
      watched.on_chunk(1);
    }
    return watched.cancel->cancelled() ? absl::CancelledError("cut")
                                       : absl::OkStatus();
  };
  // 4 s in all, each step well within the patience.
  EXPECT_OK(FetchWatched(options, absl::Seconds(3), moving));
  EXPECT_EQ(seen, 10);

  // No patience (the last holder): the caller's options, unwatched.
  const FetchOptions plain;
  EXPECT_OK(
      FetchWatched(plain, absl::ZeroDuration(), [&](const FetchOptions& given) {
        return &given == &plain ? absl::OkStatus()
                                : absl::InternalError("watched");
      }));

  // The caller's cancellation reaches the fetch and stays CANCELLED.
  options.on_chunk = nullptr;
  options.cancel = std::make_shared<Cancellation>();
  std::thread canceller([cancel = options.cancel] {
    absl::SleepFor(absl::Milliseconds(50));
    cancel->Cancel();
  });
  EXPECT_THAT(FetchWatched(options, absl::Seconds(30), blocked),
              StatusIs(absl::StatusCode::kCancelled, HasSubstr("interrupted")));
  canceller.join();
}

}  // namespace
}  // namespace tessera
