// The client library's logged calls carry one request id for every attempt
// and retry UNAVAILABLE (client/client.h): against a real gRPC server on
// loopback that plays a daemon answering on purpose (the daemons' own
// handling of the ids is tests/integration/request_id_test.cc), and tell
// the daemon the deadline they meant (wire/call_deadline.h).
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "common/proto_convert.h"
#include "common/sharding_spec.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tessera/v1/control.grpc.pb.h"
#include "tessera/v1/shard.grpc.pb.h"
#include "tests/testing/status_matchers.h"
#include "wire/call_deadline.h"
#include "wire/request_id.h"

namespace tessera {
namespace {

using ::tessera::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

ShardingSpec OneRank() {
  return *ChunkShardingSpec::Create(0, std::vector<std::string>{"rank:0/cpu"});
}

// The daemon's ShardService, which serves region reads and fetches:
// records what each call carried and refuses it.
class ScriptedShards final : public v1::ShardService::Service {
 public:
  using Recorder =
      std::function<void(const grpc::ServerContext&, const std::string&)>;
  explicit ScriptedShards(Recorder record) : record_(std::move(record)) {}

  grpc::Status FetchShard(grpc::ServerContext* context,
                          const v1::FetchShardRequest*,
                          grpc::ServerWriter<v1::ShardChunk>*) override {
    record_(*context, "FetchShard");
    return {grpc::StatusCode::INTERNAL, "scripted"};
  }
  grpc::Status DescribeTensor(grpc::ServerContext* context,
                              const v1::DescribeTensorRequest*,
                              v1::DescribeTensorResponse*) override {
    record_(*context, "DescribeTensor");
    return {grpc::StatusCode::INTERNAL, "scripted"};
  }

 private:
  const Recorder record_;
};

// A one-daemon cluster whose CreateTensor and DeleteTensor answer each
// attempt with the next status of a script (OK once it runs out), and
// record the request id and the deadline every call carried.
class ScriptedDaemon final : public v1::ControlService::Service {
 public:
  explicit ScriptedDaemon(std::vector<grpc::Status> script)
      : script_(std::move(script)) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port_);
    builder.RegisterService(this);
    builder.RegisterService(&shards_);
    server_ = builder.BuildAndStart();
  }
  ~ScriptedDaemon() override { server_->Shutdown(); }

  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  std::vector<std::string> ids() {
    std::lock_guard<std::mutex> lock(mu_);
    return ids_;
  }
  // Each call's deadline as the daemons take it (CallDeadlineOf), and as
  // gRPC alone gives it.
  std::vector<absl::Time> deadlines() {
    std::lock_guard<std::mutex> lock(mu_);
    return deadlines_;
  }
  std::vector<absl::Time> grpc_deadlines() {
    std::lock_guard<std::mutex> lock(mu_);
    return grpc_deadlines_;
  }
  // Each call's method, and whether it said the time its client had left.
  std::vector<std::pair<std::string, bool>> calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }

  grpc::Status GetCluster(grpc::ServerContext* context,
                          const v1::GetClusterRequest*,
                          v1::ClusterInfo* info) override {
    Record(*context, "GetCluster");
    info->set_world_size(1);
    info->set_rank(0);
    v1::WorkerAddress* worker = info->add_workers();
    worker->set_rank(0);
    worker->set_address(address());
    return grpc::Status::OK;
  }
  grpc::Status CreateTensor(grpc::ServerContext* context,
                            const v1::CreateTensorRequest* request,
                            v1::TensorInfo* info) override {
    Record(*context, "CreateTensor");
    grpc::Status status = Next();
    if (!status.ok()) return status;
    info->set_name(request->name());
    info->set_tensor_id("t1");
    const std::vector<int64_t> sizes(request->sizes().begin(),
                                     request->sizes().end());
    *info->mutable_metadata() = ToProto(*BuildMetadata(OneRank(), sizes));
    info->add_shard_ranks(0);
    return grpc::Status::OK;
  }
  grpc::Status DeleteTensor(grpc::ServerContext* context,
                            const v1::DeleteTensorRequest*,
                            v1::DeleteTensorResponse*) override {
    Record(*context, "DeleteTensor");
    return Next();
  }
  grpc::Status ListTensors(grpc::ServerContext* context,
                           const v1::ListTensorsRequest*,
                           v1::ListTensorsResponse*) override {
    Record(*context, "ListTensors");
    return grpc::Status::OK;
  }

  // Region writes and Gather are recorded and refused: what they
  // carried is all the tests ask of them.
  grpc::Status WriteRegion(grpc::ServerContext* context,
                           grpc::ServerReader<v1::WriteRegionChunk>*,
                           v1::WriteRegionResponse*) override {
    Record(*context, "WriteRegion");
    return {grpc::StatusCode::INTERNAL, "scripted"};
  }
  grpc::Status Gather(grpc::ServerContext* context, const v1::GatherRequest*,
                      grpc::ServerWriter<v1::ShardChunk>*) override {
    Record(*context, "Gather");
    return {grpc::StatusCode::INTERNAL, "scripted"};
  }

 private:
  void Record(const grpc::ServerContext& context, const std::string& method) {
    const absl::Time deadline = CallDeadlineOf(context);
    const bool said = context.client_metadata().count(kTimeoutKey) == 1;
    std::lock_guard<std::mutex> lock(mu_);
    calls_.emplace_back(method, said);
    ids_.push_back(RequestIdOf(context));
    deadlines_.push_back(deadline);
    grpc_deadlines_.push_back(absl::FromChrono(context.deadline()));
  }
  grpc::Status Next() {
    std::lock_guard<std::mutex> lock(mu_);
    if (next_ >= script_.size()) return grpc::Status::OK;
    return script_[next_++];
  }

  const std::vector<grpc::Status> script_;
  ScriptedShards shards_{
      [this](const grpc::ServerContext& context, const std::string& method) {
        Record(context, method);
      }};
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::mutex mu_;
  size_t next_ = 0;
  std::vector<std::string> ids_;
  std::vector<absl::Time> deadlines_;
  std::vector<absl::Time> grpc_deadlines_;
  std::vector<std::pair<std::string, bool>> calls_;
};

