// Module: the C++ stand-in for torch.nn.Module, as far as sharding needs
// one. A module has a type name ("Linear", "EmbeddingBag", "ModuleDict" or
// any user-defined name), named attributes in insertion order, named
// submodules in insertion order, an optional forward function and forward
// hooks. It knows no operator: a "Linear" is a Module whose forward someone
// wrote (see shard_api.h for the sharding helpers that work on modules).
//
//   auto fc = Module::Create("Linear", LinearForward);
//   RETURN_IF_ERROR(fc->SetAttribute("weight", weight));   // a Tensor
//   RETURN_IF_ERROR(fc->SetAttribute("bias", bias));
//   RETURN_IF_ERROR(net.AddModule("fc1", fc));
//   ASSIGN_OR_RETURN(Tensor w, net.GetTensor("fc1.weight"));
//
// Attributes: a Tensor or ShardedTensor attribute is a parameter (it shows
// in NamedParameters/StateDict; an undefined Tensor is Python's None and is
// skipped there); strings and numbers are plain attributes. As in PyTorch,
// a parameter can only be replaced by a tensor of either kind: to store a
// string under its name, delete it first. Dotted paths ("a.b.weight") walk
// submodules; every lookup is linear in the number of names on one module.
//
// Failure, with PyTorch's wording so ported tests can match it:
//  - a missing attribute: NOT_FOUND "'Linear' object has no attribute 'foo'";
//  - a missing submodule on a path: NOT_FOUND "Linear has no attribute
//    `foo`"; a path through a non-module: INVALID_ARGUMENT "`bias` is not an
//    nn.Module";
//  - an attribute of the wrong kind: INVALID_ARGUMENT "Expected Linear.bias
//    to be a Tensor, but found str";
//  - Forward without a forward function: UNIMPLEMENTED "Module [Linear] is
//    missing the required \"forward\" function".
// A failed call changes nothing.
//
// Ownership: a module owns its attribute values (Tensor views and
// ShardedTensor handles, which share bytes with other holders: setting a
// tensor never copies it) and holds its submodules by shared_ptr, so one
// submodule may sit in several trees. Clone() deep-copies. Modules are not
// copyable; move them or hold them by shared_ptr.
//
// Thread-safety: none. A module (with its submodules) is used by one thread
// at a time, like a torch.nn.Module in one SPMD rank. Forward functions and
// hooks run on the calling thread and may modify the module.
#ifndef TESSERA_SERVER_SHARDED_MODULE_H_
#define TESSERA_SERVER_SHARDED_MODULE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tensor/tensor.h"
#include "server/sharded/sharded_tensor.h"
#include "server/sharded/state_dict.h"

namespace tessera {

class Module {
 public:
  // An attribute: a parameter (Tensor, ShardedTensor) or a plain value
  // (Python str, int, float).
  using Value =
      std::variant<Tensor, ShardedTensor, std::string, int64_t, double>;
  // What forward takes and returns: a dense or a sharded tensor.
  using ForwardValue = StateValue;
  using ForwardFn = std::function<absl::StatusOr<ForwardValue>(
      Module& self, const std::vector<ForwardValue>& inputs)>;
  // register_forward_hook: runs after forward with its output and returns
  // the output to use (return `output` itself to keep it). An error stops
  // Forward and is its result.
  using ForwardHook = std::function<absl::StatusOr<ForwardValue>(
      Module& self, const std::vector<ForwardValue>& inputs,
      ForwardValue output)>;

  explicit Module(std::string type_name, ForwardFn forward = nullptr);
  static std::shared_ptr<Module> Create(std::string type_name,
                                        ForwardFn forward = nullptr);

  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  Module(Module&&) = default;
  Module& operator=(Module&&) = default;

  // type(module).__name__.
  const std::string& type_name() const { return type_name_; }

