// Port of the reference's TestCustomSharder (test_sharder.py), and tests
// of ShardModule's plans beyond it: parameter specs on nested modules,
// src_rank, output_plan and return_local_tensor, missing paths, plans that
// are checked whole before anything changes, and mistakes made on one rank
// only. Each test runs in 4 real rank processes on loopback and is
// instantiated for "cpu" and "cuda:N" placements (the latter skip without
// a GPU; see device_ranks_test.h).
//
// Every rank builds its model from the same seeded Generator, so a rank
// checks sharded parameters (gathered whole) and sharded outputs against
// the dense model it started from.
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/sharding_spec.h"
#include "common/status_macros.h"
#include "common/tensor/tensor.h"
#include "common/tensor/tensor_ops.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/sharded/module.h"
#include "server/sharded/nn.h"
#include "server/sharded/shard_api.h"
#include "server/sharded/sharded_tensor.h"
#include "server/sharded/sharding_plan.h"
#include "tests/integration/device_ranks_test.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::StatusIs;
using ::testing::_;
using ::testing::HasSubstr;

class TestCustomSharder : public DeviceRanksTest {};
class TestShardModule : public DeviceRanksTest {};

using Forward = Module::ForwardValue;
using Inputs = std::vector<Forward>;

// The reference's sizes: CustomEmbeddingBagCollection(10, 10, 8), and the
// split TEST_GPU_NUM // 2.
constexpr int64_t kNumBags = 10;
constexpr int64_t kEmbeddingsPerBag = 10;
constexpr int64_t kDim = 8;
constexpr int kSplit = 2;

absl::StatusOr<Tensor> Dense(absl::StatusOr<Forward> value) {
  if (!value.ok()) return value.status();
  if (const Tensor* tensor = std::get_if<Tensor>(&*value)) return *tensor;
  return absl::InternalError("expected a dense output, got a ShardedTensor");
}

// The child `name` of `parent`, shared (GetSubmodule only lends it).
absl::StatusOr<std::shared_ptr<Module>> Child(const Module& parent,
                                              const std::string& name) {
  for (const auto& [key, child] : parent.children()) {
    if (key == name) return child;
  }
  return absl::NotFoundError(absl::StrCat("no child ", name));
}

// Model.to(device): every dense parameter of the tree.
absl::Status MoveParameters(Module& module, const Device& device) {
  for (const auto& [path, value] : module.NamedParameters()) {
    const Tensor* tensor = std::get_if<Tensor>(&value);
    if (tensor == nullptr) continue;
    ASSIGN_OR_RETURN(Tensor moved, tensor->To(device));
    RETURN_IF_ERROR(module.SetAttribute(path, std::move(moved)));
  }
  return absl::OkStatus();
}

// The forward of CustomEmbeddingBagCollection and CustomShardedEBC:
// torch.cat of every bag's output, in the ModuleDict's order.
absl::StatusOr<Forward> CatBags(Module& self, const Inputs& inputs) {
  ASSIGN_OR_RETURN(Module * bags, self.GetSubmodule("embedding_bags"));
  std::vector<Tensor> outputs;
  for (const auto& [name, bag] : bags->children()) {
    ASSIGN_OR_RETURN(Tensor out, Dense(bag->Forward(inputs)));
    outputs.push_back(std::move(out));
  }
  ASSIGN_OR_RETURN(Tensor joined, Cat(outputs, 0));
  return Forward(std::move(joined));
}

std::string BagKey(int64_t i) { return absl::StrCat("embedding_bag_", i); }

absl::StatusOr<std::shared_ptr<Module>> MakeEbc(int64_t num_bags,
                                                int64_t per_bag, int64_t dim,
                                                Generator* generator) {
  auto ebc = Module::Create("CustomEmbeddingBagCollection", CatBags);
  RETURN_IF_ERROR(ebc->SetAttribute("num_bags", num_bags));
  auto bags = Module::Create("ModuleDict");
  for (int64_t i = 0; i < num_bags; ++i) {
    ASSIGN_OR_RETURN(auto bag,
                     MakeEmbeddingBag(per_bag, dim, "sum", generator));
    RETURN_IF_ERROR(bags->AddModule(BagKey(i), std::move(bag)));
  }
  RETURN_IF_ERROR(ebc->AddModule("embedding_bags", std::move(bags)));
  return ebc;
}

