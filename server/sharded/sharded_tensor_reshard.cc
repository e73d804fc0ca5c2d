// ShardedTensor::Reshard: moving a chunk-sharded tensor to another chunk
// layout with one AllToAll.
//
// Every member enumerates the same (old shard, new shard) pairs in the same
// order, so sender and receiver agree, without talking, on where each
// intersection sits in the bytes one rank sends another: the AllToAll
// carries nothing but element data.
#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/region.h"
#include "common/status_macros.h"
#include "server/sharded/sharded_tensor.h"

namespace tessera {
namespace {

// Per shard of a layout: its owner's group rank and its device.
struct Owners {
  std::vector<int> group_rank;
  std::vector<Device> device;
};

absl::StatusOr<Owners> ResolveOwners(const ShardedTensorMetadata& metadata,
                                     const ProcessGroup& group,
                                     const Rank& rank) {
  const WorkerResolver* resolver = rank.rpc_initialized() ? &rank : nullptr;
  Owners owners;
  for (const ShardMetadata& shard : metadata.shards_metadata) {
    ASSIGN_OR_RETURN(auto placement,
                     ParseAndValidateRemoteDevice(group.global_ranks(),
                                                  shard.placement(), resolver));
    // Every shard of a reshard moves to or from some member: one without an
    // owner (a bare device) or on a non-member would index the plan with -1.
    const std::optional<int> group_rank = group.GroupRank(placement.first);
    if (placement.first < 0 || !group_rank.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "reshard: placement ", shard.placement()->ToString(), " of shard ",
          owners.group_rank.size(),
          placement.first < 0 ? " names no rank or worker"
                              : " is on a rank outside the process group"));
    }
    owners.group_rank.push_back(*group_rank);
    owners.device.push_back(placement.second);
  }
  return owners;
}

// A box that moves from group rank `from` (inside its old shard `source`)
// to group rank `to` (inside its new shard `target`), at global `offsets`.
// Its elements sit at `send_offset` of the bytes `from` sends `to`, and at
// `recv_offset` of those `to` receives from `from`.
struct Piece {
  size_t source = 0;
  size_t target = 0;
  int from = 0;
  int to = 0;
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
  int64_t send_offset = 0;
  int64_t recv_offset = 0;
};

