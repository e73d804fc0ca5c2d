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
// Lanes: over the data plane, a large box (of a fetch or a write) is cut
// into parts moved over several connections at once, each landing in
// place (client/lanes.h; FetchOptions::lanes, RegionWriteOptions::lanes,
// the client's default from Create). A versioned tensor read by its own id
// is read at one version across the lanes: parts that got an older
// version than another part are read again at the newest one.
//
// When the owner runs on this host (it publishes a local address), a fetch
// first tries the local path (client/local_path.h): the owner lends the
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
#include "client/region_transfer.h"
#include "common/cancellation.h"
#include "common/device.h"
#include "common/shard_metadata.h"
#include "common/sharded_tensor_metadata.h"
#include "common/tensor/tensor.h"
#include "google/protobuf/message_lite.h"
#include "grpcpp/channel.h"
#include "grpcpp/support/byte_buffer.h"
#include "io/socket.h"
#include "tessera/v1/shard.grpc.pb.h"
#include "tessera/v1/shard.pb.h"
#include "wire/chunk_assembler.h"
#include "wire/data_connection.h"

namespace tessera {

class LocalPathClient;

// Whether a fetch may take the local path (docs/data_plane.md,
// "The local path"): mapping the owner's memory instead of receiving its
// bytes over a socket.
enum class LocalPath {
  // Taken when the owner publishes a local address of this host, unless
  // the shard is known to be smaller than FetchOptions::local_min_bytes;
  // any local failure (no such socket, memory that cannot be shared, a
  // mapping or CUDA IPC failure) silently falls back to the stream.
  kAuto,
  // Never taken.
  kOff,
  // Taken or the fetch fails with FAILED_PRECONDITION saying why (tests and
  // benchmarks use it to prove the local path was taken).
  kRequired,
};

// The bytes of shard `shard` of a tensor described by `metadata` (its
// elements times its dtype's width) when it is placed in host memory, for
// FetchOptions::shard_bytes; -1 when the metadata does not say (no such
// shard, an unknown dtype, more bytes than an int64_t holds) and for a
// shard on a GPU, whose boxes stay judged by their own size (its owner
// lends a CUDA IPC handle, which each read opens and closes: not worth it
// for a small box).
int64_t HostShardBytes(const v1::ShardedTensorMetadata& metadata, size_t shard);

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
  // When set, Cancel() ends the fetch at once with CANCELLED, also while
  // it waits on the owner (the socket or RPC is interrupted); the
  // destination then holds part of the bytes.
  std::shared_ptr<Cancellation> cancel;
  LocalPath local_path = LocalPath::kAuto;
  // When set, receives the published version the owner served
  // (ShardHeader.version: 0 for an unversioned tensor).
  int64_t* served_version = nullptr;
  // kAuto takes the stream for a shard smaller than this (owners lend
  // none: kLocalPathMinBytes, client/region_transfer.h), judged by
  // shard_bytes when it is known,
  // else by the destination (an allocating fetch's is the shard).
  int64_t local_min_bytes = kLocalPathMinBytes;
  // The whole shard's bytes when the caller knows them and the shard is in
  // host memory (HostShardBytes of its metadata); -1 when not.
  int64_t shard_bytes = -1;
  // Data-plane connections a large fetch is striped across at most
  // (client/lanes.h: LaneCount); 0: the client's default. 1 never stripes.
  int lanes = 0;
};

struct TensorDescription {
  ShardedTensorMetadata metadata;
  std::vector<int64_t> local_shard_indices;
};

