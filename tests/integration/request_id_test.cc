// Request ids are idempotency keys (docs/control_log.md, "Retries and
// request ids"): real `tessera-server` processes on loopback
// (tests/testing/daemon_cluster.h), called through raw gRPC stubs that set
// the id themselves and through the client library.
//
// Covered: a retry of a committed op, through the same daemon or another,
// is answered with the first outcome and applies nothing (a create retried
// after the tensor was deleted does not bring it back); the same id for
// another request is refused on every daemon; GetOperation tells
// committed, failed (and a failed op runs again on retry), pending and
// unknown; a client's --request-id numbers its calls so that the same
// script run twice applies nothing twice; a daemon restarted after the op
// committed still tells the retry from a new op; an op whose call ended at
// its deadline while a daemon was stalled ends known, never ambiguous.
#include <signal.h>

#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "common/proto_convert.h"
#include "common/sharding_spec.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tessera/v1/control.grpc.pb.h"
#include "tests/testing/daemon_cluster.h"
#include "tests/testing/daemon_state.h"
#include "tests/testing/status_matchers.h"
#include "wire/auth.h"
#include "wire/grpc_status.h"
#include "wire/request_id.h"

namespace tessera {
namespace {

using ::tessera::testing::DaemonCluster;
using ::tessera::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int kWorld = 3;

ShardingSpec Rows() {
  std::vector<std::string> placements;
  for (int r = 0; r < kWorld; ++r) {
    placements.push_back(absl::StrCat("rank:", r, "/cpu"));
  }
  return *ChunkShardingSpec::Create(0, placements);
}

v1::CreateTensorRequest CreateRequest(const std::string& name) {
  v1::CreateTensorRequest request;
  request.set_name(name);
  request.add_sizes(6);
  request.add_sizes(4);
  request.set_dtype(ToProto(DType::kFloat32));
  *request.mutable_spec() = ToProto(Rows());
  request.set_init(v1::INIT_KIND_ZEROS);
  return request;
}

class RequestIdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(cluster_,
                         DaemonCluster::Start(testing::QuietClusterOptions(
                             kWorld, TESSERA_SERVER_PATH)));
    for (int r = 0; r < kWorld; ++r) {
      stubs_.push_back(v1::ControlService::NewStub(
          CreateTesseraChannel(cluster_->address(r))));
    }
  }

  // CreateTensor through daemon `rank` with request id `id`.
  absl::StatusOr<v1::TensorInfo> Create(
      int rank, const std::string& id, const v1::CreateTensorRequest& request,
      absl::Duration timeout = absl::Seconds(30)) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    SetRequestId(context, id);
    v1::TensorInfo info;
    absl::Status status =
        FromGrpcStatus(stubs_[rank]->CreateTensor(&context, request, &info));
    if (!status.ok()) return status;
    return info;
  }

  absl::Status Delete(int rank, const std::string& id,
                      const std::string& name) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    SetRequestId(context, id);
    v1::DeleteTensorRequest request;
    request.set_name(name);
    v1::DeleteTensorResponse response;
    return FromGrpcStatus(
        stubs_[rank]->DeleteTensor(&context, request, &response));
  }

  absl::StatusOr<v1::OperationStatus> Operation(int rank,
                                                const std::string& id) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::GetOperationRequest request;
    request.set_request_id(id);
    v1::OperationStatus status;
    absl::Status called =
        FromGrpcStatus(stubs_[rank]->GetOperation(&context, request, &status));
    if (!called.ok()) return called;
    return status;
  }

  // "name=id" of every tensor daemon `rank` lists.
  std::vector<std::string> Listed(int rank) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::ListTensorsResponse response;
    EXPECT_TRUE(stubs_[rank]
                    ->ListTensors(&context, v1::ListTensorsRequest(), &response)
                    .ok());
    std::vector<std::string> listed;
    for (const v1::TensorInfo& info : response.tensors()) {
      listed.push_back(absl::StrCat(info.name(), "=", info.tensor_id()));
    }
    return listed;
  }

  // Every daemon lists `expected` ("name=id").
  void ExpectEveryDaemonLists(const std::vector<std::string>& expected) {
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_THAT(Listed(r), ::testing::UnorderedElementsAreArray(expected))
          << "rank " << r;
    }
  }

  std::unique_ptr<DaemonCluster> cluster_;
  std::vector<std::unique_ptr<v1::ControlService::Stub>> stubs_;
};

