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
// shard's memory (or, for a CUDA shard, the chunk's staging buffer), so it
// reaches the socket without a user-space copy (this doubled loopback
// throughput). A stream holds a reference to its RegisteredTensor and its
// payload slices to the shard's storage: unregistering a tensor mid-stream
// is safe (the stream completes from the bytes it holds), and a client
// that cancels or disappears ends the stream cleanly. Bytes are read while
// they are sent: a shard written concurrently may reach the client torn,
// which its checksum check reports as DATA_LOSS.
//
// A strided shard is first made contiguous where it lives: a host copy for
// a host shard, a device-to-device copy for a CUDA shard (never a whole
// copy to the host), on the thread that starts the call. CUDA bytes then
// reach the host chunk by chunk (chunk_source.h): each chunk is copied
// device -> pinned staging buffer on a CUDA stream of the shard's device,
// `staging_depth` chunks ahead of the one being sent, so the copy of the
// next chunks overlaps the send of this one, and the chunk's payload slice
// references its staging buffer (which returns to the stream's small pool
// once gRPC lets go of the slice). The gRPC callback thread that writes
// chunk k waits for chunk k's copy event only: that copy was enqueued a
// chunk (or more) earlier, so the wait is short (at most one chunk's copy
// time). A CUDA error ends the stream with it (INTERNAL, or UNAVAILABLE /
// RESOURCE_EXHAUSTED, with CUDA's description), after the chunks already
// sent. A stream that ends early (client gone, error) waits for its copies
// in flight before freeing their buffers.
//
// A request may name a region of the shard (FetchShardRequest.region_*):
// only that box is sent, as if it were the shard (its header's sizes and
// total_bytes are the box's; its metadata stays the shard's). A strided box
// is made contiguous like any strided shard.
//
// Errors (as gRPC status codes): INVALID_ARGUMENT for an empty tensor id, a
// negative shard_index / chunk_bytes, or a region that does not have the
// shard's rank or holds a negative number; OUT_OF_RANGE for a region that
// leaves the shard; NOT_FOUND "unknown tensor <id>" and NOT_FOUND for a
// shard this rank does not own; FAILED_PRECONDITION for a shard without
// bytes (meta device); allocation errors as Storage.
//
// Thread-safety: the service is safe for any number of concurrent calls.
// It shares ownership of the registry; shutting the grpc::Server down
// ends every stream.
#ifndef TESSERA_SERVER_SERVE_SHARD_SERVICE_H_
#define TESSERA_SERVER_SERVE_SHARD_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include "grpcpp/server_builder.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/byte_buffer.h"
#include "server/serve/chunk_stream.h"
#include "server/serve/fetch.h"
#include "server/serve/shard_registry.h"
#include "tessera/v1/shard.grpc.pb.h"
#include "tessera/v1/shard.pb.h"
#include "wire/request_limit.h"

namespace tessera {

// Sets the server-wide arguments a shard server needs: no limit on the size
// of sent messages (gRPC's server default, made explicit because a chunk
// of max_chunk_bytes plus its header must fit; do not lower it afterwards),
// and received messages of up to kMaxRequestBytes (wire/request_limit.h,
// which says why). Loopback measurements showed no gain from flow-control
// or frame-size arguments, so none are set. Call before
// builder->BuildAndStart(); it does not register the service.
void ConfigureShardServer(grpc::ServerBuilder* builder);

// The callback service with FetchShard taking and writing raw ByteBuffers.
using ShardServiceBase = v1::ShardService::WithRawCallbackMethod_FetchShard<
    v1::ShardService::WithCallbackMethod_DescribeTensor<
        v1::ShardService::Service>>;

class ShardServiceImpl final : public ShardServiceBase {
 public:
  // Option values are clamped: chunk sizes to at least kMinChunkBytes, the
  // default to at most max_chunk_bytes, the staging depth to
  // [1, kMaxStagingDepth].
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

#endif  // TESSERA_SERVER_SERVE_SHARD_SERVICE_H_
