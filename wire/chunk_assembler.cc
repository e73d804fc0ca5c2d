#include "wire/chunk_assembler.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/checksum.h"
#include "common/proto_convert.h"
#include "common/region.h"
#include "common/status_macros.h"
#include "common/tensor/cuda_util.h"
#include "tessera/v1/shard.grpc.pb.h"
#include "wire/grpc_status.h"

namespace tessera {
namespace {

std::atomic<ChecksumFailureObserver> checksum_failure_observer{nullptr};

}  // namespace

namespace internal_chunk_assembler {

// Lands verified chunks in a contiguous CUDA destination through a ring of
// pinned host slots: a chunk is received and hashed in a slot, then copied
// to its offset in the destination asynchronously (cudaMemcpyAsync on a
// stream of the destination's device), and the slot is reused once that
// copy is done (an event per slot). So the pinned memory a stream holds is
// kSlots chunks, not the shard (a 1 GiB shard used to pin 1 GiB per fetch,
// which cost more than the transfer), and slots come from the pinned-buffer
// cache of common/tensor/storage.cc. The destructor waits for the copies in
// flight before the slots and the destination are let go.
class DeviceLanding {
 public:
  // Chunks in flight to the device while the next ones are received.
  static constexpr int kSlots = 4;

  static absl::StatusOr<std::unique_ptr<DeviceLanding>> Create(
      const Tensor& destination) {
    const int device = destination.device().index().value_or(0);
    ASSIGN_OR_RETURN(CudaStream stream, CudaStream::Create(device));
    // The destination may still be being written on the legacy default
    // stream (a cudaMemset that zeroed it, say), which this stream does not
    // wait for by itself.
    RETURN_IF_ERROR(stream.WaitForLegacyStream());
    std::vector<Slot> slots(kSlots);
    for (Slot& slot : slots) {
      ASSIGN_OR_RETURN(slot.copied, CudaEvent::Create(device));
    }
    return std::unique_ptr<DeviceLanding>(
        new DeviceLanding(destination, std::move(slots), std::move(stream)));
  }

  // Where the next chunk, of `size` bytes, is to be written: the next slot,
  // once its previous copy is done (its error otherwise), grown to `size`
  // when smaller. `what` names the chunk in errors.
  absl::StatusOr<char*> Next(int64_t size, absl::string_view what) {
    Slot& slot = slots_[next_];
    if (slot.in_flight) {
      RETURN_IF_ERROR(Annotated(slot.copied.Synchronize(), what));
      slot.in_flight = false;
    }
    if (slot.buffer == nullptr ||
        slot.buffer->nbytes() < static_cast<size_t>(size)) {
      slot.buffer.reset();
      ASSIGN_OR_RETURN(slot.buffer,
                       Storage::Allocate(static_cast<size_t>(size),
                                         Device::Cpu(), /*pinned=*/true));
    }
    return static_cast<char*>(slot.buffer->data());
  }

  // Enqueues the copy of the slot Next() returned last, holding `size`
  // verified bytes, to [offset, offset + size) of the destination.
  absl::Status Land(int64_t offset, int64_t size, absl::string_view what) {
    Slot& slot = slots_[next_];
    RETURN_IF_ERROR(Annotated(
        CudaMemcpyAsync(static_cast<char*>(destination_.data_ptr()) + offset,
                        slot.buffer->data(), static_cast<size_t>(size),
                        stream_),
        what));
    slot.in_flight = true;
    // Should recording fail, the stream is abandoned with that error and
    // the slot is not written again before the destructor waited.
    RETURN_IF_ERROR(Annotated(slot.copied.Record(stream_), what));
    next_ = (next_ + 1) % kSlots;
    return absl::OkStatus();
  }

  // Waits for every copy enqueued; the first error among them.
  absl::Status Synchronize(absl::string_view what) {
    return Annotated(stream_.Synchronize(), what);
  }

 private:
  struct Slot {
    std::shared_ptr<Storage> buffer;
    CudaEvent copied;
    bool in_flight = false;
  };

  DeviceLanding(Tensor destination, std::vector<Slot> slots, CudaStream stream)
      : destination_(std::move(destination)),
        slots_(std::move(slots)),
        stream_(std::move(stream)) {}

  absl::Status Annotated(const absl::Status& status,
                         absl::string_view what) const {
    return Annotate(status, absl::StrCat(what, ": copying to ",
                                         destination_.device().ToString()));
  }

