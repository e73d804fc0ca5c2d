// Server streams of ShardChunk messages on the gRPC callback API, for
// every method whose responses are ShardChunks (ShardService.FetchShard,
// ControlService.ReadRegion and Gather), and ReactorThread for reactors
// whose work must not block gRPC's callback threads.
//
// A stream writes one chunk at a time (a slow reader holds at most one
// chunk of server memory); a chunk's payload is a slice that references the
// bytes (the shard's storage, or for CUDA bytes the chunk's staging buffer,
// chunk_source.h), so it reaches the socket without a user-space copy.
// Every path (success, client cancellation, server shutdown) reaches Finish
// once; the reactor frees itself in OnDone.
#ifndef TESSERA_SERVER_SERVE_CHUNK_STREAM_H_
#define TESSERA_SERVER_SERVE_CHUNK_STREAM_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/server_callback.h"
#include "server/serve/chunk_source.h"
#include "server/serve/fetch.h"

namespace tessera {

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
// the client has gone. `active` as for NewChunkStreamReactor.
grpc::ServerWriteReactor<grpc::ByteBuffer>* NewDeferredChunkStream(
    std::function<absl::StatusOr<PreparedFetch>()> prepare, int64_t chunk_bytes,
    int staging_depth = kDefaultStagingDepth,
    std::shared_ptr<std::atomic<int64_t>> active = nullptr);

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

}  // namespace tessera

#endif  // TESSERA_SERVER_SERVE_CHUNK_STREAM_H_
