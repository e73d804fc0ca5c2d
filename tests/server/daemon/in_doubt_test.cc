// InDoubt (server/daemon/in_doubt.h) on its own: an op held in doubt is
// committed late or given up as the re-formed group decides, exactly once,
// and its outcome waits for its coordinator. The decision itself, across
// real daemons, is VersionReplicasTest's (tests/integration/versions_test.cc).
#include "server/daemon/in_doubt.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tessera::control_internal {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

v1::ControlOp Publish() {
  v1::ControlOp op;
  op.set_client_request_id("r-1");
  op.set_coordinator(0);
  op.set_request_id(7);
  op.mutable_publish_version()->add_versions()->set_name("w");
  return op;
}

// A LateCommit counting its commits and give-ups.
LateCommit Counting(int* commits, int* give_ups) {
  return LateCommit{[commits] {
                      ++*commits;
                      OpResult result;
                      result.group.set_id("w@7");
                      return result;
                    },
                    [give_ups] { ++*give_ups; }};
}

TEST(InDoubtTest, CommittedElsewhereCommitsHereOnceAndTellsTheResult) {
  InDoubt in_doubt;
  in_doubt.Committed(14);
  int commits = 0, give_ups = 0;
  in_doubt.Hold(15, Publish(), Counting(&commits, &give_ups),
                absl::UnavailableError("AllGather: connection reset"));
  EXPECT_EQ(in_doubt.held_entry(), 15);
  ASSERT_TRUE(in_doubt.held().has_value());
  EXPECT_EQ(in_doubt.held()->op.client_request_id(), "r-1");
  EXPECT_EQ(in_doubt.last_committed(), 14);
  EXPECT_FALSE(in_doubt.TakeResolved().has_value());

  in_doubt.Resolve(/*committed_elsewhere=*/true);
  EXPECT_EQ(commits, 1);
  EXPECT_EQ(give_ups, 0);
  EXPECT_EQ(in_doubt.held_entry(), 0);
  EXPECT_EQ(in_doubt.last_committed(), 15);
  std::optional<InDoubt::Resolved> resolved = in_doubt.TakeResolved();
  ASSERT_TRUE(resolved.has_value());
  EXPECT_EQ(resolved->entry, 15);
  EXPECT_THAT(resolved->status, IsOk());
  EXPECT_EQ(resolved->result.group.id(), "w@7");
  EXPECT_FALSE(in_doubt.TakeResolved().has_value());
  // Nothing held: deciding again does nothing.
  in_doubt.Resolve(true);
  EXPECT_EQ(commits, 1);
  EXPECT_FALSE(in_doubt.TakeResolved().has_value());
}

TEST(InDoubtTest, CommittedNowhereGivesUpAndSaysNotApplied) {
  InDoubt in_doubt;
  int commits = 0, give_ups = 0;
  in_doubt.Hold(15, Publish(), Counting(&commits, &give_ups),
                absl::UnavailableError("AllGather: connection reset"));
  in_doubt.Resolve(/*committed_elsewhere=*/false);
  EXPECT_EQ(commits, 0);
  EXPECT_EQ(give_ups, 1);
  EXPECT_EQ(in_doubt.last_committed(), 0);
  std::optional<InDoubt::Resolved> resolved = in_doubt.TakeResolved();
  ASSERT_TRUE(resolved.has_value());
  EXPECT_THAT(resolved->status,
              StatusIs(absl::StatusCode::kUnavailable,
                       AllOf(HasSubstr("PublishVersion was not applied"),
                             HasSubstr("connection reset"),
                             HasSubstr("no daemon committed it"))));
}

TEST(InDoubtTest, ASecondHoldGivesTheFirstUp) {
  InDoubt in_doubt;
  int commits = 0, give_ups = 0, later_commits = 0, later_give_ups = 0;
  in_doubt.Hold(15, Publish(), Counting(&commits, &give_ups),
                absl::UnavailableError("broke"));
  in_doubt.Hold(16, Publish(), Counting(&later_commits, &later_give_ups),
                absl::UnavailableError("broke again"));
  EXPECT_EQ(give_ups, 1);
  EXPECT_EQ(in_doubt.held_entry(), 16);
  in_doubt.Resolve(true);
  EXPECT_EQ(commits, 0);
  EXPECT_EQ(later_commits, 1);
}

}  // namespace
}  // namespace tessera::control_internal