TEST_F(RequestIdTest, ARetryIsAnsweredWithTheFirstOutcomeAndAppliesNothing) {
  ASSERT_OK_AND_ASSIGN(v1::TensorInfo first,
                       Create(1, "t-create-w", CreateRequest("w")));
  // The same call again, through the same daemon and through another: the
  // first outcome, not ALREADY_EXISTS.
  for (int rank : {1, 2, 0}) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    ASSERT_OK_AND_ASSIGN(v1::TensorInfo again,
                         Create(rank, "t-create-w", CreateRequest("w")));
    EXPECT_EQ(again.tensor_id(), first.tensor_id()) << "rank " << rank;
    EXPECT_EQ(again.name(), "w");
  }
  // A new id is a new operation.
  EXPECT_THAT(Create(1, "t-create-w-2", CreateRequest("w")).status(),
              StatusIs(absl::StatusCode::kAlreadyExists, ::testing::_));
  ExpectEveryDaemonLists({absl::StrCat("w=", first.tensor_id())});

  // After a delete, a late retry of the create does not bring it back.
  ASSERT_OK(Delete(0, "t-delete-w", "w"));
  for (int rank : {1, 2}) {
    ASSERT_OK_AND_ASSIGN(v1::TensorInfo late,
                         Create(rank, "t-create-w", CreateRequest("w")));
    EXPECT_EQ(late.tensor_id(), first.tensor_id());
  }
  ASSERT_OK(Delete(2, "t-delete-w", "w"));  // Nor does the delete fail.
  ExpectEveryDaemonLists({});
}

TEST_F(RequestIdTest, TheSameIdForAnotherRequestIsRefusedEverywhere) {
  ASSERT_OK_AND_ASSIGN(v1::TensorInfo a,
                       Create(0, "t-reused", CreateRequest("a")));
  for (int rank = 0; rank < kWorld; ++rank) {
    EXPECT_THAT(
        Create(rank, "t-reused", CreateRequest("b")).status(),
        StatusIs(absl::StatusCode::kInvalidArgument,
                 AllOf(HasSubstr("request id t-reused was used by another "
                                 "operation, CreateTensor 'a' (log entry"),
                       HasSubstr("give each operation an id of its own"))))
        << "rank " << rank;
  }
  v1::CreateTensorRequest ones = CreateRequest("a");
  ones.set_init(v1::INIT_KIND_ONES);
  EXPECT_THAT(Create(1, "t-reused", ones).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  ExpectEveryDaemonLists({absl::StrCat("a=", a.tensor_id())});
}

TEST_F(RequestIdTest, GetOperationTellsCommittedFailedAndUnknown) {
  ASSERT_OK_AND_ASSIGN(v1::TensorInfo a, Create(0, "t-a", CreateRequest("a")));
  for (int rank = 0; rank < kWorld; ++rank) {
    ASSERT_OK_AND_ASSIGN(v1::OperationStatus status, Operation(rank, "t-a"));
    EXPECT_EQ(status.state(), v1::OperationStatus::STATE_COMMITTED)
        << "rank " << rank;
    EXPECT_EQ(status.method(), "CreateTensor");
    EXPECT_EQ(status.tensor(), "a");
    EXPECT_GT(status.log_entry(), 0);
  }

  // A failed op changed nothing: reported with its error, and run again
  // when retried with the same id.
  ASSERT_OK_AND_ASSIGN(v1::TensorInfo blocker,
                       Create(1, "t-blocker", CreateRequest("b")));
  EXPECT_THAT(Create(2, "t-b", CreateRequest("b")).status(),
              StatusIs(absl::StatusCode::kAlreadyExists, ::testing::_));
  for (int rank = 0; rank < kWorld; ++rank) {
    ASSERT_OK_AND_ASSIGN(v1::OperationStatus status, Operation(rank, "t-b"));
    EXPECT_EQ(status.state(), v1::OperationStatus::STATE_FAILED)
        << "rank " << rank;
    EXPECT_EQ(status.code(),
              static_cast<int>(absl::StatusCode::kAlreadyExists));
    EXPECT_THAT(status.message(), HasSubstr("b"));
  }
  ASSERT_OK(Delete(0, "t-unblock", "b"));
  ASSERT_OK_AND_ASSIGN(v1::TensorInfo b, Create(2, "t-b", CreateRequest("b")));
  EXPECT_NE(b.tensor_id(), blocker.tensor_id());
  ASSERT_OK_AND_ASSIGN(v1::OperationStatus now, Operation(1, "t-b"));
  EXPECT_EQ(now.state(), v1::OperationStatus::STATE_COMMITTED);

  ASSERT_OK_AND_ASSIGN(v1::OperationStatus never, Operation(1, "t-never"));
  EXPECT_EQ(never.state(), v1::OperationStatus::STATE_UNKNOWN);
  EXPECT_THAT(Operation(1, "not an id").status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("is not a request id")));
  ExpectEveryDaemonLists(
      {absl::StrCat("a=", a.tensor_id()), absl::StrCat("b=", b.tensor_id())});
}

