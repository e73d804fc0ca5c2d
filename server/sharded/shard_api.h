// Sharding dense tensors and modules (torch.distributed._shard.api):
// ShardTensor (_shard_tensor), ShardParameter (shard_parameter), and the
// forward hooks ReshardOutput (_reshard_output) and CollectLocalShard
// (_collect_local_shard).
//
// ShardTensor and ShardParameter are collective over the process group:
// every member calls them with the same spec and src_rank and a tensor of
// the same size and dtype; src_rank's values become the sharded tensor's.
// Members first all-gather a small record (a local error, or src_rank and
// the spec), so that a mistake made on any member — including arguments
// that differ between members — fails on every member instead of leaving
// the others waiting; then the source scatters each member's shards, packed
// into one buffer per member (one Scatter, empty shards welcome).
//
// Failure (PyTorch's wording):
//  - an EnumerableShardingSpec: UNIMPLEMENTED "EnumerableShardingSpec.shard
//    not implemented yet!";
//  - a non-contiguous tensor: INVALID_ARGUMENT "input tensor is not a
//    contiguous Tensor" ("param: bias is not a contiguous Tensor" from
//    ShardParameter);
//  - members that disagree: INVALID_ARGUMENT "src_rank=1 on rank: 1 does not
//    match with src_rank=0 on rank: 0", "sharding_spec=ChunkShardingSpec(
//    dim=0, placements=[...]) on rank: 1 does not match with sharding_spec=
//    ... on rank: 0";
//  - a mistake on another member: its error, prefixed "on rank 2: ";
//  - the spec's own errors (BuildMetadata, placements outside the group),
//    src_rank outside the group (INVALID_ARGUMENT), no rank or a non-member
//    (FAILED_PRECONDITION, without communicating), and transport errors.
//
// Thread-safety: as the process group's collectives (one thread issues
// them). The hooks run inside Module::Forward on the module's thread.
#ifndef TESSERA_SERVER_SHARDED_SHARD_API_H_
#define TESSERA_SERVER_SHARDED_SHARD_API_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/sharding_spec.h"
#include "common/tensor/tensor.h"
#include "server/sharded/module.h"
#include "server/sharded/sharded_tensor.h"

namespace tessera {

// _shard_tensor: shards `tensor` by `spec` (a ChunkShardingSpec), taking
// the values from group rank `src_rank` of the group. The result's
// sharding_spec() is `spec`; its dtype, requires_grad and pin_memory are
// the tensor's. From `options` only the rank, the process group (src_rank
// and the placements refer to it) and init_rrefs are used.
absl::StatusOr<ShardedTensor> ShardTensor(
    const Tensor& tensor, const ShardingSpec& spec, int src_rank = 0,
    const ShardedTensorOptions& options = {});

// shard_parameter: replaces the tensor attribute `param_name` of `module`
// (a dotted path may name a submodule's) with ShardTensor of it. NOT_FOUND
// "Linear has no attribute `foo`"; INVALID_ARGUMENT "Expected Linear.bias
// to be a Tensor, but found str". Local mistakes still take part in the
// first exchange, so every member fails. On failure the module is
// unchanged.
absl::Status ShardParameter(Module& module, absl::string_view param_name,
                            const ShardingSpec& spec, int src_rank = 0,
                            const ShardedTensorOptions& options = {});

// shard_parameter's checks of `path` on `module` alone (the NOT_FOUND and
// INVALID_ARGUMENT errors above), without communicating: the tensor that
// ShardParameter would shard. For callers that validate a whole plan first.
absl::StatusOr<Tensor> ParameterToShard(const Module& module,
                                        absl::string_view path);

// _reshard_output: registers a forward hook that reshards a ShardedTensor
// output in place (ShardedTensor::Reshard, collective); other outputs pass
// through. Returns `module`.
Module& ReshardOutput(Module& module, ShardingSpec spec);

// _collect_local_shard: registers a forward hook that turns a ShardedTensor
// output into its local tensor (UNIMPLEMENTED "Only single local shard is
// supported." otherwise), dropping the chunk dimension when its size there
// is 1 (a [4, 16] tensor over 4 ranks gives each rank a [16] tensor).
// Other outputs pass through. Returns `module`.
Module& CollectLocalShard(Module& module);

}  // namespace tessera

#endif  // TESSERA_SERVER_SHARDED_SHARD_API_H_
