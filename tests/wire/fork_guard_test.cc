// The fork guard (wire/fork_guard.h) on a real gRPC server on loopback: a
// child forked after the process made a call is refused at once, on a
// channel it inherited and on one it makes, and can drop both without
// aborting; the parent's calls go on.
#include "wire/fork_guard.h"

#include <grpcpp/grpcpp.h>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "tests/testing/forked_child.h"
#include "wire/auth.h"

namespace tessera {
namespace {

// Health/Check, synchronously (as the client's control calls are made).
grpc::Status Check(const std::shared_ptr<grpc::Channel>& channel) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  grpc::health::v1::HealthCheckResponse response;
  return grpc::health::v1::Health::NewStub(channel)->Check(
      &context, grpc::health::v1::HealthCheckRequest(), &response);
}

// Health/Check as raw bytes on a private completion queue driven by the
// calling thread (as ShardClient's gRPC fetches are made).
grpc::Status CheckOnOwnQueue(const std::shared_ptr<grpc::Channel>& channel) {
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue queue;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  grpc::ByteBuffer request(nullptr, 0);
  grpc::ByteBuffer response;
  grpc::Status status;
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> call =
      stub.PrepareUnaryCall(&context, "/grpc.health.v1.Health/Check", request,
                            &queue);
  call->StartCall();
  call->Finish(&response, &status, &queue);
  void* tag;
  bool ok;
  queue.Next(&tag, &ok);
  queue.Shutdown();
  while (queue.Next(&tag, &ok)) {
  }
  return status;
}

// In the child: whether a call was refused as forked, at once.
bool RefusedAtOnce(const std::shared_ptr<grpc::Channel>& channel) {
  for (auto call : {Check, CheckOnOwnQueue}) {
    const absl::Time start = absl::Now();
    const grpc::Status status = call(channel);
    if (status.error_code() != grpc::StatusCode::FAILED_PRECONDITION ||
        !absl::StrContains(status.error_message(), "forked") ||
        absl::Now() - start > absl::Seconds(5)) {
      return false;
    }
  }
  return true;
}

// The forked child's checks; its exit code says which one failed (a hang
// is the parent's timeout, an abort dropping a channel a signal).
int ChildChecks(std::shared_ptr<grpc::Channel> channel,
                const std::string& target) {
  if (!ForkedAfterGrpc()) return 10;
  if (!RefusedAtOnce(channel)) return 11;
  std::shared_ptr<grpc::Channel> fresh = CreateTesseraChannel(target);
  if (!RefusedAtOnce(fresh)) return 12;
  const absl::Status checked = CheckNotForkedAfterGrpc("dialling x");
  if (!absl::IsFailedPrecondition(checked) ||
      !absl::StrContains(checked.message(), "dialling x: ") ||
      !absl::StrContains(checked.message(), "\"spawn\"")) {
    return 13;
  }
  fresh.reset();
  channel.reset();
  return 0;
}

TEST(ForkGuardTest, AChildIsRefusedAtOnceAndTheParentGoesOn) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  const std::string target = "127.0.0.1:" + std::to_string(port);
  std::shared_ptr<grpc::Channel> channel = CreateTesseraChannel(target);
  ASSERT_TRUE(Check(channel).ok());
  ASSERT_TRUE(CheckOnOwnQueue(channel).ok());
  ASSERT_FALSE(ForkedAfterGrpc());

  // A hung child under AddressSanitizer is forked again (forked_child.h).
  // The child holds the last reference, so dropping it frees the channel.
  const testing::ChildResult child = testing::RunInChild(
      [&] { return ChildChecks(std::move(channel), target); },
      absl::Seconds(testing::kChildForks == 1 ? 30 : 15));
  ASSERT_TRUE(child.passed()) << child.Describe();
  EXPECT_FALSE(ForkedAfterGrpc());
  EXPECT_TRUE(Check(channel).ok());
  EXPECT_TRUE(CheckOnOwnQueue(channel).ok());
  server->Shutdown();
}

}  // namespace
}  // namespace tessera