// The client numbers its logged calls under its request id, so that the
// same calls made again (a script run twice) apply nothing twice.
TEST_F(RequestIdTest,
       AClientsRequestIdNumbersItsCallsAndASecondRunAppliesNothing) {
  ClientOptions options;
  options.request_id = "job-7";
  auto run = [&](int rank) -> absl::Status {
    ASSIGN_OR_RETURN(std::shared_ptr<Client> client,
                     Client::Connect(cluster_->address(rank), options));
    RETURN_IF_ERROR(client->Create("a", {6, 4}, Rows()).status());
    RETURN_IF_ERROR(client->Create("b", {6, 4}, Rows()).status());
    return client->Delete("a");
  };
  ASSERT_OK(run(0));
  const std::vector<std::string> after_first = Listed(0);
  ASSERT_OK(run(1));  // Through another daemon: still nothing applied.
  ExpectEveryDaemonLists(after_first);
  EXPECT_THAT(after_first, ::testing::ElementsAre(HasSubstr("b=")));

  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Client> client,
                       Client::Connect(cluster_->address(2)));
  ASSERT_OK_AND_ASSIGN(v1::OperationStatus second,
                       client->Operation("job-7.2"));
  EXPECT_EQ(second.state(), v1::OperationStatus::STATE_COMMITTED);
  EXPECT_EQ(second.tensor(), "b");
  ASSERT_OK_AND_ASSIGN(v1::OperationStatus third, client->Operation("job-7.3"));
  EXPECT_EQ(third.method(), "DeleteTensor");

  ClientOptions too_long;
  too_long.request_id = std::string(65, 'x');
  EXPECT_THAT(
      Client::Connect(cluster_->address(0), too_long).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1 to 64 of")));
}

// A daemon that restarted after the op committed adopts the others'
// records when it joins: it answers the retry (with the tensor as it is),
// and every daemon still skips it alike.
TEST_F(RequestIdTest, ARestartedDaemonTellsARetryFromANewOperation) {
  ASSERT_OK_AND_ASSIGN(v1::TensorInfo first,
                       Create(1, "t-before-restart", CreateRequest("w")));
  cluster_->Kill(1);
  ASSERT_OK(cluster_->Restart(1)) << cluster_->Log(1);
  stubs_[1] =
      v1::ControlService::NewStub(CreateTesseraChannel(cluster_->address(1)));
  // It joins the running cluster (the others notice within a poll).
  absl::StatusOr<v1::OperationStatus> known;
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  do {
    known = Operation(1, "t-before-restart");
    if (known.ok() && known->state() == v1::OperationStatus::STATE_COMMITTED) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(200));
  } while (absl::Now() < give_up);
  ASSERT_OK(known.status()) << cluster_->Log(1);
  ASSERT_EQ(known->state(), v1::OperationStatus::STATE_COMMITTED)
      << cluster_->Log(1);

  absl::StatusOr<v1::TensorInfo> retried;
  do {  // Operations wait while the restarted daemon refills.
    retried = Create(1, "t-before-restart", CreateRequest("w"));
    if (retried.ok() || !absl::IsUnavailable(retried.status())) break;
    absl::SleepFor(absl::Milliseconds(200));
  } while (absl::Now() < give_up);
  ASSERT_OK(retried.status()) << cluster_->Log(1);
  EXPECT_EQ(retried->tensor_id(), first.tensor_id());
  ASSERT_OK_AND_ASSIGN(v1::TensorInfo from_veteran,
                       Create(2, "t-before-restart", CreateRequest("w")));
  EXPECT_EQ(from_veteran.tensor_id(), first.tensor_id());
  ExpectEveryDaemonLists({absl::StrCat("w=", first.tensor_id())});
}

