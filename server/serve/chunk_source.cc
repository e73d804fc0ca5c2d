#include "server/serve/chunk_source.h"

#include <algorithm>
#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/int_math.h"
#include "common/status_macros.h"
#include "common/tensor/cuda_util.h"
#include "common/tensor/storage.h"

namespace tessera {

int64_t ChunkSource::num_chunks() const {
  return CeilDiv(total_bytes_, chunk_bytes_);
}

namespace {

absl::Status NoChunkLeft(int64_t total_bytes) {
  return absl::OutOfRangeError(
      absl::StrCat("every chunk of ", total_bytes, " bytes was handed out"));
}

// ---- Host bytes: views of the storage ---------------------------------------

class HostChunkSource final : public ChunkSource {
 public:
  HostChunkSource(Tensor bytes, int64_t chunk_bytes)
      : ChunkSource(static_cast<int64_t>(bytes.nbytes()), chunk_bytes),
        bytes_(std::move(bytes)),
        base_(static_cast<const char*>(bytes_.data_ptr())) {}

  absl::StatusOr<HostChunk> Next() override {
    if (done()) return NoChunkLeft(total_bytes_);
    HostChunk chunk;
    chunk.offset = next_offset_;
    chunk.size = static_cast<size_t>(
        std::min(chunk_bytes_, total_bytes_ - next_offset_));
    chunk.data = base_ + next_offset_;
    chunk.owner = bytes_.storage();
    next_offset_ += static_cast<int64_t>(chunk.size);
    return chunk;
  }

 private:
  const Tensor bytes_;
  const char* const base_;
};

// ---- Staged bytes: the pipeline over a StagingCopier ------------------------

// A staging buffer taken from a pool, or a transient one (pooled false)
// that is freed on release.
struct Lease {
  std::unique_ptr<StagingBuffer> buffer;
  bool pooled = false;
};

// The free staging buffers of one source. Shared by the source and the
// owners of the chunks it handed out, which give their buffers back from
// any thread, possibly after the source is gone.
class StagingPool {
 public:
  explicit StagingPool(int capacity) : capacity_(capacity) {}

  // A free pooled buffer, else a new one from `copier`: pooled while the
  // pool has fewer than `capacity` buffers, transient otherwise. Never
  // waits for a buffer to come back.
  absl::StatusOr<Lease> Acquire(StagingCopier& copier, size_t bytes) {
    bool grow = false;
    {
      absl::MutexLock lock(&mu_);
      if (!free_.empty()) {
        Lease lease{std::move(free_.back()), true};
        free_.pop_back();
        return lease;
      }
      if (pooled_ < capacity_) {
        ++pooled_;
        grow = true;
      }
    }
    // Allocated outside the lock: pinning memory takes a while.
    absl::StatusOr<std::unique_ptr<StagingBuffer>> made =
        copier.NewBuffer(bytes);
    if (made.ok() && (*made == nullptr || (*made)->size() < bytes)) {
      made = absl::InternalError(
          absl::StrCat("staging buffer of ", bytes, " bytes is too small"));
    }
    if (!made.ok()) {
      if (grow) {
        absl::MutexLock lock(&mu_);
        --pooled_;
      }
      return made.status();
    }
    return Lease{*std::move(made), grow};
  }

  // Takes a buffer back (a transient one is freed here, on the caller's
  // thread). Only call once no copy into it is in flight.
  void Release(Lease lease) {
    if (!lease.pooled) return;
    absl::MutexLock lock(&mu_);
    free_.push_back(std::move(lease.buffer));
  }

 private:
  const int capacity_;
  absl::Mutex mu_;
  // Pooled buffers in existence, free or leased.
  int pooled_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::unique_ptr<StagingBuffer>> free_ ABSL_GUARDED_BY(mu_);
};

// What a staged chunk's owner points at: gives the buffer back to its pool
// when the last owner goes.
class HeldBuffer {
 public:
  HeldBuffer(std::shared_ptr<StagingPool> pool, Lease lease)
      : pool_(std::move(pool)), lease_(std::move(lease)) {}
  ~HeldBuffer() { pool_->Release(std::move(lease_)); }
  HeldBuffer(const HeldBuffer&) = delete;
  HeldBuffer& operator=(const HeldBuffer&) = delete;

 private:
  const std::shared_ptr<StagingPool> pool_;
  Lease lease_;
};

class StagedChunkSource final : public ChunkSource {
 public:
  StagedChunkSource(std::unique_ptr<StagingCopier> copier, int64_t total_bytes,
                    int64_t chunk_bytes, int depth)
      : ChunkSource(total_bytes, chunk_bytes),
        copier_(std::move(copier)),
        depth_(depth),
        buffer_bytes_(static_cast<size_t>(std::min(chunk_bytes, total_bytes))),
        pool_(std::make_shared<StagingPool>(depth + 2)) {}

  ~StagedChunkSource() override {
    // Copies still in flight write into buffers of this source's: they
    // must end before those can be freed (or reused by anyone).
    for (InFlight& copy : in_flight_) {
      copier_->Wait(copy.ticket).IgnoreError();
      pool_->Release(std::move(copy.lease));
    }
    in_flight_.clear();
    copier_.reset();
  }

