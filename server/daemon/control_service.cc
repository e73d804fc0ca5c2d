#include "server/daemon/control_service.h"

#include <atomic>
#include <deque>
#include <memory>

#include <functional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/status_macros.h"
#include "server/daemon/control_core.h"
#include "server/daemon/region_io.h"
#include "server/serve/chunk_stream.h"
#include "server/sharded/sharded_tensor.h"
#include "tessera/v1/control_internal.pb.h"
#include "wire/auth.h"
#include "wire/call_deadline.h"
#include "wire/grpc_status.h"
#include "wire/request_id.h"
#include "wire/version_id.h"

namespace tessera {
namespace control_internal {
namespace {

template <typename Message>
absl::StatusOr<Message> ParseRaw(const grpc::ByteBuffer& serialized,
                                 absl::string_view method) {
  grpc::ByteBuffer buffer(serialized);
  Message message;
  if (!grpc::SerializationTraits<Message>::Deserialize(&buffer, &message)
           .ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(method, ": malformed request"));
  }
  return message;
}

// The reactor of a call that waits for its op; needed (over the default
// reactor) to hear of cancellation.
class OpReactor final : public grpc::ServerUnaryReactor {
 public:
  void Attach(std::weak_ptr<Core> core, std::weak_ptr<PendingCall> call) {
    core_ = std::move(core);
    call_ = std::move(call);
  }
  void OnCancel() override {
    std::shared_ptr<PendingCall> call = call_.lock();
    if (call == nullptr) return;
    absl::Status cancelled = absl::CancelledError(absl::StrCat(
        call->method(), " was cancelled by the client",
        call->request_id().empty()
            ? " (it carried no request id: list or describe the tensors to "
              "see whether it ran)"
            : absl::StrCat(" (`tessera op ", call->request_id(),
                           "` tells whether it ran)")));
    if (std::shared_ptr<Core> core = core_.lock()) {
      core->Finish(call, cancelled);
    } else {
      call->Complete(cancelled);
    }
  }
  void OnDone() override { delete this; }

 private:
  // Set before the handler returns, read only by OnCancel(), which gRPC
  // runs after it.
  std::weak_ptr<Core> core_;
  std::weak_ptr<PendingCall> call_;
};

// A unary call whose work may block for seconds (MarkStale waits out the
// stale-copy fence): the work runs on a thread of the call's own, never on
// gRPC's callback threads, which every callback method shares.
class ThreadedReactor final : public grpc::ServerUnaryReactor {
 public:
  explicit ThreadedReactor(std::function<absl::Status()> work) {
    thread_.Start(
        [this, work = std::move(work)] { Finish(ToGrpcStatus(work())); });
  }
  void OnDone() override {
    thread_.Join();
    delete this;
  }

 private:
  ReactorThread thread_;
};

// OK when the caller's token may call ControlService/`method` (wire/auth.h).
absl::Status Authorize(const grpc::CallbackServerContext& context,
                       absl::string_view method) {
  return AuthorizeCall(
      context,
      absl::StrCat(v1::ControlService::service_full_name(), "/", method));
}

grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* context,
                               const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

// Logs `op` and answers the call with `reply(result)` once every daemon has
// run it.
grpc::ServerUnaryReactor* RunLogged(const std::shared_ptr<Core>& core,
                                    grpc::CallbackServerContext* context,
                                    std::string method, v1::ControlOp op,
                                    std::function<void(OpResult&)> reply) {
  auto* reactor = new OpReactor();
  std::shared_ptr<PendingCall> call = core->NewCall(
      std::move(method), RequestIdOf(*context), CallDeadlineOf(*context),
      [reactor, reply = std::move(reply)](const absl::Status& status,
                                          OpResult result) {
        if (status.ok()) reply(result);
        reactor->Finish(ToGrpcStatus(status));
      });
  reactor->Attach(core, call);
  core->Submit(std::move(op), call);
  return reactor;
}

}  // namespace
}  // namespace control_internal