const grpc::Status kRestarting(grpc::StatusCode::UNAVAILABLE,
                               "failed to connect to all addresses");

TEST(ClientRetryTest, AnUnavailableCallIsRetriedWithTheSameId) {
  ScriptedDaemon daemon({kRestarting, kRestarting});
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Client> client,
                       Client::Connect(daemon.address()));
  ASSERT_OK(client->Create("w", {4}, OneRank()).status());
  const std::vector<std::string> ids = daemon.ids();
  ASSERT_EQ(ids.size(), 4u);  // GetCluster, then three attempts.
  EXPECT_TRUE(IsValidRequestId(ids[1])) << ids[1];
  EXPECT_THAT(ids, ElementsAre(::testing::_, ids[1], ids[1], ids[1]));
}

TEST(ClientRetryTest, RetriesStopAfterTheLastAttemptNamingTheId) {
  ScriptedDaemon daemon({kRestarting, kRestarting, kRestarting, kRestarting});
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Client> client,
                       Client::Connect(daemon.address()));
  const absl::Status deleted = client->Delete("w");
  const std::vector<std::string> ids = daemon.ids();
  ASSERT_EQ(ids.size(), 1u + kLoggedCallAttempts);
  EXPECT_THAT(
      deleted,
      StatusIs(
          absl::StatusCode::kUnavailable,
          AllOf(HasSubstr("deleting tensor w"),
                HasSubstr(absl::StrCat("(request id ", ids[1], ": `tessera op ",
                                       ids[1], "` tells whether it ran)")))));
}

TEST(ClientRetryTest, OnlyUnavailableIsRetriedAndNotAppliedNamesNoId) {
  {
    ScriptedDaemon daemon(
        {grpc::Status(grpc::StatusCode::ALREADY_EXISTS, "tensor w exists")});
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<Client> client,
                         Client::Connect(daemon.address()));
    EXPECT_THAT(client->Create("w", {4}, OneRank()).status(),
                StatusIs(absl::StatusCode::kAlreadyExists, ::testing::_));
    EXPECT_EQ(daemon.ids().size(), 2u);
  }
  {
    // Certain: not applied. Retried, and said as the daemon said it.
    const grpc::Status not_applied(
        grpc::StatusCode::UNAVAILABLE,
        "DeleteTensor was not applied: the daemons' process group broke "
        "while it ran; retry it");
    ScriptedDaemon daemon({not_applied, not_applied, not_applied});
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<Client> client,
                         Client::Connect(daemon.address()));
    const absl::Status deleted = client->Delete("w");
    EXPECT_THAT(deleted, StatusIs(absl::StatusCode::kUnavailable,
                                  AllOf(HasSubstr("was not applied"),
                                        Not(HasSubstr("tessera op")))));
  }
}

TEST(ClientRetryTest, AClientsRequestIdNumbersItsLoggedCalls) {
  ScriptedDaemon daemon({});
  ClientOptions options;
  options.request_id = "job-7";
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Client> client,
                       Client::Connect(daemon.address(), options));
  ASSERT_OK(client->Create("a", {4}, OneRank()).status());
  ASSERT_OK(client->List().status());
  ASSERT_OK(client->Create("b", {4}, OneRank()).status());
  ASSERT_OK(client->Delete("a"));
  // Connecting carries no id; reads carry the id as it is.
  EXPECT_THAT(daemon.ids(),
              ElementsAre("", "job-7", "job-7", "job-7.2", "job-7.3"));

  for (const std::string& bad :
       {std::string(65, 'x'), std::string("has space"), std::string("")}) {
    ClientOptions refused;
    refused.request_id = bad;
    absl::StatusOr<std::shared_ptr<Client>> connected =
        Client::Connect(daemon.address(), refused);
    if (bad.empty()) {
      EXPECT_OK(connected.status());  // Empty: a new id per call.
    } else {
      EXPECT_THAT(
          connected.status(),
          StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1 to 64 of")))
          << bad;
    }
  }
}