  absl::StatusOr<HostChunk> Next() override {
    if (!failed_.ok()) return failed_;
    if (done()) return NoChunkLeft(total_bytes_);
    // Chunks next..next+depth are enqueued before waiting for `next`.
    while (enqueued_offset_ < total_bytes_ &&
           static_cast<int64_t>(in_flight_.size()) <= depth_) {
      const size_t size = static_cast<size_t>(
          std::min(chunk_bytes_, total_bytes_ - enqueued_offset_));
      absl::StatusOr<Lease> lease = pool_->Acquire(*copier_, buffer_bytes_);
      if (!lease.ok()) return Fail(lease.status());
      absl::StatusOr<StagingCopier::Ticket> ticket =
          copier_->Enqueue(enqueued_offset_, size, lease->buffer->data());
      if (!ticket.ok()) {
        pool_->Release(*std::move(lease));
        return Fail(ticket.status());
      }
      in_flight_.push_back(
          InFlight{enqueued_offset_, size, *ticket, *std::move(lease)});
      enqueued_offset_ += static_cast<int64_t>(size);
    }
    InFlight copy = std::move(in_flight_.front());
    in_flight_.pop_front();
    const absl::Status copied = copier_->Wait(copy.ticket);
    if (!copied.ok()) {
      pool_->Release(std::move(copy.lease));
      return Fail(copied);
    }
    HostChunk chunk;
    chunk.offset = copy.offset;
    chunk.size = copy.size;
    chunk.data = copy.lease.buffer->data();
    chunk.owner = std::make_shared<HeldBuffer>(pool_, std::move(copy.lease));
    next_offset_ += static_cast<int64_t>(copy.size);
    return chunk;
  }

 private:
  struct InFlight {
    int64_t offset;
    size_t size;
    StagingCopier::Ticket ticket;
    Lease lease;
  };

  absl::Status Fail(absl::Status status) {
    failed_ = status;
    return status;
  }

  std::unique_ptr<StagingCopier> copier_;
  const int64_t depth_;
  const size_t buffer_bytes_;
  const std::shared_ptr<StagingPool> pool_;
  // Enqueued and not yet handed out, in order.
  std::deque<InFlight> in_flight_;
  int64_t enqueued_offset_ = 0;
  // Sticky: the error that ended the source.
  absl::Status failed_;
};

// ---- Strided host bytes: gathered chunk by chunk ----------------------------

// Host memory of a Storage: private pages for gathered chunks, pinned ones
// for CUDA staging.
class StorageBuffer final : public StagingBuffer {
 public:
  explicit StorageBuffer(std::shared_ptr<Storage> storage)
      : storage_(std::move(storage)) {}
  char* data() override { return static_cast<char*>(storage_->data()); }
  size_t size() const override { return storage_->nbytes(); }

 private:
  const std::shared_ptr<Storage> storage_;
};

// Copies of a strided host view's row-major bytes, made on the caller's
// thread when enqueued (so the pipeline gathers each chunk just before it
// is sent, while it is still in the cache).
class HostGatherCopier final : public StagingCopier {
 public:
  explicit HostGatherCopier(Tensor source) : source_(std::move(source)) {}

  absl::StatusOr<std::unique_ptr<StagingBuffer>> NewBuffer(
      size_t bytes) override {
    ASSIGN_OR_RETURN(std::shared_ptr<Storage> storage,
                     Storage::Allocate(bytes, Device::Cpu(), /*pinned=*/false,
                                       HostSharing::kPrivate));
    return std::unique_ptr<StagingBuffer>(
        new StorageBuffer(std::move(storage)));
  }
  absl::StatusOr<Ticket> Enqueue(int64_t offset, size_t bytes,
                                 char* destination) override {
    RETURN_IF_ERROR(CopyRowMajorBytes(source_, offset, bytes, destination));
    return next_ticket_++;
  }
  absl::Status Wait(Ticket) override { return absl::OkStatus(); }

 private:
  const Tensor source_;
  Ticket next_ticket_ = 0;
};

// ---- The CUDA copier --------------------------------------------------------

// Device -> pinned host copies of a contiguous CUDA tensor, on a stream of
// its own on the tensor's device; one event per copy, recycled once
// waited for.
class CudaStagingCopier final : public StagingCopier {
 public:
  static absl::StatusOr<std::unique_ptr<StagingCopier>> Create(
      const Tensor& source) {
    const int device = source.device().index().value_or(0);
    ASSIGN_OR_RETURN(CudaStream stream, CudaStream::Create(device));
    // The bytes may still be in the making on the legacy default stream
    // (a synchronous copy that made a strided shard contiguous, a memset);
    // this stream does not wait for it by itself.
    RETURN_IF_ERROR(stream.WaitForLegacyStream());
    return std::unique_ptr<StagingCopier>(
        new CudaStagingCopier(source, std::move(stream)));
  }