using control_internal::Core;
using control_internal::OpResult;

ControlServiceImpl::ControlServiceImpl(std::shared_ptr<Rank> rank,
                                       ControlOptions options)
    : core_(std::make_shared<Core>(std::move(rank), std::move(options))) {}

ControlServiceImpl::~ControlServiceImpl() { Shutdown(); }

absl::Status ControlServiceImpl::Start() { return core_->Start(); }

void ControlServiceImpl::Shutdown() { core_->Shutdown(); }

int64_t ControlServiceImpl::applied_ops() const { return core_->applied_ops(); }

grpc::ServerUnaryReactor* ControlServiceImpl::GetCluster(
    grpc::CallbackServerContext* context, const v1::GetClusterRequest* request,
    v1::ClusterInfo* response) {
  if (absl::Status allowed =
          control_internal::Authorize(*context, "GetCluster");
      !allowed.ok()) {
    return control_internal::Done(context, allowed);
  }
  absl::StatusOr<v1::ClusterInfo> info = core_->Cluster();
  if (info.ok()) *response = *std::move(info);
  return control_internal::Done(context, info.status());
}

grpc::ServerUnaryReactor* ControlServiceImpl::GetStats(
    grpc::CallbackServerContext* context, const v1::GetStatsRequest* request,
    v1::DaemonStats* response) {
  absl::Status allowed = control_internal::Authorize(*context, "GetStats");
  if (allowed.ok()) {
    response->set_rank(core_->rank());
    response->set_metrics(MetricsText());
  }
  return control_internal::Done(context, allowed);
}

grpc::ServerUnaryReactor* ControlServiceImpl::GetOperation(
    grpc::CallbackServerContext* context,
    const v1::GetOperationRequest* request, v1::OperationStatus* response) {
  if (absl::Status allowed =
          control_internal::Authorize(*context, "GetOperation");
      !allowed.ok()) {
    return control_internal::Done(context, allowed);
  }
  absl::StatusOr<v1::OperationStatus> status =
      core_->Operation(request->request_id());
  if (status.ok()) *response = *std::move(status);
  return control_internal::Done(context, status.status());
}

grpc::ServerUnaryReactor* ControlServiceImpl::RenewLeases(
    grpc::CallbackServerContext* context, const v1::RenewLeasesRequest* request,
    v1::RenewLeasesResponse* response) {
  absl::Status allowed = control_internal::Authorize(*context, "RenewLeases");
  // Keeping an open version takes the role that opens one.
  if (allowed.ok() && request->versions_size() > 0) {
    allowed = control_internal::Authorize(*context, "BeginVersion");
  }
  if (!allowed.ok()) return control_internal::Done(context, allowed);
  return control_internal::Done(context,
                                core_->RenewLeases(*request, response));
}

grpc::ServerUnaryReactor* ControlServiceImpl::MarkStale(
    grpc::CallbackServerContext* context, const v1::MarkStaleRequest* request,
    v1::MarkStaleResponse* response) {
  if (absl::Status allowed = control_internal::Authorize(*context, "MarkStale");
      !allowed.ok()) {
    return control_internal::Done(context, allowed);
  }
  return new control_internal::ThreadedReactor(
      [core = core_, request = *request, deadline = CallDeadlineOf(*context)] {
        return core->MarkStale(request, deadline);
      });
}

grpc::ServerUnaryReactor* ControlServiceImpl::ListTensors(
    grpc::CallbackServerContext* context, const v1::ListTensorsRequest* request,
    v1::ListTensorsResponse* response) {
  if (absl::Status allowed =
          control_internal::Authorize(*context, "ListTensors");
      !allowed.ok()) {
    return control_internal::Done(context, allowed);
  }
  absl::Status accepting = core_->Accepting();
  if (accepting.ok()) {
    *response = core_->List(std::vector<std::string>(request->names().begin(),
                                                     request->names().end()),
                            request->after(), request->page_bytes());
  }
  return control_internal::Done(context, accepting);
}

