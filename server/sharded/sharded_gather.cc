#include "server/sharded/sharded_gather.h"

#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/region_transfer.h"
#include "client/shard_client.h"
#include "common/status_macros.h"

namespace tessera {
namespace {

absl::StatusOr<PackedLayout> Pack(const ProcessGroup& group,
                                  const ShardedTensorMetadata& metadata,
                                  const std::vector<int>& owners) {
  if (owners.size() != metadata.shards_metadata.size()) {
    return absl::FailedPreconditionError(
        "this ShardedTensor does not know its shards' owners");
  }
  PackedLayout layout;
  layout.rank_elems.assign(group.size(), 0);
  for (size_t i = 0; i < owners.size(); ++i) {
    std::optional<int> g = group.GroupRank(owners[i]);
    if (!g.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("shard ", i, " is placed on rank ", owners[i],
                       ", which is not in the tensor's process group"));
    }
    layout.group_rank.push_back(*g);
    layout.offset.push_back(layout.rank_elems[*g]);
    layout.rank_elems[*g] += metadata.shards_metadata[i].numel();
  }
  return layout;
}

// The flat 1-d view of shard `i` inside `buffer`, shaped as the shard.
absl::StatusOr<Tensor> ShardView(const Tensor& buffer,
                                 const PackedLayout& layout,
                                 const ShardMetadata& shard, size_t i) {
  ASSIGN_OR_RETURN(Tensor flat,
                   buffer.Narrow(0, layout.offset[i], shard.numel()));
  return flat.View(shard.shard_sizes());
}

}  // namespace

absl::Status ValidateGatherOutput(int my_rank, int dst,
                                  const std::vector<int64_t>& size, DType dtype,
                                  const Tensor& out) {
  auto tuple = [](const std::vector<int64_t>& v) {
    return absl::StrCat("(", absl::StrJoin(v, ", "),
                        v.size() == 1 ? ",)" : ")");
  };
  if (my_rank != dst) {
    if (out.defined()) {
      return absl::InvalidArgumentError(
          "Argument ``dst_tensor`` must NOT be specified on non-destination "
          "ranks.");
    }
    return absl::OkStatus();
  }
  if (!out.defined()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Argument ``dst_tensor`` must be specified on destination rank ", dst));
  }
  if (out.sizes() != size) {
    return absl::InvalidArgumentError(
        absl::StrCat("Argument ``dst_tensor`` have size ", tuple(out.sizes()),
                     ",but should be ", tuple(size)));
  }
  if (out.dtype() != dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Argument ``dst_tensor`` has dtype ", DTypeName(out.dtype()),
        ", but the sharded tensor is ", DTypeName(dtype)));
  }
  return absl::OkStatus();
}

ShardedGather::ShardedGather(GatherSource source) : state_(std::move(source)) {}

absl::Status ShardedGather::Prepare() {
  if (state_.rank == nullptr || state_.group == nullptr) {
    return absl::FailedPreconditionError(
        "gather needs a process group; this ShardedTensor has none");
  }
  if (!state_.group->is_member()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", state_.rank->rank(), " is not a member of process group ",
        state_.group->name()));
  }
  ASSIGN_OR_RETURN(layout_,
                   Pack(*state_.group, *state_.metadata, state_.owners));
  // Buffers on the group's device: Gloo moves host memory, NCCL its own
  // device's (also on a rank without shards, which must still take part).
  device_ = state_.group->device();
  // Each group rank's one shard with elements, where it has exactly one.
  lone_shard_.assign(state_.group->size(), std::nullopt);
  std::vector<int> with_elements(state_.group->size(), 0);
  const auto& shards = state_.metadata->shards_metadata;
  for (size_t i = 0; i < shards.size(); ++i) {
    if (shards[i].numel() == 0) continue;
    const int g = layout_.group_rank[i];
    if (++with_elements[g] == 1) lone_shard_[g] = i;
    if (with_elements[g] == 2) lone_shard_[g] = std::nullopt;
  }
  return absl::OkStatus();
}

bool ShardedGather::Pulls(int root) const {
  if (!state_.registered || !state_.rank->rpc_initialized() ||
      state_.rank->rpc_rank() != state_.rank->rank() || !device_.is_cpu()) {
    return false;
  }
  const auto element_bytes = static_cast<int64_t>(
      ElementSize(state_.metadata->tensor_properties.dtype));
  const auto& shards = state_.metadata->shards_metadata;
  int64_t remote_bytes = 0;
  int64_t remote_shards = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    if (layout_.group_rank[i] == root || shards[i].numel() == 0) continue;
    remote_bytes += shards[i].numel() * element_bytes;
    ++remote_shards;
  }
  return remote_shards > 0 && remote_bytes >= kPullMinBytes &&
         remote_bytes / remote_shards >= kPullMinShardBytes;
}

