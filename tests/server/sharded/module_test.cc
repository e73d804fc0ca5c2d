// Module (the torch.nn.Module stand-in) on its own: attributes, dotted
// paths, submodules, parameters and state dicts, deep copies, forward and
// hooks. No ranks: sharded attributes are built in no-process-group mode.
#include "server/sharded/module.h"
#include "server/sharded/nn.h"

#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "common/shard_metadata.h"
#include "common/tensor/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/sharded/sharded_tensor.h"
#include "server/sharded/state_dict.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Sizes = std::vector<int64_t>;
using ForwardValue = Module::ForwardValue;

std::vector<float> Values(const Tensor& t) {
  return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
}

// torch.nn.Linear(in, out) (server/sharded/nn.h's).
std::shared_ptr<Module> Linear(int64_t in, int64_t out, Generator& generator) {
  absl::StatusOr<std::shared_ptr<Module>> fc = MakeLinear(in, out, &generator);
  EXPECT_TRUE(fc.ok()) << fc.status();
  return *fc;
}

// A 4x3 ShardedTensor of two 2x3 shards, both local (no process group).
ShardedTensor LocalSharded() {
  std::vector<Shard> shards;
  ShardedTensorMetadata metadata;
  metadata.size = {4, 3};
  for (int64_t i = 0; i < 2; ++i) {
    ShardMetadata md =
        *ShardMetadata::Create({2 * i, 0}, {2, 3}, absl::string_view("cpu"));
    shards.push_back(Shard{*Tensor::Full({2, 3}, static_cast<double>(i)), md});
    metadata.shards_metadata.push_back(md);
  }
  auto st = ShardedTensor::InitFromLocalShardsAndGlobalMetadata(
      std::move(shards), std::move(metadata));
  EXPECT_OK(st.status());
  return *st;
}

// Net { fc1: Linear(12, 12), sub: Sub { fc2: Linear(12, 4), scale: 0.5 } }.
std::shared_ptr<Module> Net() {
  Generator generator(3);
  auto net = Module::Create("Net");
  auto sub = Module::Create("Sub");
  EXPECT_OK(sub->AddModule("fc2", Linear(12, 4, generator)));
  EXPECT_OK(sub->SetAttribute("scale", 0.5));
  EXPECT_OK(net->AddModule("fc1", Linear(12, 12, generator)));
  EXPECT_OK(net->AddModule("sub", sub));
  return net;
}

std::vector<std::string> Names(const StateDict& dict) {
  std::vector<std::string> names;
  for (const auto& [name, value] : dict) names.push_back(name);
  return names;
}

TEST(ModuleTest, LinearParametersFollowTorchInit) {
  Generator generator(7);
  std::shared_ptr<Module> fc = Linear(12, 12, generator);
  EXPECT_EQ("Linear", fc->type_name());
  ASSERT_OK_AND_ASSIGN(Tensor weight, fc->GetTensor("weight"));
  ASSERT_OK_AND_ASSIGN(Tensor bias, fc->GetTensor("bias"));
  EXPECT_EQ(Sizes({12, 12}), weight.sizes());
  EXPECT_EQ(Sizes({12}), bias.sizes());
  const double bound = 1.0 / std::sqrt(12.0);
  for (float v : Values(weight)) {
    EXPECT_LT(std::abs(v), bound);
  }
  // The same seed gives the same parameters.
  Generator again(7);
  ASSERT_OK_AND_ASSIGN(Tensor weight2,
                       Linear(12, 12, again)->GetTensor("weight"));
  EXPECT_TRUE(Equal(weight, weight2));
  EXPECT_THAT(Names(fc->NamedParameters()), ElementsAre("weight", "bias"));
}

