#include "server/sharded/nn.h"

#include <cmath>
#include <utility>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/sharded/sharded_ops.h"

namespace tessera {
namespace {

// Any variant whose alternatives are all OpValue's, as an OpValue.
template <typename Variant>
OpValue AsOpValue(const Variant& value) {
  return std::visit([](const auto& v) { return OpValue(v); }, value);
}

absl::StatusOr<Module::ForwardValue> AsForwardValue(OpValue value) {
  if (auto* tensor = std::get_if<Tensor>(&value)) return *tensor;
  if (auto* st = std::get_if<ShardedTensor>(&value)) return *st;
  return absl::InvalidArgumentError(absl::StrCat(
      "forward: the op returned ", OpValueString(value), ", not a tensor"));
}

absl::Status OneInput(const Module& self,
                      const std::vector<Module::ForwardValue>& inputs) {
  if (inputs.size() == 1) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      self.type_name(), ".forward() takes 1 input, got ", inputs.size()));
}

absl::StatusOr<Module::ForwardValue> LinearForward(
    Module& self, const std::vector<Module::ForwardValue>& inputs) {
  RETURN_IF_ERROR(OneInput(self, inputs));
  ASSIGN_OR_RETURN(Module::Value weight, self.GetAttribute("weight"));
  ASSIGN_OR_RETURN(Module::Value bias, self.GetAttribute("bias"));
  ASSIGN_OR_RETURN(OpValue out,
                   CallOp("linear", {AsOpValue(inputs[0]), AsOpValue(weight),
                                     AsOpValue(bias)}));
  return AsForwardValue(std::move(out));
}

absl::StatusOr<Module::ForwardValue> EmbeddingBagForward(
    Module& self, const std::vector<Module::ForwardValue>& inputs) {
  RETURN_IF_ERROR(OneInput(self, inputs));
  ASSIGN_OR_RETURN(Module::Value weight, self.GetAttribute("weight"));
  ASSIGN_OR_RETURN(Module::Value mode, self.GetAttribute("mode"));
  ASSIGN_OR_RETURN(
      OpValue out,
      CallOp("embedding_bag", {AsOpValue(inputs[0]), AsOpValue(weight)},
             {{"mode", AsOpValue(mode)}}));
  return AsForwardValue(std::move(out));
}

// float32 values uniform in [-bound, bound).
absl::StatusOr<Tensor> Uniform(std::vector<int64_t> sizes, double bound,
                               Generator* generator) {
  ASSIGN_OR_RETURN(Tensor t, Tensor::Rand(sizes, {}, generator));
  float* data = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    data[i] = static_cast<float>((2.0 * data[i] - 1.0) * bound);
  }
  return t;
}

}  // namespace

absl::StatusOr<std::shared_ptr<Module>> MakeLinear(int64_t in_features,
                                                   int64_t out_features,
                                                   Generator* generator) {
  // kaiming_uniform_(a=sqrt(5)) and the bias init both give 1/sqrt(in).
  const double bound =
      in_features > 0 ? 1.0 / std::sqrt(static_cast<double>(in_features)) : 0;
  ASSIGN_OR_RETURN(Tensor weight,
                   Uniform({out_features, in_features}, bound, generator));
  ASSIGN_OR_RETURN(Tensor bias, Uniform({out_features}, bound, generator));
  auto module = Module::Create("Linear", LinearForward);
  RETURN_IF_ERROR(module->SetAttribute("weight", std::move(weight)));
  RETURN_IF_ERROR(module->SetAttribute("bias", std::move(bias)));
  return module;
}

absl::StatusOr<std::shared_ptr<Module>> MakeEmbeddingBag(int64_t num_embeddings,
                                                         int64_t embedding_dim,
                                                         std::string mode,
                                                         Generator* generator) {
  ASSIGN_OR_RETURN(Tensor weight, Tensor::Randn({num_embeddings, embedding_dim},
                                                {}, generator));
  auto module = Module::Create("EmbeddingBag", EmbeddingBagForward);
  RETURN_IF_ERROR(module->SetAttribute("weight", std::move(weight)));
  RETURN_IF_ERROR(module->SetAttribute("mode", std::move(mode)));
  return module;
}

}  // namespace tessera