// The reference's CustomSharder: CustomShardedEBC takes the collection's
// bags after sharding each one's weight (by ShardModule, on the collection
// itself) row-wise below the split and column-wise from it on. The
// reference's CustomShardedEBC has no forward (PyTorch never swaps it in);
// here it is swapped in, so it gets the collection's.
class CustomSharder : public Sharder {
 public:
  static absl::StatusOr<std::shared_ptr<CustomSharder>> Create(
      const std::vector<std::string>& devices, int split) {
    ASSIGN_OR_RETURN(ChunkShardingSpec rowwise,
                     ChunkShardingSpec::Create(0, devices));
    ASSIGN_OR_RETURN(ChunkShardingSpec colwise,
                     ChunkShardingSpec::Create(1, devices));
    return std::make_shared<CustomSharder>(rowwise, colwise, split);
  }
  CustomSharder(ChunkShardingSpec rowwise, ChunkShardingSpec colwise, int split)
      : rowwise_(std::move(rowwise)),
        colwise_(std::move(colwise)),
        split_(split) {}

  ShardingSpec rowwise_spec() const { return rowwise_; }
  ShardingSpec colwise_spec() const { return colwise_; }

  absl::StatusOr<std::shared_ptr<Module>> Shard(
      std::shared_ptr<Module> ebc) override {
    if (ebc->type_name() != "CustomEmbeddingBagCollection") {
      return absl::InvalidArgumentError(
          "The custom sharder only supports CustomEmbeddingBagCollection");
    }
    ASSIGN_OR_RETURN(Module::Value value, ebc->GetAttribute("num_bags"));
    const int64_t num_bags = std::get<int64_t>(value);
    if (split_ >= num_bags) {
      return absl::InvalidArgumentError("split_idx must be below num_bags");
    }
    auto sharded = Module::Create("CustomShardedEBC", CatBags);
    RETURN_IF_ERROR(sharded->SetAttribute("split_idx", int64_t{split_}));
    auto bags = Module::Create("ModuleDict");
    ASSIGN_OR_RETURN(Module * ebc_bags, ebc->GetSubmodule("embedding_bags"));
    for (int64_t i = 0; i < num_bags; ++i) {
      ShardingPlan plan;
      plan.plan.emplace(absl::StrCat("embedding_bags.", BagKey(i), ".weight"),
                        i < split_ ? rowwise_spec() : colwise_spec());
      RETURN_IF_ERROR(ShardModule(*ebc, plan));
      ASSIGN_OR_RETURN(auto bag, Child(*ebc_bags, BagKey(i)));
      RETURN_IF_ERROR(bags->AddModule(BagKey(i), std::move(bag)));
    }
    RETURN_IF_ERROR(sharded->AddModule("embedding_bags", std::move(bags)));
    return sharded;
  }

 private:
  ChunkShardingSpec rowwise_;
  ChunkShardingSpec colwise_;
  int split_;
};

// The reference's MyModule: forward is self.ebc(inputs).
absl::StatusOr<std::shared_ptr<Module>> MakeMyModule(Generator* generator) {
  auto model = Module::Create(
      "MyModule",
      [](Module& self, const Inputs& inputs) -> absl::StatusOr<Forward> {
        ASSIGN_OR_RETURN(Module * ebc, self.GetSubmodule("ebc"));
        return ebc->Forward(inputs);
      });
  ASSIGN_OR_RETURN(auto ebc,
                   MakeEbc(kNumBags, kEmbeddingsPerBag, kDim, generator));
  RETURN_IF_ERROR(model->AddModule("ebc", std::move(ebc)));
  return model;
}

