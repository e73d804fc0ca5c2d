// Region reads and writes of named tensors on a daemon: the bodies of
// ControlService.ReadRegion and WriteRegion (proto/tessera/v1/control.proto).
//
// The daemon that receives a call serves the part of the region its own
// shards hold from its ShardRegistry and moves the rest to or from the
// shards' owners: a read fetches each remote overlap with
// ShardClient::FetchRegionInto (only those bytes cross the network), a
// write forwards each remote overlap to its owner's WriteRegion, pinned to
// the tensor id it resolved, so the owner writes it locally. Remote
// transfers run in parallel, bounded by the call's deadline (capped at
// RegionEnv::max_call_time).
//
// Errors (as gRPC codes): NOT_FOUND for an unknown name (as `resolve`
// says); FAILED_PRECONDITION when the request pins a tensor id the name no
// longer has, or when the tensor was resharded or re-created while a read's
// pieces moved (its old shards are gone: a read never mixes two layouts);
// INVALID_ARGUMENT for a region of the wrong rank, negative
// offsets or sizes, a dtype other than the tensor's, or a malformed write
// stream (no header, a repeated header, offsets that do not continue, more
// or fewer bytes than total_bytes); OUT_OF_RANGE for a region outside the
// tensor; RESOURCE_EXHAUSTED for a region larger than max_region_bytes or
// than what is left of the daemon's memory budget, naming the call, the
// tensor, the region and the bytes asked and left (see Staging);
// DATA_LOSS for a chunk whose checksum does not match; the owners' errors
// (UNAVAILABLE, DEADLINE_EXCEEDED...) annotated with the shard and owner.
// Sizes are checked before anything is allocated; nothing here aborts the
// daemon on bad input.
//
// Staging: a call reserves what it will stage in the daemon's memory
// budget before it allocates anything (a write: at its header, before any
// data arrives), and gives it back when it is done (a read once its stream
// ends, a write once applied): the region itself, plus a contiguous buffer
// for each piece that is strided within the region and moves to or from
// another daemon (a read lands it there before copying it into the region;
// a write packs it there once for all its holders), so at most twice the
// region. Nothing else a call allocates grows with the region, so
// concurrent calls never stage more than the budget: one that does not fit
// is refused whole, and the others go on.
//
// A write is applied only once all of it arrived and verified; a write
// that fails while applying may have written some shards (as
// client/client.h says). There is no isolation between concurrent writes and
// reads of overlapping boxes.
//
// Thread-safety: every function may be called concurrently.
#ifndef TESSERA_SERVER_DAEMON_REGION_IO_H_
#define TESSERA_SERVER_DAEMON_REGION_IO_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/shard_metadata.h"
#include "common/sharded_tensor_metadata.h"
#include "common/tensor/tensor.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/server_callback.h"
#include "server/daemon/memory_budget.h"
#include "server/daemon/refill.h"
#include "server/rank/rank.h"
#include "server/serve/shard_service.h"
#include "tessera/v1/control.pb.h"

namespace tessera {

// What region calls need from their daemon.
struct RegionEnv {
  // The daemon's rank, with RPC initialised: its registry holds the local
  // shards; Worker(r) / ClientFor(r) reach the owners.
  std::shared_ptr<Rank> rank;
  // The daemon's named-tensor table: the TensorInfo of `name`, or NOT_FOUND.
  std::function<absl::StatusOr<v1::TensorInfo>(const std::string& name)>
      resolve;
  // Largest region one call may read or write: the daemon holds it in
  // memory while it moves.
  int64_t max_region_bytes = int64_t{8} << 30;
  // Longest a call may take when its own deadline is later (or unset).
  absl::Duration max_call_time = absl::Minutes(10);
  // Owners a call transfers to or from at once.
  int parallelism = 16;
  // The daemon's memory budget: every staging buffer of a call is reserved
  // in it (RESOURCE_EXHAUSTED beyond; see Staging above); null: no budget.
  std::shared_ptr<MemoryBudget> budget;
  // The refill in progress of the tensor with this id on this daemon
  // (refill.h), or null: writes to shards it refills go into it.
  std::function<std::shared_ptr<Refill>(const std::string& tensor_id)>
      refilling;
  // Marks the copies of `tensor_id` on `ranks` stale (they missed a piece
  // of a write another holder took: stale_copies.h) and returns after the
  // fence; null: they are not marked, and such a write fails.
  std::function<absl::Status(const std::string& tensor_id,
                             const std::vector<int>& ranks,
                             absl::Time deadline)>
      mark_stale;
};

// Fills `destination` (the box's sizes, any strides, CPU or CUDA; written
// in place) with the box at global `box` offsets of the tensor `info` (as
// the daemon's table holds it, laid out as `metadata`), for a daemon that
// needs the bytes itself: ReadRegion's stream, Reshard's new shards and
// copies (server/daemon/control_ops.h). A piece whose shard, or a copy of
// it, is registered on this daemon under info.tensor_id() is copied; any
// other is fetched from its holders in turn, the owner then each replica
// (ShardClient::FetchRegionInto; UNAVAILABLE, DEADLINE_EXCEEDED and
// NOT_FOUND move on to the next holder), each try with an even share of
// the time left until `deadline`; at most `parallelism` pieces at once.
// Errors name `op`, the tensor, the shard and the holder; a piece may have
// been written when another failed. Allocates nothing but the staging of
// strided remote pieces (BoxStagingBytes), which the caller reserves.
absl::Status ReadBoxInto(const Rank& rank, const v1::TensorInfo& info,
                         const ShardedTensorMetadata& metadata,
                         const ShardMetadata& box, const Tensor& destination,
                         int parallelism, absl::Time deadline,
                         absl::string_view op);

// The bytes ReadBoxInto of `box` stages besides its destination: each
// piece that is strided within the box and that no shard or copy
// registered on this daemon holds lands in a contiguous buffer of its own
// before it is copied into place. At most the box's size.
int64_t BoxStagingBytes(const Rank& rank, const v1::TensorInfo& info,
                        const ShardedTensorMetadata& metadata,
                        const ShardMetadata& box);

// Reads the region of `request` into a new contiguous host tensor,
// returned ready to stream (NewChunkStreamReactor): the header's metadata
// is the region (offsets and sizes in the tensor, placed on this rank's
// CPU). Blocks until every remote overlap arrived, or `deadline`.
absl::StatusOr<PreparedFetch> PrepareRegionRead(
    const RegionEnv& env, const v1::ReadRegionRequest& request,
    absl::Time deadline);

// The whole ReadRegion call for a raw callback method: parses `request` (a
// serialized ReadRegionRequest; INVALID_ARGUMENT when malformed), runs
// PrepareRegionRead off gRPC's threads (NewDeferredChunkStream) under the
// call's deadline, and streams the result in chunks of
// ChunkBytesFor(chunks, request.chunk_bytes).
grpc::ServerWriteReactor<grpc::ByteBuffer>* StartReadRegion(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    RegionEnv env, const ShardServiceOptions& chunks);

// The whole WriteRegion call: returns the reactor (owned by gRPC) that
// receives the header and the chunks, then applies the write on a thread
// of its own and finishes the call with response->bytes_written set.
grpc::ServerReadReactor<v1::WriteRegionChunk>* StartWriteRegion(
    grpc::CallbackServerContext* context, v1::WriteRegionResponse* response,
    RegionEnv env);

}  // namespace tessera

#endif  // TESSERA_SERVER_DAEMON_REGION_IO_H_
