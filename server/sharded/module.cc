#include "server/sharded/module.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace tessera {
namespace {

bool IsParameter(const Module::Value& value) {
  return std::holds_alternative<Tensor>(value) ||
         std::holds_alternative<ShardedTensor>(value);
}

const std::vector<int64_t>& SizesOf(const StateValue& value) {
  if (const auto* tensor = std::get_if<Tensor>(&value)) return tensor->sizes();
  return std::get<ShardedTensor>(value).size();
}

std::string Shape(const std::vector<int64_t>& sizes) {
  return absl::StrCat("[", absl::StrJoin(sizes, ", "), "]");
}

std::string Quoted(const std::vector<std::string>& keys) {
  return absl::StrJoin(keys, ", ", [](std::string* out, const std::string& k) {
    absl::StrAppend(out, "\"", k, "\"");
  });
}

}  // namespace

Module::Module(std::string type_name, ForwardFn forward)
    : type_name_(std::move(type_name)), forward_(std::move(forward)) {}

std::shared_ptr<Module> Module::Create(std::string type_name,
                                       ForwardFn forward) {
  return std::make_shared<Module>(std::move(type_name), std::move(forward));
}

std::string Module::TypeName(const Value& value) {
  struct Namer {
    std::string operator()(const Tensor& t) const {
      return t.defined() ? "Tensor" : "NoneType";
    }
    std::string operator()(const ShardedTensor&) const {
      return "ShardedTensor";
    }
    std::string operator()(const std::string&) const { return "str"; }
    std::string operator()(int64_t) const { return "int"; }
    std::string operator()(double) const { return "float"; }
  };
  return std::visit(Namer(), value);
}

const Module::Value* Module::FindAttribute(absl::string_view name) const {
  for (const auto& [key, value] : attributes_) {
    if (key == name) return &value;
  }
  return nullptr;
}

const std::shared_ptr<Module>* Module::FindChild(absl::string_view name) const {
  for (const auto& [key, child] : children_) {
    if (key == name) return &child;
  }
  return nullptr;
}

absl::Status Module::NoAttribute(absl::string_view name) const {
  return absl::NotFoundError(
      absl::StrCat("'", type_name_, "' object has no attribute '", name, "'"));
}

absl::Status Module::WrongKind(absl::string_view name,
                               absl::string_view expected,
                               const Value& found) const {
  return absl::InvalidArgumentError(
      absl::StrCat("Expected ", type_name_, ".", name, " to be a ", expected,
                   ", but found ", TypeName(found)));
}

absl::StatusOr<const Module*> Module::GetSubmodule(
    absl::string_view path) const {
  const Module* module = this;
  if (path.empty()) return module;
  for (absl::string_view item : absl::StrSplit(path, '.')) {
    const std::shared_ptr<Module>* child = module->FindChild(item);
    if (child == nullptr) {
      if (module->FindAttribute(item) != nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("`", item, "` is not an nn.Module"));
      }
      return absl::NotFoundError(
          absl::StrCat(module->type_name_, " has no attribute `", item, "`"));
    }
    module = child->get();
  }
  return module;
}

absl::StatusOr<Module*> Module::GetSubmodule(absl::string_view path) {
  ASSIGN_OR_RETURN(const Module* module,
                   static_cast<const Module*>(this)->GetSubmodule(path));
  return const_cast<Module*>(module);
}

absl::StatusOr<std::pair<const Module*, std::string>> Module::Owner(
    absl::string_view path) const {
  const size_t dot = path.rfind('.');
  if (dot == absl::string_view::npos) {
    return std::make_pair(this, std::string(path));
  }
  ASSIGN_OR_RETURN(const Module* owner, GetSubmodule(path.substr(0, dot)));
  return std::make_pair(owner, std::string(path.substr(dot + 1)));
}

absl::StatusOr<std::pair<Module*, std::string>> Module::Owner(
    absl::string_view path) {
  ASSIGN_OR_RETURN(auto owner, static_cast<const Module*>(this)->Owner(path));
  return std::make_pair(const_cast<Module*>(owner.first),
                        std::move(owner.second));
}

bool Module::HasAttribute(absl::string_view path) const {
  return GetAttribute(path).ok();
}

