// ShardClient: fetches shards from one shard server (one gRPC channel).
//
// FetchShardInto streams a shard's bytes straight into a caller-provided
// tensor (any strides, CPU or CUDA): every chunk's XXH3 checksum and offset
// are verified before its bytes are written at that offset. Every call has
// a deadline (FetchOptions::timeout); a dead or stalled peer gives
// UNAVAILABLE or DEADLINE_EXCEEDED, never a hang.
//
// FetchRegionInto fetches only a box of a shard (the server sends just
// those bytes), over either transport.
//
// When the owner runs on this host (it publishes a local address), a fetch
// first tries the local path (client/local_fetch.h): the owner lends the
// shard's memory and the box is copied straight out of it, no socket
// carrying bytes. FetchOptions::local_path says whether it may (kAuto:
// falling back to the stream on any failure of the path), must not (kOff)
// or must (kRequired) be taken.
//
// Errors: NOT_FOUND for an unknown tensor or shard (as the server says),
// DATA_LOSS for a checksum or framing mismatch (the destination may then
// hold partial or corrupt bytes), INVALID_ARGUMENT when the destination does
// not match the shard's (or the region's) dtype and sizes, or the region
// does not have the shard's rank; OUT_OF_RANGE for a region that leaves
// the shard.
//
// Thread-safety: a ShardClient is safe to use from many threads at once;
// calls share the channel (HTTP/2 multiplexes them). A ShardAssembler
// belongs to one stream and is not thread-safe.
#ifndef TESSERA_CLIENT_SHARD_CLIENT_H_
#define TESSERA_CLIENT_SHARD_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/socket_io.h"
#include "common/device.h"
#include "common/shard_metadata.h"
#include "common/sharded_tensor_metadata.h"
#include "common/tensor.h"
#include "google/protobuf/message_lite.h"
#include "grpcpp/channel.h"
#include "grpcpp/support/byte_buffer.h"
#include "tessera/v1/shard.grpc.pb.h"
#include "tessera/v1/shard.pb.h"

namespace tessera {

class LocalFetcher;

namespace internal_shard_client {
// A received ShardChunk whose payload still lies in the message's slices.
struct ParsedChunk;
// Host -> device copies of verified chunks into a CUDA destination.
class DeviceLanding;
}  // namespace internal_shard_client

// Whether a fetch may take the same-host fast path (docs/data_plane.md,
// "The local path"): mapping the owner's memory instead of receiving its
// bytes over a socket.
enum class LocalPath {
  // Taken when the owner publishes a local address of this host, unless
  // the fetch is known to be smaller than FetchOptions::local_min_bytes;
  // any local failure (no such socket, memory that cannot be shared, a
  // mapping or CUDA IPC failure) silently falls back to the stream.
  kAuto,
  // Never taken.
  kOff,
  // Taken or the fetch fails with FAILED_PRECONDITION saying why (tests and
  // benchmarks use it to prove the fast path was taken).
  kRequired,
};

// The default of FetchOptions::local_min_bytes: below this many bytes
// (known from the destination) a kAuto fetch takes the stream, as the
// local path's fixed cost (a descriptor or handle lent and given back, one
// more message) is more than a small stream's whole time. Measured with
// tests/bench/client_bench (4 daemons on one 2-vCPU host), p50 of a box
// read, local path / data plane: 4 KiB 156 / 47 us, 64 KiB 165 / 70 us,
// 1 MiB 284 / 538 us.
inline constexpr int64_t kLocalPathMinBytes = 256 << 10;

struct FetchOptions {
  // Largest chunk the server should send; 0 = the server's default.
  int64_t chunk_bytes = 0;
  // Deadline of the whole call.
  absl::Duration timeout = absl::Seconds(60);
  // Where a fetched shard is allocated (FetchShard only).
  Device device = Device::Cpu();
  bool pin_memory = false;
  // Called on the fetching thread after each chunk was verified and
  // written, with its size in bytes (once, with all of them, when the
  // bytes came over the local path). Keep it cheap.
  std::function<void(int64_t bytes)> on_chunk;
  LocalPath local_path = LocalPath::kAuto;
  // kAuto takes the stream for a destination smaller than this.
  int64_t local_min_bytes = kLocalPathMinBytes;
};

struct TensorDescription {
  ShardedTensorMetadata metadata;
  std::vector<int64_t> local_shard_indices;
};

// Receives one FetchShard stream into a tensor: the verification and
// placement logic of ShardClient, separate from the transport so that it
// can be tested with hand-made chunks.
//
// Messages are parsed from their wire bytes without copying the payload,
// which is then written at its offset in one pass (hashing as it goes):
// straight into the destination when it is contiguous host memory,
// otherwise into a contiguous host staging buffer (pinned for a CUDA
// destination). For a contiguous CUDA destination, each chunk's bytes are
// copied host -> device as soon as the chunk is verified (cudaMemcpyAsync
// on a stream of the destination's device, after the work already queued
// on its legacy default stream), so that the copy overlaps receiving the
// next chunk; Finish() waits for those copies and reports their CUDA
// errors. Other (strided) destinations get the staging buffer's bytes in
// one copy in Finish(). Destroying an assembler waits for its copies in
// flight, so an abandoned stream never leaves a copy reading freed memory.
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
  // mismatch) and advances.
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
  absl::Status Verify(int64_t offset, int64_t length, uint64_t checksum);
  int64_t received_bytes() const { return received_bytes_; }
  int64_t total_bytes() const { return total_bytes_; }

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

