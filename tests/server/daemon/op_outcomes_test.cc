// OpOutcomes (server/daemon/op_outcomes.h) on its own: what a retry is
// answered with, which ids are remembered, what adoption keeps, and the
// bounds on records and results.
#include "server/daemon/op_outcomes.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/daemon/tensor_table.h"
#include "tests/testing/status_matchers.h"
#include "wire/message_digest.h"

namespace tessera::control_internal {
namespace {

using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

v1::ControlOp Create(const std::string& id, const std::string& name) {
  v1::ControlOp op;
  op.set_client_request_id(id);
  op.set_coordinator(1);
  op.set_request_id(7);
  op.mutable_create_tensor()->set_name(name);
  op.mutable_create_tensor()->add_sizes(4);
  return op;
}

OpResult Info(const std::string& tensor_id, size_t padding = 0) {
  OpResult result;
  result.info.set_name("w");
  result.info.set_tensor_id(tensor_id);
  result.info.mutable_metadata()->mutable_size()->Add(
      static_cast<int64_t>(padding));
  if (padding > 0) result.names.push_back(std::string(padding, 'x'));
  return result;
}

TEST(OpOutcomesTest, ARetryIsAnsweredWithTheFirstResultWhateverItsEnvelope) {
  TensorTable table(0);
  OpOutcomes outcomes(&table);
  EXPECT_FALSE(outcomes.Replay(Create("r-1", "w")).has_value());
  outcomes.Committed(Create("r-1", "w"), 12, Info("t12"));
  // Another coordinator, call and deadline: the same request.
  v1::ControlOp retry = Create("r-1", "w");
  retry.set_coordinator(3);
  retry.set_request_id(99);
  retry.set_deadline_unix_nanos(12345);
  std::optional<Replayed> replayed = outcomes.Replay(retry);
  ASSERT_TRUE(replayed.has_value());
  EXPECT_TRUE(replayed->status.ok());
  EXPECT_EQ(replayed->result.info.tensor_id(), "t12");
  EXPECT_EQ(replayed->first_entry, 12);
  // The same id for another request.
  replayed = outcomes.Replay(Create("r-1", "v"));
  ASSERT_TRUE(replayed.has_value());
  EXPECT_THAT(replayed->status,
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("was used by another operation, "
                                 "CreateTensor 'w' (log entry 12)")));
  // No id, or a gather: never remembered.
  outcomes.Committed(Create("", "x"), 13, Info("t13"));
  EXPECT_FALSE(outcomes.Replay(Create("", "x")).has_value());
  v1::ControlOp gather;
  gather.set_client_request_id("r-g");
  gather.mutable_gather()->set_name("w");
  outcomes.Committed(gather, 14, Info("t12"));
  EXPECT_FALSE(outcomes.Replay(gather).has_value());
  EXPECT_FALSE(outcomes.Find("r-g").has_value());
}

// Results are kept serialized (a tenth of their size as messages) and
// come back whole: a create's infos with their shards, a group, names.
// The digest is that of the op with its envelope cleared, taken without a
// copy: the same for a retry, another for another request.
TEST(OpOutcomesTest, TheDigestIsTheRequestsAlone) {
  v1::ControlOp many;
  many.set_client_request_id("r-2");
  many.set_coordinator(2);
  many.set_incarnation(5);
  many.set_deadline_unix_nanos(99);
  for (int i = 0; i < 3; ++i) {
    v1::CreateTensorRequest* one = many.mutable_create_tensors()->add_tensors();
    one->set_name(absl::StrCat("t", i));
    one->add_sizes(i + 1);
    one->set_versions(2);
  }
  v1::ControlOp publish;
  publish.set_request_id(3);
  v1::VersionHandle* handle = publish.mutable_publish_version()->add_versions();
  handle->set_name("w");
  handle->set_number(2);
  for (const v1::ControlOp& op :
       {Create("r-1", "w"), many, publish, v1::ControlOp()}) {
    v1::ControlOp request = op;
    request.clear_coordinator();
    request.clear_incarnation();
    request.clear_request_id();
    request.clear_deadline_unix_nanos();
    request.clear_client_request_id();
    EXPECT_EQ(OpOutcomes::Digest(op), MessageDigest(request))
        << op.ShortDebugString();
  }
  EXPECT_NE(OpOutcomes::Digest(Create("r-1", "w")),
            OpOutcomes::Digest(Create("r-1", "v")));
  EXPECT_NE(OpOutcomes::Digest(many), OpOutcomes::Digest(publish));
}

TEST(OpOutcomesTest, AKeptResultComesBackWhole) {
  TensorTable table(0);
  OpOutcomes outcomes(&table);
  OpResult result = Info("t1");
  result.names = {"a", "b"};
  for (int t = 0; t < 3; ++t) {
    v1::TensorInfo& info = result.infos.emplace_back();
    info.set_name(absl::StrCat("w", t));
    info.set_tensor_id(absl::StrCat("id-", t));
    for (int s = 0; s < 128; ++s) {
      v1::ShardMetadata* shard = info.mutable_metadata()->add_shards_metadata();
      shard->add_shard_offsets(s * 4);
      shard->add_shard_sizes(4);
      info.add_shard_ranks(s % 4);
    }
  }
  result.group.set_id("g-1");
  v1::VersionHandle* handle = result.group.add_versions();
  handle->set_name("w0");
  handle->set_number(3);
  handle->set_tensor_id("id-0@3");
  outcomes.Committed(Create("r-1", "w"), 5, result);
  std::optional<Replayed> replayed = outcomes.Replay(Create("r-1", "w"));
  ASSERT_TRUE(replayed.has_value());
  ASSERT_TRUE(replayed->status.ok());
  EXPECT_EQ(replayed->result.info.SerializeAsString(),
            result.info.SerializeAsString());
  EXPECT_EQ(replayed->result.names, result.names);
  ASSERT_EQ(replayed->result.infos.size(), result.infos.size());
  for (size_t t = 0; t < result.infos.size(); ++t) {
    EXPECT_EQ(replayed->result.infos[t].SerializeAsString(),
              result.infos[t].SerializeAsString());
  }
  EXPECT_EQ(replayed->result.group.SerializeAsString(),
            result.group.SerializeAsString());
}

TEST(OpOutcomesTest, AFailureIsToldButARetryRunsAgain) {
  TensorTable table(0);
  OpOutcomes outcomes(&table);
  outcomes.Failed(Create("r-2", "w"), 5,
                  absl::AlreadyExistsError("tensor w exists"));
  EXPECT_FALSE(outcomes.Replay(Create("r-2", "w")).has_value());
  std::optional<v1::OperationStatus> found = outcomes.Find("r-2");
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->state(), v1::OperationStatus::STATE_FAILED);
  EXPECT_EQ(found->code(), static_cast<int>(absl::StatusCode::kAlreadyExists));
  outcomes.Committed(Create("r-2", "w"), 9, Info("t9"));
  found = outcomes.Find("r-2");
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->state(), v1::OperationStatus::STATE_COMMITTED);
  EXPECT_EQ(found->log_entry(), 9);
}