class ShardClient {
 public:
  // A client for the server at `address` ("host:port"). Connecting is lazy:
  // an unreachable server shows up as UNAVAILABLE on the first call.
  // With a `data_plane_address` (the server's raw data plane, see
  // docs/data_plane.md), shards are fetched over it; gRPC still carries
  // DescribeTensor. Data-plane connections are pooled, one per concurrent
  // fetch, and dropped after any error. With a `local_address` (the
  // server's local path server, "<host id>/<socket name>") that names
  // this host, fetches first try the local path (FetchOptions::local_path;
  // see local_path.h); an address of another host is ignored. `lanes` is
  // the most data-plane connections a large transfer is striped across
  // when its options ask for no count (0: kDefaultDataLanes, 1: never).
  static std::shared_ptr<ShardClient> Create(
      const std::string& address, std::string data_plane_address = "",
      std::string local_address = "", int lanes = 0);
  explicit ShardClient(std::shared_ptr<grpc::Channel> channel,
                       std::string data_plane_address = "",
                       std::string local_address = "", int lanes = 0);
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
  // Writes `data` (the shard's dtype, any strides; on the CPU, or CUDA,
  // staged through host memory) as the box at `region_offsets` (relative
  // to the shard) of shard `shard_index` of `tensor_id`, or of the
  // server's replica of it with options.replica, over the data plane:
  // the server receives the bytes straight into the shard's memory.
  // Returns false, with nothing written, when this client knows no data
  // plane or the server cannot take this write there (a shard on a GPU, a
  // box that is no dense run of the shard, a tensor id not registered
  // there: it may be refilling); write through ControlService.WriteRegion
  // then (client/region_transfer.h). Errors: the server's
  // (INVALID_ARGUMENT, OUT_OF_RANGE, UNAUTHENTICATED, PERMISSION_DENIED,
  // DATA_LOSS for a chunk changed on its way) or the connection's
  // (UNAVAILABLE, DEADLINE_EXCEEDED at options.deadline, CANCELLED). A
  // write that fails once its first chunk left may have changed any byte of
  // the box (the message says "may be partly written"; docs/data_plane.md).
  absl::StatusOr<bool> WriteRegion(absl::string_view tensor_id,
                                   int64_t shard_index,
                                   absl::Span<const int64_t> region_offsets,
                                   const Tensor& data,
                                   const RegionWriteOptions& options) const;
  // One box of FetchRegionsPipelined: FetchRegionInto's arguments, with
  // where the version served goes (when not null).
  struct RegionFetch {
    std::string tensor_id;
    int64_t shard_index = 0;
    std::vector<int64_t> region_offsets;
    Tensor destination;
    int64_t* served_version = nullptr;
  };
  // The most boxes one FetchRegionsPipelined call sends at once: their
  // requests (a few hundred bytes each) always fit the server's receive
  // buffer, so sending them never waits on answers not yet read.
  static constexpr size_t kMaxPipelinedFetches = 64;
  // Fetches small boxes over one data-plane connection, every request sent
  // before any answer is read: one round trip for all of them instead of
  // one each (a read plan's pieces of small shards, which never take the
  // local path). At most kMaxPipelinedFetches boxes (INVALID_ARGUMENT for
  // every box beyond). Returns one status per box: OK when its bytes are
  // in its destination; else the server's verdict on it, or UNAVAILABLE
  // when it was not answered because the connection failed first (the
  // destination may then be partly written). Callers fetch every box that
  // is not OK on their own (FetchRegionInto), which tells a stalled or
  // restarted daemon from a refused box. FAILED_PRECONDITION for every box
  // when this client knows no data plane. Bounded by options.timeout and
  // options.cancel; options.local_path, lanes and on_chunk do not apply.
  std::vector<absl::Status> FetchRegionsPipelined(
      absl::Span<const RegionFetch> boxes, const FetchOptions& options) const;
  // Whether fetches go over the data plane (else gRPC).
  bool has_data_plane() const { return !data_plane_address_.empty(); }
  // Whether fetches may take the local path (the owner runs on this host).
  bool same_host() const;
  absl::StatusOr<TensorDescription> DescribeTensor(
      absl::string_view tensor_id,
      absl::Duration timeout = absl::Seconds(10)) const;
  // Over the data plane: the digest (wire/message_digest.h) of what the
  // daemon's ControlService.DescribeTensor would answer for the tensor
  // `name` now (a DescribeDigestRequest on a pooled connection).
  // FAILED_PRECONDITION when this client knows no data plane; the server's
  // errors (NOT_FOUND, UNIMPLEMENTED from a server that is no daemon,
  // UNAVAILABLE while it is not serving, UNAUTHENTICATED...) or the
  // connection's (UNAVAILABLE, DEADLINE_EXCEEDED at `deadline`).
  absl::StatusOr<uint64_t> DescribeDigest(const std::string& name,
                                          absl::Time deadline) const;

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
  absl::Status DataPlaneStream(const v1::FetchShardRequest& request,
                               const FetchOptions& options,
                               ShardAssembler* assembler) const;
  absl::Status ReceiveChunks(DataConnection& stream, absl::Time deadline,
                             ShardAssembler* assembler) const;
  // The lanes a fetch of `bytes` with `options` takes: 1 unless it goes
  // over the data plane (no local path taken) and is large enough.
  int FetchLanes(const FetchOptions& options, int64_t bytes) const;
  // LaneCount of `bytes` with the count `asked` (0: this client's).
  int LanesFor(int64_t bytes, int asked) const;
  // A data-plane fetch of the box at `region_offsets` into `destination`
  // striped across `lanes` connections; the version read (the same for
  // every part) in *version, the shard's metadata in *metadata.
  absl::Status FetchStriped(absl::string_view tensor_id, int64_t shard_index,
                            absl::Span<const int64_t> region_offsets,
                            const Tensor& destination,
                            const FetchOptions& options, int lanes,
                            int64_t* version,
                            std::optional<ShardMetadata>* metadata) const;
  // One data-plane write of `request` (a framed BulkWriteRequest) whose
  // bytes are the `total` at `base`: false when the server asks for gRPC
  // (nothing written). *started says whether bytes began to land. When
  // set, `go_ahead` is asked once the server gave its go-ahead, before any
  // byte is sent: false sends nothing (ABORTED; the connection is closed).
  absl::StatusOr<bool> WriteStream(const v1::DataPlaneRequest& request,
                                   const char* base, int64_t total,
                                   const RegionWriteOptions& options,
                                   const std::string& what, bool* started,
                                   const std::function<bool()>& go_ahead) const;
  // An idle pooled connection when `reuse` and there is one, else a new one
  // (over TLS, with the process token, when this process has them);
  // cancelling `cancel` interrupts a new one's handshake.
  absl::StatusOr<DataConnection> TakeConnection(
      absl::Time deadline, bool reuse,
      const std::shared_ptr<Cancellation>& cancel) const;
  void ReturnConnection(DataConnection socket) const;
  // A data-plane connection and the reply frame to one request on it;
  // while it lives, cancelling interrupts every wait on the connection.
  struct Exchange {
    DataConnection connection;
    Cancellation::Registration interrupt;
    std::string reply;
  };
  // Sends the request `frame` over a pooled connection (or a new one) and
  // reads the reply frame; a pooled connection the server closed while
  // idle is replaced once by a fresh one, and the idle pool dropped.
  absl::StatusOr<Exchange> Request(
      const std::string& frame, absl::Time deadline,
      const std::shared_ptr<Cancellation>& cancel) const;
  // Ends the exchange's registration and pools its connection, unless
  // the cancellation was cancelled (its connection may be interrupted).
  void Release(Exchange exchange,
               const std::shared_ptr<Cancellation>& cancel) const;
  void DropIdleConnections() const;

