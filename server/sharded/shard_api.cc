#include "server/sharded/shard_api.h"

#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/proto_convert.h"
#include "common/status_macros.h"
#include "server/collective/process_group.h"
#include "server/rank/rank.h"

namespace tessera {
namespace {

using Context = RankAndGroup;

// Problems found here cannot be shared with the group (this process is not
// in one), so they are returned before any exchange.
absl::StatusOr<Context> GroupOf(const ShardedTensorOptions& options) {
  ASSIGN_OR_RETURN(Context context, ResolveRankAndGroup(options));
  if (!context.group->is_member()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard_tensor: rank ", context.rank->rank(),
        " is not a member of process group ", context.group->name()));
  }
  return context;
}

// The shards of the tensor as one member computes them: their metadata,
// each one's owner (group rank) and device, and where each sits in its
// owner's packed buffer.
struct ScatterLayout {
  ShardedTensorMetadata metadata;
  std::vector<int> owner;
  std::vector<Device> device;
  std::vector<int64_t> offset;
  std::vector<int64_t> rank_elems;
};

absl::StatusOr<ScatterLayout> LocalLayout(const Tensor& tensor,
                                          const ShardingSpec& spec,
                                          int src_rank,
                                          const Context& context) {
  if (!std::holds_alternative<ChunkShardingSpec>(spec)) {
    return absl::UnimplementedError(
        "EnumerableShardingSpec.shard not implemented yet!");
  }
  if (!tensor.defined()) {
    return absl::InvalidArgumentError("input tensor is undefined");
  }
  if (!tensor.is_contiguous()) {
    return absl::InvalidArgumentError(
        "input tensor is not a contiguous Tensor");
  }
  const ProcessGroup& group = *context.group;
  if (src_rank < 0 || src_rank >= group.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("src_rank=", src_rank,
                     " is not a rank of the process "
                     "group (size ",
                     group.size(), ")"));
  }
  TensorProperties properties;
  properties.dtype = tensor.dtype();
  properties.requires_grad = tensor.requires_grad();
  properties.pin_memory = tensor.is_pinned();
  ScatterLayout layout;
  ASSIGN_OR_RETURN(layout.metadata,
                   BuildMetadata(spec, tensor.sizes(), properties));
  const WorkerResolver* resolver =
      context.rank->rpc_initialized() ? context.rank.get() : nullptr;
  layout.rank_elems.assign(group.size(), 0);
  for (const ShardMetadata& shard : layout.metadata.shards_metadata) {
    ASSIGN_OR_RETURN(auto placement,
                     ParseAndValidateRemoteDevice(group.global_ranks(),
                                                  shard.placement(), resolver));
    const int owner = group.GroupRank(placement.first).value_or(0);
    layout.owner.push_back(owner);
    layout.device.push_back(placement.second);
    layout.offset.push_back(layout.rank_elems[owner]);
    layout.rank_elems[owner] += shard.numel();
  }
  return layout;
}

// PyTorch's repr of a spec, for mismatch messages.
std::string SpecRepr(const ShardingSpec& spec) {
  if (const auto* chunk = std::get_if<ChunkShardingSpec>(&spec)) {
    return absl::StrCat(
        "ChunkShardingSpec(dim=", chunk->dim(), ", placements=[",
        absl::StrJoin(chunk->placements(), ", ",
                      [](std::string* out, const RemoteDevice& d) {
                        absl::StrAppend(out, d.ToString());
                      }),
        "])");
  }
  const auto& shards = std::get<EnumerableShardingSpec>(spec).shards();
  return absl::StrCat(
      "EnumerableShardingSpec(shards=[",
      absl::StrJoin(shards, ", ",
                    [](std::string* out, const ShardMetadata& m) {
                      absl::StrAppend(out, m.ToString());
                    }),
      "])");
}

struct Arguments {
  int src_rank = 0;
  std::vector<ShardingSpec> spec;  // One entry; ShardingSpec has no default.
};

// What each member contributes to the first exchange: src_rank in decimal,
// ':' and the serialized spec.
std::string EncodeArguments(int src_rank, const ShardingSpec& spec) {
  return absl::StrCat(src_rank, ":", ToProto(spec).SerializeAsString());
}

absl::StatusOr<Arguments> DecodeArguments(absl::string_view bytes, int rank) {
  const size_t colon = bytes.find(':');
  Arguments arguments;
  v1::ShardingSpec proto;
  if (colon == absl::string_view::npos ||
      !absl::SimpleAtoi(bytes.substr(0, colon), &arguments.src_rank) ||
      !proto.ParseFromArray(bytes.data() + colon + 1,
                            static_cast<int>(bytes.size() - colon - 1))) {
    return absl::DataLossError(
        absl::StrCat("shard_tensor: malformed arguments from rank ", rank));
  }
  ASSIGN_OR_RETURN(ShardingSpec spec, FromProto(proto));
  arguments.spec.push_back(std::move(spec));
  return arguments;
}

