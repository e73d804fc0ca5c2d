// MemoryBudget (server/daemon/memory_budget.h): reservations add up, are
// refused past the limit with a message naming what asked, and give their
// bytes back when released, moved from or destroyed; concurrent reserving
// never overshoots; memory kept for reuse is reclaimed only when a request
// does not fit otherwise. Plus the default limit's inputs.
#include "server/daemon/memory_budget.h"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/daemon/cgroup_memory.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(MemoryBudgetTest, ReservesUpToTheLimitAndGivesBack) {
  auto budget = MemoryBudget::Create(100, "--memory-limit");
  ASSERT_OK_AND_ASSIGN(MemoryBudget::Reservation a, budget->Reserve(60, "a"));
  EXPECT_EQ(budget->used(), 60);
  EXPECT_THAT(budget->Reserve(41, "CreateTensor \"w\"").status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("CreateTensor \"w\" needs 41 bytes"),
                             HasSubstr("40 bytes left of its 100 bytes"),
                             HasSubstr("--memory-limit"))));
  EXPECT_EQ(budget->used(), 60);
  {
    ASSERT_OK_AND_ASSIGN(MemoryBudget::Reservation b, budget->Reserve(40, "b"));
    EXPECT_EQ(budget->used(), 100);
    ASSERT_OK(budget->Reserve(0, "nothing").status());
  }
  EXPECT_EQ(budget->used(), 60);
  MemoryBudget::Reservation moved = std::move(a);
  EXPECT_EQ(budget->used(), 60);
  EXPECT_EQ(moved.bytes(), 60);
  moved.Release();
  EXPECT_EQ(budget->used(), 0);
  moved.Release();  // Once only.
  EXPECT_EQ(budget->used(), 0);
  EXPECT_THAT(budget->Reserve(-1, "negative").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  EXPECT_THAT(budget->Reserve(int64_t{1} << 62, "huge").status(),
              StatusIs(absl::StatusCode::kResourceExhausted, ::testing::_));
}

TEST(MemoryBudgetTest, ChargesPastTheLimitRefuseReservesUntilGivenBack) {
  auto budget = MemoryBudget::Create(100, "--memory-limit");
  ASSERT_OK_AND_ASSIGN(MemoryBudget::Reservation a, budget->Reserve(60, "a"));
  {
    MemoryBudget::Reservation charged = budget->Charge(70);
    EXPECT_EQ(charged.bytes(), 70);
    EXPECT_EQ(budget->used(), 130);
    EXPECT_THAT(budget->Reserve(1, "one").status(),
                StatusIs(absl::StatusCode::kResourceExhausted,
                         HasSubstr("0 bytes left of its 100 bytes")));
    a.Release();
    EXPECT_THAT(budget->Reserve(31, "31").status(),
                StatusIs(absl::StatusCode::kResourceExhausted, ::testing::_));
    ASSERT_OK(budget->Reserve(30, "30").status());
  }
  EXPECT_EQ(budget->used(), 0);
  EXPECT_EQ(budget->Charge(-5).bytes(), 0);
  EXPECT_EQ(budget->used(), 0);
}

// Memory kept only for reuse: it gives its reservation back on demand.
class KeptForReuse : public MemoryBudget::Reclaimable {
 public:
  explicit KeptForReuse(MemoryBudget::Reservation held)
      : held_(std::move(held)) {}
  int64_t Reclaim() override {
    ++asked_;
    const int64_t bytes = held_.bytes();
    held_.Release();
    return bytes;
  }
  int64_t KeptBytes() const override { return held_.bytes(); }
  int asked() const { return asked_; }

 private:
  MemoryBudget::Reservation held_;
  int asked_ = 0;
};

TEST(MemoryBudgetTest, ReclaimsWhatIsKeptForReuseOnlyWhenARequestDoesNotFit) {
  auto budget = MemoryBudget::Create(100, "test");
  ASSERT_OK_AND_ASSIGN(MemoryBudget::Reservation kept,
                       budget->Reserve(50, "k"));
  auto spare = std::make_shared<KeptForReuse>(std::move(kept));
  budget->AddReclaimable(spare);
  // A gone one is skipped.
  budget->AddReclaimable(
      std::make_shared<KeptForReuse>(MemoryBudget::Reservation()));
  EXPECT_EQ(budget->kept_for_reuse(), 50);
  ASSERT_OK_AND_ASSIGN(MemoryBudget::Reservation a, budget->Reserve(40, "a"));
  EXPECT_EQ(spare->asked(), 0);  // It fit.
  EXPECT_EQ(budget->kept_for_reuse(), 50);
  ASSERT_OK_AND_ASSIGN(MemoryBudget::Reservation b, budget->Reserve(30, "b"));
  EXPECT_EQ(spare->asked(), 1);
  EXPECT_EQ(budget->kept_for_reuse(), 0);
  EXPECT_EQ(budget->used(), 70);
  // Nothing left to reclaim: refused, saying what is left.
  EXPECT_THAT(budget->Reserve(31, "c").status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("30 bytes left")));
  EXPECT_EQ(budget->used(), 70);
}