TEST(OpOutcomesTest, AdoptionKeepsOwnResultsAndForgetsDroppedTensors) {
  TensorTable table(0);
  OpOutcomes veteran(&table);
  veteran.Committed(Create("r-a", "a"), 1, Info("ta"));
  veteran.Committed(Create("r-b", "b"), 2, Info("tb"));
  const std::vector<v1::CommittedOp> exported = veteran.Export();
  ASSERT_EQ(exported.size(), 2u);
  google::protobuf::RepeatedPtrField<v1::CommittedOp> records(exported.begin(),
                                                              exported.end());

  OpOutcomes restarted(&table);
  restarted.Adopt(records, {"tb"});  // "b" was applied on some daemons only.
  EXPECT_FALSE(restarted.Replay(Create("r-b", "b")).has_value());
  // Adopted without a result, and the table has no "a": the op committed,
  // but its result is not here.
  std::optional<Replayed> replayed = restarted.Replay(Create("r-a", "a"));
  ASSERT_TRUE(replayed.has_value());
  EXPECT_THAT(replayed->status,
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("committed at log entry 1")));

  veteran.Adopt(records, {});
  replayed = veteran.Replay(Create("r-a", "a"));
  ASSERT_TRUE(replayed.has_value());
  EXPECT_TRUE(replayed->status.ok());
  EXPECT_EQ(replayed->result.info.tensor_id(), "ta");
}

TEST(OpOutcomesTest, RecordsAndResultsAreBounded) {
  TensorTable table(0);
  OpOutcomes outcomes(&table);
  for (size_t i = 0; i < kRememberedOps + 10; ++i) {
    outcomes.Committed(Create(absl::StrCat("r-", i), "w"),
                       static_cast<int64_t>(i + 1), Info("t"));
  }
  EXPECT_EQ(outcomes.Export().size(), kRememberedOps);
  EXPECT_FALSE(outcomes.Find("r-0").has_value());
  EXPECT_TRUE(outcomes.Find(absl::StrCat("r-", kRememberedOps + 9)));

  // Big results: the oldest lose theirs first, the records stay.
  OpOutcomes big(&table);
  const size_t quarter = kRememberedResultBytes / 4;
  for (int i = 0; i < 6; ++i) {
    big.Committed(Create(absl::StrCat("b-", i), "w"), i + 1,
                  Info(absl::StrCat("t", i), quarter));
  }
  std::optional<Replayed> oldest = big.Replay(Create("b-0", "w"));
  ASSERT_TRUE(oldest.has_value());
  EXPECT_THAT(oldest->status,
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("keeps no copy of its result")));
  std::optional<Replayed> newest = big.Replay(Create("b-5", "w"));
  ASSERT_TRUE(newest.has_value());
  EXPECT_TRUE(newest->status.ok());
  EXPECT_EQ(newest->result.info.tensor_id(), "t5");
  // One result over the whole budget is not kept at all.
  big.Committed(Create("huge", "w"), 7, Info("t7", kRememberedResultBytes + 1));
  std::optional<Replayed> huge = big.Replay(Create("huge", "w"));
  ASSERT_TRUE(huge.has_value());
  EXPECT_FALSE(huge->status.ok());
}

}  // namespace
}  // namespace tessera::control_internal
