#include "wire/fork_guard.h"

#include <pthread.h>

#include <atomic>
#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"
#include "grpcpp/support/interceptor.h"
#include "grpcpp/support/status.h"
#include "wire/grpc_status.h"

namespace tessera {
namespace {

std::atomic<bool> forked_after_grpc{false};

void MarkChild() { forked_after_grpc.store(true, std::memory_order_relaxed); }

using grpc::experimental::InterceptionHookPoints;

// Takes over every call (Hijack) and answers it with the refusal: nothing
// is sent, no connection is made, nothing waits on gRPC's pollers.
class ForkRefusal final : public grpc::experimental::Interceptor {
 public:
  explicit ForkRefusal(std::string method) : method_(std::move(method)) {}

  void Intercept(
      grpc::experimental::InterceptorBatchMethods* methods) override {
    const bool starts = methods->QueryInterceptionHookPoint(
        InterceptionHookPoints::PRE_SEND_INITIAL_METADATA);
    if (methods->QueryInterceptionHookPoint(
            InterceptionHookPoints::PRE_SEND_MESSAGE) &&
        !starts) {
      methods->FailHijackedSendMessage();
    }
    if (methods->QueryInterceptionHookPoint(
            InterceptionHookPoints::PRE_RECV_MESSAGE)) {
      methods->FailHijackedRecvMessage();
    }
    if (methods->QueryInterceptionHookPoint(
            InterceptionHookPoints::PRE_RECV_STATUS)) {
      *methods->GetRecvStatus() = ToGrpcStatus(ForkedAfterGrpcError(method_));
    }
    if (starts) {
      methods->Hijack();
    } else {
      methods->Proceed();
    }
  }

 private:
  const std::string method_;
};

class ForkGuardFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* info) override {
    if (!ForkedAfterGrpc()) return nullptr;
    return new ForkRefusal(info->method() == nullptr ? "a call"
                                                     : info->method());
  }
};

}  // namespace

void NoteGrpcInUse() {
  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(nullptr, nullptr, MarkChild); });
}

bool ForkedAfterGrpc() {
  return forked_after_grpc.load(std::memory_order_relaxed);
}

absl::Status ForkedAfterGrpcError(absl::string_view what) {
  return absl::FailedPreconditionError(absl::StrCat(
      what,
      ": this process was forked from one that had already used gRPC (a "
      "Tessera client or daemon), and gRPC cannot be used after fork(): use "
      "the client in the parent only, or start this process with exec "
      "(Python multiprocessing's \"spawn\" or \"forkserver\" start method; "
      "torch DataLoader(..., multiprocessing_context=\"spawn\"))"));
}

absl::Status CheckNotForkedAfterGrpc(absl::string_view what) {
  if (!ForkedAfterGrpc()) return absl::OkStatus();
  return ForkedAfterGrpcError(what);
}

std::shared_ptr<grpc::Channel> KeptInForkedChildren(
    std::shared_ptr<grpc::Channel> channel) {
  grpc::Channel* const pointer = channel.get();
  return std::shared_ptr<grpc::Channel>(
      pointer, [owner = std::move(channel)](grpc::Channel*) mutable {
        if (ForkedAfterGrpc()) {
          // Never freed: the channel outlives every owner in this process.
          new std::shared_ptr<grpc::Channel>(std::move(owner));
        }
      });
}

std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>
ForkGuardInterceptorFactory() {
  return std::make_unique<ForkGuardFactory>();
}

}  // namespace tessera