int64_t Numel(const std::vector<int64_t>& sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

// The part of one AllToAll buffer that `piece` occupies, shaped as the box.
absl::StatusOr<Tensor> PieceView(const Tensor& stream, int64_t offset,
                                 const Piece& piece) {
  ASSIGN_OR_RETURN(Tensor flat, stream.Narrow(0, offset, Numel(piece.sizes)));
  return flat.View(piece.sizes);
}

// One flat buffer cut into per-peer streams of the given lengths.
struct Streams {
  Tensor buffer;
  std::vector<Tensor> per_rank;
};

absl::StatusOr<Streams> MakeStreams(const std::vector<int64_t>& elems,
                                    const TensorOptions& options) {
  Streams streams;
  int64_t total = 0;
  for (int64_t n : elems) total += n;
  // A staging buffer: private memory (the new shards are not).
  ASSIGN_OR_RETURN(streams.buffer,
                   Tensor::Empty({total}, TensorOptions(options).Private()));
  int64_t start = 0;
  for (int64_t n : elems) {
    ASSIGN_OR_RETURN(Tensor part, streams.buffer.Narrow(0, start, n));
    streams.per_rank.push_back(std::move(part));
    start += n;
  }
  return streams;
}

// Both layouts and this member's part in the exchange.
struct ReshardPlan {
  int me = 0;
  Owners old_owners;
  Owners new_owners;
  ShardedTensorMetadata new_metadata;
  std::vector<Piece> pieces;  // Those this member sends or receives.
  std::vector<int64_t> send_elems;
  std::vector<int64_t> recv_elems;
};

void PlanPieces(const ShardedTensorMetadata& old_metadata, ReshardPlan& plan,
                int group_size) {
  plan.send_elems.assign(group_size, 0);
  plan.recv_elems.assign(group_size, 0);
  const auto& olds = old_metadata.shards_metadata;
  const auto& news = plan.new_metadata.shards_metadata;
  for (size_t i = 0; i < olds.size(); ++i) {
    for (size_t j = 0; j < news.size(); ++j) {
      const int from = plan.old_owners.group_rank[i];
      const int to = plan.new_owners.group_rank[j];
      if (from != plan.me && to != plan.me) continue;
      std::optional<ShardMetadata> box = Intersect(olds[i], news[j]);
      if (!box.has_value()) continue;
      Piece piece;
      piece.source = i;
      piece.target = j;
      piece.from = from;
      piece.to = to;
      piece.offsets.assign(box->shard_offsets().begin(),
                           box->shard_offsets().end());
      piece.sizes.assign(box->shard_sizes().begin(), box->shard_sizes().end());
      const int64_t n = Numel(piece.sizes);
      if (from == plan.me) {
        piece.send_offset = plan.send_elems[to];
        plan.send_elems[to] += n;
      }
      if (to == plan.me) {
        piece.recv_offset = plan.recv_elems[from];
        plan.recv_elems[from] += n;
      }
      plan.pieces.push_back(std::move(piece));
    }
  }
}

// This member's tensor per shard index of `metadata` (null for others'),
// given its local shards in metadata order.
absl::StatusOr<std::vector<const Tensor*>> LocalByIndex(
    const std::vector<Shard>& local, const Owners& owners, int me) {
  std::vector<const Tensor*> by_index(owners.group_rank.size(), nullptr);
  size_t next = 0;
  for (size_t i = 0; i < by_index.size(); ++i) {
    if (owners.group_rank[i] != me) continue;
    if (next == local.size()) break;
    by_index[i] = &local[next++].tensor;
  }
  if (next != local.size()) {
    return absl::InternalError(
        "reshard: local shards do not match the tensor's metadata");
  }
  return by_index;
}

absl::Status CheckReshardable(const ShardedTensor& st,
                              const ShardingSpec& spec) {
  if (!std::holds_alternative<ChunkShardingSpec>(spec) ||
      !std::holds_alternative<ChunkShardingSpec>(st.sharding_spec())) {
    return absl::UnimplementedError(
        "Only ChunkShardingSpec supported for reshard.");
  }
  if (st.rank() == nullptr || st.process_group() == nullptr) {
    return absl::FailedPreconditionError(
        "reshard needs a process group; this ShardedTensor has none");
  }
  if (!st.process_group()->is_member()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "reshard: rank ", st.rank()->rank(),
        " is not a member of process group ", st.process_group()->name()));
  }
  return absl::OkStatus();
}

absl::StatusOr<ReshardPlan> Plan(const ShardedTensor& st,
                                 const ShardingSpec& spec) {
  const ProcessGroup& group = *st.process_group();
  ReshardPlan plan;
  plan.me = group.rank();
  ASSIGN_OR_RETURN(plan.old_owners,
                   ResolveOwners(st.metadata(), group, *st.rank()));
  // Judged on the global layout, which every member shares, so that all
  // members fail together rather than some waiting in the AllToAll.
  std::vector<int> shards_per_rank(group.size(), 0);
  for (int g : plan.old_owners.group_rank) ++shards_per_rank[g];
  for (int count : shards_per_rank) {
    if (count != 1) {
      return absl::UnimplementedError(
          "Only single local shard supported for reshard.");
    }
  }
  ASSIGN_OR_RETURN(
      plan.new_metadata,
      BuildMetadata(spec, st.size(), st.metadata().tensor_properties));
  ASSIGN_OR_RETURN(plan.new_owners,
                   ResolveOwners(plan.new_metadata, group, *st.rank()));
  // Moving data onto the meta device would drop it, and say OK.
  const auto& old_devices = plan.old_owners.device;
  const bool has_data =
      std::any_of(old_devices.begin(), old_devices.end(),
                  [](const Device& device) { return !device.is_meta(); });
  for (size_t i = 0; has_data && i < plan.new_owners.device.size(); ++i) {
    if (plan.new_owners.device[i].is_meta()) {
      return absl::InvalidArgumentError(
          absl::StrCat("reshard: shard ", i,
                       " would be on the meta device, which holds "
                       "no data: the tensor's values would be lost"));
    }
  }
  PlanPieces(st.metadata(), plan, group.size());
  return plan;
}