 private:
  using ParsedChunk = internal_shard_client::ParsedChunk;

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
  absl::Status CheckPlacement(int64_t offset, int64_t size) const;
  // Writes the payload at its offset; false on a checksum mismatch.
  bool WriteAndVerify(const ParsedChunk& chunk);
  // "chunk at offset 4096 of shard 3 of tensor t"
  std::string ChunkName(int64_t offset) const;
  // "shard 3 of tensor t"
  std::string ShardName() const;

  std::string tensor_id_;
  int64_t shard_index_;
  std::string name_;
  // The expected region (ExpectRegion), when fetching one.
  std::optional<std::vector<int64_t>> region_offsets_;
  std::vector<int64_t> region_sizes_;
  std::function<void(int64_t)> on_chunk_;
  Tensor destination_;
  // For an allocating assembler: where to allocate.
  std::optional<TensorOptions> allocate_;
  // Defined when chunks cannot be written into the destination directly.
  Tensor staging_;
  // Set for a contiguous CUDA destination: lands each verified chunk of
  // staging_ in it.
  std::unique_ptr<internal_shard_client::DeviceLanding> landing_;
  char* write_base_ = nullptr;
  std::optional<ShardMetadata> metadata_;
  int64_t total_bytes_ = 0;
  int64_t received_bytes_ = 0;
};

class ShardClient {
 public:
  // A client for the server at `address` ("host:port"). Connecting is lazy:
  // an unreachable server shows up as UNAVAILABLE on the first call.
  // With a `bulk_address` (the server's raw data plane, see
  // docs/data_plane.md), shards are fetched over it; gRPC still carries
  // DescribeTensor. Data-plane connections are pooled, one per concurrent
  // fetch, and dropped after any error. With a `local_address` (the
  // server's local share server, "<host id>/<socket name>") that names
  // this host, fetches first try the local path (FetchOptions::local_path;
  // see local_fetch.h); an address of another host is ignored.
  static std::shared_ptr<ShardClient> Create(const std::string& address,
                                             std::string bulk_address = "",
                                             std::string local_address = "");
  explicit ShardClient(std::shared_ptr<grpc::Channel> channel,
                       std::string bulk_address = "",
                       std::string local_address = "");
  ~ShardClient();

