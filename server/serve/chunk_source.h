// ChunkSource: the row-major bytes of a fetch (PreparedFetch::bytes), handed
// out chunk by chunk as host memory, for the senders of shard streams
// (ShardService's gRPC reactor and DataPlaneServer's raw data plane).
//
// - Host bytes: every chunk is a view of the tensor's storage (no copy),
//   whose owner keeps that storage alive.
// - Strided host bytes (a box of a shard): each chunk is gathered into a
//   pooled host buffer when it is handed out, just before it is sent (no
//   copy of the whole box first).
// - CUDA bytes: chunks are staged device -> pinned host buffer by
//   cudaMemcpyAsync on a non-blocking stream of the source's device, each
//   copy followed by an event. Handing out chunk k first enqueues the
//   copies up to chunk k + depth, then waits for chunk k's event only; so
//   while the caller sends chunk k, the copies of the next chunks run. The
//   stream first waits (on the device, not the host) for the device's
//   legacy default stream, so copies see the bytes of any synchronous CUDA
//   call made before the source was created.
//
// Staging buffers come from a per-source pool of at most depth + 2 (what a
// sender holds at once: the chunks in flight, the one being sent, and one
// that a transport such as gRPC may still hold after its write completed).
// A buffer goes back to the pool only when the last copy of the owner of
// the chunk it was handed out in is dropped, on any thread; when every
// pooled buffer is still held, a transient buffer is allocated (and freed
// on release) rather than waiting for one.
//
// The copy engine is a narrow interface (StagingCopier: NewBuffer, Enqueue,
// Wait) so that the pipeline is tested with a host copier; the CUDA copier
// is the one NewChunkSource uses for CUDA bytes.
//
// Errors: a failed enqueue, wait or buffer allocation ends the source:
// Next() returns that error from then on (CUDA errors as in
// common/tensor/cuda_util.h: INTERNAL, UNAVAILABLE or RESOURCE_EXHAUSTED with
// CUDA's description). Next() once every chunk was handed out is OUT_OF_RANGE.
//
// Thread-safety: a ChunkSource belongs to one stream and is used by one
// thread at a time. Chunk owners may be copied and dropped on any thread,
// also after the source is gone. Destroying a source waits for the copies
// it has in flight (at most `depth`, each a chunk) before freeing their
// buffers: a client that cancels mid-stream never leaves a copy writing
// into freed memory.
#ifndef TESSERA_SERVER_SERVE_CHUNK_SOURCE_H_
#define TESSERA_SERVER_SERVE_CHUNK_SOURCE_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/tensor/tensor.h"

namespace tessera {

// Chunks a CUDA source stages ahead of the one being sent, by default.
inline constexpr int kDefaultStagingDepth = 2;
// Depths are clamped to [1, kMaxStagingDepth].
inline constexpr int kMaxStagingDepth = 16;

// One chunk of a source's bytes: [offset, offset + size) of its row-major
// bytes, at `data` in host memory. `data` stays valid while any copy of
// `owner` lives; dropping the last one releases the memory (a staging
// buffer returns to its pool).
struct HostChunk {
  int64_t offset = 0;
  const char* data = nullptr;
  size_t size = 0;
  std::shared_ptr<const void> owner;
};

// Host memory that staged copies land in (pinned, for CUDA); freed by its
// destructor.
class StagingBuffer {
 public:
  virtual ~StagingBuffer() = default;
  virtual char* data() = 0;
  virtual size_t size() const = 0;
};

// The copy engine of a staged source: copies of the source's bytes into
// host buffers, asynchronous or not. Used by one thread at a time.
class StagingCopier {
 public:
  using Ticket = uint64_t;

  virtual ~StagingCopier() = default;

  // A buffer of `bytes` for copies to land in.
  virtual absl::StatusOr<std::unique_ptr<StagingBuffer>> NewBuffer(
      size_t bytes) = 0;
  // Starts copying the source's bytes [offset, offset + bytes) to
  // `destination` (inside a buffer from NewBuffer, which the caller keeps
  // alive until Wait for the returned ticket has returned). The copy may
  // run after Enqueue returns; on an error, no copy into `destination` is
  // left running.
  virtual absl::StatusOr<Ticket> Enqueue(int64_t offset, size_t bytes,
                                         char* destination) = 0;
  // Blocks until the copy of `ticket` is complete: OK, or why it failed.
  // Called exactly once per ticket, in the order they were enqueued.
  virtual absl::Status Wait(Ticket ticket) = 0;
};

class ChunkSource {
 public:
  virtual ~ChunkSource() = default;

  int64_t total_bytes() const { return total_bytes_; }
  int64_t chunk_bytes() const { return chunk_bytes_; }
  // ceil(total_bytes / chunk_bytes): 0 for no bytes.
  int64_t num_chunks() const;
  // Every chunk was handed out (at once for zero bytes).
  bool done() const { return next_offset_ == total_bytes_; }

  // The next chunk: chunk_bytes bytes, or fewer for the last one.
  virtual absl::StatusOr<HostChunk> Next() = 0;

 protected:
  ChunkSource(int64_t total_bytes, int64_t chunk_bytes)
      : total_bytes_(total_bytes), chunk_bytes_(chunk_bytes) {}

  const int64_t total_bytes_;
  const int64_t chunk_bytes_;
  // Offset of the next chunk to hand out.
  int64_t next_offset_ = 0;
};

// The chunks of `bytes`, a tensor on the CPU (views of its storage when
// contiguous, else gathered chunk by chunk) or a contiguous one on a CUDA
// device (staged through pinned buffers `depth` chunks ahead, see above);
// any tensor without bytes gives no chunks. INVALID_ARGUMENT for an
// undefined tensor, a non-contiguous CUDA tensor or chunk_bytes < 1;
// FAILED_PRECONDITION for a meta tensor with bytes; CUDA errors creating the
// stream. The source keeps `bytes`' storage alive.
absl::StatusOr<std::unique_ptr<ChunkSource>> NewChunkSource(
    const Tensor& bytes, int64_t chunk_bytes, int depth = kDefaultStagingDepth);

// The staging pipeline over any copier (NewChunkSource's for CUDA bytes):
// the chunks of `total_bytes` source bytes, `depth` ahead (clamped).
// INVALID_ARGUMENT for a null copier, negative total_bytes or chunk_bytes
// < 1.
absl::StatusOr<std::unique_ptr<ChunkSource>> NewStagedChunkSource(
    std::unique_ptr<StagingCopier> copier, int64_t total_bytes,
    int64_t chunk_bytes, int depth = kDefaultStagingDepth);

}  // namespace tessera

#endif  // TESSERA_SERVER_SERVE_CHUNK_SOURCE_H_
