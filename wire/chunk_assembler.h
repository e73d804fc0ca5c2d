// ShardAssembler: receives one chunk stream into a tensor, the receiving
// half of every transport (gRPC ShardChunk streams, the data plane, the
// local path), separate from the transports so that it can be tested with
// hand-made chunks. ChunkSequence: the order, size and checksum checks of
// a chunked byte stream, shared by ShardAssembler and the daemons'
// WriteRegion receiver (server/daemon/region_io.cc).
#ifndef TESSERA_WIRE_CHUNK_ASSEMBLER_H_
#define TESSERA_WIRE_CHUNK_ASSEMBLER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/cancellation.h"
#include "common/device.h"
#include "common/shard_metadata.h"
#include "common/tensor/tensor.h"
#include "grpcpp/support/byte_buffer.h"
#include "tessera/v1/shard.pb.h"
#include "wire/chunk_codec.h"

namespace tessera {

namespace internal_chunk_assembler {
// Host -> device copies of verified chunks into a CUDA destination.
class DeviceLanding;
}  // namespace internal_chunk_assembler

// Called, from the receiving thread, each time a ShardAssembler finds a
// chunk whose bytes do not match their checksum: the daemon counts those
// it received as a client of other daemons
// (tessera_received_checksum_failures_total). Process-wide; null (the
// default) calls nothing. Set it once, before any stream.
using ChecksumFailureObserver = void (*)();
void SetChecksumFailureObserver(ChecksumFailureObserver observer);

// The checks every receiver of a chunked byte stream makes: chunks come
// contiguous and in order, none runs past the announced total, each
// matches its XXH3-64, and the stream ends with exactly the total. Errors
// carry `code` (DATA_LOSS where a server's stream is checked: the bytes
// were lost in transit; INVALID_ARGUMENT where a client's upload is: the
// request is malformed) and name the chunk with `name(offset)` and the
// whole as "the <unit>'s" ("shard", "region"). Not thread-safe.
class ChunkSequence {
 public:
  ChunkSequence(absl::StatusCode code, std::string unit)
      : code_(code), unit_(std::move(unit)) {}

  void Start(int64_t total_bytes) {
    total_bytes_ = total_bytes;
    received_bytes_ = 0;
  }
  // A chunk of `size` bytes at `offset` continues the stream and fits.
  absl::Status CheckNext(int64_t offset, int64_t size,
                         absl::string_view chunk_name) const;
  // A mismatch is DATA_LOSS "<chunk_name>: checksum mismatch" whatever the
  // code: the bytes changed on their way.
  static absl::Status CheckChecksum(uint64_t actual, uint64_t expected,
                                    absl::string_view chunk_name);
  void Advance(int64_t size) { received_bytes_ += size; }
  // Exactly the total arrived: "<stream_name>: the stream ended after X of
  // Y bytes" otherwise.
  absl::Status CheckComplete(absl::string_view stream_name) const;

  int64_t received_bytes() const { return received_bytes_; }
  int64_t total_bytes() const { return total_bytes_; }
  // Received bytes and total set at once (a stream taken whole).
  void Complete(int64_t total_bytes) {
    total_bytes_ = received_bytes_ = total_bytes;
  }

