// ReformableGroup tests: ranks are threads of this process over one
// HashStore and real Gloo TCP pairs on loopback. A member that stalls past
// the timeout, a member that restarts, a member that never comes back.
#include "server/collective/reformable_group.h"

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/tensor/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/store/hash_store.h"
#include "server/store/prefix_store.h"
#include "tests/testing/run_threads.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::RunThreads;
using ::tessera::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr absl::Duration kTimeout = absl::Seconds(1);

ProcessGroupOptions Options(std::shared_ptr<Store> store, int rank, int world) {
  ProcessGroupOptions options;
  options.store = std::move(store);
  options.rank = rank;
  for (int r = 0; r < world; ++r) options.global_ranks.push_back(r);
  options.name = "0";
  options.timeout = kTimeout;
  return options;
}

// Every member's rank, all-gathered: proves the generation moves bytes
// between every pair.
void ExpectAllGatherWorks(ProcessGroup& group) {
  absl::StatusOr<Tensor> mine =
      Tensor::Full({1}, group.rank(), TensorOptions().WithDType(DType::kInt64));
  ASSERT_OK(mine.status());
  std::vector<Tensor> outputs;
  for (int r = 0; r < group.size(); ++r) {
    outputs.push_back(
        *Tensor::Empty({1}, TensorOptions().WithDType(DType::kInt64)));
  }
  ASSERT_OK(group.AllGather(*mine, outputs));
  for (int r = 0; r < group.size(); ++r) {
    EXPECT_EQ(outputs[r].data<int64_t>()[0], r);
  }
}

class ReformableGroupTest : public ::testing::Test {
 protected:
  std::shared_ptr<Store> GroupStore() {
    return std::make_shared<PrefixStore>("pg/0", store_);
  }
  // Forms generation 1 of a group of `world` members, one thread each;
  // null entries where a member failed (the failure is reported).
  std::vector<std::shared_ptr<ReformableGroup>> FormGroups(int world) {
    std::vector<std::shared_ptr<ReformableGroup>> groups(world);
    RunThreads(world, [&](int r) {
      absl::StatusOr<std::shared_ptr<ReformableGroup>> group =
          ReformableGroup::Create("gloo", Options(GroupStore(), r, world));
      ASSERT_OK(group.status());
      groups[r] = *group;
    });
    return groups;
  }
  std::shared_ptr<HashStore> store_ = std::make_shared<HashStore>();
};

TEST_F(ReformableGroupTest, AStallPastTheTimeoutIsHealedByTheNextGeneration) {
  constexpr int kWorld = 3;
  RunThreads(kWorld, [&](int r) {
    absl::StatusOr<std::shared_ptr<ReformableGroup>> group =
        ReformableGroup::Create("gloo", Options(GroupStore(), r, kWorld));
    ASSERT_OK(group.status());
    EXPECT_EQ((*group)->generation(), 1);
    EXPECT_FALSE((*group)->NeedsReform());
    // Rank 2 stalls for twice the timeout: the others' barrier fails.
    if (r == 2) absl::SleepFor(2 * kTimeout);
    EXPECT_THAT((*group)->Barrier(), Not(IsOk()));
    EXPECT_THAT((*group)->Usable(),
                StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::_));
    EXPECT_TRUE((*group)->NeedsReform());
    ASSERT_OK((*group)->Reform());
    EXPECT_EQ((*group)->generation(), 2);
    EXPECT_OK((*group)->Usable());
    GroupState state = (*group)->State();
    EXPECT_EQ(state.generation, 2);
    EXPECT_EQ(state.forming, 0);
    ExpectAllGatherWorks(**group);
    ASSERT_OK((*group)->Barrier());
    (*group)->Shutdown();
  });
}

TEST_F(ReformableGroupTest, ARestartedMemberJoinsAndItsOldProcessIsFenced) {
  std::vector<std::shared_ptr<ReformableGroup>> first = FormGroups(2);
  ASSERT_NE(first[0], nullptr);
  ASSERT_NE(first[1], nullptr);
  std::shared_ptr<ReformableGroup> restarted;
  RunThreads(2, [&](int r) {
    if (r == 1) {
      // A new process for rank 1, while the old one still lives.
      absl::StatusOr<std::shared_ptr<ReformableGroup>> group =
          ReformableGroup::Create("gloo", Options(GroupStore(), 1, 2));
      ASSERT_OK(group.status());
      restarted = *group;
      EXPECT_EQ(restarted->generation(), 2);
      ExpectAllGatherWorks(*restarted);
      return;
    }
    // Rank 0 notices the request for a new generation while idle.
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (!first[0]->NeedsReform() && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    ASSERT_OK(first[0]->Reform());
    EXPECT_EQ(first[0]->generation(), 2);
    ExpectAllGatherWorks(*first[0]);
  });
  // The old rank 1 is a zombie: fenced off, its transport closed.
  EXPECT_TRUE(first[1]->NeedsReform());
  EXPECT_THAT(
      first[1]->Reform(),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("fenced off")));
  EXPECT_THAT(first[1]->Barrier(),
              StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::_));
  first[0]->Shutdown();
  restarted->Shutdown();
}

TEST_F(ReformableGroupTest, AMemberThatNeverReturnsIsNamedAtTheDeadline) {
  std::vector<std::shared_ptr<ReformableGroup>> groups = FormGroups(2);
  ASSERT_NE(groups[0], nullptr);
  ASSERT_NE(groups[1], nullptr);
  // Rank 1 is gone; rank 0 waits for it, and says so while it waits.
  groups[1]->Shutdown();
  // Never "all arrived" meanwhile (also before it first counted who is
  // missing, when `missing` is still empty): the daemons log new operations
  // only once it is.
  std::atomic<bool> saw_missing{false};
  std::atomic<bool> saw_all_arrived{false};
  std::thread watcher([&] {
    const absl::Time until = absl::Now() + absl::Seconds(3);
    while (absl::Now() < until && !saw_missing) {
      GroupState state = groups[0]->State();
      if (state.all_arrived) saw_all_arrived = true;
      if (state.forming == 2 && state.missing == std::vector<int>{1}) {
        saw_missing = true;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
  });
  ReformOptions options;
  options.deadline = absl::Now() + absl::Seconds(2);
  EXPECT_THAT(groups[0]->Reform(options),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       AllOf(HasSubstr("generation 2"),
                             HasSubstr("ranks [1] did not take part"))));
  watcher.join();
  EXPECT_TRUE(saw_missing);
  EXPECT_FALSE(saw_all_arrived);
  EXPECT_FALSE(groups[0]->State().all_arrived);

  // Cancelled while waiting.
  options.deadline = absl::InfiniteFuture();
  const absl::Time cancel_at = absl::Now() + absl::Milliseconds(300);
  options.cancelled = [&] { return absl::Now() >= cancel_at; };
  EXPECT_THAT(groups[0]->Reform(options),
              StatusIs(absl::StatusCode::kCancelled, ::testing::_));
  groups[0]->Shutdown();
  EXPECT_THAT(
      groups[0]->Reform(),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("shut down")));
}

TEST_F(ReformableGroupTest, UnknownBackendsAreRefused) {
  EXPECT_THAT(ReformableGroup::Create("mpi", Options(GroupStore(), 0, 1)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("Backend mpi not supported")));
}

}  // namespace
}  // namespace tessera
