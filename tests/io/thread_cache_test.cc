#include "io/thread_cache.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <set>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/testing/forked_child.h"

namespace tessera {
namespace {

// Waits up to 10 s for at least `count` idle cached threads.
bool AwaitIdle(size_t count) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (IdleCachedThreads() < count) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

TEST(ThreadCacheTest, WaitReturnsAfterTheWorkAndItsCapturesAreGone) {
  auto captured = std::make_shared<int>(7);
  std::weak_ptr<int> watch = captured;
  int seen = 0;
  std::shared_ptr<ThreadJob> job =
      StartThread([&seen, captured = std::move(captured)] {
        absl::SleepFor(absl::Milliseconds(20));
        seen = *captured;
      });
  job->Wait();
  EXPECT_EQ(seen, 7);
  EXPECT_TRUE(watch.expired());
}

// Work started one after another, each once the last one's thread is
// idle again, runs on the few threads idle already, not on a new thread
// each time (kernel thread ids are not reused soon; pthread ids are).
TEST(ThreadCacheTest, AFinishedThreadRunsTheNextWork) {
  std::set<pid_t> threads;
  for (int i = 0; i < 20; ++i) {
    // As many idle as before once this one's thread is idle again.
    const size_t idle = std::max<size_t>(IdleCachedThreads(), 1);
    pid_t tid = 0;
    StartThread([&tid] { tid = gettid(); })->Wait();
    ASSERT_TRUE(AwaitIdle(idle));
    threads.insert(tid);
  }
  EXPECT_FALSE(threads.count(gettid()));
  // Other tests' idle threads may be taken too, but not 20 new ones.
  EXPECT_LE(threads.size(), 3u);
}

TEST(ThreadCacheTest, WaitForTimesOutWhileTheWorkRuns) {
  std::atomic<bool> release{false};
  std::shared_ptr<ThreadJob> job = StartThread([&release] {
    while (!release.load()) absl::SleepFor(absl::Milliseconds(1));
  });
  EXPECT_FALSE(job->WaitFor(absl::Milliseconds(30)));
  release.store(true);
  EXPECT_TRUE(job->WaitFor(absl::Seconds(30)));
}

// Every Start gets a thread at once: work that waits for work it started
// (as nested transfers do) never waits for a free thread.
TEST(ThreadCacheTest, WorkWaitingForWorkItStartedNeverDeadlocks) {
  constexpr int kOuter = 100;  // more than kMaxIdleThreads
  std::atomic<int> inner_done{0};
  std::atomic<int> started{0};
  std::vector<std::shared_ptr<ThreadJob>> outer;
  for (int i = 0; i < kOuter; ++i) {
    outer.push_back(StartThread([&] {
      ++started;
      // All outer work holds its thread until every one has started.
      while (started.load() < kOuter) absl::SleepFor(absl::Milliseconds(1));
      StartThread([&inner_done] { ++inner_done; })->Wait();
    }));
  }
  for (const auto& job : outer) {
    ASSERT_TRUE(job->WaitFor(absl::Seconds(60)));
  }
  EXPECT_EQ(inner_done.load(), kOuter);
  EXPECT_LE(IdleCachedThreads(), kMaxIdleThreads);
}

// A child forked while the parent had idle threads has none of them: its
// work must run on a thread of its own, not be handed to one that is not
// there (it would never run).
TEST(ThreadCacheTest, AForkedChildRunsWorkOnThreadsOfItsOwn) {
  StartThread([] {})->Wait();
  ASSERT_TRUE(AwaitIdle(1));
  // A child that does not finish under AddressSanitizer is forked again
  // (forked_child.h).
  const testing::ChildResult child = testing::RunInChild(
      [] {
        std::atomic<bool> ran{false};
        const bool finished = StartThread([&ran] {
                                ran.store(true);
                              })->WaitFor(absl::Seconds(10));
        return finished && ran.load() ? 0 : 1;
      },
      absl::Seconds(30));
  EXPECT_TRUE(child.passed()) << child.Describe();
}

}  // namespace
}  // namespace tessera
