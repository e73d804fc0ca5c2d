// ShardedTensor: a tensor cut into shards that live on the ranks of a
// process group (torch.distributed._shard.ShardedTensor, SPMD style).
//
// Every rank of the group calls the same factory with the same arguments;
// each allocates only the shards placed on it (its local shards) and
// registers them with its shard server, so that other ranks — and clients
// outside the world — can fetch them. Creation sends no message: metadata
// follows from the spec, and the tensor id from the per-group creation
// order (Rank::NextTensorId). Remote shards are just metadata plus the
// owner's address; to_here() fetches over gRPC.
//
// A ShardedTensor is a handle: copies share the same shards. When the last
// handle on a rank is destroyed, that rank's shards leave its registry
// (fetching them then gives NOT_FOUND).
//
// Thread-safety: const methods may be called concurrently; the shards'
// bytes are shared with the shard server, which reads them while serving.
// Failure: factories validate everything before allocating and return
// PyTorch's error wording (see each factory).
#ifndef TESSERA_SERVER_SHARDED_SHARDED_TENSOR_H_
#define TESSERA_SERVER_SHARDED_SHARDED_TENSOR_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/remote_shard.h"
#include "common/device.h"
#include "common/dtype.h"
#include "common/shard_metadata.h"
#include "common/sharded_tensor_metadata.h"
#include "common/sharding_spec.h"
#include "common/tensor/tensor.h"
#include "common/tensor_properties.h"
#include "server/collective/process_group.h"
#include "server/rank/rank.h"

namespace tessera {

struct ShardedTensorOptions {
  DType dtype = DType::kFloat32;
  Layout layout = Layout::kStrided;
  bool requires_grad = false;
  bool pin_memory = false;
  MemoryFormat memory_format = MemoryFormat::kContiguous;
  // The group the shards' placements refer to; null: the rank's default
  // group.
  std::shared_ptr<ProcessGroup> process_group;
  // The rank creating the tensor; null: DefaultRank().
  std::shared_ptr<Rank> rank;
  // Whether remote_shards() is available (needs Rank::InitRpc).
  bool init_rrefs = false;
  // The id to register the shards under; empty: a fresh one
  // (Rank::NextTensorId). For a daemon that rebuilds a tensor the cluster
  // already knows by its id.
  std::string tensor_id;

  ShardedTensorOptions& WithDType(DType d) {
    dtype = d;
    return *this;
  }
  ShardedTensorOptions& WithProcessGroup(std::shared_ptr<ProcessGroup> g) {
    process_group = std::move(g);
    return *this;
  }
  ShardedTensorOptions& WithRank(std::shared_ptr<Rank> r) {
    rank = std::move(r);
    return *this;
  }
  ShardedTensorOptions& WithInitRrefs(bool i) {
    init_rrefs = i;
    return *this;
  }
  ShardedTensorOptions& WithTensorId(std::string id) {
    tensor_id = std::move(id);
    return *this;
  }
};

// The rank and group `options` designate: options.rank, else DefaultRank();
// options.process_group, else that rank's default group.
// FAILED_PRECONDITION "Default process group has not been initialized"
// when there is no rank.
struct RankAndGroup {
  std::shared_ptr<Rank> rank;
  std::shared_ptr<ProcessGroup> group;
};
absl::StatusOr<RankAndGroup> ResolveRankAndGroup(
    const ShardedTensorOptions& options);

// Owner rank -> that rank's shards, in shard order.
using RemoteShardMap = std::map<int, std::vector<RemoteShard>>;

class ShardedTensor {
 public:
  // sharded_tensor.empty/zeros/ones/full/rand/randn. Errors:
  //  - no rank: FAILED_PRECONDITION "Default process group has not been
  //    initialized";
  //  - layout / memory format: INVALID_ARGUMENT "Only torch.strided layout
  //    is currently supported" / "Only torch.contiguous_format
  //    memory_format is currently supported";
  //  - the spec: "Invalid sharding dim", "Global rank 5 does not exist in
  //    input process group", worker names (see
  //    ParseAndValidateRemoteDevice), volume/overlap errors;
  //  - init_rrefs: FAILED_PRECONDITION "RPC Framework needs to be
  //    initialized", INVALID_ARGUMENT "Default ProcessGroup and RPC ranks
  //    must be the same".
  // Rand/Randn draw each local shard in shard order from `generator` (the
  // default generator when null), like torch.rand of the shard's size.
  static absl::StatusOr<ShardedTensor> Empty(
      const ShardingSpec& spec, absl::Span<const int64_t> sizes,
      const ShardedTensorOptions& options = {});
  static absl::StatusOr<ShardedTensor> Zeros(
      const ShardingSpec& spec, absl::Span<const int64_t> sizes,
      const ShardedTensorOptions& options = {});
  static absl::StatusOr<ShardedTensor> Ones(
      const ShardingSpec& spec, absl::Span<const int64_t> sizes,
      const ShardedTensorOptions& options = {});
  static absl::StatusOr<ShardedTensor> Full(
      const ShardingSpec& spec, absl::Span<const int64_t> sizes,
      double fill_value, const ShardedTensorOptions& options = {});
  static absl::StatusOr<ShardedTensor> Rand(
      const ShardingSpec& spec, absl::Span<const int64_t> sizes,
      const ShardedTensorOptions& options = {}, Generator* generator = nullptr);
  static absl::StatusOr<ShardedTensor> Randn(
      const ShardingSpec& spec, absl::Span<const int64_t> sizes,
      const ShardedTensorOptions& options = {}, Generator* generator = nullptr);

