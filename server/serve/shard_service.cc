#include "server/serve/shard_service.h"

#include <algorithm>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/proto_convert.h"
#include "common/region.h"
#include "common/status_macros.h"
#include "common/tensor/tensor.h"
#include "google/protobuf/io/coded_stream.h"
#include "grpcpp/support/slice.h"
#include "wire/chunk_codec.h"
#include "wire/grpc_status.h"
#include "xxhash.h"

namespace tessera {
namespace {

// A stream that ends with an error before writing anything.
class FailedFetch final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  explicit FailedFetch(const absl::Status& status) {
    Finish(status.ok() ? grpc::Status(grpc::StatusCode::INTERNAL,
                                      "stream failed without an error")
                       : ToGrpcStatus(status));
  }
  void OnDone() override { delete this; }
};

// A slice of a chunk's bytes that holds the chunk's owner (the shard's
// storage, or a staging buffer) until gRPC is done with it, possibly after
// the stream.
grpc::Slice SliceOf(const HostChunk& chunk) {
  return grpc::Slice(
      const_cast<char*>(chunk.data), chunk.size,
      [](void* owner) {
        delete static_cast<std::shared_ptr<const void>*>(owner);
      },
      new std::shared_ptr<const void>(chunk.owner));
}

// Streams one prepared fetch. Exactly one write is in flight from Start
// until the last chunk, which is sent together with the status, so every
// path (success, client cancellation, server shutdown) reaches Finish
// exactly once and then OnDone, which frees the reactor.
class ChunkStreamReactor final
    : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  ChunkStreamReactor(int64_t chunk_bytes, int staging_depth,
                     std::shared_ptr<std::atomic<int64_t>> active)
      : active_(std::move(active)),
        chunk_bytes_(chunk_bytes),
        staging_depth_(staging_depth) {
    if (active_ != nullptr) active_->fetch_add(1);
  }

  // Streams `prepared`, or finishes with its error. Called once.
  void Start(absl::StatusOr<PreparedFetch> prepared) {
    if (!prepared.ok()) {
      Finish(ToGrpcStatus(prepared.status()));
      return;
    }
    absl::StatusOr<std::unique_ptr<ChunkSource>> source =
        NewChunkSource(prepared->bytes, chunk_bytes_, staging_depth_);
    if (!source.ok()) {
      Finish(ToGrpcStatus(source.status()));
      return;
    }
    tensor_ = std::move(prepared->tensor);
    source_ = *std::move(source);
    header_ = std::move(prepared->header);
    NextWrite();
  }

  // Runs `prepare` on a thread of this reactor's, then Start()s with its
  // result.
  void StartDeferred(std::function<absl::StatusOr<PreparedFetch>()> prepare) {
    thread_.Start([this, prepare = std::move(prepare)] { Start(prepare()); });
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      // The client cancelled, its deadline passed, or the server is
      // shutting down: the stream is dead, only the status remains.
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "stream broken"));
      return;
    }
    NextWrite();
  }

  void OnDone() override {
    thread_.Join();
    // Waits for the staging copies still in flight (a stream cut short).
    source_.reset();
    if (active_ != nullptr) active_->fetch_sub(1);
    delete this;
  }

 private:
  void NextWrite() {
    // Lets go of the previous chunk first, so that its staging buffer can
    // serve the next copy unless gRPC still holds it.
    message_.Clear();
    HostChunk chunk;  // Zero bytes: the header alone.
    if (!source_->done()) {
      // For CUDA bytes: enqueues the copies ahead, then waits for this
      // chunk's, which was enqueued at least one write earlier.
      absl::StatusOr<HostChunk> next = source_->Next();
      if (!next.ok()) {
        Finish(ToGrpcStatus(next.status()));
        return;
      }
      chunk = *std::move(next);
    }
    message_ = EncodeShardChunk(chunk.offset == 0 ? &header_ : nullptr,
                                chunk.offset, SliceOf(chunk));
    if (source_->done()) {
      StartWriteAndFinish(&message_, grpc::WriteOptions(), grpc::Status::OK);
    } else {
      StartWrite(&message_);
    }
  }

  const std::shared_ptr<std::atomic<int64_t>> active_;
  const int64_t chunk_bytes_;
  const int staging_depth_;
  std::shared_ptr<const RegisteredTensor> tensor_;
  std::unique_ptr<ChunkSource> source_;
  v1::ShardHeader header_;
  // The message being written; gRPC reads it until OnWriteDone.
  grpc::ByteBuffer message_;
  ReactorThread thread_;
};

absl::Status UnknownTensor(absl::string_view tensor_id) {
  return absl::NotFoundError(absl::StrCat("unknown tensor ", tensor_id));
}

absl::StatusOr<v1::FetchShardRequest> ParseRequest(
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

// The shard's bytes, contiguous where they live: the shard itself when it
// already is, otherwise a contiguous copy on its own device (a CUDA shard
// is staged to the host later, chunk by chunk, by the stream).
absl::StatusOr<Tensor> ContiguousBytes(const Tensor& shard) {
  if (shard.numel() == 0) return shard;
  if (shard.device().is_meta()) {
    return absl::FailedPreconditionError(
        "shard is on the meta device and has no bytes to send");
  }
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

absl::StatusOr<FetchView> PrepareFetchView(
    const ShardRegistry& registry, const v1::FetchShardRequest& request) {
  RETURN_IF_ERROR(ValidateRequest(request));
  FetchView found;
  found.tensor = registry.Find(request.tensor_id());
  if (found.tensor == nullptr) return UnknownTensor(request.tensor_id());
  const LocalShard* local = found.tensor->FindShard(request.shard_index());
  if (local == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        "shard ", request.shard_index(), " of tensor ", request.tensor_id(),
        " is not served by this rank (it has ",
        found.tensor->metadata.shards_metadata.size(), " shards)"));
  }
  ASSIGN_OR_RETURN(found.view, SourceOf(request, local->shard.tensor));
  found.header =
      HeaderOf(found.view,
               ToProto(found.tensor->metadata.shards_metadata[local->index]));
  return found;
}

