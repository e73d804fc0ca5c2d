#include "server/serve/fetch.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/proto_convert.h"
#include "common/region.h"
#include "common/status_macros.h"
#include "common/tensor/tensor.h"
#include "tessera/v1/shard.grpc.pb.h"

namespace tessera {
namespace {

absl::Status ValidateRequest(const v1::FetchShardRequest& request) {
  if (request.tensor_id().empty()) {
    return absl::InvalidArgumentError("FetchShard: empty tensor_id");
  }
  if (request.shard_index() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("FetchShard: negative shard_index ", request.shard_index(),
                     " for tensor ", request.tensor_id()));
  }
  if (request.chunk_bytes() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "FetchShard: negative chunk_bytes ", request.chunk_bytes()));
  }
  return absl::OkStatus();
}

// The bytes a stream sends of `shard` (a shard or a view of its box): the
// view itself in host memory (a strided one is gathered chunk by chunk as
// it is sent, see NewChunkSource), otherwise a contiguous copy on its own
// device (a CUDA shard is staged to the host later, chunk by chunk, by the
// stream).
absl::StatusOr<Tensor> StreamedBytes(const Tensor& shard) {
  if (shard.numel() == 0) return shard;
  if (shard.device().is_meta()) {
    return absl::FailedPreconditionError(
        "shard is on the meta device and has no bytes to send");
  }
  if (shard.device().is_cpu()) return shard;
  return shard.Contiguous();
}

// What a request sends of `shard`: all of it, or the view of its region.
absl::StatusOr<Tensor> SourceOf(const v1::FetchShardRequest& request,
                                const Tensor& shard) {
  if (request.region_offsets().empty() && request.region_sizes().empty()) {
    return shard;
  }
  const std::string of = absl::StrCat("shard ", request.shard_index(),
                                      " of tensor ", request.tensor_id());
  RETURN_IF_ERROR(ValidateRegion(request.region_offsets(),
                                 request.region_sizes(), shard.sizes(), of,
                                 "shard"));
  return RegionView(shard, request.region_offsets(), request.region_sizes());
}

v1::ShardHeader HeaderOf(const Tensor& source, v1::ShardMetadata metadata) {
  v1::ShardHeader header;
  *header.mutable_metadata() = std::move(metadata);
  header.set_dtype(ToProto(source.dtype()));
  header.mutable_sizes()->Add(source.sizes().begin(), source.sizes().end());
  header.set_total_bytes(static_cast<int64_t>(source.nbytes()));
  return header;
}

}  // namespace

ShardServiceOptions ClampChunkOptions(ShardServiceOptions options) {
  options.max_chunk_bytes =
      std::max(options.max_chunk_bytes, ShardServiceOptions::kMinChunkBytes);
  options.default_chunk_bytes =
      std::clamp(options.default_chunk_bytes,
                 ShardServiceOptions::kMinChunkBytes, options.max_chunk_bytes);
  options.staging_depth =
      std::clamp(options.staging_depth, 1, kMaxStagingDepth);
  return options;
}

absl::StatusOr<v1::FetchShardRequest> ParseFetchRequest(
    const grpc::ByteBuffer& serialized) {
  grpc::ByteBuffer buffer(serialized);
  v1::FetchShardRequest request;
  if (!grpc::SerializationTraits<v1::FetchShardRequest>::Deserialize(&buffer,
                                                                     &request)
           .ok()) {
    return MalformedFetchError();
  }
  return request;
}

absl::Status ReadOnlyVersionError(absl::string_view tensor_id,
                                  absl::string_view what) {
  return absl::FailedPreconditionError(absl::StrCat(
      what, ": ", tensor_id,
      " is a published version of a versioned tensor, which is read-only: "
      "write into a new version (begin, then publish; docs/versions.md)"));
}

absl::Status UnknownTensorError(absl::string_view tensor_id) {
  return absl::NotFoundError(absl::StrCat("unknown tensor ", tensor_id));
}

