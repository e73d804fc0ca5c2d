// Sharding a whole module by a plan (torch.distributed._shard.shard_module,
// sharding_plan.ShardingPlan and sharder.Sharder).
//
//   ShardingPlan plan;
//   plan.plan.emplace("fc1.weight", rowwise_spec);      // ShardParameter
//   plan.plan.emplace("ebc", std::make_shared<MySharder>());
//   plan.output_plan.emplace("fc1", output_spec);        // ReshardOutput
//   plan.return_local_tensor.push_back("fc1");           // CollectLocalShard
//   RETURN_IF_ERROR(ShardModule(model, plan));
//
// ShardModule is collective over the process group: every member calls it
// with the same plan and src_rank on a module of the same structure (the
// SPMD contract of PyTorch's shard_module). Before it changes anything it
// checks, on every member:
//  - the plan alone: a Sharder keyed by "" is INVALID_ARGUMENT "Module path
//    must not be empty for custom sharder!" (PyTorch's KeyError); a spec for
//    a parameter inside the subtree of a Sharder's module is
//    INVALID_ARGUMENT "ShardingPlan is in-valid, trying to shard a
//    parameter: ebc.bag.weight, but there's already a Sharder entry for
//    module ebc, parameter sharding should not conflict with the submodule
//    tree that a Sharder is working with!" (PyTorch's RuntimeError); as
//    PyTorch does not, Tessera also rejects a Sharder inside another
//    Sharder's subtree with the same last words; a null Sharder is
//    INVALID_ARGUMENT "Only `ShardingSpec` and `Sharder` are supported to
//    shard 'ebc'";
//  - the plan against the module: every spec names a shardable parameter
//    (ShardParameter's errors: NOT_FOUND "Linear has no attribute `foo`",
//    INVALID_ARGUMENT "Expected Linear.bias to be a Tensor, but found str"),
//    every Sharder, output_plan and return_local_tensor path names a
//    submodule (Module::GetSubmodule's errors), except paths inside a
//    Sharder's subtree, which only exist once the Sharder has run;
// and all-gathers the outcome with the plan's fingerprint, so that one
// member's mistake, or plans that differ between members (INVALID_ARGUMENT
// "sharding plan on rank: 1 does not match with sharding plan on rank: 0"),
// fail every member before any parameter moves ("on rank 2: " prefixes
// another member's error).
//
// Then, as PyTorch: every spec entry is applied with ShardParameter (in the
// plan's key order), then every Sharder (key order): its Shard gets the
// submodule at its path and the returned module replaces that submodule in
// its parent, at the same position (PyTorch's own swap assigns an
// attribute named "mod_name" instead and so never replaces anything; the
// documented intent is implemented here). Then output_plan registers
// ReshardOutput and return_local_tensor CollectLocalShard on the modules at
// those paths (in the sharded tree; "" is the root). An error in these
// steps (a transport error, a Sharder's own error, a path inside a
// Sharder's result that does not exist) leaves the steps before it done.
//
// Ownership: the plan holds its Sharders by shared_ptr; ShardModule keeps
// neither the plan nor the Sharders. Thread-safety: as the process group's
// collectives; a module is used by one thread.
#ifndef TESSERA_SERVER_SHARDED_SHARDING_PLAN_H_
#define TESSERA_SERVER_SHARDED_SHARDING_PLAN_H_

#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/sharding_spec.h"
#include "server/sharded/module.h"
#include "server/sharded/sharded_tensor.h"

namespace tessera {

// A sharding strategy that a ShardingSpec per parameter cannot express:
// it turns a module into its sharded version.
class Sharder {
 public:
  virtual ~Sharder() = default;

  // Returns the module that replaces `module` in the tree (it may be
  // `module` itself, changed in place). Runs on every member, in the same
  // order; a Sharder that communicates must make every member fail
  // together, as ShardModule does.
  virtual absl::StatusOr<std::shared_ptr<Module>> Shard(
      std::shared_ptr<Module> module) = 0;
};

struct ShardingPlan {
  using Entry = std::variant<ShardingSpec, std::shared_ptr<Sharder>>;

  // A parameter's dotted path -> the spec to shard it by, or a submodule's
  // dotted path -> the Sharder that replaces it.
  std::map<std::string, Entry> plan;
  // A module's path ("" is the root) -> the spec its ShardedTensor outputs
  // are resharded to.
  std::map<std::string, ShardingSpec> output_plan;
  // Modules whose ShardedTensor outputs become their local tensors.
  std::vector<std::string> return_local_tensor;
};

// shard_module: shards `module` by `plan`, taking the values of sharded
// parameters from group rank `src_rank`. From `options` only the rank,
// the process group and init_rrefs are used (as ShardParameter). Needs an
// initialized rank (FAILED_PRECONDITION otherwise, and for a process that
// is not a member of the group), even for a plan of Sharders only.
absl::Status ShardModule(Module& module, const ShardingPlan& plan,
                         int src_rank = 0,
                         const ShardedTensorOptions& options = {});

}  // namespace tessera

#endif  // TESSERA_SERVER_SHARDED_SHARDING_PLAN_H_