 private:
  absl::StatusCode code_;
  std::string unit_;
  int64_t total_bytes_ = 0;
  int64_t received_bytes_ = 0;
};

// Receives one FetchShard stream into a tensor: the verification and
// placement logic of ShardClient, separate from the transport so that it
// can be tested with hand-made chunks.
//
// Messages are parsed from their wire bytes without copying the payload,
// which is then written at its offset in one pass (hashing as it goes):
// straight into the destination when it is contiguous host memory,
// otherwise into a contiguous host staging buffer. A contiguous CUDA
// destination needs no staging buffer of the shard's size: each chunk is
// received into one of a few pinned, chunk-sized slots and copied host ->
// device as soon as it is verified (cudaMemcpyAsync on a stream of the
// destination's device, after the work already queued on its legacy
// default stream), so that the copy overlaps receiving the next chunks; a
// slot is reused once its copy is done. Finish() waits for those copies
// and reports their CUDA errors. Other (strided) destinations, CUDA ones
// through a pinned buffer, get the staging buffer's bytes in one copy in
// Finish(). Destroying an assembler waits for its copies in flight, so an
// abandoned stream never leaves a copy reading freed memory.
class ShardAssembler {
 public:
  // Writes into `destination`, a view of any strides on the CPU or CUDA.
  ShardAssembler(absl::string_view tensor_id, int64_t shard_index,
                 Tensor destination);
  // Allocates the destination from the header's dtype and sizes.
  ShardAssembler(absl::string_view tensor_id, int64_t shard_index,
                 Device device, bool pin_memory);
  ~ShardAssembler();

  // Expects the stream of a region fetch: the header's sizes must be
  // `sizes` and the box must lie inside the shard its metadata describes
  // (DATA_LOSS otherwise). Call before the first chunk.
  void ExpectRegion(absl::Span<const int64_t> offsets,
                    absl::Span<const int64_t> sizes);
  // Names the stream in error messages instead of "shard i of tensor t"
  // (e.g. "region [0, 2] of tensor w" for the daemons' ReadRegion).
  void set_name(std::string name) { name_ = std::move(name); }
  // Called after each chunk was verified, with its size in bytes.
  void set_on_chunk(std::function<void(int64_t bytes)> on_chunk) {
    on_chunk_ = std::move(on_chunk);
  }
  // Once `cancel` is cancelled, the next chunk (Consume, Place) is refused
  // with CANCELLED, so that whoever feeds the assembler stops the stream;
  // the feeder registers with cancel() to interrupt its waits.
  void set_cancel(std::shared_ptr<Cancellation> cancel) {
    cancel_ = std::move(cancel);
  }
  const std::shared_ptr<Cancellation>& cancel() const { return cancel_; }
  // CANCELLED "shard 3 of tensor t: cancelled by the caller after N bytes"
  // once the cancellation was cancelled; OK otherwise.
  absl::Status CheckCancel() const;

  // Verifies one serialized ShardChunk and writes its bytes. The first
  // chunk must carry the header: INVALID_ARGUMENT when its dtype or sizes
  // differ from the destination's, DATA_LOSS when it is missing or
  // malformed. DATA_LOSS also for an unparsable message, a second header,
  // an offset that does not continue the previous chunk, data past the
  // header's total_bytes (these three are checked before anything is
  // written), and a checksum mismatch ("chunk at offset X of shard Y of
  // tensor Z: checksum mismatch"; the chunk's bytes have then been written
  // already). After an error, the stream should be abandoned.
  absl::Status Consume(const grpc::ByteBuffer& message);
  // Same, for a chunk already parsed (serializes it first).
  absl::Status Consume(const v1::ShardChunk& chunk);
  // The same checks for the raw data plane, which receives payloads
  // straight into place: Start takes the header; Place checks that a chunk
  // of `length` (> 0) bytes at `offset` continues the stream and fits, and
  // returns where its bytes go; Verify hashes them there (DATA_LOSS on a
  // mismatch) and advances. A `checksum` of nullopt: the bytes came over a
  // channel that authenticates them already (TLS's AEAD record tags,
  // DataConnection::authenticated()), they are not hashed again.
  absl::Status Start(const v1::ShardHeader& header);
  // Instead of chunks, all bytes at once (the local path, which reads the
  // owner's memory where it lies): the header is checked as by Start, then
  // `fill` writes the header's elements into the destination (allocated
  // first when allocating; a view of the header's dtype and sizes, of any
  // strides, on the CPU or CUDA) and the stream counts as complete
  // (Finish() is not needed). DATA_LOSS when the header is malformed;
  // INVALID_ARGUMENT when the destination does not match; fill's errors
  // otherwise. The assembler is unchanged unless this succeeds (the
  // destination may then hold part of the bytes), so a failed attempt can
  // be followed by a stream into the same assembler.
  using Fill = std::function<absl::Status(const Tensor& destination)>;
  absl::Status FillFrom(const v1::ShardHeader& header, const Fill& fill);
  absl::StatusOr<char*> Place(int64_t offset, int64_t length);
  absl::Status Verify(int64_t offset, int64_t length,
                      std::optional<uint64_t> checksum);
  int64_t received_bytes() const { return sequence_.received_bytes(); }
  int64_t total_bytes() const { return sequence_.total_bytes(); }