absl::StatusOr<Tensor> Arange2x4(const Device& device) {
  std::vector<int64_t> values = {0, 1, 2, 3, 4, 5, 6, 7};
  ASSIGN_OR_RETURN(Tensor host,
                   Tensor::FromVector<int64_t>(absl::MakeSpan(values), {2, 4}));
  return host.To(device);
}

// Rows [begin, end) of two float tensors on any device, within `tolerance`
// relative to 1 + |expected| (0: bit for bit).
void ExpectRowsNear(const Tensor& expected, const Tensor& actual, int64_t begin,
                    int64_t end, double tolerance) {
  ASSERT_OK_AND_ASSIGN(Tensor e, expected.Narrow(0, begin, end - begin));
  ASSERT_OK_AND_ASSIGN(Tensor a, actual.Narrow(0, begin, end - begin));
  ASSERT_OK_AND_ASSIGN(e, e.To(Device::Cpu()));
  ASSERT_OK_AND_ASSIGN(a, a.To(Device::Cpu()));
  ASSERT_OK_AND_ASSIGN(e, e.Contiguous());
  ASSERT_OK_AND_ASSIGN(a, a.Contiguous());
  for (int64_t i = 0; i < e.numel(); ++i) {
    const float x = e.data<float>()[i];
    const float y = a.data<float>()[i];
    if (tolerance == 0) {
      ASSERT_EQ(x, y) << "at " << begin << " + " << i;
    } else {
      ASSERT_NEAR(x, y, tolerance * (1 + std::fabs(x)))
          << "at " << begin << " + " << i;
    }
  }
}

// The sharded parameter at `path`, gathered whole, equals `dense`.
void ExpectShardedAs(const Module& module, const std::string& path,
                     const ShardingSpec& spec, const Tensor& dense) {
  ASSERT_OK_AND_ASSIGN(ShardedTensor st, module.GetShardedTensor(path));
  EXPECT_EQ(st.sharding_spec(), spec) << path;
  ASSERT_OK_AND_ASSIGN(Tensor whole, st.GatherAll());
  ASSERT_OK_AND_ASSIGN(Tensor host, dense.To(Device::Cpu()));
  EXPECT_TRUE(Equal(host, whole)) << path;
}

TEST_P(TestCustomSharder, CustomSharder) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms(/*init_rpc=*/false));
  ASSERT_OK_AND_ASSIGN(auto custom_sharder,
                       CustomSharder::Create(Placements({0, 1, 2, 3}), kSplit));
  ShardingPlan sharding_plan;
  sharding_plan.plan.emplace("ebc", custom_sharder);

  Generator generator(2022);
  ASSERT_OK_AND_ASSIGN(auto local_model, MakeMyModule(&generator));
  ASSERT_OK(MoveParameters(*local_model, DeviceOf(rank())));
  ASSERT_OK_AND_ASSIGN(auto sharded_model, local_model->Clone());

  ASSERT_OK(ShardModule(*sharded_model, sharding_plan));

  ASSERT_OK_AND_ASSIGN(Module * ebc, sharded_model->GetSubmodule("ebc"));
  EXPECT_EQ(ebc->type_name(), "CustomShardedEBC");
  ASSERT_OK_AND_ASSIGN(Module * emb_bags, ebc->GetSubmodule("embedding_bags"));
  ASSERT_OK_AND_ASSIGN(ShardedTensor first,
                       emb_bags->GetShardedTensor("embedding_bag_0.weight"));
  ASSERT_OK_AND_ASSIGN(ShardedTensor last,
                       emb_bags->GetShardedTensor("embedding_bag_9.weight"));
  EXPECT_EQ(first.sharding_spec(), custom_sharder->rowwise_spec());
  EXPECT_EQ(last.sharding_spec(), custom_sharder->colwise_spec());
  // Beyond the reference: every bag, values included, and the local model
  // (deep-copied) stays dense.
  for (int64_t i = 0; i < kNumBags; ++i) {
    const std::string weight =
        absl::StrCat("ebc.embedding_bags.", BagKey(i), ".weight");
    ASSERT_OK_AND_ASSIGN(Tensor dense, local_model->GetTensor(weight));
    ExpectShardedAs(*sharded_model, weight,
                    i < kSplit ? custom_sharder->rowwise_spec()
                               : custom_sharder->colwise_spec(),
                    dense);
  }

  ASSERT_OK_AND_ASSIGN(Tensor input, Arange2x4(DeviceOf(rank())));
  ASSERT_OK_AND_ASSIGN(Tensor local_output,
                       Dense(local_model->Forward({input})));
  ASSERT_OK_AND_ASSIGN(Tensor sharded_output,
                       Dense(sharded_model->Forward({input})));
  ASSERT_EQ(local_output.sizes(), (Sizes{2 * kNumBags, kDim}));
  ASSERT_EQ(sharded_output.sizes(), local_output.sizes());
  EXPECT_EQ(sharded_output.device(), local_output.device());
  // Row-wise bags add each owner's partial sum in rank order: for the
  // input bag {4, 5, 6, 7} (rows 3..5 on rank 1, 6..8 on rank 2) that is
  // (w4 + w5) + (w6 + w7) instead of ((w4 + w5) + w6) + w7, which differs
  // in the last bits, so PyTorch's float32 tolerance. Column-wise bags sum
  // every column on one rank in the dense order: bit for bit.
  ExpectRowsNear(local_output, sharded_output, 0, 2 * kSplit, 1e-5);
  ExpectRowsNear(local_output, sharded_output, 2 * kSplit, 2 * kNumBags, 0);
}