absl::StatusOr<PreparedFetch> PrepareFetch(
    const ShardRegistry& registry, const v1::FetchShardRequest& request) {
  ASSIGN_OR_RETURN(FetchView found, PrepareFetchView(registry, request));
  PreparedFetch prepared;
  ASSIGN_OR_RETURN(prepared.bytes, ContiguousBytes(found.view));
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
  ASSIGN_OR_RETURN(prepared.bytes, ContiguousBytes(box));
  prepared.header = HeaderOf(box, ToProto(metadata));
  return prepared;
}

namespace {

ShardServiceOptions Clamped(ShardServiceOptions options) {
  options.max_chunk_bytes =
      std::max(options.max_chunk_bytes, ShardServiceOptions::kMinChunkBytes);
  options.default_chunk_bytes =
      std::clamp(options.default_chunk_bytes,
                 ShardServiceOptions::kMinChunkBytes, options.max_chunk_bytes);
  options.staging_depth =
      std::clamp(options.staging_depth, 1, kMaxStagingDepth);
  return options;
}

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* NewChunkStreamReactor(
    PreparedFetch prepared, int64_t chunk_bytes,
    std::shared_ptr<std::atomic<int64_t>> active, int staging_depth) {
  auto* reactor =
      new ChunkStreamReactor(chunk_bytes, staging_depth, std::move(active));
  reactor->Start(std::move(prepared));
  return reactor;
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* NewFailedChunkStream(
    const absl::Status& status) {
  return new FailedFetch(status);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* NewDeferredChunkStream(
    std::function<absl::StatusOr<PreparedFetch>()> prepare, int64_t chunk_bytes,
    int staging_depth) {
  auto* reactor = new ChunkStreamReactor(chunk_bytes, staging_depth, nullptr);
  reactor->StartDeferred(std::move(prepare));
  return reactor;
}

void ReactorThread::Start(std::function<void()> work) {
  // Held until thread_ is assigned, so that a Join() (which cannot come
  // before the work finished the call) always sees it.
  absl::MutexLock lock(&mu_);
  thread_ = std::thread([this, work = std::move(work)] {
    { absl::MutexLock lock(&mu_); }
    work();
    // The reactor, and this object with it, may be gone from here on.
  });
}

void ReactorThread::Join() {
  absl::MutexLock lock(&mu_);
  if (!thread_.joinable()) return;
  if (thread_.get_id() == std::this_thread::get_id()) {
    thread_.detach();
  } else {
    thread_.join();
  }
}

void ConfigureShardServer(grpc::ServerBuilder* builder) {
  builder->SetMaxSendMessageSize(-1);
}

ShardServiceImpl::ShardServiceImpl(std::shared_ptr<ShardRegistry> registry,
                                   ShardServiceOptions options)
    : registry_(std::move(registry)), options_(Clamped(options)) {}

absl::Status MalformedFetchError() {
  return absl::InvalidArgumentError("FetchShard: malformed request");
}

absl::Status ShuttingDownError() {
  return absl::UnavailableError("shard server is shutting down");
}

int64_t ChunkBytesFor(const ShardServiceOptions& options, int64_t requested) {
  const ShardServiceOptions clamped = Clamped(options);
  if (requested == 0) return clamped.default_chunk_bytes;
  return std::clamp(requested, ShardServiceOptions::kMinChunkBytes,
                    clamped.max_chunk_bytes);
}

int64_t ShardServiceImpl::ChunkBytesFor(int64_t requested) const {
  return tessera::ChunkBytesFor(options_, requested);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* ShardServiceImpl::FetchShard(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  absl::StatusOr<v1::FetchShardRequest> parsed = ParseRequest(*request);
  if (!parsed.ok()) return new FailedFetch(parsed.status());
  absl::StatusOr<PreparedFetch> prepared = PrepareFetch(*registry_, *parsed);
  if (!prepared.ok()) return new FailedFetch(prepared.status());
  return NewChunkStreamReactor(std::move(*prepared),
                               ChunkBytesFor(parsed->chunk_bytes()),
                               active_fetches_, options_.staging_depth);
}

grpc::ServerUnaryReactor* ShardServiceImpl::DescribeTensor(
    grpc::CallbackServerContext* context,
    const v1::DescribeTensorRequest* request,
    v1::DescribeTensorResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  std::shared_ptr<const RegisteredTensor> tensor =
      registry_->Find(request->tensor_id());
  if (tensor == nullptr) {
    reactor->Finish(ToGrpcStatus(UnknownTensor(request->tensor_id())));
    return reactor;
  }
  *response->mutable_metadata() = ToProto(tensor->metadata);
  for (const LocalShard& local : tensor->local_shards) {
    response->add_local_shard_indices(local.index);
  }
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace tessera