  // Fetches shard `shard_index` of `tensor_id` into a new tensor on
  // options.device; returns it with its metadata.
  absl::StatusOr<Shard> FetchShard(absl::string_view tensor_id,
                                   int64_t shard_index,
                                   const FetchOptions& options = {}) const;
  // Fetches into `destination` (a view that is written in place).
  absl::Status FetchShardInto(absl::string_view tensor_id, int64_t shard_index,
                              const Tensor& destination,
                              const FetchOptions& options = {}) const;
  // Fetches the box of the shard at `region_offsets` (relative to the
  // shard's own offsets) with destination's sizes into `destination` (a
  // view of any strides, CPU or CUDA, written in place). Only the box's
  // bytes cross the network. An empty region_offsets with a destination of
  // the shard's rank 0 fetches a 0-d shard.
  absl::Status FetchRegionInto(absl::string_view tensor_id, int64_t shard_index,
                               absl::Span<const int64_t> region_offsets,
                               const Tensor& destination,
                               const FetchOptions& options = {}) const;
  absl::StatusOr<TensorDescription> DescribeTensor(
      absl::string_view tensor_id,
      absl::Duration timeout = absl::Seconds(10)) const;

 private:
  // Runs one fetch: over the local path when options allow and it can be
  // taken, else over the data plane when there is one, else over gRPC,
  // feeding every chunk to `assembler`.
  absl::Status Fetch(const v1::FetchShardRequest& request,
                     const FetchOptions& options,
                     ShardAssembler* assembler) const;
  // The stream part of Fetch.
  absl::Status FetchStream(const v1::FetchShardRequest& request,
                           const FetchOptions& options,
                           ShardAssembler* assembler) const;
  // One FetchShard call over gRPC.
  absl::Status Stream(const v1::FetchShardRequest& request,
                      const FetchOptions& options,
                      ShardAssembler* assembler) const;
  // The same over the raw data plane.
  absl::Status BulkStream(const v1::FetchShardRequest& request,
                          const FetchOptions& options,
                          ShardAssembler* assembler) const;
  absl::Status ReceiveChunks(int fd, absl::Time deadline,
                             ShardAssembler* assembler) const;
  // An idle pooled connection when `reuse` and there is one, else a new one.
  absl::StatusOr<Socket> TakeConnection(absl::Time deadline, bool reuse) const;
  void ReturnConnection(Socket socket) const;
  void DropIdleConnections() const;

  std::shared_ptr<grpc::Channel> channel_;
  std::string bulk_address_;
  // Null without a local address.
  std::unique_ptr<LocalFetcher> local_;
  mutable absl::Mutex pool_mu_;
  mutable std::vector<Socket> idle_ ABSL_GUARDED_BY(pool_mu_);
  std::unique_ptr<v1::ShardService::Stub> stub_;
};

// A channel to a Tessera daemon or shard server that accepts any chunk a
// server sends (larger than gRPC's default 4 MiB receive limit).
std::shared_ptr<grpc::Channel> NewShardChannel(const std::string& address);

// Runs one server-streaming call of `method` (such as
// "/tessera.v1.ControlService/Gather") whose responses are ShardChunk
// messages, read raw for ShardAssembler's zero-copy parse: feeds every
// message to `assembler`, then calls its Finish(). Bounded by `deadline`.
// The call's own errors (UNAVAILABLE, DEADLINE_EXCEEDED, the server's
// status) are annotated with `what`; the assembler's (DATA_LOSS,
// INVALID_ARGUMENT) are returned as they are, after cancelling the call.
// Thread-safe (the channel is shared; the call is the caller's).
absl::Status ReceiveChunkStream(const std::shared_ptr<grpc::Channel>& channel,
                                const std::string& method,
                                const google::protobuf::MessageLite& request,
                                absl::Time deadline, absl::string_view what,
                                ShardAssembler* assembler);

}  // namespace tessera

#endif  // TESSERA_CLIENT_SHARD_CLIENT_H_
