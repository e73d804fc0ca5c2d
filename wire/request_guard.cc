#include "wire/request_guard.h"

#include <google/protobuf/descriptor.h>
#include <grpcpp/impl/server_builder_option.h>
#include <grpcpp/impl/server_builder_plugin.h>
#include <grpcpp/support/server_interceptor.h>

#include <algorithm>
#include <atomic>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

namespace tessera {
namespace {

using grpc::experimental::InterceptionHookPoints;

// The descriptor of Tessera's method "/tessera.v1.Service/Method"; null
// for any other (gRPC's own services, such as reflection when it is off,
// keep their UNIMPLEMENTED).
const google::protobuf::MethodDescriptor* FindMethod(absl::string_view path) {
  absl::ConsumePrefix(&path, "/");
  if (!absl::StartsWith(path, "tessera.")) return nullptr;
  return google::protobuf::DescriptorPool::generated_pool()->FindMethodByName(
      absl::StrReplaceAll(path, {{"/", "."}}));
}

std::atomic<RequestObserver> request_observer{nullptr};

class RequestGuard final : public grpc::experimental::Interceptor {
 public:
  explicit RequestGuard(grpc::experimental::ServerRpcInfo* info)
      : method_(info->method() != nullptr ? info->method() : ""),
        arrived_(absl::Now()) {}

  void Intercept(
      grpc::experimental::InterceptorBatchMethods* methods) override {
    // A request that parsed reaches this hook with its message; one that
    // did not, with none or (for a server-streaming method) not at all.
    if (methods->QueryInterceptionHookPoint(
            InterceptionHookPoints::POST_RECV_MESSAGE) &&
        methods->GetRecvMessage() != nullptr) {
      parsed_ = true;
    }
    if (methods->QueryInterceptionHookPoint(
            InterceptionHookPoints::PRE_SEND_STATUS)) {
      grpc::Status status = methods->GetSendStatus();
      if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED &&
          status.error_message().empty()) {
        if (const auto* method = FindMethod(method_)) {
          status = Rewrite(*method);
          methods->ModifySendStatus(status);
        }
      }
      Report(status.error_code());
    }
    methods->Proceed();
  }

 private:
  grpc::Status Rewrite(const google::protobuf::MethodDescriptor& method) const {
    if (!parsed_) {
      return grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat(method_, ": malformed request: not a valid ",
                       method.input_type()->full_name()));
    }
    return grpc::Status(grpc::StatusCode::INTERNAL,
                        absl::StrCat(method_,
                                     ": the request failed unexpectedly on "
                                     "this server (see its log)"));
  }

  void Report(grpc::StatusCode code) const {
    const RequestObserver observer =
        request_observer.load(std::memory_order_relaxed);
    if (observer == nullptr) return;
    absl::string_view method = method_;
    const bool known = FindMethod(method) != nullptr;
    absl::ConsumePrefix(&method, "/");
    observer(known ? method : "other", code, absl::Now() - arrived_);
  }

  const std::string method_;
  const absl::Time arrived_;
  bool parsed_ = false;
};

class RequestGuardFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new RequestGuard(info);
  }
};

std::atomic<bool> reflection_enabled{true};

// Drops gRPC's reflection plugin from a builder.
class NoReflection final : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>*
                         plugins) override {
    plugins->erase(
        std::remove_if(plugins->begin(), plugins->end(),
                       [](const std::unique_ptr<grpc::ServerBuilderPlugin>& p) {
                         return p->name() == "proto_server_reflection";
                       }),
        plugins->end());
  }
};

}  // namespace

void AddRequestGuard(grpc::ServerBuilder& builder) {
  std::vector<
      std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
      creators;
  creators.push_back(std::make_unique<RequestGuardFactory>());
  builder.experimental().SetInterceptorCreators(std::move(creators));
  if (!reflection_enabled.load()) {
    builder.SetOption(std::make_unique<NoReflection>());
  }
}

void SetServerReflection(bool enabled) { reflection_enabled.store(enabled); }

void SetRequestObserver(RequestObserver observer) {
  request_observer.store(observer, std::memory_order_relaxed);
}

}  // namespace tessera
