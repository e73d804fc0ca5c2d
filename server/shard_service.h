// ShardServiceImpl: serves this rank's local shards (tessera.v1.ShardService)
// out of a ShardRegistry, on the gRPC callback API.
//
// FetchShard streams a shard's row-major bytes in chunks of at most
// chunk_bytes (the request's, clamped to [kMinChunkBytes,
// max_chunk_bytes], or default_chunk_bytes when it asks for 0). The first
// chunk carries the header; every chunk carries its byte offset and the
// XXH3-64 (seed 0) of its data. One write is in flight per stream, so a
// slow reader holds at most one chunk of server memory. FetchShard is served
// raw (grpc::ByteBuffer): a chunk's payload is a slice that references the
// shard's memory, so it reaches the socket without a user-space copy (this
// doubled loopback throughput). A stream holds a reference to its
// RegisteredTensor and its payload slices to the shard's storage:
// unregistering a tensor mid-stream is safe (the stream completes from the
// bytes it holds), and a client that cancels or disappears ends the stream
// cleanly. Bytes are read while they are sent: a shard written concurrently
// may reach the client torn, which its checksum check reports as DATA_LOSS.
//
// Shards that are not contiguous host memory (strided views, CUDA tensors)
// are first copied whole into a contiguous host buffer (pinned for CUDA)
// when the stream starts; that copy runs on the gRPC thread that starts
// the call.
//
// Errors (as gRPC status codes): INVALID_ARGUMENT for an empty tensor id or
// a negative shard_index / chunk_bytes; NOT_FOUND "unknown tensor <id>" and
// NOT_FOUND for a shard this rank does not own; FAILED_PRECONDITION for a
// shard without bytes (meta device); allocation errors as Storage.
//
// Thread-safety: the service is safe for any number of concurrent calls.
// It shares ownership of the registry; shutting the grpc::Server down
// ends every stream.
#ifndef TESSERA_SERVER_SHARD_SERVICE_H_
#define TESSERA_SERVER_SHARD_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include "grpcpp/server_builder.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/byte_buffer.h"
#include "server/shard_registry.h"
#include "tessera/v1/shard.grpc.pb.h"
#include "tessera/v1/shard.pb.h"

namespace tessera {

struct ShardServiceOptions {
  static constexpr int64_t kMinChunkBytes = 4 << 10;
  // Chunks of a few MiB keep per-message overhead negligible while leaving
  // room for other streams on the same HTTP/2 connection.
  int64_t default_chunk_bytes = 4 << 20;
  int64_t max_chunk_bytes = 16 << 20;
};

// One fetch, validated and ready to stream (shared by FetchShard and the
// raw data plane, bulk_server.h).
struct PreparedFetch {
  // Keeps the registration (and so the shard's storage) alive for the
  // whole stream, even if the tensor is unregistered meanwhile.
  std::shared_ptr<const RegisteredTensor> tensor;
  // The shard's bytes, contiguous in host memory.
  Tensor bytes;
  v1::ShardHeader header;
};

// Validates `request` and finds its shard: INVALID_ARGUMENT for a malformed
// request, NOT_FOUND for an unknown tensor or a shard this rank does not
// serve, FAILED_PRECONDITION for a meta shard (no bytes).
absl::StatusOr<PreparedFetch> PrepareFetch(
    const ShardRegistry& registry, const v1::FetchShardRequest& request);

// The chunk size a request for `requested` bytes (0: the default) gets.
int64_t ChunkBytesFor(const ShardServiceOptions& options, int64_t requested);

// Sets the server-wide arguments a shard server needs: no limit on the size
// of sent messages (gRPC's server default, made explicit because a chunk
// of max_chunk_bytes plus its header must fit; do not lower it afterwards).
// Loopback measurements showed no gain from flow-control or frame-size
// arguments, so none are set. Call before builder->BuildAndStart(); it
// does not register the service.
void ConfigureShardServer(grpc::ServerBuilder* builder);

// The callback service with FetchShard taking and writing raw ByteBuffers.
using ShardServiceBase = v1::ShardService::WithRawCallbackMethod_FetchShard<
    v1::ShardService::WithCallbackMethod_DescribeTensor<
        v1::ShardService::Service>>;

class ShardServiceImpl final : public ShardServiceBase {
 public:
  // Option values are clamped: chunk sizes to at least kMinChunkBytes, the
  // default to at most max_chunk_bytes.
  explicit ShardServiceImpl(std::shared_ptr<ShardRegistry> registry,
                            ShardServiceOptions options = {});

  // `request` is a serialized FetchShardRequest; every message written is
  // a serialized ShardChunk.
  grpc::ServerWriteReactor<grpc::ByteBuffer>* FetchShard(
      grpc::CallbackServerContext* context,
      const grpc::ByteBuffer* request) override;

  grpc::ServerUnaryReactor* DescribeTensor(
      grpc::CallbackServerContext* context,
      const v1::DescribeTensorRequest* request,
      v1::DescribeTensorResponse* response) override;

  const ShardServiceOptions& options() const { return options_; }
  // FetchShard streams started and not yet done (a stream is done once
  // gRPC has called its OnDone, whether it completed, failed or was
  // cancelled).
  int64_t active_fetches() const { return active_fetches_->load(); }

 private:
  // The chunk size a request gets.
  int64_t ChunkBytesFor(int64_t requested) const;

  const std::shared_ptr<ShardRegistry> registry_;
  const ShardServiceOptions options_;
  // Shared with the streams, which may finish after a Shutdown.
  const std::shared_ptr<std::atomic<int64_t>> active_fetches_ =
      std::make_shared<std::atomic<int64_t>>(0);
};

}  // namespace tessera

#endif  // TESSERA_SERVER_SHARD_SERVICE_H_