absl::StatusOr<FetchView> PrepareFetchView(const ShardRegistry& registry,
                                           const v1::FetchShardRequest& request,
                                           bool write, absl::Time deadline) {
  RETURN_IF_ERROR(ValidateRequest(request));
  FetchView found;
  ShardRegistry::Resolved resolved = registry.Resolve(
      request.tensor_id(), write ? absl::InfinitePast() : deadline);
  found.tensor = std::move(resolved.tensor);
  found.writable = resolved.writable;
  if (found.tensor == nullptr) return UnknownTensorError(request.tensor_id());
  if (resolved.behind && deadline == absl::InfinitePast() && !write) {
    // Asked not to wait (as the gate is): say so, to be asked again with
    // the time to wait.
    return absl::UnavailableError(
        absl::StrCat("tensor id ", request.tensor_id(),
                     ": that version is not yet published on this rank"));
  }
  RETURN_IF_ERROR(registry.CheckServe(request.tensor_id(), write, deadline));
  if (write) {
    ASSIGN_OR_RETURN(ShardRegistry::WritePass pass,
                     registry.EnterWrite(request.tensor_id()));
    found.pass = std::make_shared<ShardRegistry::WritePass>(std::move(pass));
  }
  const LocalShard* local = found.tensor->FindShard(request.shard_index());
  if (local == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        "shard ", request.shard_index(), " of tensor ", request.tensor_id(),
        " is not served by this rank (it has ",
        found.tensor->metadata->shards_metadata.size(), " shards)"));
  }
  ASSIGN_OR_RETURN(found.view, SourceOf(request, local->tensor));
  found.header =
      HeaderOf(found.view,
               ToProto(found.tensor->metadata->shards_metadata[local->index]));
  found.header.set_version(resolved.version);
  return found;
}

absl::StatusOr<PreparedFetch> PrepareFetch(const ShardRegistry& registry,
                                           const v1::FetchShardRequest& request,
                                           absl::Time deadline) {
  ASSIGN_OR_RETURN(FetchView found,
                   PrepareFetchView(registry, request, false, deadline));
  PreparedFetch prepared;
  ASSIGN_OR_RETURN(prepared.bytes, StreamedBytes(found.view));
  prepared.tensor = std::move(found.tensor);
  prepared.header = std::move(found.header);
  return prepared;
}

absl::StatusOr<PreparedFetch> PrepareTensorFetch(
    const Tensor& box, const ShardMetadata& metadata) {
  if (!box.defined() || box.sizes() != metadata.shard_sizes()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", box.DebugString(),
                                                   " does not hold the box ",
                                                   metadata.ToString()));
  }
  PreparedFetch prepared;
  ASSIGN_OR_RETURN(prepared.bytes, StreamedBytes(box));
  prepared.header = HeaderOf(box, ToProto(metadata));
  return prepared;
}

absl::Status CheckWriteHeader(v1::DType sent, int64_t total_bytes, DType dtype,
                              int64_t nbytes, absl::string_view what,
                              absl::string_view unit) {
  absl::StatusOr<DType> data = FromProto(sent);
  if (!data.ok()) return Annotate(data.status(), what);
  if (*data != dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the data is ", DTypeName(*data),
                     " but the tensor is ", DTypeName(dtype)));
  }
  if (total_bytes != nbytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": total_bytes ", total_bytes, " is not the ",
                     nbytes, " bytes of the ", unit));
  }
  return absl::OkStatus();
}

absl::Status MalformedFetchError() {
  return absl::InvalidArgumentError("FetchShard: malformed request");
}

absl::Status ShuttingDownError() {
  return absl::UnavailableError("shard server is shutting down");
}

int64_t ChunkBytesFor(const ShardServiceOptions& options, int64_t requested) {
  const ShardServiceOptions clamped = ClampChunkOptions(options);
  if (requested == 0) return clamped.default_chunk_bytes;
  return std::clamp(requested, ShardServiceOptions::kMinChunkBytes,
                    clamped.max_chunk_bytes);
}

}  // namespace tessera