// Every attempt of a logged call has one deadline, and the daemon must see
// that one: it answers just before it (server/daemon/op_log.h), and an
// answer after the client gave up leaves the caller unsure whether its op
// ran. gRPC's own timeout header rounds up, and a retry may reuse the one
// the first attempt sent, so the attempts' deadlines drifted apart by the
// pauses between them (0.2 s, then 0.4 s).
TEST(ClientRetryTest, EveryAttemptCarriesTheDeadlineTheClientMeant) {
  ScriptedDaemon daemon({kRestarting, kRestarting});
  ClientOptions options;
  options.timeout = absl::Seconds(30);
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Client> client,
                       Client::Connect(daemon.address(), options));
  const absl::Time before = absl::Now();
  ASSERT_OK(client->Create("w", {4}, OneRank()).status());
  const absl::Time after = absl::Now();
  const std::vector<absl::Time> deadlines = daemon.deadlines();
  ASSERT_EQ(deadlines.size(), 4u);  // GetCluster, then three attempts.
  for (size_t i = 1; i < deadlines.size(); ++i) {
    // The client's deadline lies in [before, after] + 30 s; loopback's
    // transit is all the daemon may add.
    EXPECT_GE(deadlines[i], before + options.timeout) << i;
    EXPECT_LE(deadlines[i], after + options.timeout + absl::Milliseconds(50))
        << i;
    // (gRPC converts its deadline to wall time anew on each ask.)
    EXPECT_LE(deadlines[i], daemon.grpc_deadlines()[i] + absl::Milliseconds(1))
        << i;
    EXPECT_LT(absl::AbsDuration(deadlines[i] - deadlines[1]),
              absl::Milliseconds(150))
        << "attempt " << i << " of 3";
  }
}

// Not only logged calls: every call a daemon serves under a deadline it
// keeps (region reads and writes, Gather, shard fetches; CallDeadlineOf's
// users) must learn the client's, or it works on after the client gave up.
TEST(ClientRetryTest, EveryKindOfCallSaysTheTimeItHasLeft) {
  ScriptedDaemon daemon({});
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Client> client,
                       Client::Connect(daemon.address()));
  ASSERT_OK_AND_ASSIGN(ShardedTensorView view,
                       client->Create("w", {4}, OneRank()));
  ASSERT_OK_AND_ASSIGN(Tensor data, Tensor::Zeros({4}));
  EXPECT_FALSE(view.Write({0}, data).ok());
  EXPECT_FALSE(view.ReadRegion({0}, {4}).ok());
  EXPECT_FALSE(client->Gather("w").ok());
  ASSERT_OK(client->List().status());
  ASSERT_OK(client->Delete("w"));
  std::vector<std::string> methods;
  for (const auto& [method, said] : daemon.calls()) {
    methods.push_back(method);
    EXPECT_TRUE(said) << method << " did not say its client's time left";
  }
  for (const char* method :
       {"GetCluster", "CreateTensor", "WriteRegion", "FetchShard", "Gather",
        "ListTensors", "DeleteTensor"}) {
    EXPECT_THAT(methods, ::testing::Contains(method));
  }
}

// The header can only make a deadline sooner; a malformed one is ignored.
TEST(ClientRetryTest, ADaemonTakesTheSoonerDeadlineAndIgnoresBadHeaders) {
  ScriptedDaemon daemon({});
  auto stub = v1::ControlService::NewStub(grpc::CreateChannel(
      daemon.address(), grpc::InsecureChannelCredentials()));
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  const std::vector<std::string> headers = {
      "5000000", "99000000", "abc", "-5", "", "99999999999999999999999"};
  for (const std::string& header : headers) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(deadline));
    context.AddMetadata(kTimeoutKey, header);
    v1::ListTensorsResponse response;
    ASSERT_TRUE(stub->ListTensors(&context, {}, &response).ok());
  }
  const std::vector<absl::Time> seen = daemon.deadlines();
  const std::vector<absl::Time> grpc_seen = daemon.grpc_deadlines();
  ASSERT_EQ(seen.size(), headers.size());
  // 5 s left: sooner than gRPC's 20 s, so taken.
  EXPECT_LT(seen[0], deadline - absl::Seconds(10));
  EXPECT_GT(seen[0], deadline - absl::Seconds(16));
  for (size_t i = 1; i < headers.size(); ++i) {
    // (gRPC converts its deadline to wall time anew on each ask.)
    EXPECT_LT(absl::AbsDuration(seen[i] - grpc_seen[i]), absl::Milliseconds(1))
        << "header '" << headers[i] << "'";
  }
}

}  // namespace
}  // namespace tessera