absl::StatusOr<Module::Value> Module::GetAttribute(
    absl::string_view path) const {
  ASSIGN_OR_RETURN(auto owner, Owner(path));
  const Value* value = owner.first->FindAttribute(owner.second);
  if (value == nullptr) return owner.first->NoAttribute(owner.second);
  return *value;
}

absl::StatusOr<Tensor> Module::GetTensor(absl::string_view path) const {
  ASSIGN_OR_RETURN(auto owner, Owner(path));
  const Value* value = owner.first->FindAttribute(owner.second);
  if (value == nullptr) return owner.first->NoAttribute(owner.second);
  const Tensor* tensor = std::get_if<Tensor>(value);
  if (tensor == nullptr || !tensor->defined()) {
    return owner.first->WrongKind(owner.second, "Tensor", *value);
  }
  return *tensor;
}

absl::StatusOr<ShardedTensor> Module::GetShardedTensor(
    absl::string_view path) const {
  ASSIGN_OR_RETURN(auto owner, Owner(path));
  const Value* value = owner.first->FindAttribute(owner.second);
  if (value == nullptr) return owner.first->NoAttribute(owner.second);
  const ShardedTensor* st = std::get_if<ShardedTensor>(value);
  if (st == nullptr) {
    return owner.first->WrongKind(owner.second, "ShardedTensor", *value);
  }
  return *st;
}

absl::Status Module::SetAttribute(absl::string_view path, Value value) {
  ASSIGN_OR_RETURN(auto owner, Owner(path));
  Module& module = *owner.first;
  const std::string& name = owner.second;
  if (name.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("attribute name can't be empty string \"\": ", path));
  }
  if (module.FindChild(name) != nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot assign '", TypeName(value), "' as child module '",
                     name, "' (torch.nn.Module or None expected)"));
  }
  for (auto& [key, current] : module.attributes_) {
    if (key != name) continue;
    if (IsParameter(current) && !IsParameter(value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot assign '", TypeName(value), "' as parameter '",
                       name, "' (torch.nn.Parameter or None expected)"));
    }
    current = std::move(value);
    return absl::OkStatus();
  }
  module.attributes_.emplace_back(name, std::move(value));
  return absl::OkStatus();
}

absl::Status Module::DeleteAttribute(absl::string_view path) {
  ASSIGN_OR_RETURN(auto owner, Owner(path));
  Module& module = *owner.first;
  const std::string& name = owner.second;
  auto named = [&name](const auto& entry) { return entry.first == name; };
  auto attribute =
      std::find_if(module.attributes_.begin(), module.attributes_.end(), named);
  if (attribute != module.attributes_.end()) {
    module.attributes_.erase(attribute);
    return absl::OkStatus();
  }
  auto child =
      std::find_if(module.children_.begin(), module.children_.end(), named);
  if (child != module.children_.end()) {
    module.children_.erase(child);
    return absl::OkStatus();
  }
  return module.NoAttribute(name);
}

absl::Status Module::AddModule(const std::string& name,
                               std::shared_ptr<Module> module) {
  if (module == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot add a null module as '", name, "'"));
  }
  if (name.empty()) {
    return absl::InvalidArgumentError("module name can't be empty string \"\"");
  }
  if (name.find('.') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("module name can't contain \".\", got: ", name));
  }
  if (FindAttribute(name) != nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("attribute '", name, "' already exists"));
  }
  for (auto& [key, child] : children_) {
    if (key != name) continue;
    child = std::move(module);
    return absl::OkStatus();
  }
  children_.emplace_back(name, std::move(module));
  return absl::OkStatus();
}

void Module::AppendParameters(const std::string& prefix,
                              tessera::StateDict& out) const {
  for (const auto& [name, value] : attributes_) {
    if (const auto* tensor = std::get_if<Tensor>(&value)) {
      if (tensor->defined()) out.emplace_back(prefix + name, *tensor);
    } else if (const auto* st = std::get_if<ShardedTensor>(&value)) {
      out.emplace_back(prefix + name, *st);
    }
  }
  for (const auto& [name, child] : children_) {
    child->AppendParameters(absl::StrCat(prefix, name, "."), out);
  }
}

