#include "common/cancellation.h"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

TEST(CancellationTest, CancelRunsEveryLiveCallbackOnce) {
  Cancellation cancel;
  int a = 0, b = 0, gone = 0;
  Cancellation::Registration ra = cancel.OnCancel([&] { ++a; });
  Cancellation::Registration rb = cancel.OnCancel([&] { ++b; });
  {
    Cancellation::Registration rg = cancel.OnCancel([&] { ++gone; });
  }
  EXPECT_FALSE(cancel.cancelled());
  cancel.Cancel();
  cancel.Cancel();
  EXPECT_TRUE(cancel.cancelled());
  EXPECT_EQ(a, 1);
  EXPECT_EQ(b, 1);
  EXPECT_EQ(gone, 0);
}

TEST(CancellationTest, RegisteringWhenCancelledRunsAtOnce) {
  Cancellation cancel;
  cancel.Cancel();
  int ran = 0;
  Cancellation::Registration r = cancel.OnCancel([&] { ++ran; });
  EXPECT_EQ(ran, 1);
}

TEST(CancellationTest, NullCancellationsAreNeverCancelled) {
  const std::shared_ptr<Cancellation> none;
  EXPECT_FALSE(Cancelled(none));
  int ran = 0;
  Cancellation::Registration r = OnCancel(none, [&] { ++ran; });
  EXPECT_EQ(ran, 0);
}

TEST(CancellationTest, MovedAndResetRegistrationsUnregisterOnce) {
  Cancellation cancel;
  int ran = 0;
  Cancellation::Registration first = cancel.OnCancel([&] { ++ran; });
  Cancellation::Registration second = std::move(first);
  first.Reset();  // moved from: nothing
  Cancellation::Registration third = cancel.OnCancel([&] { ran += 10; });
  third = std::move(second);  // unregisters the "+10" one
  cancel.Cancel();
  EXPECT_EQ(ran, 1);
}

// What a transfer relies on: once the Registration is gone, its callback
// is not running and will not run, so the socket it names may be closed.
TEST(CancellationTest, DestroyingARegistrationWaitsForItsRunningCallback) {
  Cancellation cancel;
  absl::Notification entered;
  std::atomic<bool> finished{false};
  auto registration =
      std::make_unique<Cancellation::Registration>(cancel.OnCancel([&] {
        entered.Notify();
        absl::SleepFor(absl::Milliseconds(200));
        finished = true;
      }));
  std::thread canceller([&] { cancel.Cancel(); });
  entered.WaitForNotification();
  registration.reset();
  EXPECT_TRUE(finished);
  canceller.join();
}

TEST(CancellationTest, ConcurrentRegistrationsAndCancelRunEachCallbackOnce) {
  for (int round = 0; round < 50; ++round) {
    Cancellation cancel;
    std::atomic<int> ran{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&] {
        for (int i = 0; i < 20; ++i) {
          Cancellation::Registration r = cancel.OnCancel([&] { ++ran; });
        }
        Cancellation::Registration kept = cancel.OnCancel([&] { ++ran; });
        while (!cancel.cancelled()) std::this_thread::yield();
      });
    }
    cancel.Cancel();
    for (std::thread& thread : threads) thread.join();
    // Each thread's kept callback ran once (at Cancel or at registration),
    // plus any of the short-lived ones alive at Cancel or made after it.
    EXPECT_GE(ran.load(), 4);
    EXPECT_LE(ran.load(), 4 * 21);
  }
}

}  // namespace
}  // namespace tessera