  absl::StatusOr<std::unique_ptr<StagingBuffer>> NewBuffer(
      size_t bytes) override {
    ASSIGN_OR_RETURN(std::shared_ptr<Storage> storage,
                     Storage::Allocate(bytes, Device::Cpu(), /*pinned=*/true));
    return std::unique_ptr<StagingBuffer>(
        new StorageBuffer(std::move(storage)));
  }

  absl::StatusOr<Ticket> Enqueue(int64_t offset, size_t bytes,
                                 char* destination) override {
    if (offset < 0 || offset > static_cast<int64_t>(source_.nbytes()) ||
        bytes > source_.nbytes() - static_cast<size_t>(offset)) {
      return absl::OutOfRangeError(absl::StrCat(
          "staging copy of ", bytes, " bytes at ", offset, " leaves the ",
          source_.nbytes(), " bytes of ", source_.DebugString()));
    }
    CudaEvent event;
    if (!free_events_.empty()) {
      event = std::move(free_events_.back());
      free_events_.pop_back();
    } else {
      ASSIGN_OR_RETURN(event, CudaEvent::Create(stream_.device()));
    }
    RETURN_IF_ERROR(
        CudaMemcpyAsync(destination, base_ + offset, bytes, stream_));
    const absl::Status recorded = event.Record(stream_);
    if (!recorded.ok()) {
      // No ticket to wait for: the copy must not outlive this call, since
      // the caller may free `destination` now.
      stream_.Synchronize().IgnoreError();
      return recorded;
    }
    const Ticket ticket = next_ticket_++;
    pending_.emplace_back(ticket, std::move(event));
    return ticket;
  }

  absl::Status Wait(Ticket ticket) override {
    if (pending_.empty() || pending_.front().first != ticket) {
      return absl::InternalError(
          absl::StrCat("staging copy ", ticket, " waited for out of order"));
    }
    CudaEvent event = std::move(pending_.front().second);
    pending_.pop_front();
    RETURN_IF_ERROR(event.Synchronize());
    free_events_.push_back(std::move(event));
    return absl::OkStatus();
  }

 private:
  CudaStagingCopier(Tensor source, CudaStream stream)
      : source_(std::move(source)),
        base_(static_cast<const char*>(source_.data_ptr())),
        stream_(std::move(stream)) {}

  // Declared first so that it goes last: the stream's destructor waits for
  // the copies reading it.
  const Tensor source_;
  const char* const base_;
  CudaStream stream_;
  Ticket next_ticket_ = 0;
  std::deque<std::pair<Ticket, CudaEvent>> pending_;
  std::vector<CudaEvent> free_events_;
};

int ClampDepth(int depth) { return std::clamp(depth, 1, kMaxStagingDepth); }

}  // namespace

absl::StatusOr<std::unique_ptr<ChunkSource>> NewStagedChunkSource(
    std::unique_ptr<StagingCopier> copier, int64_t total_bytes,
    int64_t chunk_bytes, int depth) {
  if (copier == nullptr) {
    return absl::InvalidArgumentError("staged chunk source without a copier");
  }
  if (total_bytes < 0 || chunk_bytes < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk source of ", total_bytes, " bytes in chunks of ", chunk_bytes));
  }
  return std::unique_ptr<ChunkSource>(new StagedChunkSource(
      std::move(copier), total_bytes, chunk_bytes, ClampDepth(depth)));
}

absl::StatusOr<std::unique_ptr<ChunkSource>> NewChunkSource(const Tensor& bytes,
                                                            int64_t chunk_bytes,
                                                            int depth) {
  if (!bytes.defined()) {
    return absl::InvalidArgumentError("chunk source of an undefined tensor");
  }
  if (chunk_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk source in chunks of ", chunk_bytes, " bytes"));
  }
  if (bytes.nbytes() == 0) {
    return std::unique_ptr<ChunkSource>(
        new HostChunkSource(bytes, chunk_bytes));
  }
  if (bytes.device().is_meta()) {
    return absl::FailedPreconditionError(
        "tensor is on the meta device and has no bytes to send");
  }
  if (bytes.device().is_cpu() && !bytes.is_contiguous()) {
    // Gathered when handed out (depth 0): one buffer being sent, one a
    // transport may still hold.
    return std::unique_ptr<ChunkSource>(new StagedChunkSource(
        std::make_unique<HostGatherCopier>(bytes),
        static_cast<int64_t>(bytes.nbytes()), chunk_bytes, /*depth=*/0));
  }
  if (!bytes.is_contiguous()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk source of a non-contiguous tensor ", bytes.DebugString()));
  }
  if (bytes.device().is_cpu()) {
    return std::unique_ptr<ChunkSource>(
        new HostChunkSource(bytes, chunk_bytes));
  }
  if (!bytes.device().is_cuda()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot stream the bytes of ", bytes.DebugString()));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<StagingCopier> copier,
                   CudaStagingCopier::Create(bytes));
  return NewStagedChunkSource(std::move(copier),
                              static_cast<int64_t>(bytes.nbytes()), chunk_bytes,
                              depth);
}

}  // namespace tessera