// _shard_tensor's cross-rank validation. Every member gets an error when
// any member has one: first its own, then the lowest failing member's, then
// PyTorch's mismatch messages.
absl::Status CheckAgreement(ProcessGroup& group, const absl::Status& local,
                            int src_rank, const ShardingSpec& spec) {
  ASSIGN_OR_RETURN(
      std::vector<std::string> gathered,
      AllGatherOutcomes(group, local.ok() ? absl::StatusOr<std::string>(
                                                EncodeArguments(src_rank, spec))
                                          : local));
  std::vector<Arguments> all;
  for (size_t r = 0; r < gathered.size(); ++r) {
    ASSIGN_OR_RETURN(Arguments arguments,
                     DecodeArguments(gathered[r], static_cast<int>(r)));
    all.push_back(std::move(arguments));
  }
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].src_rank != src_rank) {
      return absl::InvalidArgumentError(absl::StrCat(
          "src_rank=", src_rank, " on rank: ", group.rank(),
          " does not match with src_rank=", all[r].src_rank, " on rank: ", r));
    }
    if (!(all[r].spec.front() == spec)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sharding_spec=", SpecRepr(spec), " on rank: ", group.rank(),
          " does not match with sharding_spec=", SpecRepr(all[r].spec.front()),
          " on rank: ", r));
    }
  }
  return absl::OkStatus();
}

// Shard `i` inside its owner's packed buffer, shaped as the shard.
absl::StatusOr<Tensor> PackedShard(const Tensor& buffer,
                                   const ScatterLayout& layout, size_t i) {
  const ShardMetadata& shard = layout.metadata.shards_metadata[i];
  ASSIGN_OR_RETURN(Tensor flat,
                   buffer.Narrow(0, layout.offset[i], shard.numel()));
  return flat.View(shard.shard_sizes());
}

// The source packs every member's shards into one buffer per member.
absl::StatusOr<std::vector<Tensor>> PackForScatter(
    const Tensor& tensor, const ScatterLayout& layout,
    const TensorOptions& options) {
  std::vector<Tensor> buffers;
  for (int64_t elems : layout.rank_elems) {
    ASSIGN_OR_RETURN(Tensor buffer,
                     Tensor::Empty({elems}, TensorOptions(options).Private()));
    buffers.push_back(std::move(buffer));
  }
  const auto& shards = layout.metadata.shards_metadata;
  for (size_t i = 0; i < shards.size(); ++i) {
    if (shards[i].numel() == 0) continue;
    ASSIGN_OR_RETURN(Tensor view,
                     PackedShard(buffers[layout.owner[i]], layout, i));
    RETURN_IF_ERROR(CopyBox(tensor, shards[i].shard_offsets(), view,
                            std::vector<int64_t>(shards[i].dim(), 0),
                            shards[i].shard_sizes()));
  }
  return buffers;
}

absl::StatusOr<std::vector<Shard>> ScatterShards(const Tensor& tensor,
                                                 const ScatterLayout& layout,
                                                 int src_rank,
                                                 ProcessGroup& group) {
  // Buffers on the group's device: Gloo moves host memory, NCCL its own
  // device's (whatever device the tensor or the shards are on).
  const TensorOptions options =
      TensorOptions().WithDType(tensor.dtype()).WithDevice(group.device());
  const int me = group.rank();
  std::vector<Tensor> inputs;
  if (me == src_rank) {
    ASSIGN_OR_RETURN(inputs, PackForScatter(tensor, layout, options));
  }
  ASSIGN_OR_RETURN(Tensor received,
                   Tensor::Empty({layout.rank_elems[me]}, options));
  RETURN_IF_ERROR(group.Scatter(inputs, received, src_rank));

  const TensorProperties& p = layout.metadata.tensor_properties;
  std::vector<Shard> local;
  const auto& shards = layout.metadata.shards_metadata;
  for (size_t i = 0; i < shards.size(); ++i) {
    if (layout.owner[i] != me) continue;
    const Device& device = layout.device[i];
    ASSIGN_OR_RETURN(Tensor view, PackedShard(received, layout, i));
    ASSIGN_OR_RETURN(
        Tensor shard,
        view.To(device, p.pin_memory && device.type() == Device::Type::kCpu));
    shard.set_requires_grad(p.requires_grad);
    local.push_back(Shard{std::move(shard), shards[i]});
  }
  return local;
}

