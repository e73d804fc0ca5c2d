// StaleCopies (server/daemon/stale_copies.h) over a HashStore: a mark stops
// the marked daemon serving the tensor at its next look and starts one
// refill, whose end clears exactly the marks it covered; a daemon that
// cannot look at its marks stops serving copies after the fence, and one
// that stopped looking still refuses what it knew stale; a writer
// waits the fence after marking. Across real daemons:
// ResilienceTest.AWriteOutlivesAHolderStalledPastItsDeadline.
#include "server/daemon/stale_copies.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/store/hash_store.h"
#include "tests/testing/status_matchers.h"

namespace tessera::control_internal {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

StaleCopiesOptions Quick() {
  StaleCopiesOptions options;
  options.fence = absl::Milliseconds(400);
  options.period = absl::Milliseconds(50);
  options.max_marks = 3;
  return options;
}

// The refills a daemon's StaleCopies asked for, in order.
struct Refills {
  absl::Mutex mu;
  std::vector<std::string> started;
  bool WaitFor(size_t n) {
    absl::MutexLock lock(&mu);
    const auto enough = [&] { return started.size() >= n; };
    return mu.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(5));
  }
};

void StartLooking(StaleCopies& copies, Refills& refills) {
  copies.Start(
      [&refills](const std::string& tensor_id) {
        absl::MutexLock lock(&refills.mu);
        refills.started.push_back(tensor_id);
      },
      [](absl::string_view tensor_id) { return tensor_id != "single"; });
}

// Starts `holder` (rank 1) looking at its marks, has `writer` mark its
// copy of "t" stale, and waits for the holder's refill to start.
void MarkAndAwaitTheRefill(StaleCopies& writer, StaleCopies& holder,
                           Refills& refills) {
  StartLooking(holder, refills);
  ASSERT_THAT(writer.Mark({1}, "t", absl::Now() + absl::Seconds(5)), IsOk());
  ASSERT_TRUE(refills.WaitFor(1));
}

TEST(StaleCopiesTest, AMarkStopsServingUntilTheRefillClearsIt) {
  auto store = std::make_shared<HashStore>();
  StaleCopies writer(store, 0, Quick());
  StaleCopies holder(store, 2, Quick());
  Refills refills;
  StartLooking(holder, refills);
  EXPECT_THAT(holder.CheckServe("t1", false, absl::Now()), IsOk());

  const absl::Time start = absl::Now();
  ASSERT_THAT(writer.Mark({2}, "t1", absl::Now() + absl::Seconds(5)), IsOk());
  // The writer waited out the fence.
  EXPECT_GE(absl::Now() - start, Quick().fence);
  ASSERT_TRUE(refills.WaitFor(1));
  EXPECT_THAT(refills.started, ElementsAre("t1"));
  EXPECT_TRUE(holder.Stale("t1"));
  for (const char* id : {"t1", "t1/replicas"}) {
    EXPECT_THAT(holder.CheckServe(id, false, absl::Now() + absl::Seconds(1)),
                StatusIs(absl::StatusCode::kUnavailable,
                         HasSubstr("rank 2's copy of tensor id t1 missed a "
                                   "write")));
    EXPECT_THAT(holder.CheckServe(id, true, absl::Now()),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         HasSubstr("write it over a stream")));
  }
  // Other tensors are served.
  EXPECT_THAT(holder.CheckServe("t2", false, absl::Now()), IsOk());

  // Marked again while it refilled: one more refill after this one.
  ASSERT_THAT(writer.Mark({2}, "t1", absl::Now() + absl::Seconds(5)), IsOk());
  absl::SleepFor(absl::Milliseconds(200));
  holder.Refilled("t1", true);
  ASSERT_TRUE(refills.WaitFor(2));
  EXPECT_TRUE(holder.Stale("t1"));
  holder.Refilled("t1", true);
  EXPECT_FALSE(holder.Stale("t1"));
  EXPECT_THAT(holder.CheckServe("t1", false, absl::Now()), IsOk());
  // Both marks were cleared: no third refill.
  absl::SleepFor(absl::Milliseconds(300));
  absl::MutexLock lock(&refills.mu);
  EXPECT_EQ(refills.started.size(), 2u);
  EXPECT_EQ(*store->Get("stale/2", absl::ZeroDuration()), "");
}

TEST(StaleCopiesTest, AFailedRefillKeepsTheCopyStaleAndIsTriedAgain) {
  auto store = std::make_shared<HashStore>();
  StaleCopies writer(store, 0, Quick());
  StaleCopies holder(store, 1, Quick());
  Refills refills;
  ASSERT_NO_FATAL_FAILURE(MarkAndAwaitTheRefill(writer, holder, refills));
  holder.Refilled("t", false);
  EXPECT_TRUE(holder.Stale("t"));
  ASSERT_TRUE(refills.WaitFor(2));  // After a fence.
  holder.Refilled("t", true);
  EXPECT_FALSE(holder.Stale("t"));
}

TEST(StaleCopiesTest, WithoutALookWithinTheFenceCopiesAreNotServed) {
  auto store = std::make_shared<HashStore>();
  StaleCopies holder(store, 1, Quick());
  Refills refills;
  StartLooking(holder, refills);
  EXPECT_THAT(holder.CheckServe("t", false, absl::Now()), IsOk());
  holder.Stop();  // No more looks, as while stalled or cut off.
  absl::SleepFor(Quick().fence);
  EXPECT_THAT(holder.CheckServe("t", false, absl::Now() + absl::Seconds(1)),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("has not seen its stale marks")));
  // A tensor without copies is served regardless.
  EXPECT_THAT(holder.CheckServe("single", false, absl::Now()), IsOk());
}

// Core::Shutdown stops the looks but keeps the gate while the transports
// drain: what was known stale stays refused, at once.
TEST(StaleCopiesTest, AStoppedDaemonStillRefusesItsStaleCopies) {
  auto store = std::make_shared<HashStore>();
  StaleCopies writer(store, 0, Quick());
  StaleCopies holder(store, 1, Quick());
  Refills refills;
  ASSERT_NO_FATAL_FAILURE(MarkAndAwaitTheRefill(writer, holder, refills));
  holder.Stop();
  const absl::Time start = absl::Now();
  EXPECT_THAT(
      holder.CheckServe("t", false, absl::Now() + absl::Seconds(5)),
      StatusIs(absl::StatusCode::kUnavailable, HasSubstr("missed a write")));
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
}

TEST(StaleCopiesTest, MarksAreBoundedAndTheFenceKeepsTheDeadline) {
  auto store = std::make_shared<HashStore>();
  StaleCopies writer(store, 0, Quick());
  for (int i = 0; i < 3; ++i) {
    ASSERT_THAT(writer.Mark({3}, "t", absl::Now() + absl::Seconds(5)), IsOk());
  }
  EXPECT_THAT(writer.Mark({3}, "t", absl::Now() + absl::Seconds(5)),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("rank 3 has 3 copies marked stale")));
  const absl::Time start = absl::Now();
  EXPECT_THAT(writer.Mark({4}, "t", absl::Now() + absl::Milliseconds(100)),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("marked stale, but the deadline came")));
  EXPECT_LT(absl::Now() - start, Quick().fence);
}

}  // namespace
}  // namespace tessera::control_internal