// A create whose call ends while a daemon is stalled says where the op
// is and under which id, and so does a retry of it meanwhile; once the
// daemon resumes, the op's outcome is
// known (committed or failed, never open), and a retry with the id leaves
// exactly one tensor.
TEST_F(RequestIdTest, AnOpPastItsDeadlineEndsKnown) {
  ASSERT_OK(Create(0, "t-warm", CreateRequest("warm")).status());
  absl::Cleanup resume = [&] { cluster_->Resume(2); };
  ASSERT_OK(cluster_->Stop(2));
  const absl::Status ended =
      Create(0, "t-stalled", CreateRequest("w"), absl::Seconds(2)).status();
  EXPECT_THAT(ended,
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       AllOf(HasSubstr("did not finish within its deadline"),
                             HasSubstr("request id t-stalled"),
                             HasSubstr("tessera op t-stalled"))));
  EXPECT_THAT(ended.message(), ::testing::Not(HasSubstr("may still")));
  ASSERT_OK_AND_ASSIGN(v1::OperationStatus during, Operation(0, "t-stalled"));
  EXPECT_EQ(during.state(), v1::OperationStatus::STATE_PENDING);
  EXPECT_GT(during.log_entry(), 0);
  // A retry with the id while the first attempt still runs here, held
  // behind the silent daemon until its deadline, is not told "not
  // applied": that attempt may still commit.
  ASSERT_OK(testing::TimeUntilDaemonState(
                cluster_->address(0),
                [](const v1::ClusterInfo& info) {
                  return absl::StartsWith(info.state(), "waiting");
                },
                absl::Now(), absl::Seconds(20))
                .status());
  const absl::Status retried_during =
      Create(0, "t-stalled", CreateRequest("w"), absl::Seconds(2)).status();
  EXPECT_THAT(retried_during, StatusIs(absl::StatusCode::kDeadlineExceeded,
                                       HasSubstr("tessera op t-stalled")));
  EXPECT_THAT(retried_during.message(),
              ::testing::Not(HasSubstr("not applied")));
  std::cout << "[ request id ] a retry during the stall: " << retried_during
            << "\n";
  std::move(resume).Invoke();

  absl::StatusOr<v1::OperationStatus> after;
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  do {
    after = Operation(0, "t-stalled");
    if (after.ok() && (after->state() == v1::OperationStatus::STATE_COMMITTED ||
                       after->state() == v1::OperationStatus::STATE_FAILED)) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(200));
  } while (absl::Now() < give_up);
  ASSERT_OK(after.status());
  ASSERT_THAT(after->state(),
              ::testing::AnyOf(v1::OperationStatus::STATE_COMMITTED,
                               v1::OperationStatus::STATE_FAILED))
      << after->DebugString();
  // Committed: the retry answers it; failed: the retry runs it. One tensor.
  absl::StatusOr<v1::TensorInfo> retried;
  do {
    retried = Create(0, "t-stalled", CreateRequest("w"));
    if (retried.ok() || !absl::IsUnavailable(retried.status())) break;
    absl::SleepFor(absl::Milliseconds(200));
  } while (absl::Now() < give_up);
  ASSERT_OK(retried.status()) << after->DebugString();
  std::vector<std::string> listed = Listed(0);
  EXPECT_THAT(listed,
              ::testing::Contains(absl::StrCat("w=", retried->tensor_id())));
  ExpectEveryDaemonLists(listed);
}

}  // namespace
}  // namespace tessera