TEST_P(TestCustomSharder, CustomSharderErrors) {
  RANKS_TEST_BEGIN();
  ASSERT_OK_AND_ASSIGN(auto custom_sharder,
                       CustomSharder::Create(Placements({0, 1, 2, 3}), kSplit));
  ShardingPlan sharding_plan;
  sharding_plan.plan.emplace("", custom_sharder);
  Generator generator(7);
  ASSERT_OK_AND_ASSIGN(auto sharded_model,
                       MakeEbc(kNumBags, kEmbeddingsPerBag, kDim, &generator));
  ASSERT_OK(MoveParameters(*sharded_model, DeviceOf(rank())));

  // Before comms exist the plan's own mistake is still the answer.
  EXPECT_THAT(
      ShardModule(*sharded_model, sharding_plan),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("path must not be empty for custom sharder!")));
  EXPECT_THAT(ShardModule(*sharded_model, ShardingPlan()),
              StatusIs(absl::StatusCode::kFailedPrecondition, _));

  ASSERT_OK(InitComms(/*init_rpc=*/false));
  EXPECT_THAT(
      ShardModule(*sharded_model, sharding_plan),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("path must not be empty for custom sharder!")));

  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {0, 1}));
  sharding_plan = ShardingPlan();
  sharding_plan.plan.emplace("embedding_bags.embedding_bag_0.weight", spec);
  sharding_plan.plan.emplace("embedding_bags", custom_sharder);
  EXPECT_THAT(
      ShardModule(*sharded_model, sharding_plan),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("should not conflict with the submodule tree")));
  EXPECT_THAT(ShardModule(*sharded_model, sharding_plan),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("trying to shard a parameter: "
                                 "embedding_bags.embedding_bag_0.weight, but "
                                 "there's already a Sharder entry for module "
                                 "embedding_bags, parameter sharding")));
  // The plan is checked before anything is sharded.
  EXPECT_OK(sharded_model->GetTensor("embedding_bags.embedding_bag_0.weight"));
}