absl::StatusOr<v1::TensorInfo> ControlServiceImpl::Describe(
    const std::string& name) const {
  return core_->Describe(name);
}

grpc::ServerUnaryReactor* ControlServiceImpl::DescribeTensor(
    grpc::CallbackServerContext* context,
    const v1::DescribeNamedTensorRequest* request, v1::TensorInfo* response) {
  if (absl::Status allowed =
          control_internal::Authorize(*context, "DescribeTensor");
      !allowed.ok()) {
    return control_internal::Done(context, allowed);
  }
  absl::StatusOr<v1::TensorInfo> info = core_->Describe(request->name());
  if (info.ok()) *response = *std::move(info);
  return control_internal::Done(context, info.status());
}

grpc::ServerUnaryReactor* ControlServiceImpl::CreateTensor(
    grpc::CallbackServerContext* context,
    const v1::CreateTensorRequest* request, v1::TensorInfo* response) {
  if (absl::Status allowed =
          control_internal::Authorize(*context, "CreateTensor");
      !allowed.ok()) {
    return control_internal::Done(context, allowed);
  }
  v1::ControlOp op;
  *op.mutable_create_tensor() = *request;
  return control_internal::RunLogged(
      core_, context, "CreateTensor", std::move(op),
      [response](OpResult& result) { *response = std::move(result.info); });
}

grpc::ServerUnaryReactor* ControlServiceImpl::CreateTensors(
    grpc::CallbackServerContext* context,
    const v1::CreateTensorsRequest* request,
    v1::ListTensorsResponse* response) {
  if (absl::Status allowed =
          control_internal::Authorize(*context, "CreateTensors");
      !allowed.ok()) {
    return control_internal::Done(context, allowed);
  }
  v1::ControlOp op;
  *op.mutable_create_tensors() = *request;
  return control_internal::RunLogged(
      core_, context, "CreateTensors", std::move(op),
      [response](OpResult& result) {
        for (v1::TensorInfo& info : result.infos) {
          *response->add_tensors() = std::move(info);
        }
      });
}

grpc::ServerUnaryReactor* ControlServiceImpl::DeleteTensor(
    grpc::CallbackServerContext* context,
    const v1::DeleteTensorRequest* request,
    v1::DeleteTensorResponse* response) {
  if (absl::Status allowed =
          control_internal::Authorize(*context, "DeleteTensor");
      !allowed.ok()) {
    return control_internal::Done(context, allowed);
  }
  v1::ControlOp op;
  *op.mutable_delete_tensor() = *request;
  return control_internal::RunLogged(core_, context, "DeleteTensor",
                                     std::move(op), [](OpResult&) {});
}

namespace control_internal {
namespace {

// A logged version op answered with its VersionGroup.
template <typename Request>
grpc::ServerUnaryReactor* RunVersionOp(
    const std::shared_ptr<Core>& core, grpc::CallbackServerContext* context,
    const char* method, const Request& request,
    Request* (v1::ControlOp::*mutable_request)(), v1::VersionGroup* response) {
  if (absl::Status allowed = Authorize(*context, method); !allowed.ok()) {
    return Done(context, allowed);
  }
  v1::ControlOp op;
  *(op.*mutable_request)() = request;
  return RunLogged(core, context, method, std::move(op),
                   [response](OpResult& result) {
                     if (response != nullptr)
                       *response = std::move(result.group);
                   });
}

}  // namespace
}  // namespace control_internal

grpc::ServerUnaryReactor* ControlServiceImpl::BeginVersion(
    grpc::CallbackServerContext* context,
    const v1::BeginVersionRequest* request, v1::VersionGroup* response) {
  return control_internal::RunVersionOp(
      core_, context, "BeginVersion", *request,
      &v1::ControlOp::mutable_begin_version, response);
}

grpc::ServerUnaryReactor* ControlServiceImpl::PublishVersion(
    grpc::CallbackServerContext* context,
    const v1::PublishVersionRequest* request, v1::VersionGroup* response) {
  return control_internal::RunVersionOp(
      core_, context, "PublishVersion", *request,
      &v1::ControlOp::mutable_publish_version, response);
}