  // Attributes, by name or dotted path.
  bool HasAttribute(absl::string_view path) const;
  absl::StatusOr<Value> GetAttribute(absl::string_view path) const;
  // The attribute when it holds that kind (a defined Tensor for GetTensor);
  // INVALID_ARGUMENT "Expected Linear.bias to be a Tensor, but found str"
  // otherwise.
  absl::StatusOr<Tensor> GetTensor(absl::string_view path) const;
  absl::StatusOr<ShardedTensor> GetShardedTensor(absl::string_view path) const;
  // Adds the attribute or replaces its value in place (its position stays).
  // INVALID_ARGUMENT for a name that is a submodule ("cannot assign 'Tensor'
  // as child module 'fc' ...") and for a plain value over a parameter
  // ("cannot assign 'str' as parameter 'bias' ...").
  absl::Status SetAttribute(absl::string_view path, Value value);
  // `del module.path`: removes an attribute or a submodule.
  absl::Status DeleteAttribute(absl::string_view path);
  const std::vector<std::pair<std::string, Value>>& attributes() const {
    return attributes_;
  }

  // add_module: adds or replaces the child `name`. INVALID_ARGUMENT for an
  // empty name, a name with '.', a name taken by an attribute ("attribute
  // 'bias' already exists") or a null module.
  absl::Status AddModule(const std::string& name,
                         std::shared_ptr<Module> module);
  // get_submodule: "" is this module. The pointer is borrowed: valid while
  // the submodule stays in the tree (or is otherwise held).
  absl::StatusOr<Module*> GetSubmodule(absl::string_view path);
  absl::StatusOr<const Module*> GetSubmodule(absl::string_view path) const;
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children()
      const {
    return children_;
  }

  // named_parameters(): every defined tensor attribute of this module and
  // its submodules (depth first, own attributes before children's), by
  // dotted name. A submodule reachable twice is listed twice.
  tessera::StateDict NamedParameters() const;
  // state_dict(): what a checkpoint saves — the same entries.
  tessera::StateDict StateDict() const;
  // load_state_dict: sets each parameter named in `state_dict` to its value
  // (the handle is stored, not copied). Checks everything first; on any
  // error nothing is set. INVALID_ARGUMENT "Error(s) in loading state_dict
  // for Linear:" followed by one line per problem: when `strict`, "Missing
  // key(s) in state_dict: \"bias\"." and "Unexpected key(s) in state_dict:
  // \"foo\"."; always "size mismatch for weight: copying a param with shape
  // [4, 4] from checkpoint, the shape in current model is [12, 12].".
  absl::Status LoadStateDict(const tessera::StateDict& state_dict,
                             bool strict = true);

  // copy.deepcopy: a new tree with dense tensors cloned (same device),
  // ShardedTensor handles and plain values copied, submodules cloned, the
  // forward function and hooks copied. Errors are Tensor::Clone's.
  absl::StatusOr<std::shared_ptr<Module>> Clone() const;

  void SetForward(ForwardFn forward) { forward_ = std::move(forward); }
  // Returns a handle for RemoveForwardHook. Hooks run in registration order.
  int RegisterForwardHook(ForwardHook hook);
  // False when no hook has that handle.
  bool RemoveForwardHook(int handle);
  // module(*inputs): forward, then every hook (those registered when the
  // call starts, so a hook may add or remove hooks).
  absl::StatusOr<ForwardValue> Forward(
      const std::vector<ForwardValue>& inputs = {});

  // Python's type name of an attribute value: "Tensor", "ShardedTensor",
  // "str", "int", "float", and "NoneType" for an undefined Tensor.
  static std::string TypeName(const Value& value);

 private:
  // The module owning the last component of `path`, and that component.
  absl::StatusOr<std::pair<const Module*, std::string>> Owner(
      absl::string_view path) const;
  absl::StatusOr<std::pair<Module*, std::string>> Owner(absl::string_view path);
  const Value* FindAttribute(absl::string_view name) const;
  const std::shared_ptr<Module>* FindChild(absl::string_view name) const;
  absl::Status NoAttribute(absl::string_view name) const;
  absl::Status WrongKind(absl::string_view name, absl::string_view expected,
                         const Value& found) const;
  void AppendParameters(const std::string& prefix,
                        tessera::StateDict& out) const;

  std::string type_name_;
  std::vector<std::pair<std::string, Value>> attributes_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  ForwardFn forward_;
  std::vector<std::pair<int, ForwardHook>> hooks_;
  int next_hook_ = 0;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_SHARDED_MODULE_H_
