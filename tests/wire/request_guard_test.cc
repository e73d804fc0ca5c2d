// The request guard (wire/request_guard.h) on a real gRPC server on
// loopback: a request that does not parse is INVALID_ARGUMENT naming the
// method and its message type, a handler that throws is INTERNAL naming
// the method, an unknown method stays UNIMPLEMENTED, and good calls pass
// untouched.
#include "wire/request_guard.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tessera/v1/control.grpc.pb.h"
#include "tests/testing/raw_call.h"
#include "wire/auth.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

// GetCluster answers; ListTensors throws while creating its reactor.
class TestControl final : public v1::ControlService::CallbackService {
 public:
  grpc::ServerUnaryReactor* GetCluster(grpc::CallbackServerContext* context,
                                       const v1::GetClusterRequest*,
                                       v1::ClusterInfo* response) override {
    response->set_world_size(3);
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerUnaryReactor* ListTensors(grpc::CallbackServerContext*,
                                        const v1::ListTensorsRequest*,
                                        v1::ListTensorsResponse*) override {
    throw std::runtime_error("boom");
  }
};

class RequestGuardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port);
    AddRequestGuard(builder);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    channel_ = CreateTesseraChannel("127.0.0.1:" + std::to_string(port));
  }
  void TearDown() override { server_->Shutdown(); }

  grpc::Status RawCall(const std::string& method, const std::string& bytes) {
    return ::tessera::testing::RawUnaryCall(channel_, method, bytes);
  }

  TestControl service_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(RequestGuardTest, MalformedRequestIsInvalidArgumentNamingTheMethod) {
  // Field 1 with wire type 7 (invalid), and a length-delimited field that
  // runs past the end.
  for (const std::string& bytes :
       {std::string("\x0f\x01", 2), std::string("\x0a\x7f\x01", 3)}) {
    const grpc::Status status =
        RawCall("/tessera.v1.ControlService/GetCluster", bytes);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(),
                HasSubstr("/tessera.v1.ControlService/GetCluster: malformed "
                          "request: not a valid tessera.v1.GetClusterRequest"));
  }
}

TEST_F(RequestGuardTest, GoodCallsPassAndThrowingHandlersAreInternal) {
  auto stub = v1::ControlService::NewStub(channel_);
  grpc::ClientContext context;
  v1::ClusterInfo info;
  ASSERT_TRUE(stub->GetCluster(&context, {}, &info).ok());
  EXPECT_EQ(info.world_size(), 3);

  grpc::ClientContext list_context;
  v1::ListTensorsResponse listed;
  const grpc::Status thrown = stub->ListTensors(&list_context, {}, &listed);
  EXPECT_EQ(thrown.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_THAT(thrown.error_message(),
              HasSubstr("/tessera.v1.ControlService/ListTensors"));
  // The server still serves.
  grpc::ClientContext again;
  EXPECT_TRUE(stub->GetCluster(&again, {}, &info).ok());
}

TEST_F(RequestGuardTest, UnknownMethodsStayUnimplemented) {
  EXPECT_EQ(RawCall("/tessera.v1.ControlService/NoSuchMethod", "").error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_EQ(RawCall("/no.Such/Service", "").error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
}

// Every call is reported with its final code (after the guard's rewrite);
// a method Tessera does not define is "other", whatever name was sent.
TEST_F(RequestGuardTest, EveryCallIsReportedWithABoundedMethodName) {
  static absl::Mutex mu;
  static std::vector<std::pair<std::string, grpc::StatusCode>> seen;
  SetRequestObserver(
      [](absl::string_view method, grpc::StatusCode code, absl::Duration took) {
        absl::MutexLock lock(&mu);
        seen.emplace_back(std::string(method), code);
        EXPECT_GE(took, absl::ZeroDuration());
      });
  auto stub = v1::ControlService::NewStub(channel_);
  grpc::ClientContext context;
  v1::ClusterInfo info;
  ASSERT_TRUE(stub->GetCluster(&context, {}, &info).ok());
  RawCall("/tessera.v1.ControlService/GetCluster", std::string("\x0f\x01", 2))
      .error_code();
  RawCall("/made.up/Name12345", "").error_code();
  SetRequestObserver(nullptr);
  // The server sends its status before the client sees it: by now each
  // call was reported.
  absl::MutexLock lock(&mu);
  EXPECT_THAT(
      seen, ::testing::IsSupersetOf({std::pair<std::string, grpc::StatusCode>(
                                         "tessera.v1.ControlService/GetCluster",
                                         grpc::StatusCode::OK),
                                     std::pair<std::string, grpc::StatusCode>(
                                         "tessera.v1.ControlService/GetCluster",
                                         grpc::StatusCode::INVALID_ARGUMENT)}));
  for (const auto& [method, code] : seen) {
    EXPECT_THAT(method, ::testing::AnyOf("other",
                                         ::testing::StartsWith("tessera.v1.")));
  }
}

// SetServerReflection(false) takes reflection off every server built
// afterwards (gRPC's reflection library adds it to every server once
// linked in).
TEST(ServerReflectionTest, CanBeTurnedOff) {
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  constexpr char kMethod[] =
      "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";
  auto serve = [](TestControl& service, int* port) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             port);
    AddRequestGuard(builder);
    builder.RegisterService(&service);
    return builder.BuildAndStart();
  };
  auto call = [&](int port) {
    return ::tessera::testing::RawUnaryCall(
        CreateTesseraChannel("127.0.0.1:" + std::to_string(port)), kMethod, "");
  };
  TestControl service;
  int port = 0;
  std::unique_ptr<grpc::Server> with = serve(service, &port);
  EXPECT_TRUE(call(port).ok());
  with->Shutdown();
  SetServerReflection(false);
  TestControl other;
  std::unique_ptr<grpc::Server> without = serve(other, &port);
  EXPECT_EQ(call(port).error_code(), grpc::StatusCode::UNIMPLEMENTED);
  without->Shutdown();
  SetServerReflection(true);
}

}  // namespace
}  // namespace tessera