  // Called once the stream ended: DATA_LOSS unless a header and exactly
  // total_bytes arrived; then completes the copy into the destination
  // (for a CUDA destination: waits for the chunks' device copies; a CUDA
  // error, as from Consume/Verify when a copy cannot be enqueued, is
  // INTERNAL, UNAVAILABLE or RESOURCE_EXHAUSTED with CUDA's description).
  absl::Status Finish();

  // The destination (allocated once the header arrived, when allocating).
  const Tensor& destination() const { return destination_; }
  // The shard's metadata from the header; nullopt before it arrived.
  const std::optional<ShardMetadata>& metadata() const { return metadata_; }
  // The published version the header says the bytes are (ShardHeader.
  // version; 0 before it arrived, and for an unversioned tensor).
  int64_t version() const { return version_; }

 private:
  // A header's fields, checked against the expected region or its own
  // metadata (the validation of Start and FillFrom).
  struct CheckedHeader {
    ShardMetadata metadata;
    DType dtype;
    std::vector<int64_t> sizes;
  };
  absl::StatusOr<CheckedHeader> CheckHeader(
      const v1::ShardHeader& header) const;
  absl::Status StartFromHeader(const ParsedChunk& chunk);
  absl::Status PrepareDestination(DType dtype,
                                  const std::vector<int64_t>& sizes);
  // Where a chunk's bytes are written: at its offset in the destination or
  // the staging buffer, or in the next slot of landing_.
  absl::StatusOr<char*> ChunkTarget(int64_t offset, int64_t length);
  // Writes the payload at `out`; false on a checksum mismatch.
  bool WriteAndVerify(const ParsedChunk& chunk, char* out);
  // DATA_LOSS "<chunk at offset>: checksum mismatch", told to the process's
  // ChecksumFailureObserver first.
  absl::Status ChecksumMismatch(int64_t offset) const;
  // "chunk at offset 4096 of shard 3 of tensor t"
  std::string ChunkName(int64_t offset) const;
  // "shard 3 of tensor t"
  std::string ShardName() const;

  std::string tensor_id_;
  int64_t shard_index_;
  int64_t version_ = 0;
  std::string name_;
  // The expected region (ExpectRegion), when fetching one.
  std::optional<std::vector<int64_t>> region_offsets_;
  std::vector<int64_t> region_sizes_;
  std::function<void(int64_t)> on_chunk_;
  std::shared_ptr<Cancellation> cancel_;
  Tensor destination_;
  // For an allocating assembler: where to allocate.
  std::optional<TensorOptions> allocate_;
  // Defined when chunks cannot be written into the destination directly.
  Tensor staging_;
  // Set for a contiguous CUDA destination (then staging_ is not): receives
  // each chunk in a pinned slot and lands it once verified.
  std::unique_ptr<internal_chunk_assembler::DeviceLanding> landing_;
  // Where chunk bytes go by offset, without landing_.
  char* write_base_ = nullptr;
  // Where Place put the last chunk, for Verify.
  char* placed_ = nullptr;
  std::optional<ShardMetadata> metadata_;
  ChunkSequence sequence_{absl::StatusCode::kDataLoss, "shard"};
};

}  // namespace tessera

#endif  // TESSERA_WIRE_CHUNK_ASSEMBLER_H_