TEST(ModuleTest, MissingAttributeIsAttributeError) {
  Generator generator(1);
  std::shared_ptr<Module> fc = Linear(2, 2, generator);
  EXPECT_FALSE(fc->HasAttribute("foo"));
  EXPECT_TRUE(fc->HasAttribute("bias"));
  EXPECT_THAT(fc->GetAttribute("foo"),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("'Linear' object has no attribute 'foo'")));
  EXPECT_THAT(fc->DeleteAttribute("foo"),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("'Linear' object has no attribute 'foo'")));
}

TEST(ModuleTest, WrongKindNamesModuleAttributeAndType) {
  Generator generator(1);
  std::shared_ptr<Module> fc = Linear(2, 2, generator);
  // PyTorch refuses a str over a parameter until the parameter is deleted.
  EXPECT_THAT(fc->SetAttribute("bias", std::string("foo")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("cannot assign 'str' as parameter 'bias'")));
  ASSERT_OK(fc->DeleteAttribute("bias"));
  ASSERT_OK(fc->SetAttribute("bias", std::string("foo")));
  EXPECT_THAT(
      fc->GetTensor("bias"),
      StatusIs(
          absl::StatusCode::kInvalidArgument,
          HasSubstr("Expected Linear.bias to be a Tensor, but found str")));
  EXPECT_THAT(fc->GetShardedTensor("weight"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("Expected Linear.weight to be a "
                                 "ShardedTensor, but found Tensor")));
  ASSERT_OK(fc->SetAttribute("bias", Tensor()));
  EXPECT_THAT(fc->GetTensor("bias"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("but found NoneType")));
  // None parameters are not listed.
  EXPECT_THAT(Names(fc->NamedParameters()), ElementsAre("weight"));
}

TEST(ModuleTest, TypeNames) {
  EXPECT_EQ("Tensor", Module::TypeName(*Tensor::Zeros({1})));
  EXPECT_EQ("NoneType", Module::TypeName(Tensor()));
  EXPECT_EQ("ShardedTensor", Module::TypeName(LocalSharded()));
  EXPECT_EQ("str", Module::TypeName(std::string("x")));
  EXPECT_EQ("int", Module::TypeName(int64_t{3}));
  EXPECT_EQ("float", Module::TypeName(2.5));
}

TEST(ModuleTest, SetAttributeKeepsOrderAndReplacesInPlace) {
  Module m("Custom");
  ASSERT_OK(m.SetAttribute("a", int64_t{1}));
  ASSERT_OK(m.SetAttribute("b", std::string("two")));
  ASSERT_OK(m.SetAttribute("a", int64_t{3}));
  ASSERT_EQ(2u, m.attributes().size());
  EXPECT_EQ("a", m.attributes()[0].first);
  EXPECT_EQ(3, std::get<int64_t>(m.attributes()[0].second));
  ASSERT_OK(m.DeleteAttribute("a"));
  ASSERT_EQ(1u, m.attributes().size());
  EXPECT_EQ("b", m.attributes()[0].first);
}

TEST(ModuleTest, DottedPaths) {
  std::shared_ptr<Module> net = Net();
  ASSERT_OK_AND_ASSIGN(Module * fc2, net->GetSubmodule("sub.fc2"));
  EXPECT_EQ("Linear", fc2->type_name());
  ASSERT_OK_AND_ASSIGN(Module * self, net->GetSubmodule(""));
  EXPECT_EQ(net.get(), self);
  ASSERT_OK_AND_ASSIGN(Tensor w, net->GetTensor("sub.fc2.weight"));
  EXPECT_EQ(Sizes({4, 12}), w.sizes());
  ASSERT_OK_AND_ASSIGN(Module::Value scale, net->GetAttribute("sub.scale"));
  EXPECT_EQ(0.5, std::get<double>(scale));

  EXPECT_THAT(net->GetSubmodule("sub.nope"),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("Sub has no attribute `nope`")));
  EXPECT_THAT(net->GetSubmodule("fc1.weight"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("`weight` is not an nn.Module")));
  EXPECT_THAT(net->GetAttribute("sub.fc2.foo"),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("'Linear' object has no attribute 'foo'")));

  // Setting and deleting through a path acts on the owning submodule.
  ASSERT_OK_AND_ASSIGN(Tensor zeros, Tensor::Zeros({4}));
  ASSERT_OK(net->SetAttribute("sub.fc2.bias", zeros));
  ASSERT_OK_AND_ASSIGN(Tensor bias, fc2->GetTensor("bias"));
  EXPECT_EQ(zeros.data_ptr(), bias.data_ptr());
  ASSERT_OK(net->DeleteAttribute("sub.fc2"));
  EXPECT_THAT(net->GetSubmodule("sub.fc2"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("fc2")));
}

