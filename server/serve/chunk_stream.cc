#include "server/serve/chunk_stream.h"

#include <string>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "grpcpp/support/slice.h"
#include "server/metrics/metrics.h"
#include "wire/chunk_codec.h"
#include "wire/grpc_status.h"

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
        started_(absl::Now()),
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
    keepalive_ = std::move(prepared->keepalive);
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
      // Every chunk is handed to gRPC: counted as served.
      CountTransfer(MetricsTransport::kGrpc, MetricsDirection::kRead,
                    header_.total_bytes(), absl::Now() - started_);
      StartWriteAndFinish(&message_, grpc::WriteOptions(), grpc::Status::OK);
    } else {
      StartWrite(&message_);
    }
  }

  const std::shared_ptr<std::atomic<int64_t>> active_;
  const absl::Time started_;
  const int64_t chunk_bytes_;
  const int staging_depth_;
  std::shared_ptr<const RegisteredTensor> tensor_;
  std::shared_ptr<const void> keepalive_;
  std::unique_ptr<ChunkSource> source_;
  v1::ShardHeader header_;
  // The message being written; gRPC reads it until OnWriteDone.
  grpc::ByteBuffer message_;
  ReactorThread thread_;
};

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
    int staging_depth, std::shared_ptr<std::atomic<int64_t>> active) {
  auto* reactor =
      new ChunkStreamReactor(chunk_bytes, staging_depth, std::move(active));
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

}  // namespace tessera
