#include "client/version_watcher.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "grpcpp/support/sync_stream.h"
#include "wire/fork_guard.h"
#include "wire/grpc_status.h"
#include "wire/request_id.h"

namespace tessera {

VersionWatcher::VersionWatcher(std::shared_ptr<v1::ControlService::Stub> stub,
                               std::shared_ptr<const void> keepalive,
                               std::string name, int64_t after,
                               std::function<void(int64_t)> on_next,
                               absl::Duration stream_lifetime)
    : stub_(std::move(stub)),
      keepalive_(std::move(keepalive)),
      name_(std::move(name)),
      on_next_(std::move(on_next)),
      stream_lifetime_(stream_lifetime),
      last_(after) {
  thread_ = std::thread([this] { Loop(); });
}

VersionWatcher::~VersionWatcher() {
  if (ForkedAfterGrpc()) {
    // Inherited from the parent: its thread is not in this process (it
    // can be neither joined nor detached: its handle is left, never
    // freed), and its lock and call may be mid-use there
    // (wire/fork_guard.h).
    new std::thread(std::move(thread_));
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (context_ != nullptr) context_->TryCancel();
  }
  thread_.join();
}

absl::StatusOr<int64_t> VersionWatcher::Next(absl::Duration timeout) {
  RETURN_IF_ERROR(
      CheckNotForkedAfterGrpc(absl::StrCat("watching tensor ", name_)));
  int64_t number = 0;
  {
    absl::MutexLock lock(&mu_);
    const auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !ready_.empty() || !ended_.ok();
    };
    mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
    if (!ready_.empty()) {
      number = ready_.front();
      ready_.pop_front();
    } else if (!ended_.ok()) {
      return ended_;
    }
  }
  if (number > 0) {
    if (on_next_) on_next_(number);
    return number;
  }
  return absl::DeadlineExceededError(
      absl::StrCat("watching tensor ", name_, ": no version published within ",
                   absl::FormatDuration(timeout)));
}

void VersionWatcher::Loop() {
  absl::Duration pause = absl::Milliseconds(50);
  while (true) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + stream_lifetime_));
    SetRequestId(context, NewRequestId());
    v1::WatchVersionsRequest request;
    request.set_name(name_);
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      request.set_after(last_);
      context_ = &context;
    }
    std::unique_ptr<grpc::ClientReader<v1::VersionEvent>> stream =
        stub_->WatchVersions(&context, request);
    v1::VersionEvent event;
    bool received = false;
    while (stream->Read(&event)) {
      received = true;
      absl::MutexLock lock(&mu_);
      if (event.number() > last_) {
        last_ = event.number();
        ready_.push_back(event.number());
      }
    }
    const absl::Status status = FromGrpcStatus(stream->Finish());
    {
      absl::MutexLock lock(&mu_);
      context_ = nullptr;
      if (stopping_) return;
      // Final: the tensor is gone or has no versions.
      if (absl::IsNotFound(status) || absl::IsFailedPrecondition(status) ||
          absl::IsInvalidArgument(status) || absl::IsPermissionDenied(status) ||
          absl::IsUnauthenticated(status)) {
        ended_ = Annotate(status, absl::StrCat("watching tensor ", name_));
        return;
      }
    }
    // The stream's deadline passed (open the next one at once) or the
    // daemon could not be reached (again after a pause that grows).
    if (received || absl::IsDeadlineExceeded(status) || status.ok()) {
      pause = absl::Milliseconds(50);
      continue;
    }
    absl::MutexLock lock(&mu_);
    const auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_;
    };
    if (mu_.AwaitWithTimeout(absl::Condition(&stopping), pause)) return;
    pause = std::min(pause * 2, absl::Seconds(2));
  }
}

}  // namespace tessera
