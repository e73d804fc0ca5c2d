// Operators on ShardedTensors: PyTorch's __torch_function__ dispatch for
// ShardedTensor, the registry of custom ops (custom_sharded_op_impl,
// custom_sharding_spec_op) and the built-in sharded ops.
//
//   ASSIGN_OR_RETURN(OpValue y, CallOp("linear", {x, weight, bias}));
//
// CallOp looks for a ShardedTensor among the positional, then the keyword
// arguments. Finding one, it checks the arguments (PyTorch's
// _basic_validation) and dispatches in PyTorch's order:
//   1. the op registered with RegisterShardedOp under that name;
//   2. the op registered with RegisterShardingSpecOp for the kind of that
//      tensor's spec ("chunk" or "enumerable", see ShardingSpecKind);
//   3. the built-in sharded op;
//   4. else UNIMPLEMENTED "torch function 'asin', with args: (...) and
//      kwargs: {...} not supported for ShardedTensor!".
// Registered ops receive (types, args, kwargs, process_group): types is
// {"ShardedTensor"}, the group that tensor's. Finding no ShardedTensor,
// CallOp runs the dense kernel of common/tensor/tensor_ops.h ("asin", "linear",
// "embedding_bag", "cat" with the tensors as positional arguments and an
// optional "dim"); UNIMPLEMENTED for other names.
//
// Arguments follow the torch functions' positions and keyword names:
// asin(input), linear(input, weight, bias=None), embedding_bag(input,
// weight, offsets=None, ..., mode="mean" at position 6 or as a keyword; as
// in PyTorch the default mode is "mean", which Tessera does not implement:
// pass mode="sum"). A None argument is std::monostate or an undefined
// Tensor.
//
// Built-in sharded ops, collective over the sharded tensor's group (every
// member calls them in the same order, each with its own dense input):
//  - asin(st): asin of each local shard; a new ShardedTensor with the same
//    layout and spec. Sends nothing.
//  - linear(input, weight, bias) with weight [out, in] a ShardedTensor cut
//    along dim 0 (row-wise: each member owns output features) or dim 1
//    (column-wise: each owns input features), input [*, in] and bias [out]
//    dense: each member gets linear(its own input, the whole weight, bias),
//    a dense tensor on its input's device (so equal inputs give equal
//    results on every member).
//  - embedding_bag(input, weight, mode="sum") with weight [num, dim] cut
//    row-wise (each member sums the rows it owns) or column-wise (each
//    member computes its columns); input 2-D bags of int64/int32 indices.
// Both all-gather the members' inputs, let each member compute its shards'
// part of every member's result and return the parts with one all-to-all;
// parts are concatenated by shard offset or summed in group-rank order (so
// every member gets the same bits for the same input). Local mistakes
// (shapes, dtypes, indices) travel through a first exchange of input
// shapes, so every member fails together instead of waiting.
//
// Thread-safety: a registry may be used from any thread (a mutex guards
// the tables; ops run unlocked and may call CallOp themselves). Collective
// ops follow their process group's rules.
#ifndef TESSERA_SERVER_SHARDED_SHARDED_OPS_H_
#define TESSERA_SERVER_SHARDED_SHARDED_OPS_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "common/tensor/tensor.h"
#include "server/collective/process_group.h"
#include "server/sharded/sharded_tensor.h"

namespace tessera {

// An argument or result of an op: None, a dense or sharded tensor, an int,
// a float or a string.
using OpValue = std::variant<std::monostate, Tensor, ShardedTensor, int64_t,
                             double, std::string>;
using OpArgs = std::vector<OpValue>;
using OpKwargs = std::map<std::string, OpValue>;
using ShardedOpFn = std::function<absl::StatusOr<OpValue>(
    const std::vector<std::string>& types, const OpArgs& args,
    const OpKwargs& kwargs, const std::shared_ptr<ProcessGroup>& group)>;

// Python's repr of an argument, for messages: "None", "3", "'sum'",
// "Tensor(float32, [3, 20], cpu)", "ShardedTensor(0/1, float32, [10, 20])".
std::string OpValueString(const OpValue& value);

class ShardedOpRegistry {
 public:
  // custom_sharded_op_impl(op): `fn` runs for `op` whenever a ShardedTensor
  // is an argument, replacing an earlier registration. `fn` may be any
  // callable taking (types, args, kwargs, process_group) and returning
  // something an absl::StatusOr<OpValue> can be made of; anything else is
  // INVALID_ARGUMENT "Custom sharded op function expects signature:
  // (types, args, kwargs, process_group)..." (a Status, not a compile
  // error, as PyTorch's TypeError), as is an empty op name.
  template <typename Fn>
  absl::Status RegisterShardedOp(absl::string_view op, Fn&& fn) {
    return Register(kAnySpec, op, std::forward<Fn>(fn)).status();
  }
  // custom_sharding_spec_op(spec class, op): `fn` runs for `op` on
  // ShardedTensors whose spec is of `spec_kind` ("chunk", "enumerable");
  // INVALID_ARGUMENT for another kind, and as RegisterShardedOp.
  template <typename Fn>
  absl::Status RegisterShardingSpecOp(absl::string_view spec_kind,
                                      absl::string_view op, Fn&& fn) {
    if (spec_kind == kAnySpec) return UnknownSpecKind(spec_kind);
    return Register(spec_kind, op, std::forward<Fn>(fn)).status();
  }
  // Remove a registration; false when there is none.
  bool UnregisterShardedOp(absl::string_view op);
  bool UnregisterShardingSpecOp(absl::string_view spec_kind,
                                absl::string_view op);

