#include "server/serve/shard_service.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/proto_convert.h"
#include "wire/auth.h"
#include "wire/call_deadline.h"
#include "wire/grpc_status.h"

namespace tessera {

void ConfigureShardServer(grpc::ServerBuilder* builder) {
  builder->SetMaxSendMessageSize(-1);
  builder->SetMaxReceiveMessageSize(kMaxRequestBytes);
}

ShardServiceImpl::ShardServiceImpl(std::shared_ptr<ShardRegistry> registry,
                                   ShardServiceOptions options)
    : registry_(std::move(registry)), options_(ClampChunkOptions(options)) {}

namespace {

// OK when the caller's token may call ShardService/`method` (wire/auth.h).
absl::Status Authorize(const grpc::CallbackServerContext& context,
                       absl::string_view method) {
  return AuthorizeCall(
      context,
      absl::StrCat(v1::ShardService::service_full_name(), "/", method));
}

}  // namespace

int64_t ShardServiceImpl::ChunkBytesFor(int64_t requested) const {
  return tessera::ChunkBytesFor(options_, requested);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* ShardServiceImpl::FetchShard(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  if (absl::Status allowed = Authorize(*context, "FetchShard"); !allowed.ok()) {
    return NewFailedChunkStream(allowed);
  }
  absl::StatusOr<v1::FetchShardRequest> parsed = ParseFetchRequest(*request);
  if (!parsed.ok()) return NewFailedChunkStream(parsed.status());
  // First without waiting: a copy that the serve gate must first look at
  // the store for (a daemon that has not seen its stale marks lately,
  // server/daemon/stale_copies.h) is UNAVAILABLE at once. Such a fetch
  // waits, within its deadline, on a thread of its own call: never on
  // gRPC's callback threads, which every callback method of the daemon
  // shares.
  absl::StatusOr<PreparedFetch> prepared =
      PrepareFetch(*registry_, *parsed, /*deadline=*/absl::InfinitePast());
  const int64_t chunk_bytes = ChunkBytesFor(parsed->chunk_bytes());
  if (absl::IsUnavailable(prepared.status())) {
    return NewDeferredChunkStream(
        [registry = registry_, request = *std::move(parsed),
         deadline = CallDeadlineOf(*context)] {
          return PrepareFetch(*registry, request, deadline);
        },
        chunk_bytes, options_.staging_depth, active_fetches_);
  }
  if (!prepared.ok()) return NewFailedChunkStream(prepared.status());
  return NewChunkStreamReactor(std::move(*prepared), chunk_bytes,
                               active_fetches_, options_.staging_depth);
}

grpc::ServerUnaryReactor* ShardServiceImpl::DescribeTensor(
    grpc::CallbackServerContext* context,
    const v1::DescribeTensorRequest* request,
    v1::DescribeTensorResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status allowed = Authorize(*context, "DescribeTensor");
      !allowed.ok()) {
    reactor->Finish(ToGrpcStatus(allowed));
    return reactor;
  }
  std::shared_ptr<const RegisteredTensor> tensor =
      registry_->Resolve(request->tensor_id()).tensor;
  if (tensor == nullptr) {
    reactor->Finish(ToGrpcStatus(UnknownTensorError(request->tensor_id())));
    return reactor;
  }
  *response->mutable_metadata() = ToProto(*tensor->metadata);
  for (const LocalShard& local : tensor->local_shards) {
    response->add_local_shard_indices(local.index);
  }
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace tessera