  // torch.*_like(st, dtype=...): same spec, size, group, rank and options,
  // with the dtype replaced when given.
  static absl::StatusOr<ShardedTensor> EmptyLike(
      const ShardedTensor& other, std::optional<DType> dtype = std::nullopt);
  static absl::StatusOr<ShardedTensor> ZerosLike(
      const ShardedTensor& other, std::optional<DType> dtype = std::nullopt);
  static absl::StatusOr<ShardedTensor> OnesLike(
      const ShardedTensor& other, std::optional<DType> dtype = std::nullopt);
  static absl::StatusOr<ShardedTensor> FullLike(
      const ShardedTensor& other, double fill_value,
      std::optional<DType> dtype = std::nullopt);
  static absl::StatusOr<ShardedTensor> RandLike(
      const ShardedTensor& other, std::optional<DType> dtype = std::nullopt,
      Generator* generator = nullptr);
  static absl::StatusOr<ShardedTensor> RandnLike(
      const ShardedTensor& other, std::optional<DType> dtype = std::nullopt,
      Generator* generator = nullptr);

  // ShardedTensor._init_from_local_shards (collective over the group): each
  // rank passes its shards; their metadata is all-gathered, checked (one
  // dtype, layout, requires_grad and pin_memory across ranks, no overlap,
  // full coverage of `global_sizes`) and becomes the global metadata.
  static absl::StatusOr<ShardedTensor> InitFromLocalShards(
      std::vector<Shard> local_shards, absl::Span<const int64_t> global_sizes,
      const ShardedTensorOptions& options = {});
  // ShardedTensorBase._init_from_local_shards_and_global_metadata: no
  // communication; the local shards are checked against the metadata (each
  // must match a shard of it placed on this rank — every shard when there
  // is no rank, as in PyTorch's no-process-group mode).
  static absl::StatusOr<ShardedTensor> InitFromLocalShardsAndGlobalMetadata(
      std::vector<Shard> local_shards, ShardedTensorMetadata metadata,
      const ShardedTensorOptions& options = {});

  // InitFromLocalShardsAndGlobalMetadata for a layout `spec` produced:
  // sharding_spec() reports `spec` rather than the metadata's
  // EnumerableShardingSpec. The constructor of the operations that lay a
  // tensor out by a spec (shard_tensor, reshard, to); `metadata` must be
  // BuildMetadata(spec, ...)'s.
  static absl::StatusOr<ShardedTensor> InitFromLocalShardsWithSpec(
      std::vector<Shard> local_shards, ShardedTensorMetadata metadata,
      ShardingSpec spec, const ShardedTensorOptions& options = {});