grpc::ServerUnaryReactor* ControlServiceImpl::AbortVersion(
    grpc::CallbackServerContext* context,
    const v1::AbortVersionRequest* request, v1::AbortVersionResponse*) {
  return control_internal::RunVersionOp(core_, context, "AbortVersion",
                                        *request,
                                        &v1::ControlOp::mutable_abort_version,
                                        /*response=*/nullptr);
}

grpc::ServerUnaryReactor* ControlServiceImpl::PinVersions(
    grpc::CallbackServerContext* context, const v1::PinVersionsRequest* request,
    v1::VersionGroup* response) {
  return control_internal::RunVersionOp(core_, context, "PinVersions", *request,
                                        &v1::ControlOp::mutable_pin_versions,
                                        response);
}

grpc::ServerUnaryReactor* ControlServiceImpl::UnpinVersions(
    grpc::CallbackServerContext* context,
    const v1::UnpinVersionsRequest* request, v1::UnpinVersionsResponse*) {
  return control_internal::RunVersionOp(core_, context, "UnpinVersions",
                                        *request,
                                        &v1::ControlOp::mutable_unpin_versions,
                                        /*response=*/nullptr);
}

namespace control_internal {
namespace {

// A WatchVersions stream: the kept versions after the request's first,
// then each one this daemon publishes, one write at a time. Ends OK when
// the client cancels or its deadline passes, NOT_FOUND when the tensor is
// deleted. gRPC may run OnWriteDone and OnDone on the thread that starts a
// write or finishes, so no lock is held across StartWrite or Finish; the
// reactor owns itself (self_) until OnDone, and the watch's listener holds
// it only while it runs (a weak pointer otherwise).
class WatchReactor final : public grpc::ServerWriteReactor<v1::VersionEvent> {
 public:
  static WatchReactor* New(std::shared_ptr<Core> core, std::string name) {
    auto reactor = std::shared_ptr<WatchReactor>(
        new WatchReactor(std::move(core), std::move(name)));
    reactor->self_ = reactor;
    return reactor.get();
  }

  // Registers with the watch and queues the kept versions after `after`;
  // the stream fails at once when `name` is no versioned tensor.
  void Begin(int64_t after) {
    absl::StatusOr<v1::TensorInfo> info = core_->Describe(name_);
    if (info.ok() && !Versioned(*info)) {
      info = absl::FailedPreconditionError(absl::StrCat(
          "WatchVersions: tensor ", name_,
          " has no versions (it was created without versions >= 2)"));
    }
    if (!info.ok()) {
      Fail(info.status());
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      last_ = after > 0 ? after : info->version();
      for (int64_t number : info->kept_versions()) {
        if (number > last_) pending_.push_back(number);
      }
      if (!pending_.empty()) last_ = pending_.back();
    }
    // Registered after the kept ones are queued: a version published in
    // between comes through the listener, and Queue drops repeats.
    std::weak_ptr<WatchReactor> weak = self_;
    id_.store(core_->watch().Add(name_, [weak](int64_t number) {
      if (std::shared_ptr<WatchReactor> reactor = weak.lock()) {
        reactor->Queue(number);
      }
    }));
    // One published between Describe and Add: catch up.
    absl::StatusOr<v1::TensorInfo> now = core_->Describe(name_);
    if (now.ok()) {
      for (int64_t number : now->kept_versions()) Queue(number);
    }
    Next();
  }

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
    }
    if (!ok) {
      Fail(absl::CancelledError("the watch stream broke"));
      return;
    }
    Next();
  }

  void OnCancel() override { End(grpc::Status::OK); }

  void OnDone() override {
    if (const uint64_t id = id_.load(); id != 0) core_->watch().Remove(id);
    // Freed once the last listener call holding it returns.
    std::shared_ptr<WatchReactor> self = std::move(self_);
  }