// Open versions (version_set.h): held until their lease ends.
class Leasing : public MemoryBudget::Reclaimable {
 public:
  explicit Leasing(std::vector<Leased> leased) : leased_(std::move(leased)) {}
  int64_t Reclaim() override { return 0; }
  int64_t KeptBytes() const override { return 0; }
  std::vector<Leased> LeasedNow() const override { return leased_; }

 private:
  std::vector<Leased> leased_;
};

TEST(MemoryBudgetTest, ARefusalNamesTheLargestLeasesAndHowToEndOne) {
  auto budget = MemoryBudget::Create(100, "test");
  ASSERT_OK_AND_ASSIGN(MemoryBudget::Reservation used,
                       budget->Reserve(90, "u"));
  EXPECT_THAT(budget->Reserve(20, "r").status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       Not(HasSubstr("versions opened"))));
  const absl::Time end = absl::Now() + absl::Minutes(5);
  auto a = std::make_shared<Leasing>(std::vector<Leasing::Leased>{
      {"w@2", 10, end}, {"w@3", 40, end}, {"w@4", 0, end}});
  auto b = std::make_shared<Leasing>(
      std::vector<Leasing::Leased>{{"x@7", 20, end}, {"y@9", 5, end}});
  budget->AddReclaimable(a);
  budget->AddReclaimable(b);
  EXPECT_THAT(
      budget->Reserve(20, "r").status(),
      StatusIs(
          absl::StatusCode::kResourceExhausted,
          AllOf(HasSubstr("versions opened and not yet published hold 75 "
                          "bytes of it: w@3 (40 bytes, its lease ends in 4m"),
                HasSubstr("x@7 (20 bytes"), HasSubstr("w@2 (10 bytes"),
                HasSubstr(" and 1 more."), Not(HasSubstr("w@4")),
                HasSubstr("c.join(\"w@3\").abort()"))));
}

TEST(MemoryBudgetTest, AReservationOutlivesItsBudgetHandle) {
  MemoryBudget::Reservation held;
  {
    auto budget = MemoryBudget::Create(10, "test");
    ASSERT_OK_AND_ASSIGN(held, budget->Reserve(10, "x"));
  }
  held.Release();  // The reservation kept the budget alive.
}

TEST(MemoryBudgetTest, ConcurrentReservationsNeverOvershoot) {
  auto budget = MemoryBudget::Create(1000, "test");
  std::atomic<int> granted{0};
  std::vector<std::thread> threads;
  std::vector<std::vector<MemoryBudget::Reservation>> held(8);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 1000; ++i) {
        absl::StatusOr<MemoryBudget::Reservation> r = budget->Reserve(7, "x");
        if (r.ok()) {
          held[t].push_back(*std::move(r));
          granted.fetch_add(1);
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(granted.load(), 1000 / 7);
  EXPECT_EQ(budget->used(), 1000 / 7 * 7);
  held.clear();
  EXPECT_EQ(budget->used(), 0);
}

TEST(MemoryBudgetTest, DefaultLimitIsBelowWhatTheHostHas) {
  std::string source;
  const int64_t one = DefaultMemoryLimit(1, &source);
  EXPECT_FALSE(source.empty());
  EXPECT_GT(one, 0);
  EXPECT_LT(one, PhysicalMemoryBytes());
  const CgroupLimit limit = ReadCgroupMemoryLimit();
  const int64_t cgroup = limit.bytes;
  if (cgroup > 0) {
    EXPECT_LT(one, cgroup);
  }
  if (cgroup > 0 && cgroup < PhysicalMemoryBytes()) {
    // Named by the file that sets it.
    EXPECT_THAT(source, HasSubstr(limit.file));
  }
  if (cgroup == 0 || cgroup >= PhysicalMemoryBytes()) {
    // Shared among the daemons of the host.
    EXPECT_LE(DefaultMemoryLimit(8, &source), one / 4);
  }
}

}  // namespace
}  // namespace tessera