TEST(ModuleTest, AddModuleErrors) {
  std::shared_ptr<Module> net = Net();
  EXPECT_THAT(net->AddModule("", Module::Create("X")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("can't be empty")));
  EXPECT_THAT(net->AddModule("a.b", Module::Create("X")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("can't contain \".\"")));
  ASSERT_OK_AND_ASSIGN(Module * fc1, net->GetSubmodule("fc1"));
  EXPECT_THAT(fc1->AddModule("bias", Module::Create("X")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("attribute 'bias' already exists")));
  EXPECT_THAT(
      net->AddModule("x", nullptr),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("null module")));
  EXPECT_THAT(net->SetAttribute("fc1", *Tensor::Zeros({1})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("cannot assign 'Tensor' as child module "
                                 "'fc1'")));
  // Replacing a child keeps its position.
  ASSERT_OK(net->AddModule("fc1", Module::Create("Identity")));
  EXPECT_EQ("fc1", net->children()[0].first);
  EXPECT_EQ("Identity", net->children()[0].second->type_name());
}

TEST(ModuleTest, NamedParametersAreDottedDepthFirst) {
  std::shared_ptr<Module> net = Net();
  ASSERT_OK(net->SetAttribute("sharded", LocalSharded()));
  ASSERT_OK(net->SetAttribute("note", std::string("not a parameter")));
  EXPECT_THAT(Names(net->NamedParameters()),
              ElementsAre("sharded", "fc1.weight", "fc1.bias", "sub.fc2.weight",
                          "sub.fc2.bias"));
  StateDict dict = net->StateDict();
  EXPECT_THAT(Names(dict), ElementsAre("sharded", "fc1.weight", "fc1.bias",
                                       "sub.fc2.weight", "sub.fc2.bias"));
  EXPECT_TRUE(std::holds_alternative<ShardedTensor>(dict[0].second));
  ASSERT_OK_AND_ASSIGN(Tensor w, net->GetTensor("fc1.weight"));
  EXPECT_EQ(w.data_ptr(), std::get<Tensor>(dict[1].second).data_ptr());
}

TEST(ModuleTest, LoadStateDictSetsByDottedName) {
  std::shared_ptr<Module> net = Net();
  ASSERT_OK_AND_ASSIGN(Tensor w, Tensor::Full({12, 12}, 2.0));
  StateDict dict = net->StateDict();
  dict[0].second = w;
  ASSERT_OK(net->LoadStateDict(dict));
  ASSERT_OK_AND_ASSIGN(Tensor loaded, net->GetTensor("fc1.weight"));
  EXPECT_EQ(w.data_ptr(), loaded.data_ptr());
  EXPECT_THAT(Values(loaded), ::testing::Each(2.0f));

  // A sharded value may replace a dense one of the same size.
  auto holder = Module::Create("Holder");
  ASSERT_OK(holder->SetAttribute("p", *Tensor::Zeros({4, 3})));
  ASSERT_OK(holder->LoadStateDict({{"p", LocalSharded()}}));
  EXPECT_OK(holder->GetShardedTensor("p").status());
}