 private:
  WatchReactor(std::shared_ptr<Core> core, std::string name)
      : core_(std::move(core)), name_(std::move(name)) {}

  // A number published (0: the tensor was deleted).
  void Queue(int64_t number) {
    {
      absl::MutexLock lock(&mu_);
      if (number == 0) {
        deleted_ = true;
      } else if (number > last_) {
        pending_.push_back(number);
        last_ = number;
      } else {
        return;
      }
    }
    Next();
  }

  // Starts the next write, or ends the stream of a deleted tensor.
  void Next() {
    bool end = false;
    {
      absl::MutexLock lock(&mu_);
      if (writing_ || finished_) return;
      if (pending_.empty()) {
        if (!deleted_) return;
        end = true;
      } else {
        event_.set_name(name_);
        event_.set_number(pending_.front());
        pending_.pop_front();
        writing_ = true;
      }
    }
    if (end) {
      Fail(absl::NotFoundError(
          absl::StrCat("WatchVersions: tensor ", name_, " was deleted")));
      return;
    }
    StartWrite(&event_);
  }

  void Fail(const absl::Status& status) { End(ToGrpcStatus(status)); }

  void End(const grpc::Status& status) {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      finished_ = true;
    }
    Finish(status);
  }

  const std::shared_ptr<Core> core_;
  const std::string name_;
  std::shared_ptr<WatchReactor> self_;
  std::atomic<uint64_t> id_{0};
  absl::Mutex mu_;
  int64_t last_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<int64_t> pending_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool deleted_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  // Written only while no write is in flight.
  v1::VersionEvent event_;
};

}  // namespace
}  // namespace control_internal

grpc::ServerWriteReactor<v1::VersionEvent>* ControlServiceImpl::WatchVersions(
    grpc::CallbackServerContext* context,
    const v1::WatchVersionsRequest* request) {
  auto* reactor = control_internal::WatchReactor::New(core_, request->name());
  absl::Status allowed = control_internal::Authorize(*context, "WatchVersions");
  if (allowed.ok()) allowed = core_->Accepting();
  if (allowed.ok() && request->after() < 0) {
    allowed = absl::InvalidArgumentError(
        absl::StrCat("WatchVersions: negative after ", request->after()));
  }
  if (!allowed.ok()) {
    reactor->Finish(ToGrpcStatus(allowed));
    return reactor;
  }
  reactor->Begin(request->after());
  return reactor;
}

grpc::ServerUnaryReactor* ControlServiceImpl::Reshard(
    grpc::CallbackServerContext* context, const v1::ReshardRequest* request,
    v1::TensorInfo* response) {
  if (absl::Status allowed = control_internal::Authorize(*context, "Reshard");
      !allowed.ok()) {
    return control_internal::Done(context, allowed);
  }
  v1::ControlOp op;
  *op.mutable_reshard() = *request;
  return control_internal::RunLogged(
      core_, context, "Reshard", std::move(op),
      [response](OpResult& result) { *response = std::move(result.info); });
}

grpc::ServerUnaryReactor* ControlServiceImpl::SaveCheckpoint(
    grpc::CallbackServerContext* context,
    const v1::SaveCheckpointRequest* request,
    v1::SaveCheckpointResponse* response) {
  if (absl::Status allowed =
          control_internal::Authorize(*context, "SaveCheckpoint");
      !allowed.ok()) {
    return control_internal::Done(context, allowed);
  }
  v1::ControlOp op;
  *op.mutable_save_checkpoint() = *request;
  return control_internal::RunLogged(core_, context, "SaveCheckpoint",
                                     std::move(op),
                                     [response](OpResult& result) {
                                       for (std::string& name : result.names) {
                                         response->add_names(std::move(name));
                                       }
                                     });
}