  const Tensor destination_;
  std::vector<Slot> slots_;
  int next_ = 0;
  // Last, so that it is destroyed first: its destructor waits for the
  // copies that use the slots and the destination.
  CudaStream stream_;
};

}  // namespace internal_chunk_assembler

namespace {

// A peer's malformed message is lost data as far as this client is
// concerned, not a bad argument of the caller's.
absl::Status Malformed(absl::string_view what, const absl::Status& status) {
  return absl::DataLossError(
      absl::StrCat(what, ": malformed: ", status.message()));
}

// Copies and hashes in pieces small enough to stay in cache between the
// two passes over them.
constexpr size_t kHashCopyPieceBytes = 256 << 10;

}  // namespace

// ---- ChunkSequence ----------------------------------------------------------

absl::Status ChunkSequence::CheckNext(int64_t offset, int64_t size,
                                      absl::string_view chunk_name) const {
  if (offset != received_bytes_) {
    return absl::Status(
        code_, absl::StrCat(chunk_name, ": expected offset ", received_bytes_,
                            " (chunks must be contiguous and in order)"));
  }
  if (size < 0 || size > total_bytes_ - received_bytes_) {
    return absl::Status(
        code_, absl::StrCat(chunk_name, ": ", size, " bytes overrun the ",
                            unit_, "'s ", total_bytes_, " bytes"));
  }
  return absl::OkStatus();
}

void SetChecksumFailureObserver(ChecksumFailureObserver observer) {
  checksum_failure_observer.store(observer, std::memory_order_relaxed);
}

absl::Status ChunkSequence::CheckChecksum(uint64_t actual, uint64_t expected,
                                          absl::string_view chunk_name) {
  if (actual != expected) {
    return absl::DataLossError(absl::StrCat(chunk_name, ": checksum mismatch"));
  }
  return absl::OkStatus();
}

absl::Status ChunkSequence::CheckComplete(absl::string_view stream_name) const {
  if (received_bytes_ != total_bytes_) {
    return absl::Status(
        code_, absl::StrCat(stream_name, ": the stream ended after ",
                            received_bytes_, " of ", total_bytes_, " bytes"));
  }
  return absl::OkStatus();
}

// ---- ShardAssembler ---------------------------------------------------------

ShardAssembler::ShardAssembler(absl::string_view tensor_id, int64_t shard_index,
                               Tensor destination)
    : tensor_id_(tensor_id),
      shard_index_(shard_index),
      destination_(std::move(destination)) {}

ShardAssembler::ShardAssembler(absl::string_view tensor_id, int64_t shard_index,
                               Device device, bool pin_memory)
    : tensor_id_(tensor_id),
      shard_index_(shard_index),
      // A fetched copy stays in this process: private memory, fast to
      // fill (a memory file would cost several times more per byte).
      allocate_(TensorOptions()
                    .WithDevice(device)
                    .WithPinMemory(pin_memory)
                    .Private()) {}

// Out of line, where DeviceLanding is complete; waits for its copies.
ShardAssembler::~ShardAssembler() = default;

void ShardAssembler::ExpectRegion(absl::Span<const int64_t> offsets,
                                  absl::Span<const int64_t> sizes) {
  region_offsets_.emplace(offsets.begin(), offsets.end());
  region_sizes_.assign(sizes.begin(), sizes.end());
}

std::string ShardAssembler::ShardName() const {
  if (!name_.empty()) return name_;
  return absl::StrCat("shard ", shard_index_, " of tensor ", tensor_id_);
}

std::string ShardAssembler::ChunkName(int64_t offset) const {
  return absl::StrCat("chunk at offset ", offset, " of ", ShardName());
}

absl::Status ShardAssembler::Consume(const v1::ShardChunk& chunk) {
  grpc::ByteBuffer message;
  bool own_buffer;
  grpc::Status serialized =
      grpc::SerializationTraits<v1::ShardChunk>::Serialize(chunk, &message,
                                                           &own_buffer);
  if (!serialized.ok()) return FromGrpcStatus(serialized);
  return Consume(message);
}

absl::Status ShardAssembler::Consume(const grpc::ByteBuffer& message) {
  std::vector<grpc::Slice> slices;
  if (message.Valid() && !message.Dump(&slices).ok()) {
    return absl::DataLossError(
        absl::StrCat(ShardName(), ": unreadable message"));
  }
  ParsedChunk chunk;
  if (!ParseShardChunk(slices, &chunk)) {
    return absl::DataLossError(absl::StrCat(ShardName(),
                                            ": malformed chunk after offset ",
                                            sequence_.received_bytes()));
  }
  if (!metadata_.has_value()) {
    RETURN_IF_ERROR(StartFromHeader(chunk));
  } else if (chunk.header.has_value()) {
    return absl::DataLossError(
        absl::StrCat(ChunkName(chunk.offset), ": header repeated"));
  }
  RETURN_IF_ERROR(CheckCancel());
  RETURN_IF_ERROR(sequence_.CheckNext(chunk.offset, chunk.data_size,
                                      ChunkName(chunk.offset)));
  char* target = write_base_;
  if (chunk.data_size > 0) {
    ASSIGN_OR_RETURN(target, ChunkTarget(chunk.offset, chunk.data_size));
  }
  if (!WriteAndVerify(chunk, target)) return ChecksumMismatch(chunk.offset);
  if (landing_ != nullptr && chunk.data_size > 0) {
    RETURN_IF_ERROR(
        landing_->Land(chunk.offset, chunk.data_size, ChunkName(chunk.offset)));
  }
  sequence_.Advance(chunk.data_size);
  if (on_chunk_ && chunk.data_size > 0) on_chunk_(chunk.data_size);
  return absl::OkStatus();
}

absl::Status ShardAssembler::StartFromHeader(const ParsedChunk& chunk) {
  if (!chunk.header.has_value()) {
    return absl::DataLossError(
        absl::StrCat(ShardName(), ": first chunk carries no header"));
  }
  return Start(*chunk.header);
}

absl::Status ShardAssembler::Start(const v1::ShardHeader& header) {
  if (metadata_.has_value()) {
    return absl::DataLossError(absl::StrCat(ShardName(), ": header repeated"));
  }
  ASSIGN_OR_RETURN(CheckedHeader checked, CheckHeader(header));
  RETURN_IF_ERROR(PrepareDestination(checked.dtype, checked.sizes));
  sequence_.Start(header.total_bytes());
  metadata_ = std::move(checked.metadata);
  version_ = header.version();
  return absl::OkStatus();
}

absl::Status ShardAssembler::FillFrom(const v1::ShardHeader& header,
                                      const Fill& fill) {
  if (metadata_.has_value()) {
    return absl::DataLossError(absl::StrCat(ShardName(), ": header repeated"));
  }
  ASSIGN_OR_RETURN(CheckedHeader checked, CheckHeader(header));
  Tensor destination = destination_;
  if (allocate_.has_value()) {
    ASSIGN_OR_RETURN(
        destination,
        Tensor::Empty(checked.sizes,
                      TensorOptions(*allocate_).WithDType(checked.dtype)));
  } else if (!destination.defined() || destination.dtype() != checked.dtype ||
             destination.sizes() != checked.sizes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "destination ", destination.DebugString(), " does not match ",
        ShardName(), ", which is ", DTypeName(checked.dtype), " [",
        absl::StrJoin(checked.sizes, ", "), "]"));
  }
  RETURN_IF_ERROR(fill(destination));
  destination_ = std::move(destination);
  sequence_.Complete(header.total_bytes());
  metadata_ = std::move(checked.metadata);
  version_ = header.version();
  if (on_chunk_ && header.total_bytes() > 0) on_chunk_(header.total_bytes());
  return absl::OkStatus();
}

