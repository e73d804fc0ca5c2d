#include "server/serve/shard_service.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/proto_convert.h"
#include "wire/auth.h"
#include "wire/grpc_status.h"

namespace tessera {

void ConfigureShardServer(grpc::ServerBuilder* builder) {
  builder->SetMaxSendMessageSize(-1);
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
  absl::StatusOr<PreparedFetch> prepared =
      PrepareFetch(*registry_, *parsed, absl::FromChrono(context->deadline()));
  if (!prepared.ok()) return NewFailedChunkStream(prepared.status());
  return NewChunkStreamReactor(std::move(*prepared),
                               ChunkBytesFor(parsed->chunk_bytes()),
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