// Net: fc1 = Linear(32, 16), fc2 = Linear(16, 8); forward fc2(fc1(x)).
absl::StatusOr<std::shared_ptr<Module>> MakeNet(Generator* generator,
                                                const Device& device,
                                                bool with_fc2 = true) {
  auto net = Module::Create(
      "Net", [](Module& self, const Inputs& inputs) -> absl::StatusOr<Forward> {
        ASSIGN_OR_RETURN(Module * fc1, self.GetSubmodule("fc1"));
        ASSIGN_OR_RETURN(Module * fc2, self.GetSubmodule("fc2"));
        ASSIGN_OR_RETURN(Forward hidden, fc1->Forward(inputs));
        return fc2->Forward({hidden});
      });
  ASSIGN_OR_RETURN(auto fc1, MakeLinear(32, 16, generator));
  ASSIGN_OR_RETURN(auto fc2, MakeLinear(16, 8, generator));
  RETURN_IF_ERROR(net->AddModule("fc1", std::move(fc1)));
  if (with_fc2) RETURN_IF_ERROR(net->AddModule("fc2", std::move(fc2)));
  RETURN_IF_ERROR(MoveParameters(*net, device));
  return net;
}

TEST_P(TestShardModule, SpecPlanShardsNestedParameters) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms(/*init_rpc=*/false));
  Generator generator(31);
  ASSERT_OK_AND_ASSIGN(auto dense, MakeNet(&generator, DeviceOf(rank())));
  ASSERT_OK_AND_ASSIGN(auto net, dense->Clone());
  ASSERT_OK_AND_ASSIGN(ShardingSpec rowwise, Chunk(0, {0, 1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(ShardingSpec colwise, Chunk(1, {3, 2, 1, 0}));
  ShardingPlan plan;
  plan.plan.emplace("fc1.weight", rowwise);
  plan.plan.emplace("fc2.weight", colwise);
  ASSERT_OK(ShardModule(*net, plan));

  for (const auto& [path, spec] :
       {std::pair("fc1.weight", rowwise), std::pair("fc2.weight", colwise)}) {
    ASSERT_OK_AND_ASSIGN(Tensor weight, dense->GetTensor(path));
    ExpectShardedAs(*net, path, spec, weight);
  }
  EXPECT_OK(net->GetTensor("fc1.bias"));
  ASSERT_OK_AND_ASSIGN(Tensor x,
                       Tensor::Rand({5, 32}, TensorOptions(), &generator));
  ASSERT_OK_AND_ASSIGN(x, x.To(DeviceOf(rank())));
  ASSERT_OK_AND_ASSIGN(Tensor expected, Dense(dense->Forward({x})));
  ASSERT_OK_AND_ASSIGN(Tensor y, Dense(net->Forward({x})));
  ASSERT_EQ(y.sizes(), (Sizes{5, 8}));
  // The sharded linears add the same products in another order.
  ExpectRowsNear(expected, y, 0, 5, 1e-5);
}

TEST_P(TestShardModule, SpecPlanTakesValuesFromSrcRank) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms(/*init_rpc=*/false));
  // Each rank's own values; rank 3's must win on every rank.
  Generator mine(100 + rank());
  ASSERT_OK_AND_ASSIGN(auto fc, MakeLinear(12, 6, &mine));
  ASSERT_OK(MoveParameters(*fc, DeviceOf(rank())));
  Generator theirs(103);
  ASSERT_OK_AND_ASSIGN(auto source, MakeLinear(12, 6, &theirs));
  ASSERT_OK_AND_ASSIGN(Tensor expected, source->GetTensor("weight"));
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {0, 1, 2, 3}));
  ShardingPlan plan;
  plan.plan.emplace("weight", spec);
  ASSERT_OK(ShardModule(*fc, plan, /*src_rank=*/3));
  ExpectShardedAs(*fc, "weight", spec, expected);
}

// A module whose forward shards its input row-wise: a ShardedTensor output
// for output_plan and return_local_tensor to act on.
absl::StatusOr<std::shared_ptr<Module>> MakeScatterNet(ShardingSpec rowwise) {
  auto scatter = Module::Create(
      "Scatter",
      [rowwise](Module&, const Inputs& inputs) -> absl::StatusOr<Forward> {
        ASSIGN_OR_RETURN(ShardedTensor st,
                         ShardTensor(std::get<Tensor>(inputs[0]), rowwise));
        return Forward(std::move(st));
      });
  auto net = Module::Create(
      "Net", [](Module& self, const Inputs& inputs) -> absl::StatusOr<Forward> {
        ASSIGN_OR_RETURN(Module * child, self.GetSubmodule("scatter"));
        return child->Forward(inputs);
      });
  RETURN_IF_ERROR(net->AddModule("scatter", std::move(scatter)));
  return net;
}