absl::StatusOr<ShardAssembler::CheckedHeader> ShardAssembler::CheckHeader(
    const v1::ShardHeader& header) const {
  const std::string what = absl::StrCat("header of ", ShardName());
  absl::StatusOr<ShardMetadata> metadata = FromProto(header.metadata());
  if (!metadata.ok()) return Malformed(what, metadata.status());
  absl::StatusOr<DType> dtype = FromProto(header.dtype());
  if (!dtype.ok()) return Malformed(what, dtype.status());
  const std::vector<int64_t> sizes(header.sizes().begin(),
                                   header.sizes().end());
  if (region_offsets_.has_value()) {
    if (sizes != region_sizes_) {
      return absl::DataLossError(
          absl::StrCat(what, ": sizes [", absl::StrJoin(sizes, ", "),
                       "] differ from the requested region's [",
                       absl::StrJoin(region_sizes_, ", "), "]"));
    }
    const absl::Status inside =
        ValidateRegion(*region_offsets_, region_sizes_, metadata->shard_sizes(),
                       ShardName(), "shard");
    if (!inside.ok()) return Malformed(what, inside);
  } else if (sizes != metadata->shard_sizes()) {
    return absl::DataLossError(
        absl::StrCat(what, ": sizes [", absl::StrJoin(sizes, ", "),
                     "] differ from its metadata's [",
                     absl::StrJoin(metadata->shard_sizes(), ", "), "]"));
  }
  const std::optional<int64_t> numel = CheckedProduct(sizes);
  int64_t nbytes = 0;
  if (!numel.has_value() ||
      __builtin_mul_overflow(*numel, static_cast<int64_t>(ElementSize(*dtype)),
                             &nbytes) ||
      header.total_bytes() != nbytes) {
    return absl::DataLossError(
        absl::StrCat(what, ": total_bytes ", header.total_bytes(),
                     " does not match its dtype and sizes"));
  }
  return CheckedHeader{*std::move(metadata), *dtype, sizes};
}

