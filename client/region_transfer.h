// Region transfers: the pieces that both the client library (client.h) and
// the daemons (server/daemon/region_io.h) use to move a box of a named tensor.
//
//  - RunInParallel: runs independent transfers (one per shard overlap), a
//    bounded number at once.
//  - ForEachRegionPiece: the fan-out of every region read and write, on
//    the client and on the daemons: the region's buffer cut into one view
//    per overlapping shard, each handed to a transfer, in parallel.
//  - ProgressCounter: aggregates the bytes of parallel transfers into one
//    serialized (done, total) progress stream.
//  - WriteRegion: the client side of ControlService.WriteRegion: a header,
//    then the box's row-major bytes in chunks, each with its XXH3-64.
//
// Thread-safety: the functions are safe to call concurrently; a
// ProgressCounter is safe to share between the transfers it counts.
#ifndef TESSERA_CLIENT_REGION_TRANSFER_H_
#define TESSERA_CLIENT_REGION_TRANSFER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/cancellation.h"
#include "common/shard_metadata.h"
#include "common/tensor/tensor.h"
#include "tessera/v1/control.grpc.pb.h"

namespace tessera {

// Runs body(0), ..., body(n - 1), at most `parallelism` (at least 1) at
// once, on the calling thread and cached threads (io/thread_cache.h).
// Once a task has failed no new one starts; the call returns when every
// started task has ended, with the error of the lowest-numbered task that
// failed, or OK.
absl::Status RunInParallel(size_t n, int parallelism,
                           const std::function<absl::Status(size_t)>& body);

// One shard's part of a region transfer.
struct RegionPiece {
  // The shard's index in the tensor's layout.
  size_t shard = 0;
  // The part, in the tensor's (global) coordinates.
  const ShardMetadata* box = nullptr;
  // Where the part starts inside the shard.
  std::vector<int64_t> offsets_in_shard;
  // The part of the region's buffer (a view sharing its storage).
  Tensor view;
};

// The fan-out of a region transfer: `data` is the region of a tensor laid
// out as `shards` that starts at global `region_offsets` (its sizes are the
// region's; the caller has checked that it lies inside the tensor). Calls
// `body` once per shard overlapping the region, with that shard's piece, at
// most `parallelism` at once (RunInParallel's rules: the lowest-numbered
// failure wins). Pieces never overlap, so bodies may write their views
// concurrently.
absl::Status ForEachRegionPiece(
    absl::Span<const ShardMetadata> shards,
    absl::Span<const int64_t> region_offsets, const Tensor& data,
    int parallelism,
    const std::function<absl::Status(const RegionPiece&)>& body);

// ForEachRegionPiece for a write to several owners, which is not atomic:
// every piece is tried, even after one failed. `write` writes one piece
// and names its owner in *owner ("rank 2 (HOST:PORT)"), also when it fails.
// OK when every piece was written; otherwise the lowest failing shard's
// code, and a message that names every box not written (with its owner
// and error) and every box written: "writing tensor t: 3 of 4 boxes
// written; not written: [4:6, 0:4] on rank 2 (...): UNAVAILABLE: ...;
// written: [0:2, 0:4] on rank 0 (...), ...". Errors before any piece is
// tried (the region's views) are returned as they are.
absl::Status WriteEveryRegionPiece(
    absl::Span<const ShardMetadata> shards,
    absl::Span<const int64_t> region_offsets, const Tensor& data,
    int parallelism, absl::string_view what,
    const std::function<absl::Status(const RegionPiece&, std::string* owner)>&
        write);

// How WriteToHolders treats holders that did not take a piece another
// holder took.
struct HolderWriteOptions {
  // Marks holders[k] stale for each k in `missed` (they missed the piece:
  // server/daemon/stale_copies.h) and returns once none of them serves
  // the old bytes. Empty: nobody is marked (an open version's copies).
  std::function<absl::Status(const std::vector<size_t>& missed)> mark_stale;
  // With mark_stale: once one holder took the piece, the others get this
  // long, or as long as that one took if longer, before they are given up
  // (cancelled) and marked.
  absl::Duration patience = absl::Seconds(2);
  // The caller's: cancels every holder's write; a cancelled write marks
  // nobody and ends with the holders' CANCELLED.
  std::shared_ptr<Cancellation> cancel;
};

// Writes one piece to every daemon holding its shard (`holders`: its owner,
// then its replicas), in parallel: write(k, cancel, &name) writes to
// holders[k] (stopping when `cancel` is cancelled) and names it. OK when
// every holder wrote it; also when at least one did and those that did not
// are not live (UNAVAILABLE: dead, shutting down; NOT_FOUND: restarted and
// not yet in step: they refill their copies when they rejoin) or, with
// options.mark_stale, were marked stale (any other failure, or no answer
// within the patience). Otherwise the first failure's code, naming every
// holder that failed and every one that wrote (and why marking failed).
// *names lists the holders (written ones, then "not written to ..." for
// skipped or marked ones).
absl::Status WriteToHolders(
    size_t holders, const HolderWriteOptions& options,
    const std::function<
        absl::Status(size_t k, const std::shared_ptr<Cancellation>& cancel,
                     std::string* name)>& write,
    std::string* names);

// "[4:6, 0:4]": a box of global coordinates, as errors name it.
std::string BoxString(const ShardMetadata& box);

// Sums the bytes of concurrent transfers and reports (done, total) to
// `progress` (which may be empty), one call at a time, under a lock: done
// only grows, and never passes total (once known): a piece moved again (a
// read failing over from a stalled holder to a replica, a read taken again
// at a newer version, a write sent again to a restarted holder) counts
// again, so done may reach total before the transfer ends. Keep
// `progress` cheap: transfers wait for it.
class ProgressCounter {
 public:
  ProgressCounter(int64_t total,
                  std::function<void(int64_t done, int64_t total)> progress);
  // For a transfer that learns its size late (a Gather's header).
  void SetTotal(int64_t total);
  void Add(int64_t bytes);
  // Reports (total, total) once more unless that was the last report, so
  // that a completed transfer always ends with done == total (also for
  // zero bytes). Call on success only.
  void Finish();