TEST_P(TestShardModule, OutputPlanAndReturnLocalTensor) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms(/*init_rpc=*/false));
  ASSERT_OK_AND_ASSIGN(ShardingSpec rowwise, Chunk(0, {0, 1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(ShardingSpec colwise, Chunk(1, {0, 1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(auto net, MakeScatterNet(rowwise));
  Generator generator(5);
  ASSERT_OK_AND_ASSIGN(Tensor x,
                       Tensor::Rand({8, 4}, TensorOptions(), &generator));
  ASSERT_OK_AND_ASSIGN(x, x.To(DeviceOf(rank())));

  // Without a plan the output is the row-wise ShardedTensor.
  ASSERT_OK_AND_ASSIGN(Forward out, net->Forward({x}));
  ASSERT_TRUE(std::holds_alternative<ShardedTensor>(out));
  EXPECT_EQ(std::get<ShardedTensor>(out).sharding_spec(), rowwise);

  ShardingPlan plan;
  plan.output_plan.emplace("scatter", colwise);
  plan.return_local_tensor.push_back("");  // The root.
  ASSERT_OK(ShardModule(*net, plan));
  // Resharded column-wise by the child's hook, then this rank's [8, 1]
  // column, squeezed, by the root's.
  ASSERT_OK_AND_ASSIGN(Tensor local, Dense(net->Forward({x})));
  ASSERT_OK_AND_ASSIGN(Tensor column, x.Narrow(1, rank(), 1));
  ASSERT_OK_AND_ASSIGN(column, column.Contiguous());
  ASSERT_OK_AND_ASSIGN(column, column.View({8}));
  ASSERT_OK_AND_ASSIGN(column, column.To(Device::Cpu()));
  ASSERT_OK_AND_ASSIGN(local, local.To(Device::Cpu()));
  EXPECT_TRUE(Equal(column, local));
}

TEST_P(TestShardModule, MissingPathsFailBeforeAnythingIsSharded) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms(/*init_rpc=*/false));
  Generator generator(41);
  ASSERT_OK_AND_ASSIGN(auto net, MakeNet(&generator, DeviceOf(rank())));
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {0, 1, 2, 3}));
  auto plan_with = [&](const std::string& bad) {
    ShardingPlan plan;
    plan.plan.emplace("fc1.weight", spec);
    plan.plan.emplace(bad, spec);
    return plan;
  };
  // PyTorch's get_submodule and shard_parameter wording.
  EXPECT_THAT(ShardModule(*net, plan_with("fc3.weight")),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("Net has no attribute `fc3`")));
  EXPECT_THAT(ShardModule(*net, plan_with("fc2.foo")),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("Linear has no attribute `foo`")));
  EXPECT_THAT(ShardModule(*net, plan_with("fc1.weight.data")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("`weight` is not an nn.Module")));
  ASSERT_OK_AND_ASSIGN(auto sharder,
                       CustomSharder::Create(Placements({0, 1, 2, 3}), 1));
  ShardingPlan plan = plan_with("fc2.weight");
  plan.plan.emplace("fc9", sharder);
  EXPECT_THAT(ShardModule(*net, plan),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("Net has no attribute `fc9`")));
  plan = plan_with("fc2.weight");
  plan.output_plan.emplace("fc1.relu", spec);
  EXPECT_THAT(ShardModule(*net, plan),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("Linear has no attribute `relu`")));
  plan = plan_with("fc2.weight");
  plan.return_local_tensor.push_back("gelu");
  EXPECT_THAT(ShardModule(*net, plan),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("Net has no attribute `gelu`")));
  EXPECT_OK(net->GetTensor("fc1.weight"));
  EXPECT_OK(net->GetTensor("fc2.weight"));
}