absl::Status ShardAssembler::PrepareDestination(
    DType dtype, const std::vector<int64_t>& sizes) {
  if (allocate_.has_value()) {
    ASSIGN_OR_RETURN(
        destination_,
        Tensor::Empty(sizes, TensorOptions(*allocate_).WithDType(dtype)));
  } else if (!destination_.defined() || destination_.dtype() != dtype ||
             destination_.sizes() != sizes) {
    return absl::InvalidArgumentError(
        absl::StrCat("destination ", destination_.DebugString(),
                     " does not match ", ShardName(), ", which is ",
                     DTypeName(dtype), " [", absl::StrJoin(sizes, ", "), "]"));
  }
  if (destination_.device().is_cpu() && destination_.is_contiguous()) {
    write_base_ = static_cast<char*>(destination_.data_ptr());
    return absl::OkStatus();
  }
  if (destination_.device().is_cuda() && destination_.is_contiguous() &&
      destination_.nbytes() > 0) {
    absl::StatusOr<std::unique_ptr<internal_chunk_assembler::DeviceLanding>>
        landing = internal_chunk_assembler::DeviceLanding::Create(destination_);
    RETURN_IF_ERROR(Annotate(landing.status(),
                             absl::StrCat(ShardName(), ": preparing copies to ",
                                          destination_.device().ToString())));
    landing_ = *std::move(landing);
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(
      staging_,
      Tensor::Empty(sizes,
                    TensorOptions().WithDType(dtype).Private().WithPinMemory(
                        destination_.device().is_cuda())));
  write_base_ = static_cast<char*>(staging_.data_ptr());
  return absl::OkStatus();
}

absl::StatusOr<char*> ShardAssembler::ChunkTarget(int64_t offset,
                                                  int64_t length) {
  if (landing_ == nullptr) return write_base_ + offset;
  return landing_->Next(length, ChunkName(offset));
}

absl::StatusOr<char*> ShardAssembler::Place(int64_t offset, int64_t length) {
  if (!metadata_.has_value()) {
    return absl::DataLossError(
        absl::StrCat(ShardName(), ": chunk before the header"));
  }
  RETURN_IF_ERROR(CheckCancel());
  if (length <= 0) {
    return absl::DataLossError(
        absl::StrCat(ChunkName(offset), ": empty chunk"));
  }
  RETURN_IF_ERROR(sequence_.CheckNext(offset, length, ChunkName(offset)));
  ASSIGN_OR_RETURN(placed_, ChunkTarget(offset, length));
  return placed_;
}

absl::Status ShardAssembler::CheckCancel() const {
  if (!Cancelled(cancel_)) return absl::OkStatus();
  return absl::CancelledError(
      absl::StrCat(ShardName(), ": cancelled by the caller after ",
                   sequence_.received_bytes(), " bytes"));
}

absl::Status ShardAssembler::Verify(int64_t offset, int64_t length,
                                    std::optional<uint64_t> checksum) {
  if (checksum.has_value() &&
      Checksum64(placed_, static_cast<size_t>(length)) != *checksum) {
    return ChecksumMismatch(offset);
  }
  if (landing_ != nullptr) {
    RETURN_IF_ERROR(landing_->Land(offset, length, ChunkName(offset)));
  }
  sequence_.Advance(length);
  if (on_chunk_) on_chunk_(length);
  return absl::OkStatus();
}

absl::Status ShardAssembler::ChecksumMismatch(int64_t offset) const {
  if (ChecksumFailureObserver observer =
          checksum_failure_observer.load(std::memory_order_relaxed)) {
    observer();
  }
  return absl::DataLossError(
      absl::StrCat(ChunkName(offset), ": checksum mismatch"));
}

bool ShardAssembler::WriteAndVerify(const ParsedChunk& chunk, char* out) {
  Checksum64Stream state;
  for (absl::string_view view : chunk.data) {
    while (!view.empty()) {
      const size_t piece = std::min(view.size(), kHashCopyPieceBytes);
      state.Update(view.data(), piece);
      std::memcpy(out, view.data(), piece);
      out += piece;
      view.remove_prefix(piece);
    }
  }
  return state.Digest() == chunk.checksum;
}

absl::Status ShardAssembler::Finish() {
  if (!metadata_.has_value()) {
    return absl::DataLossError(
        absl::StrCat(ShardName(), ": stream ended without a header"));
  }
  RETURN_IF_ERROR(sequence_.CheckComplete(ShardName()));
  if (landing_ != nullptr) return landing_->Synchronize(ShardName());
  if (staging_.defined()) return CopyInto(staging_, destination_);
  return absl::OkStatus();
}

}  // namespace tessera