grpc::ServerUnaryReactor* ControlServiceImpl::LoadCheckpoint(
    grpc::CallbackServerContext* context,
    const v1::LoadCheckpointRequest* request,
    v1::LoadCheckpointResponse* response) {
  if (absl::Status allowed =
          control_internal::Authorize(*context, "LoadCheckpoint");
      !allowed.ok()) {
    return control_internal::Done(context, allowed);
  }
  v1::ControlOp op;
  *op.mutable_load_checkpoint() = *request;
  return control_internal::RunLogged(
      core_, context, "LoadCheckpoint", std::move(op),
      [response](OpResult& result) {
        for (v1::TensorInfo& info : result.infos) {
          *response->add_tensors() = std::move(info);
        }
      });
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* ControlServiceImpl::Gather(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  if (absl::Status allowed = control_internal::Authorize(*context, "Gather");
      !allowed.ok()) {
    return NewFailedChunkStream(allowed);
  }
  absl::StatusOr<v1::GatherRequest> parsed =
      control_internal::ParseRaw<v1::GatherRequest>(*request, "Gather");
  if (!parsed.ok()) return NewFailedChunkStream(parsed.status());
  if (parsed->chunk_bytes() < 0) {
    return NewFailedChunkStream(absl::InvalidArgumentError(
        absl::StrCat("Gather: negative chunk_bytes ", parsed->chunk_bytes())));
  }
  absl::Status accepting = core_->Accepting();
  if (!accepting.ok()) return NewFailedChunkStream(accepting);

  auto slot = std::make_shared<control_internal::ResultSlot>();
  std::shared_ptr<control_internal::PendingCall> call =
      core_->NewCall("Gather", RequestIdOf(*context), CallDeadlineOf(*context),
                     [slot](const absl::Status& status, OpResult result) {
                       slot->Set(status, std::move(result));
                     });
  const absl::Time deadline = call->deadline();
  const int rank = core_->rank();
  v1::ControlOp op;
  *op.mutable_gather() = *parsed;
  core_->Submit(std::move(op), call);
  // The stream's thread waits for the op (the submit thread completes the
  // call by its deadline at the latest; the grace only guards that).
  return NewDeferredChunkStream(
      [slot, deadline, rank]() -> absl::StatusOr<PreparedFetch> {
        ASSIGN_OR_RETURN(OpResult result,
                         slot->Wait(deadline + absl::Seconds(1)));
        const auto& sizes = result.info.metadata().size();
        ASSIGN_OR_RETURN(ShardMetadata whole,
                         ShardMetadata::Create(
                             std::vector<int64_t>(sizes.size(), 0),
                             absl::MakeConstSpan(sizes.data(), sizes.size()),
                             RemoteDevice::ForRank(rank, Device::Cpu())));
        ASSIGN_OR_RETURN(PreparedFetch prepared,
                         PrepareTensorFetch(result.gathered, whole));
        prepared.keepalive = std::move(result.gathered_reservation);
        return prepared;
      },
      ChunkBytesFor(core_->Chunks(), parsed->chunk_bytes()));
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* ControlServiceImpl::ReadRegion(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  if (absl::Status allowed =
          control_internal::Authorize(*context, "ReadRegion");
      !allowed.ok()) {
    return NewFailedChunkStream(allowed);
  }
  absl::Status accepting = core_->Accepting();
  if (!accepting.ok()) return NewFailedChunkStream(accepting);
  return StartReadRegion(context, request, core_->Env(), core_->Chunks());
}

grpc::ServerReadReactor<v1::WriteRegionChunk>* ControlServiceImpl::WriteRegion(
    grpc::CallbackServerContext* context, v1::WriteRegionResponse* response) {
  absl::Status accepting = control_internal::Authorize(*context, "WriteRegion");
  if (accepting.ok()) accepting = core_->Accepting();
  if (!accepting.ok()) {
    // A reader that fails at once.
    class Failed final : public grpc::ServerReadReactor<v1::WriteRegionChunk> {
     public:
      explicit Failed(const absl::Status& status) {
        Finish(ToGrpcStatus(status));
      }
      void OnDone() override { delete this; }
    };
    return new Failed(accepting);
  }
  return StartWriteRegion(context, response, core_->Env());
}
}  // namespace tessera
