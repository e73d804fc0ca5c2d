// ShardedGather: how ShardedTensor::Gather and GatherAll move every shard
// to one rank (or all): each member packs its shards, in shard order, into
// one flat buffer on the group's device (the shard itself when it is the
// only one and dense: no copy), the group gathers the buffers, and the
// receiver unpacks each shard into its box of the output (a member whose
// one shard is a contiguous run of the output receives straight into it).
// Large CPU gathers are pulled instead: the root fetches every remote shard
// from its owner's shard server (the local path on one host, the data plane
// across hosts) through the client library's peer-fetch surface
// (client/shard_client.h, client/region_transfer.h), several at once.
//
// Internal to server/sharded/ (sharded_tensor.cc). Thread-safety: one
// gather per object, on the calling rank's thread; the tensor's state must
// outlive it. Failures: FAILED_PRECONDITION for a tensor without a process
// group (or on a non-member), INVALID_ARGUMENT for a shard owner outside
// the group; allocation errors; the owners' fetch errors (UNAVAILABLE,
// DEADLINE_EXCEEDED, DATA_LOSS) when pulling.
#ifndef TESSERA_SERVER_SHARDED_SHARDED_GATHER_H_
#define TESSERA_SERVER_SHARDED_SHARDED_GATHER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/device.h"
#include "common/shard_metadata.h"
#include "common/sharded_tensor_metadata.h"
#include "common/tensor/tensor.h"
#include "server/collective/process_group.h"
#include "server/rank/rank.h"

namespace tessera {

// What a gather reads of one ShardedTensor's state (references into it).
struct GatherSource {
  const std::shared_ptr<Rank>& rank;
  const std::shared_ptr<ProcessGroup>& group;
  const std::string& tensor_id;
  const std::shared_ptr<const ShardedTensorMetadata>& metadata;
  // This rank's shards, in shard order.
  const std::vector<Shard>& local_shards;
  // The global rank owning each shard of metadata.
  const std::vector<int>& owners;
  // Whether the shards are in the rank's registry (a pull needs them).
  bool registered;
};

// Where each shard's elements sit when every rank packs its shards, in
// shard order, into one flat buffer per rank (the unit of Gather and
// AllGather).
struct PackedLayout {
  std::vector<int> group_rank;      // Per shard: its owner's group rank.
  std::vector<int64_t> offset;      // Per shard: offset in its owner's buffer.
  std::vector<int64_t> rank_elems;  // Per group rank: buffer length.
};

// PyTorch's checks of gather's dst_tensor, with its wording: required (of
// `size` and `dtype`) on the destination, forbidden elsewhere.
absl::Status ValidateGatherOutput(int my_rank, int dst,
                                  const std::vector<int64_t>& size, DType dtype,
                                  const Tensor& out);

class ShardedGather {
 public:
  explicit ShardedGather(GatherSource source);

  // Checks the group and computes the packed layout; first, always.
  absl::Status Prepare();
  // Whether root `root` pulls the other members' shards from their shard
  // servers instead of receiving them through the group's Gather. Decided
  // from what every member knows alike (the agreed metadata, the group's
  // device, whether RPC is up), so all members choose the same way. Pulling
  // runs one transfer per remote shard in parallel, over the fastest path
  // each owner offers: on one host the local path (a copy from the owner's
  // memory, no socket), else one data-plane stream per owner; Gloo's
  // Gather receives every peer's bytes through one thread. Worth it for
  // large shards only: it costs two small collectives (a barrier, so that
  // every shard is registered, and the outcome), and one fetch per shard.
  bool Pulls(int root) const;
  // On the root, when Pulls(): every shard into its box of `out`, the
  // local ones copied, the others fetched from their owners, in parallel.
  absl::Status Pull(const Tensor& out) const;
  // This rank's shards packed into one buffer: the shard itself when it is
  // the only one and dense on the group's device (no copy), else a copy.
  absl::StatusOr<Tensor> PackLocal() const;
  // A receive buffer per group rank: where `out` (when defined) can take
  // that rank's bytes as they are, a view of it (Unpack then skips them),
  // else a new buffer.
  absl::StatusOr<std::vector<Tensor>> Buffers(const Tensor& out = Tensor());
  // Copies every shard from the gathered buffers to its box in `out`
  // (those received into `out` directly are there already).
  absl::Status Unpack(const std::vector<Tensor>& buffers,
                      const Tensor& out) const;

 private:
  // The run of `out` that rank `g`'s one shard covers, when its box is
  // contiguous there (every dimension after the first one it cuts is
  // whole, every one before it has size 1) and `out` is dense on the
  // group's device; nullopt otherwise.
  std::optional<Tensor> DirectView(const Tensor& out, int g) const;
  absl::StatusOr<Tensor> Buffer(int group_rank) const;

  // Pulls() thresholds: bytes held outside the root in all, and per shard.
  static constexpr int64_t kPullMinBytes = int64_t{8} << 20;
  static constexpr int64_t kPullMinShardBytes = int64_t{1} << 20;
  // Remote shards fetched at once.
  static constexpr int kPullParallelism = 8;

  const GatherSource state_;
  PackedLayout layout_;
  Device device_ = Device::Cpu();
  // Per group rank, after Prepare: the index of its one shard with
  // elements, when it has exactly one.
  std::vector<std::optional<size_t>> lone_shard_;
  // Per group rank, after Buffers: received into `out` directly.
  std::vector<bool> direct_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_SHARDED_SHARDED_GATHER_H_