  // The torch function dispatch described at the top of this file.
  absl::StatusOr<OpValue> Call(absl::string_view op, const OpArgs& args,
                               const OpKwargs& kwargs = {}) const;

  // The spec kind of RegisterShardedOp's registrations.
  static constexpr absl::string_view kAnySpec = "";

 private:
  friend class ScopedOpRegistration;

  // Registers `fn` under (spec kind, op) and returns the registration it
  // replaced.
  template <typename Fn>
  absl::StatusOr<std::optional<ShardedOpFn>> Register(
      absl::string_view spec_kind, absl::string_view op, Fn&& fn) {
    ASSIGN_OR_RETURN(ShardedOpFn wrapped, Wrap(std::forward<Fn>(fn)));
    if (spec_kind != kAnySpec && spec_kind != "chunk" &&
        spec_kind != "enumerable") {
      return UnknownSpecKind(spec_kind);
    }
    if (op.empty()) return absl::InvalidArgumentError("empty op name");
    return Exchange(spec_kind, op, std::move(wrapped));
  }
  // The callable as a ShardedOpFn, or the signature error.
  template <typename Fn>
  static absl::StatusOr<ShardedOpFn> Wrap(Fn&& fn) {
    if constexpr (std::is_invocable_r_v<
                      absl::StatusOr<OpValue>, std::decay_t<Fn>&,
                      const std::vector<std::string>&, const OpArgs&,
                      const OpKwargs&, const std::shared_ptr<ProcessGroup>&>) {
      return ShardedOpFn(std::forward<Fn>(fn));
    } else {
      return SignatureError();
    }
  }
  static absl::Status SignatureError();
  static absl::Status UnknownSpecKind(absl::string_view spec_kind);
  // Puts `fn` (nullopt: nothing) under the key; returns what was there.
  std::optional<ShardedOpFn> Exchange(absl::string_view spec_kind,
                                      absl::string_view op,
                                      std::optional<ShardedOpFn> fn);
  std::optional<ShardedOpFn> Find(absl::string_view spec_kind,
                                  absl::string_view op) const;

  mutable absl::Mutex mu_;
  std::map<std::pair<std::string, std::string>, ShardedOpFn> ops_
      ABSL_GUARDED_BY(mu_);
};

// The process-wide registry (PyTorch's module-level tables).
ShardedOpRegistry& DefaultShardedOpRegistry();

// DefaultShardedOpRegistry().Call(op, args, kwargs).
absl::StatusOr<OpValue> CallOp(absl::string_view op, const OpArgs& args,
                               const OpKwargs& kwargs = {});

// A registration for one scope (a test): on destruction the previous
// registration under the same key (or none) is restored. Move-only.
class ScopedOpRegistration {
 public:
  // Registers like RegisterShardedOp (spec_kind kAnySpec) or
  // RegisterShardingSpecOp, with the same errors.
  template <typename Fn>
  static absl::StatusOr<ScopedOpRegistration> Create(
      absl::string_view spec_kind, absl::string_view op, Fn&& fn,
      ShardedOpRegistry& registry = DefaultShardedOpRegistry()) {
    ASSIGN_OR_RETURN(std::optional<ShardedOpFn> previous,
                     registry.Register(spec_kind, op, std::forward<Fn>(fn)));
    return ScopedOpRegistration(&registry, std::string(spec_kind),
                                std::string(op), std::move(previous));
  }
  ScopedOpRegistration(ScopedOpRegistration&& other) noexcept;
  ScopedOpRegistration& operator=(ScopedOpRegistration&&) = delete;
  ScopedOpRegistration(const ScopedOpRegistration&) = delete;
  ScopedOpRegistration& operator=(const ScopedOpRegistration&) = delete;
  ~ScopedOpRegistration();

 private:
  ScopedOpRegistration(ShardedOpRegistry* registry, std::string spec_kind,
                       std::string op, std::optional<ShardedOpFn> previous)
      : registry_(registry),
        spec_kind_(std::move(spec_kind)),
        op_(std::move(op)),
        previous_(std::move(previous)) {}

  ShardedOpRegistry* registry_;  // Null once moved from.
  std::string spec_kind_;
  std::string op_;
  std::optional<ShardedOpFn> previous_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_SHARDED_SHARDED_OPS_H_