tessera::StateDict Module::NamedParameters() const {
  tessera::StateDict out;
  AppendParameters("", out);
  return out;
}

tessera::StateDict Module::StateDict() const { return NamedParameters(); }

absl::Status Module::LoadStateDict(const tessera::StateDict& state_dict,
                                   bool strict) {
  std::map<std::string, const StateValue*> given;
  for (const auto& [name, value] : state_dict) given[name] = &value;
  std::vector<std::string> errors;
  std::vector<std::string> missing;
  std::set<std::string> known;
  for (const auto& [name, value] : NamedParameters()) {
    known.insert(name);
    auto it = given.find(name);
    if (it == given.end()) {
      missing.push_back(name);
      continue;
    }
    const std::vector<int64_t>& theirs = SizesOf(*it->second);
    const std::vector<int64_t>& ours = SizesOf(value);
    if (theirs != ours) {
      errors.push_back(absl::StrCat(
          "size mismatch for ", name, ": copying a param with shape ",
          Shape(theirs), " from checkpoint, the shape in current model is ",
          Shape(ours), "."));
    }
  }
  std::vector<std::string> unexpected;
  for (const auto& [name, value] : state_dict) {
    if (known.count(name) == 0) unexpected.push_back(name);
  }
  if (strict && !unexpected.empty()) {
    errors.insert(errors.begin(), absl::StrCat("Unexpected key(s) in "
                                               "state_dict: ",
                                               Quoted(unexpected), "."));
  }
  if (strict && !missing.empty()) {
    errors.insert(
        errors.begin(),
        absl::StrCat("Missing key(s) in state_dict: ", Quoted(missing), "."));
  }
  if (!errors.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Error(s) in loading state_dict for ", type_name_, ":\n\t",
                     absl::StrJoin(errors, "\n\t")));
  }
  for (const auto& [name, value] : state_dict) {
    if (known.count(name) == 0) continue;
    Value v = std::visit([](const auto& x) { return Value(x); }, value);
    RETURN_IF_ERROR(SetAttribute(name, std::move(v)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Module>> Module::Clone() const {
  auto copy = Create(type_name_, forward_);
  for (const auto& [name, value] : attributes_) {
    const Tensor* tensor = std::get_if<Tensor>(&value);
    if (tensor == nullptr || !tensor->defined()) {
      copy->attributes_.emplace_back(name, value);
      continue;
    }
    ASSIGN_OR_RETURN(Tensor cloned, tensor->Clone());
    cloned.set_requires_grad(tensor->requires_grad());
    copy->attributes_.emplace_back(name, std::move(cloned));
  }
  for (const auto& [name, child] : children_) {
    ASSIGN_OR_RETURN(std::shared_ptr<Module> cloned, child->Clone());
    copy->children_.emplace_back(name, std::move(cloned));
  }
  copy->hooks_ = hooks_;
  copy->next_hook_ = next_hook_;
  return copy;
}

int Module::RegisterForwardHook(ForwardHook hook) {
  hooks_.emplace_back(next_hook_, std::move(hook));
  return next_hook_++;
}

bool Module::RemoveForwardHook(int handle) {
  auto it = std::find_if(hooks_.begin(), hooks_.end(),
                         [handle](const auto& h) { return h.first == handle; });
  if (it == hooks_.end()) return false;
  hooks_.erase(it);
  return true;
}

absl::StatusOr<Module::ForwardValue> Module::Forward(
    const std::vector<ForwardValue>& inputs) {
  if (!forward_) {
    return absl::UnimplementedError(
        absl::StrCat("Module [", type_name_,
                     "] is missing the required \"forward\" "
                     "function"));
  }
  // Copies, so that forward or a hook may replace them while they run.
  ForwardFn forward = forward_;
  std::vector<std::pair<int, ForwardHook>> hooks = hooks_;
  ASSIGN_OR_RETURN(ForwardValue output, forward(*this, inputs));
  for (const auto& [handle, hook] : hooks) {
    ASSIGN_OR_RETURN(output, hook(*this, inputs, std::move(output)));
  }
  return output;
}

}  // namespace tessera
