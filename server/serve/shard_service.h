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
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/shard_metadata.h"
#include "common/tensor/tensor.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/byte_buffer.h"
#include "server/serve/chunk_source.h"
#include "server/serve/shard_registry.h"
#include "tessera/v1/shard.grpc.pb.h"
#include "tessera/v1/shard.pb.h"

namespace tessera {

struct ShardServiceOptions {
  static constexpr int64_t kMinChunkBytes = 4 << 10;
  // Chunks of a few MiB keep per-message overhead negligible while leaving
  // room for other streams on the same HTTP/2 connection.
  int64_t default_chunk_bytes = 4 << 20;
  int64_t max_chunk_bytes = 16 << 20;
  // How many chunks of a CUDA shard are staged to the host ahead of the
  // one being sent (clamped to [1, kMaxStagingDepth]); each stream pins
  // depth + 2 chunk-sized buffers at most (plus transient ones while the
  // transport holds more).
  int staging_depth = kDefaultStagingDepth;
};

// One fetch, validated and ready to stream (shared by FetchShard, the raw
// data plane, data_plane_server.h, and the daemon's ReadRegion and Gather).
struct PreparedFetch {
  // Keeps the registration (and so the shard's storage) alive for the
  // whole stream, even if the tensor is unregistered meanwhile. Null for a
  // fetch of a tensor that is no registered shard (PrepareTensorFetch).
  std::shared_ptr<const RegisteredTensor> tensor;
  // The bytes to send, contiguous, in host memory or on a CUDA device
  // (staged to the host chunk by chunk, see NewChunkSource); the stream
  // holds a reference to their storage.
  Tensor bytes;
  v1::ShardHeader header;
};

// A fetch's elements where they lie: the shard, or the view of its region,
// in the shard's own storage (not staged, any device), with the
// registration that keeps that storage alive and the header a stream would
// send. For the local path (server/local_path_server.h), which
// lends the storage itself. Errors as PrepareFetch, except that a meta
// shard is returned (its storage has no bytes to lend).
struct FetchView {
  std::shared_ptr<const RegisteredTensor> tensor;
  Tensor view;
  v1::ShardHeader header;
};
absl::StatusOr<FetchView> PrepareFetchView(
    const ShardRegistry& registry, const v1::FetchShardRequest& request);

// Validates `request` and finds its shard (and its region, when it names
// one): INVALID_ARGUMENT for a malformed request or region, OUT_OF_RANGE
// for a region that leaves the shard, NOT_FOUND for an unknown tensor or a
// shard this rank does not serve, FAILED_PRECONDITION for a meta shard (no
// bytes).
absl::StatusOr<PreparedFetch> PrepareFetch(
    const ShardRegistry& registry, const v1::FetchShardRequest& request);

// A fetch of `box`, a tensor holding the region `metadata` describes (its
// offsets and sizes in some sharded tensor, and where it was assembled):
// the results of the daemon's ReadRegion and Gather. The header carries
// `metadata`, the box's dtype and sizes. INVALID_ARGUMENT when box's sizes
// differ from metadata's or box is undefined; FAILED_PRECONDITION for a
// meta tensor. A strided box is made contiguous on its own device (on the
// calling thread); a contiguous box is sent from its own storage (staged
// chunk by chunk for CUDA), which must not be written while it streams.
absl::StatusOr<PreparedFetch> PrepareTensorFetch(const Tensor& box,
                                                 const ShardMetadata& metadata);

// What every transport answers a FetchShardRequest that does not parse.
absl::Status MalformedFetchError();
// What the socket transports (data plane, local path) answer a request
// arriving once their server is shutting down, as a stopped gRPC server
// would (UNAVAILABLE).
absl::Status ShuttingDownError();
// `status` (not OK) as the code and message of a socket transport's reply
// (v1::BulkFetchReply, v1::LocalFetchReply).
template <typename Reply>
Reply ErrorReply(const absl::Status& status) {
  Reply reply;
  reply.set_code(static_cast<int>(status.code()));
  reply.set_message(std::string(status.message()));
  return reply;
}

// The chunk size a request for `requested` bytes (0: the default) gets.
int64_t ChunkBytesFor(const ShardServiceOptions& options, int64_t requested);

// Server streams of ShardChunk messages, for raw callback methods whose
// responses are ShardChunks (ShardService.FetchShard, ControlService.
// ReadRegion and Gather). Each returned reactor is owned by gRPC and frees
// itself once done; return it from the method handler. It writes every
// chunk of at most `chunk_bytes` (pass ChunkBytesFor's result) as
// FetchShard does: the header in the first, one write in flight, payload
// slices referencing the bytes (no copy; staging buffers for CUDA bytes,
// `staging_depth` chunks ahead). A client that cancels or disappears ends
// the stream cleanly. `active`, when given, counts the stream while it is
// not done.
grpc::ServerWriteReactor<grpc::ByteBuffer>* NewChunkStreamReactor(
    PreparedFetch prepared, int64_t chunk_bytes,
    std::shared_ptr<std::atomic<int64_t>> active = nullptr,
    int staging_depth = kDefaultStagingDepth);
// A stream that ends at once with `status` (an error; OK is treated as
// INTERNAL, since a stream without a header is no answer).
grpc::ServerWriteReactor<grpc::ByteBuffer>* NewFailedChunkStream(
    const absl::Status& status);
// A stream whose bytes take a while to prepare (fetches from other ranks,
// a collective): `prepare` runs on a thread of the reactor's own, so no
// gRPC callback thread blocks on it, then its result is streamed (or its
// error returned). The reactor joins that thread when the call is done.
// `prepare` must be bounded by a deadline: the call (and a server
// shutdown waiting for it) lasts at least as long as it runs, even when
// the client has gone.
grpc::ServerWriteReactor<grpc::ByteBuffer>* NewDeferredChunkStream(
    std::function<absl::StatusOr<PreparedFetch>()> prepare, int64_t chunk_bytes,
    int staging_depth = kDefaultStagingDepth);

// A thread owned by a gRPC server reactor, for work that must not block
// gRPC's callback threads (fetches from other ranks, forwarded writes).
// Start() it at most once; the work must end by calling the reactor's
// Finish (or starting its last write), directly or not, and touch nothing
// of the reactor after that. Join() from the reactor's OnDone: it waits
// for the thread to end (or detaches it when gRPC runs OnDone on that very
// thread).
class ReactorThread {
 public:
  ReactorThread() = default;
  ReactorThread(const ReactorThread&) = delete;
  ReactorThread& operator=(const ReactorThread&) = delete;
  ~ReactorThread() { Join(); }

  void Start(std::function<void()> work);
  void Join();

 private:
  absl::Mutex mu_;
  std::thread thread_ ABSL_GUARDED_BY(mu_);
};

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