TEST(ModuleTest, LoadStateDictErrorsChangeNothing) {
  std::shared_ptr<Module> net = Net();
  ASSERT_OK_AND_ASSIGN(Tensor before, net->GetTensor("fc1.bias"));
  StateDict dict = net->StateDict();
  dict.erase(dict.begin() + 1);  // fc1.bias
  dict.emplace_back("foo", *Tensor::Zeros({1}));
  dict[0].second = *Tensor::Zeros({12, 12});  // fc1.weight: still fits.
  EXPECT_THAT(net->LoadStateDict(dict),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("Error(s) in loading state_dict for "
                                       "Net:"),
                             HasSubstr("Missing key(s) in state_dict: "
                                       "\"fc1.bias\"."),
                             HasSubstr("Unexpected key(s) in state_dict: "
                                       "\"foo\"."))));
  ASSERT_OK_AND_ASSIGN(Tensor weight, net->GetTensor("fc1.weight"));
  EXPECT_NE(std::get<Tensor>(dict[0].second).data_ptr(), weight.data_ptr());

  // Not strict: the known keys load, the others are ignored.
  ASSERT_OK(net->LoadStateDict(dict, /*strict=*/false));
  ASSERT_OK_AND_ASSIGN(weight, net->GetTensor("fc1.weight"));
  EXPECT_EQ(std::get<Tensor>(dict[0].second).data_ptr(), weight.data_ptr());
  ASSERT_OK_AND_ASSIGN(Tensor bias, net->GetTensor("fc1.bias"));
  EXPECT_EQ(before.data_ptr(), bias.data_ptr());
  EXPECT_FALSE(net->HasAttribute("foo"));

  // Sizes must match, strict or not.
  StateDict wrong = {{"sub.fc2.bias", *Tensor::Zeros({5})}};
  EXPECT_THAT(net->LoadStateDict(wrong, /*strict=*/false),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("size mismatch for sub.fc2.bias: copying a "
                                 "param with shape [5] from checkpoint, the "
                                 "shape in current model is [4].")));
}

TEST(ModuleTest, CloneIsDeep) {
  std::shared_ptr<Module> net = Net();
  ShardedTensor st = LocalSharded();
  ASSERT_OK(net->SetAttribute("sharded", st));
  int calls = 0;
  net->SetForward(
      [](Module& self,
         const std::vector<ForwardValue>&) -> absl::StatusOr<ForwardValue> {
        ASSIGN_OR_RETURN(Tensor w, self.GetTensor("fc1.weight"));
        return ForwardValue(w);
      });
  net->RegisterForwardHook(
      [&calls](Module&, const std::vector<ForwardValue>&, ForwardValue output) {
        ++calls;
        return absl::StatusOr<ForwardValue>(std::move(output));
      });

  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Module> copy, net->Clone());
  ASSERT_OK_AND_ASSIGN(Tensor original_w, net->GetTensor("fc1.weight"));
  ASSERT_OK_AND_ASSIGN(Tensor copy_w, copy->GetTensor("fc1.weight"));
  EXPECT_NE(original_w.data_ptr(), copy_w.data_ptr());
  EXPECT_TRUE(Equal(original_w, copy_w));
  copy_w.data<float>()[0] = 42.0f;
  EXPECT_NE(42.0f, original_w.data<float>()[0]);
  // Submodules are new objects too.
  ASSERT_OK_AND_ASSIGN(Module * fc2, net->GetSubmodule("sub.fc2"));
  ASSERT_OK_AND_ASSIGN(Module * copy_fc2, copy->GetSubmodule("sub.fc2"));
  EXPECT_NE(fc2, copy_fc2);
  ASSERT_OK_AND_ASSIGN(Module::Value scale, copy->GetAttribute("sub.scale"));
  EXPECT_EQ(0.5, std::get<double>(scale));
  // ShardedTensor handles are copied: the shards are shared.
  ASSERT_OK_AND_ASSIGN(ShardedTensor copy_st,
                       copy->GetShardedTensor("sharded"));
  EXPECT_EQ(st.local_shards()[0].tensor.data_ptr(),
            copy_st.local_shards()[0].tensor.data_ptr());
  // Forward and hooks come along, and run on the copy.
  ASSERT_OK_AND_ASSIGN(ForwardValue out, copy->Forward());
  EXPECT_EQ(copy_w.data_ptr(), std::get<Tensor>(out).data_ptr());
  EXPECT_EQ(1, calls);
}