 private:
  absl::Mutex mu_;
  int64_t done_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t total_ ABSL_GUARDED_BY(mu_);
  bool reported_done_ ABSL_GUARDED_BY(mu_) = false;
  const std::function<void(int64_t, int64_t)> progress_;
};

// Chunks of a WriteRegion stream: the requested size is clamped to
// [kMinWriteChunkBytes, kMaxWriteChunkBytes] (the maximum leaves room for
// the header under gRPC's default 4 MiB receive limit); 0 means
// kDefaultWriteChunkBytes.
inline constexpr int64_t kMinWriteChunkBytes = 4 << 10;
inline constexpr int64_t kDefaultWriteChunkBytes = 1 << 20;
inline constexpr int64_t kMaxWriteChunkBytes = 3 << 20;
int64_t WriteChunkBytesFor(int64_t requested);

// The default of FetchOptions::local_min_bytes and
// RegionWriteOptions::local_min_bytes (both set from the client's
// ClientOptions::local_min_bytes): owners lend no shard smaller than this
// (it is heap memory: kDefaultHostSharingMinBytes,
// common/tensor/storage.h), so a read or write of one takes the data plane
// at once; any box of a larger host shard takes the local path, which is
// quicker at every size since its reads poll before they block
// (io/read_spin.h) and its writes keep their mapping
// (io/mapping_cache.h); a GPU shard's box, by its own size
// (HostShardBytes, client/shard_client.h). Measured with
// tests/bench/client_bench (4 daemons on one 2-vCPU host), p50 local path
// / data plane: reads 4 KiB 15-19 / 30-35 us, 64 KiB 25-30 / 40-52, 1 MiB
// 151-209 / 604-769; writes 4 KiB 19-20 / 22-25, 64 KiB 28-32 / 121-142,
// 1 MiB 147-153 / 622-787.
inline constexpr int64_t kLocalPathMinBytes = 64 << 10;

struct RegionWriteOptions {
  // Largest chunk (see WriteChunkBytesFor).
  int64_t chunk_bytes = 0;
  // Deadline of the call.
  absl::Time deadline = absl::InfiniteFuture();
  // Called after each chunk was handed to gRPC, with its size in bytes.
  std::function<void(int64_t bytes)> on_chunk;
  // Into the daemon's replicas of the shards (WriteRegionHeader.replica).
  bool replica = false;
  // When set, Cancel() ends the write at once (the stream is cancelled,
  // even while it waits on the daemon) with CANCELLED; the daemon applies
  // nothing of an incomplete stream, nor of a complete one it had not
  // begun to apply (a stalled daemon resumed later drops it), and may have
  // applied one whose answer was still awaited (the message says which).
  std::shared_ptr<Cancellation> cancel;
  // Over the data plane (ShardClient::WriteRegion): connections a large
  // write is striped across at most (client/lanes.h); 0: the client's
  // default.
  int lanes = 0;
  // A write to a shard smaller than this skips the local path for the data
  // plane (ShardClient::WriteRegion), judged by shard_bytes when it is
  // known, else by the box.
  int64_t local_min_bytes = kLocalPathMinBytes;
  // The whole shard's bytes when the caller knows them and the shard is in
  // host memory (HostShardBytes, client/shard_client.h); -1 when not.
  int64_t shard_bytes = -1;
};

// Writes `data` (any strides; on the CPU, or CUDA, staged through host
// memory) as the box at global `offsets` of the tensor `name` through
// `stub`'s WriteRegion; with a non-empty `tensor_id`, the daemon refuses
// the write (FAILED_PRECONDITION) unless the tensor still has that id.
// Returns the bytes the daemon reports written. Errors are the daemon's
// (NOT_FOUND, INVALID_ARGUMENT, OUT_OF_RANGE, DATA_LOSS...) or the call's
// (UNAVAILABLE, DEADLINE_EXCEEDED), as they are: callers add context.
absl::StatusOr<int64_t> WriteRegion(v1::ControlService::StubInterface& stub,
                                    const std::string& name,
                                    const std::string& tensor_id,
                                    absl::Span<const int64_t> offsets,
                                    const Tensor& data,
                                    const RegionWriteOptions& options);

}  // namespace tessera

#endif  // TESSERA_CLIENT_REGION_TRANSFER_H_
