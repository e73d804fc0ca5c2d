// Transport-neutral fetches: a FetchShardRequest validated against the
// registry and turned into the bytes to send (PreparedFetch) or the view to
// lend (FetchView), shared by every transport that serves shards: the gRPC
// ShardService (shard_service.h), the data plane (data_plane_server.h), the
// local path (local_path_server.h) and the daemon's ReadRegion and Gather
// (server/daemon/). Chunk sizes are settled here too.
//
// A strided shard is made contiguous where it lives (a host copy, or a
// device-to-device copy for a CUDA shard, never a whole copy to the host),
// on the calling thread. A prepared fetch holds its RegisteredTensor, so
// unregistering the tensor meanwhile is safe.
//
// Thread-safety: the functions are safe to call concurrently.
#ifndef TESSERA_SERVER_SERVE_FETCH_H_
#define TESSERA_SERVER_SERVE_FETCH_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/shard_metadata.h"
#include "common/tensor/tensor.h"
#include "grpcpp/support/byte_buffer.h"
#include "server/serve/chunk_source.h"
#include "server/serve/shard_registry.h"
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

// `options` with chunk sizes clamped to at least kMinChunkBytes (the
// default to at most max_chunk_bytes) and the staging depth to
// [1, kMaxStagingDepth].
ShardServiceOptions ClampChunkOptions(ShardServiceOptions options);

// A serialized FetchShardRequest parsed; MalformedFetchError() otherwise.
absl::StatusOr<v1::FetchShardRequest> ParseFetchRequest(
    const grpc::ByteBuffer& serialized);
// NOT_FOUND "unknown tensor <id>".
absl::Status UnknownTensorError(absl::string_view tensor_id);

// One fetch, validated and ready to stream (shared by FetchShard, the raw
// data plane, data_plane_server.h, and the daemon's ReadRegion and Gather).
struct PreparedFetch {
  // Keeps the registration (and so the shard's storage) alive for the
  // whole stream, even if the tensor is unregistered meanwhile. Null for a
  // fetch of a tensor that is no registered shard (PrepareTensorFetch).
  std::shared_ptr<const RegisteredTensor> tensor;
  // The bytes to send: in host memory (a strided box is gathered chunk by
  // chunk as it is sent), or contiguous on a CUDA device (staged to the
  // host chunk by chunk); see NewChunkSource. The stream holds a reference
  // to their storage.
  Tensor bytes;
  v1::ShardHeader header;
  // Anything else the stream keeps until it is done (a daemon's memory
  // reservation for `bytes`); may be null.
  std::shared_ptr<const void> keepalive;
};

// A fetch's elements where they lie: the shard, or the view of its region,
// in the shard's own storage (not staged, any device), with the
// registration that keeps that storage alive and the header a stream would
// send. For the local path (server/serve/local_path_server.h), which
// lends the storage itself. Errors as PrepareFetch, except that a meta
// shard is returned (its storage has no bytes to lend).
struct FetchView {
  std::shared_ptr<const RegisteredTensor> tensor;
  Tensor view;
  // Its version in header.version (ShardRegistry::Resolve).
  v1::ShardHeader header;
  // False for a published version (or a versioned tensor's own id): it
  // must not be written.
  bool writable = true;
  // For a write: its pass (ShardRegistry::EnterWrite), held while the
  // view is.
  std::shared_ptr<ShardRegistry::WritePass> pass;
};
// FAILED_PRECONDITION for a write (`what`) of a versioned tensor's id or
// of one of its published versions: they are read-only (docs/versions.md).
absl::Status ReadOnlyVersionError(absl::string_view tensor_id,
                                  absl::string_view what);
// `write`: for a write over the data plane or the local path (the
// registry's serve gate says FAILED_PRECONDITION for a stream instead;
// a read is refused UNAVAILABLE, so the reader asks another holder).
// `deadline`: how long the gate may wait (ShardRegistry::CheckServe).
absl::StatusOr<FetchView> PrepareFetchView(
    const ShardRegistry& registry, const v1::FetchShardRequest& request,
    bool write = false, absl::Time deadline = absl::InfiniteFuture());

// Validates `request` and finds its shard (and its region, when it names
// one): INVALID_ARGUMENT for a malformed request or region, OUT_OF_RANGE
// for a region that leaves the shard, NOT_FOUND for an unknown tensor or a
// shard this rank does not serve, FAILED_PRECONDITION for a meta shard (no
// bytes).
absl::StatusOr<PreparedFetch> PrepareFetch(
    const ShardRegistry& registry, const v1::FetchShardRequest& request,
    absl::Time deadline = absl::InfiniteFuture());

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

// The checks of a write's announced dtype and size against its target (a
// box of `dtype` and `nbytes` bytes), shared by the data plane's writes and
// the daemons' WriteRegion: INVALID_ARGUMENT "<what>: the data is int32
// but the tensor is float32", an unknown dtype's error annotated with
// `what`, or "<what>: total_bytes N is not the M bytes of the <unit>".
absl::Status CheckWriteHeader(v1::DType sent, int64_t total_bytes, DType dtype,
                              int64_t nbytes, absl::string_view what,
                              absl::string_view unit);

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

}  // namespace tessera

#endif  // TESSERA_SERVER_SERVE_FETCH_H_