TEST_P(TestShardModule, PlanErrors) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms(/*init_rpc=*/false));
  Generator generator(43);
  ASSERT_OK_AND_ASSIGN(auto net, MakeNet(&generator, DeviceOf(rank())));
  ASSERT_OK_AND_ASSIGN(auto sharder,
                       CustomSharder::Create(Placements({0, 1, 2, 3}), 1));
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {0, 1, 2, 3}));

  ShardingPlan plan;
  plan.plan.emplace("fc1", std::shared_ptr<Sharder>());
  EXPECT_THAT(ShardModule(*net, plan),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("Only `ShardingSpec` and `Sharder` are "
                                 "supported to shard 'fc1'")));
  // A Sharder inside another's subtree.
  plan = ShardingPlan();
  plan.plan.emplace("fc1", sharder);
  plan.plan.emplace("fc1.inner", sharder);
  EXPECT_THAT(ShardModule(*net, plan),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("should not conflict with the submodule "
                                 "tree")));
  // A path that merely starts with a Sharder's ("fc1" and "fc10") is not
  // inside its subtree (PyTorch's string prefix test would say it is).
  // Specs come before Sharders; the Sharder's own error comes back.
  ASSERT_OK_AND_ASSIGN(auto fc10, MakeLinear(4, 4, &generator));
  ASSERT_OK(MoveParameters(*fc10, DeviceOf(rank())));
  ASSERT_OK(net->AddModule("fc10", fc10));
  plan = ShardingPlan();
  plan.plan.emplace("fc1", sharder);
  plan.plan.emplace("fc10.weight", spec);
  EXPECT_THAT(ShardModule(*net, plan),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("The custom sharder only supports "
                                 "CustomEmbeddingBagCollection")));
  ASSERT_OK_AND_ASSIGN(ShardedTensor st, net->GetShardedTensor("fc10.weight"));
  EXPECT_EQ(st.sharding_spec(), spec);
  ASSERT_OK_AND_ASSIGN(Module * fc1, net->GetSubmodule("fc1"));
  EXPECT_EQ(fc1->type_name(), "Linear");
}

TEST_P(TestShardModule, OneRanksMistakeFailsEveryRank) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms(/*init_rpc=*/false));
  Generator generator(47);
  ASSERT_OK_AND_ASSIGN(auto net, MakeNet(&generator, DeviceOf(rank()),
                                         /*with_fc2=*/rank() != 2));
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {0, 1, 2, 3}));
  ShardingPlan plan;
  plan.plan.emplace("fc1.weight", spec);
  plan.plan.emplace("fc2.weight", spec);
  EXPECT_THAT(ShardModule(*net, plan),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr(absl::StrCat(rank() == 2 ? "" : "on rank 2: ",
                                              "Net has no attribute `fc2`"))));
  EXPECT_OK(net->GetTensor("fc1.weight"));

  // Plans that differ between ranks.
  ASSERT_OK_AND_ASSIGN(ShardingSpec other, Chunk(1, {0, 1, 2, 3}));
  plan = ShardingPlan();
  plan.plan.emplace("fc1.weight", rank() == 1 ? other : spec);
  EXPECT_THAT(
      ShardModule(*net, plan),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr(absl::StrCat("sharding plan on rank: ", rank(),
                                      " does not match with sharding plan on "
                                      "rank: ",
                                      rank() == 1 ? 0 : 1))));
  EXPECT_OK(net->GetTensor("fc1.weight"));

  // The same comms still work.
  plan.plan.at("fc1.weight") = spec;
  ASSERT_OK(ShardModule(*net, plan));
  EXPECT_OK(net->GetShardedTensor("fc1.weight"));
}

TESSERA_INSTANTIATE_FOR_DEVICES(TestCustomSharder);
TESSERA_INSTANTIATE_FOR_DEVICES(TestShardModule);

}  // namespace
}  // namespace tessera