absl::StatusOr<std::vector<Shard>> AllocateNewShards(
    const ReshardPlan& plan, const TensorProperties& p) {
  std::vector<Shard> shards;
  const auto& news = plan.new_metadata.shards_metadata;
  for (size_t j = 0; j < news.size(); ++j) {
    if (plan.new_owners.group_rank[j] != plan.me) continue;
    const Device& device = plan.new_owners.device[j];
    ASSIGN_OR_RETURN(
        Tensor tensor,
        Tensor::Empty(news[j].shard_sizes(),
                      TensorOptions()
                          .WithDType(p.dtype)
                          .WithDevice(device)
                          .WithPinMemory(p.pin_memory &&
                                         device.type() == Device::Type::kCpu)
                          .WithRequiresGrad(p.requires_grad)));
    shards.push_back(Shard{std::move(tensor), news[j]});
  }
  return shards;
}

}  // namespace

absl::StatusOr<ShardedTensor> ShardedTensor::Reshard(const ShardingSpec& spec) {
  RETURN_IF_ERROR(CheckReshardable(*this, spec));
  if (std::get<ChunkShardingSpec>(spec) ==
      std::get<ChunkShardingSpec>(sharding_spec())) {
    return *this;
  }
  ASSIGN_OR_RETURN(ReshardPlan plan, Plan(*this, spec));
  ProcessGroup& group = *process_group();
  // Buffers on the group's device: Gloo moves host memory, NCCL its own
  // device's.
  const TensorOptions stream_options =
      TensorOptions().WithDType(dtype()).WithDevice(group.device());
  ASSIGN_OR_RETURN(Streams send, MakeStreams(plan.send_elems, stream_options));
  ASSIGN_OR_RETURN(Streams recv, MakeStreams(plan.recv_elems, stream_options));
  ASSIGN_OR_RETURN(std::vector<const Tensor*> old_local,
                   LocalByIndex(local_shards(), plan.old_owners, plan.me));
  const auto& olds = metadata().shards_metadata;
  for (const Piece& piece : plan.pieces) {
    if (piece.from != plan.me) continue;
    ASSIGN_OR_RETURN(Tensor view, PieceView(send.per_rank[piece.to],
                                            piece.send_offset, piece));
    RETURN_IF_ERROR(CopyBox(
        *old_local[piece.source],
        OffsetsWithin(piece.offsets, olds[piece.source].shard_offsets()), view,
        std::vector<int64_t>(piece.sizes.size(), 0), piece.sizes));
  }
  RETURN_IF_ERROR(group.AllToAll(send.per_rank, recv.per_rank));

  ASSIGN_OR_RETURN(std::vector<Shard> new_local,
                   AllocateNewShards(plan, metadata().tensor_properties));
  std::vector<Tensor> by_target(plan.new_metadata.shards_metadata.size());
  for (size_t j = 0, next = 0; j < by_target.size(); ++j) {
    if (plan.new_owners.group_rank[j] == plan.me) {
      by_target[j] = new_local[next++].tensor;
    }
  }
  const auto& news = plan.new_metadata.shards_metadata;
  for (const Piece& piece : plan.pieces) {
    if (piece.to != plan.me) continue;
    ASSIGN_OR_RETURN(Tensor view, PieceView(recv.per_rank[piece.from],
                                            piece.recv_offset, piece));
    RETURN_IF_ERROR(CopyBox(
        view, std::vector<int64_t>(piece.sizes.size(), 0),
        by_target[piece.target],
        OffsetsWithin(piece.offsets, news[piece.target].shard_offsets()),
        piece.sizes));
  }
  RETURN_IF_ERROR(
      ReplaceShards(std::move(new_local), std::move(plan.new_metadata), spec));
  return *this;
}

}  // namespace tessera