  std::shared_ptr<grpc::Channel> channel_;
  std::string data_plane_address_;
  // Null without a local address.
  std::unique_ptr<LocalPathClient> local_;
  mutable absl::Mutex pool_mu_;
  mutable std::vector<DataConnection> idle_ ABSL_GUARDED_BY(pool_mu_);
  const int lanes_;
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
// `request_id`, when not empty, goes in the call's metadata
// (wire/request_id.h). Thread-safe (the channel is shared; the call is the
// caller's).
absl::Status ReceiveChunkStream(const std::shared_ptr<grpc::Channel>& channel,
                                const std::string& method,
                                const google::protobuf::MessageLite& request,
                                absl::Time deadline, absl::string_view what,
                                ShardAssembler* assembler,
                                const std::string& request_id = "");

// Reads by a version's number return published versions only: a holder
// serves a version open there under the same id (its writers read it),
// and one whose publish it is still applying (for a moment). While
// `unpublished()` holds, waits a growing pause (2 ms to 100 ms) and calls
// `again` (which reads those pieces again), for a second at most and not
// past `deadline`: OK once it no longer holds, again's error, or
// FAILED_PRECONDITION "<what>: version <number> is not published (still
// open, or aborted) ...".
absl::Status AwaitPublished(absl::Time deadline, absl::string_view what,
                            int64_t number,
                            const std::function<bool()>& unpublished,
                            const std::function<absl::Status()>& again);

}  // namespace tessera

#endif  // TESSERA_CLIENT_SHARD_CLIENT_H_