  // ShardedTensor._init_from_local_tensor: each rank passes the tensor of
  // the shard `spec` places on it (collective only with init_rrefs).
  // INVALID_ARGUMENT "local_tensor is not a contiguous Tensor.", the spec's
  // errors (e.g. "... do not cover the entire tensor"), and Shard::Create's.
  static absl::StatusOr<ShardedTensor> InitFromLocalTensor(
      Tensor local_tensor, const ShardingSpec& spec,
      absl::Span<const int64_t> global_sizes,
      const ShardedTensorOptions& options = {});

  ShardedTensor(const ShardedTensor&) = default;
  ShardedTensor& operator=(const ShardedTensor&) = default;
  ShardedTensor(ShardedTensor&&) = default;
  ShardedTensor& operator=(ShardedTensor&&) = default;

  const std::vector<int64_t>& size() const;
  // OUT_OF_RANGE "Dimension out of range (expected to be in range of [-2,
  // 1], but got 2)".
  absl::StatusOr<int64_t> size(int64_t d) const;
  int64_t dim() const { return static_cast<int64_t>(size().size()); }
  int64_t ndim() const { return dim(); }
  DType dtype() const;
  Layout layout() const;
  // Read-only: Tessera has no autograd, so there is deliberately no setter
  // (PyTorch raises on assignment).
  bool requires_grad() const;
  bool is_pinned() const;
  // Local shards are always allocated contiguous.
  bool is_contiguous() const { return true; }
  // The device of the first local shard; the CPU when there is none.
  Device device() const;
  const ShardedTensorMetadata& metadata() const;
  // The spec the tensor was created with; for tensors built from local
  // shards, the EnumerableShardingSpec of their metadata.
  const ShardingSpec& sharding_spec() const;
  const std::vector<Shard>& local_shards() const;
  // The single local shard's tensor; UNIMPLEMENTED "Only single local shard
  // is supported." otherwise.
  absl::StatusOr<Tensor> local_tensor() const;
  // Other ranks' shards by owner. FAILED_PRECONDITION "ShardedTensor
  // created with init_rrefs=False" unless created with init_rrefs.
  absl::StatusOr<RemoteShardMap> remote_shards() const;

  // st.gather(dst, out) (collective over the group): the global rank `dst`
  // receives the whole tensor into `out` (a view of size() and this
  // tensor's dtype, on any device); the other members pass an undefined
  // Tensor. Small tensors: one Gather of each rank's packed shard bytes —
  // no per-shard messages, no dtype conversion, empty shards welcome. With
  // RPC up, a CPU group and shards of 1 MiB and more (8 MiB outside `dst`
  // in all), `dst` instead pulls every remote shard from its owner's shard
  // server straight into its box of `out`, several at once (the local path
  // on one host, the data plane across hosts), between a barrier and an
  // exchange of the outcome; a failed fetch fails every member with dst's
  // error ("on rank 0: ..."), and `out` may then hold part of the
  // tensor. INVALID_ARGUMENT
  // with PyTorch's wording: "Argument ``dst_tensor`` must be specified on
  // destination rank 1", "Argument ``dst_tensor`` have size (4, 4),but
  // should be (10, 20)", "Argument ``dst_tensor`` must NOT be specified on
  // non-destination ranks."; a dst outside the group or an `out` of
  // another dtype is INVALID_ARGUMENT too.
  absl::Status Gather(int dst, const Tensor& out = Tensor()) const;
  // Every member receives the whole tensor (DTensor's full_tensor), as a
  // new CPU tensor of this dtype: one AllGather.
  absl::StatusOr<Tensor> GatherAll() const;

  // st.reshard(spec) (collective over the group; sharded_tensor_reshard.cc),
  // in place: every handle of this tensor sees the new local shards,
  // metadata and spec, under a new tensor id (the old shards leave the
  // registry). UNIMPLEMENTED "Only ChunkShardingSpec supported for
  // reshard." unless both this tensor's spec and `spec` are chunk specs,
  // and "Only single local shard supported for reshard." unless every
  // member holds exactly one shard (judged from the metadata, so all
  // members fail together). The new layout may be uneven, have empty
  // shards or several shards per rank. An equal spec changes nothing. One
  // AllToAll sends each peer the intersections of this rank's shard with
  // the peer's new shards. Every member must pass the same spec. Returns a
  // handle of this tensor.
  absl::StatusOr<ShardedTensor> Reshard(const ShardingSpec& spec);