// ShardTensor for a tensor that may be a local mistake: the mistake still
// takes part in the exchange, so that every member fails with it.
absl::StatusOr<ShardedTensor> ShardOrFail(const absl::StatusOr<Tensor>& tensor,
                                          const ShardingSpec& spec,
                                          int src_rank,
                                          const ShardedTensorOptions& options) {
  ASSIGN_OR_RETURN(Context context, GroupOf(options));
  absl::StatusOr<ScatterLayout> layout =
      tensor.ok() ? LocalLayout(*tensor, spec, src_rank, context)
                  : absl::StatusOr<ScatterLayout>(tensor.status());
  RETURN_IF_ERROR(
      CheckAgreement(*context.group, layout.status(), src_rank, spec));
  ASSIGN_OR_RETURN(std::vector<Shard> local,
                   ScatterShards(*tensor, *layout, src_rank, *context.group));
  ShardedTensorOptions resolved = options;
  resolved.rank = context.rank;
  resolved.process_group = context.group;
  return ShardedTensor::InitFromLocalShardsWithSpec(
      std::move(local), std::move(layout->metadata), spec, resolved);
}

}  // namespace

absl::StatusOr<Tensor> ParameterToShard(const Module& module,
                                        absl::string_view path) {
  const Module* owner = &module;
  absl::string_view name = path;
  const size_t dot = path.rfind('.');
  if (dot != absl::string_view::npos) {
    ASSIGN_OR_RETURN(owner, module.GetSubmodule(path.substr(0, dot)));
    name = path.substr(dot + 1);
  }
  if (!owner->HasAttribute(name)) {
    return absl::NotFoundError(
        absl::StrCat(owner->type_name(), " has no attribute `", name, "`"));
  }
  ASSIGN_OR_RETURN(Tensor tensor, owner->GetTensor(name));
  if (!tensor.is_contiguous()) {
    return absl::InvalidArgumentError(
        absl::StrCat("param: ", name, " is not a contiguous Tensor"));
  }
  return tensor;
}

absl::StatusOr<ShardedTensor> ShardTensor(const Tensor& tensor,
                                          const ShardingSpec& spec,
                                          int src_rank,
                                          const ShardedTensorOptions& options) {
  return ShardOrFail(tensor, spec, src_rank, options);
}

absl::Status ShardParameter(Module& module, absl::string_view param_name,
                            const ShardingSpec& spec, int src_rank,
                            const ShardedTensorOptions& options) {
  ASSIGN_OR_RETURN(ShardedTensor st,
                   ShardOrFail(ParameterToShard(module, param_name), spec,
                               src_rank, options));
  return module.SetAttribute(param_name, std::move(st));
}

Module& ReshardOutput(Module& module, ShardingSpec spec) {
  module.RegisterForwardHook(
      [spec = std::move(spec)](
          Module&, const std::vector<Module::ForwardValue>&,
          Module::ForwardValue output) -> absl::StatusOr<Module::ForwardValue> {
        auto* st = std::get_if<ShardedTensor>(&output);
        if (st == nullptr) return output;
        ASSIGN_OR_RETURN(ShardedTensor resharded, st->Reshard(spec));
        return Module::ForwardValue(std::move(resharded));
      });
  return module;
}

Module& CollectLocalShard(Module& module) {
  module.RegisterForwardHook(
      [](Module&, const std::vector<Module::ForwardValue>&,
         Module::ForwardValue output) -> absl::StatusOr<Module::ForwardValue> {
        const auto* st = std::get_if<ShardedTensor>(&output);
        if (st == nullptr) return output;
        ASSIGN_OR_RETURN(Tensor local, st->local_tensor());
        const auto* chunk =
            std::get_if<ChunkShardingSpec>(&st->sharding_spec());
        if (chunk == nullptr) return Module::ForwardValue(std::move(local));
        ASSIGN_OR_RETURN(int64_t dim, WrapDim(chunk->dim(), local.dim(),
                                              /*wrap_scalar=*/false));
        if (local.sizes()[dim] != 1) return Module::ForwardValue(local);
        std::vector<int64_t> squeezed = local.sizes();
        squeezed.erase(squeezed.begin() + dim);
        ASSIGN_OR_RETURN(Tensor contiguous, local.Contiguous());
        ASSIGN_OR_RETURN(Tensor view, contiguous.View(squeezed));
        return Module::ForwardValue(std::move(view));
      });
  return module;
}

}  // namespace tessera