TEST(ModuleTest, ForwardWithoutFunctionIsUnimplemented) {
  Module m("Linear");
  EXPECT_THAT(m.Forward(),
              StatusIs(absl::StatusCode::kUnimplemented,
                       HasSubstr("Module [Linear] is missing the required "
                                 "\"forward\" function")));
}

TEST(ModuleTest, HooksRunInOrderAndMayReplaceTheOutput) {
  // forward: the first input; hooks: append their tag to a log, the second
  // replaces the output with a tensor of its own.
  Module m("Identity",
           [](Module&, const std::vector<ForwardValue>& inputs)
               -> absl::StatusOr<ForwardValue> {
             if (inputs.empty()) return absl::InvalidArgumentError("no input");
             return inputs[0];
           });
  std::vector<std::string> log;
  ASSERT_OK_AND_ASSIGN(Tensor input, Tensor::Full({2}, 1.0));
  ASSERT_OK_AND_ASSIGN(Tensor replacement, Tensor::Full({3}, 7.0));
  int first = m.RegisterForwardHook(
      [&log](Module&, const std::vector<ForwardValue>&,
             ForwardValue output) -> absl::StatusOr<ForwardValue> {
        log.push_back("first");
        return output;
      });
  int second = m.RegisterForwardHook(
      [&](Module& self, const std::vector<ForwardValue>& inputs,
          ForwardValue output) -> absl::StatusOr<ForwardValue> {
        log.push_back("second");
        EXPECT_EQ(&m, &self);
        EXPECT_EQ(1u, inputs.size());
        EXPECT_EQ(input.data_ptr(), std::get<Tensor>(output).data_ptr());
        return ForwardValue(replacement);
      });
  ASSERT_OK_AND_ASSIGN(ForwardValue out, m.Forward({input}));
  EXPECT_EQ(replacement.data_ptr(), std::get<Tensor>(out).data_ptr());
  EXPECT_THAT(log, ElementsAre("first", "second"));

  EXPECT_TRUE(m.RemoveForwardHook(second));
  EXPECT_FALSE(m.RemoveForwardHook(second));
  ASSERT_OK_AND_ASSIGN(out, m.Forward({input}));
  EXPECT_EQ(input.data_ptr(), std::get<Tensor>(out).data_ptr());

  // Errors from forward and hooks are the result.
  EXPECT_THAT(m.Forward(), StatusIs(absl::StatusCode::kInvalidArgument,
                                    HasSubstr("no input")));
  m.RegisterForwardHook([](Module&, const std::vector<ForwardValue>&,
                           ForwardValue) -> absl::StatusOr<ForwardValue> {
    return absl::InternalError("hook failed");
  });
  EXPECT_THAT(m.Forward({input}),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("hook failed")));
  EXPECT_TRUE(m.RemoveForwardHook(first));
}

// A hook may remove itself while Forward runs.
TEST(ModuleTest, HookMayRemoveItself) {
  Module m("Identity",
           [](Module&, const std::vector<ForwardValue>& inputs)
               -> absl::StatusOr<ForwardValue> { return inputs[0]; });
  int runs = 0;
  int handle = -1;
  handle = m.RegisterForwardHook(
      [&](Module& self, const std::vector<ForwardValue>&,
          ForwardValue output) -> absl::StatusOr<ForwardValue> {
        ++runs;
        EXPECT_TRUE(self.RemoveForwardHook(handle));
        return output;
      });
  ASSERT_OK_AND_ASSIGN(Tensor input, Tensor::Zeros({1}));
  ASSERT_OK(m.Forward({input}).status());
  ASSERT_OK(m.Forward({input}).status());
  EXPECT_EQ(1, runs);
}

}  // namespace
}  // namespace tessera