  // ---- Conversions: st.to / st.cuda / st.cpu (sharded_tensor_to.cc).
  // The device argument of To: "cpu", "cuda", "cuda:N", an int N (cuda:N)
  // or a Device. Parsed when To runs (bad text is INVALID_ARGUMENT).
  class DeviceArg {
   public:
    // Implicit, so that st.To("cpu"), st.To(2) and st.To(device) read as
    // in PyTorch.
    DeviceArg(Device device) : device_(device) {}            // NOLINT
    DeviceArg(int cuda_index) : index_(cuda_index) {}        // NOLINT
    DeviceArg(const char* text) : text_(text) {}             // NOLINT
    DeviceArg(std::string text) : text_(std::move(text)) {}  // NOLINT
    absl::StatusOr<Device> Resolve() const;

   private:
    std::optional<Device> device_;
    std::optional<int> index_;
    std::string text_;
  };
  struct ToOptions {
    std::optional<DType> dtype;       // Unset: keep.
    std::optional<DeviceArg> device;  // Unset: keep.
    // Unset: keep the group. A new group is a change (PyTorch ignores it
    // when dtype and device stay), so To returns a tensor bound to it.
    std::shared_ptr<ProcessGroup> process_group;
    bool copy = false;  // Copy local shards even when nothing changes.
  };
  // ShardedTensor.to: this very tensor (is_same) when dtype, device and
  // group stay and `copy` is off; otherwise a new tensor (new tensor id,
  // same group unless given, same init_rrefs) whose local shards are
  // converted (a shard that already has the dtype and device is shared)
  // and whose metadata and spec keep every shard's owner and change its
  // device type. CUDA means each rank's own device, as PyTorch's "current
  // device": rank q's shards go to cuda:(q mod visible devices), the
  // device Rank::Init gives a rank by default; a CUDA index is accepted
  // and ignored, as in PyTorch (use reshard to move between GPUs). CUDA
  // without a device is FAILED_PRECONDITION. Every rank of the group calls
  // it (the new tensor's id is agreed by creation order); no message is
  // sent.
  absl::StatusOr<ShardedTensor> To(const ToOptions& options) const;
  absl::StatusOr<ShardedTensor> To(DType dtype) const;
  absl::StatusOr<ShardedTensor> To(
      DeviceArg device, std::optional<DType> dtype = std::nullopt) const;
  // The dtype and device of `other`.
  absl::StatusOr<ShardedTensor> To(const Tensor& other) const;
  // st.cuda(device, process_group): always a new tensor, even when already
  // on the rank's CUDA device (then sharing the local tensors). A
  // `device` other than the rank's is INVALID_ARGUMENT "Only device without
  // device id (e.g. "cpu" or "cuda") is expected for ShardedTensor!".
  absl::StatusOr<ShardedTensor> Cuda(
      std::optional<int> device = std::nullopt,
      std::shared_ptr<ProcessGroup> process_group = nullptr) const;
  // st.cpu(process_group): this tensor when every shard is on the CPU.
  absl::StatusOr<ShardedTensor> Cpu(
      std::shared_ptr<ProcessGroup> process_group = nullptr) const;
  // Whether both handles are the same tensor (Python's `is`).
  bool is_same(const ShardedTensor& other) const {
    return state_ == other.state_;
  }
  // What this tensor was created with (dtype, layout, requires_grad,
  // pin_memory, memory_format, group, rank, init_rrefs): the options of
  // tensors derived from it (To, sharded ops).
  ShardedTensorOptions options() const;

  const std::string& tensor_id() const;
  const std::shared_ptr<ProcessGroup>& process_group() const;
  const std::shared_ptr<Rank>& rank() const;

 private:
  friend class ShardedTensorBuilder;
  struct State;
  explicit ShardedTensor(std::shared_ptr<State> state)
      : state_(std::move(state)) {}
  // Reshard's last step: builds a tensor of `local_shards` on this tensor's
  // rank, group and options, and swaps it into this tensor's State, so that
  // every handle sees it; the swapped-out State releases the old
  // registration when it dies (once).
  absl::Status ReplaceShards(std::vector<Shard> local_shards,
                             ShardedTensorMetadata metadata, ShardingSpec spec);

  std::shared_ptr<State> state_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_SHARDED_SHARDED_TENSOR_H_