absl::Status ShardedGather::Pull(const Tensor& out) const {
  const Rank& rank = *state_.rank;
  const auto& shards = state_.metadata->shards_metadata;
  // The local index of each of this rank's shards.
  std::vector<size_t> local_index(shards.size(), 0);
  for (size_t i = 0, next = 0; i < shards.size(); ++i) {
    if (state_.owners[i] == rank.rank()) local_index[i] = next++;
  }
  FetchOptions options;
  options.timeout = rank.options().timeout;
  const std::vector<int64_t> origin(out.dim(), 0);
  return ForEachRegionPiece(
      shards, origin, out, kPullParallelism,
      [&](const RegionPiece& piece) -> absl::Status {
        const int owner = state_.owners[piece.shard];
        if (owner == rank.rank()) {
          return CopyInto(state_.local_shards[local_index[piece.shard]].tensor,
                          piece.view);
        }
        ASSIGN_OR_RETURN(std::shared_ptr<ShardClient> client,
                         rank.ClientFor(owner));
        return client->FetchShardInto(state_.tensor_id,
                                      static_cast<int64_t>(piece.shard),
                                      piece.view, options);
      });
}

absl::StatusOr<Tensor> ShardedGather::PackLocal() const {
  if (const std::optional<size_t> only = lone_shard_[state_.group->rank()];
      only.has_value()) {
    size_t local = 0;
    for (size_t i = 0; i < *only; ++i) {
      if (state_.owners[i] == state_.rank->rank()) ++local;
    }
    const Tensor& tensor = state_.local_shards[local].tensor;
    if (tensor.is_contiguous() && tensor.device() == device_) {
      return tensor.View({tensor.numel()});
    }
  }
  ASSIGN_OR_RETURN(Tensor send, Buffer(state_.group->rank()));
  size_t next_local = 0;
  for (size_t i = 0; i < state_.owners.size(); ++i) {
    if (state_.owners[i] != state_.rank->rank()) continue;
    const Shard& shard = state_.local_shards[next_local++];
    if (shard.metadata.numel() == 0) continue;
    ASSIGN_OR_RETURN(Tensor view, ShardView(send, layout_, shard.metadata, i));
    RETURN_IF_ERROR(CopyInto(shard.tensor, view));
  }
  return send;
}

absl::StatusOr<std::vector<Tensor>> ShardedGather::Buffers(const Tensor& out) {
  std::vector<Tensor> buffers;
  direct_.assign(state_.group->size(), false);
  for (int g = 0; g < state_.group->size(); ++g) {
    if (std::optional<Tensor> view = DirectView(out, g); view.has_value()) {
      buffers.push_back(*std::move(view));
      direct_[g] = true;
      continue;
    }
    ASSIGN_OR_RETURN(Tensor buffer, Buffer(g));
    buffers.push_back(std::move(buffer));
  }
  return buffers;
}

absl::Status ShardedGather::Unpack(const std::vector<Tensor>& buffers,
                                   const Tensor& out) const {
  const auto& shards = state_.metadata->shards_metadata;
  for (size_t i = 0; i < shards.size(); ++i) {
    if (shards[i].numel() == 0) continue;
    if (!direct_.empty() && direct_[layout_.group_rank[i]]) continue;
    ASSIGN_OR_RETURN(Tensor view, ShardView(buffers[layout_.group_rank[i]],
                                            layout_, shards[i], i));
    std::vector<int64_t> zeros(shards[i].dim(), 0);
    RETURN_IF_ERROR(CopyBox(view, zeros, out, shards[i].shard_offsets(),
                            shards[i].shard_sizes()));
  }
  return absl::OkStatus();
}

std::optional<Tensor> ShardedGather::DirectView(const Tensor& out,
                                                int g) const {
  if (!out.defined() || !out.is_contiguous() || out.device() != device_) {
    return std::nullopt;
  }
  const std::optional<size_t> only = lone_shard_[g];
  if (!only.has_value()) return std::nullopt;
  const ShardMetadata& shard = state_.metadata->shards_metadata[*only];
  const absl::Span<const int64_t> offsets = shard.shard_offsets();
  const absl::Span<const int64_t> sizes = shard.shard_sizes();
  const std::vector<int64_t>& whole = out.sizes();
  size_t first_cut = 0;
  while (first_cut < sizes.size() && sizes[first_cut] == 1) ++first_cut;
  for (size_t d = first_cut + 1; d < sizes.size(); ++d) {
    if (sizes[d] != whole[d]) return std::nullopt;
  }
  int64_t start = 0;
  for (size_t d = 0; d < offsets.size(); ++d) {
    start += offsets[d] * out.strides()[d];
  }
  absl::StatusOr<Tensor> flat = out.View({out.numel()});
  if (!flat.ok()) return std::nullopt;
  absl::StatusOr<Tensor> run = flat->Narrow(0, start, shard.numel());
  if (!run.ok()) return std::nullopt;
  return *std::move(run);
}

absl::StatusOr<Tensor> ShardedGather::Buffer(int group_rank) const {
  return Tensor::Empty({layout_.rank_elems[group_rank]},
                       TensorOptions()
                           .WithDType(state_.metadata->tensor_properties.dtype)
                           .WithDevice(device_)
                           .Private());
}

}  // namespace tessera
