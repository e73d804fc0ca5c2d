// Ports of the reference's TestShardedTensorCustomOps (test_sharded_tensor.py)
// and tests of the dispatch order and the built-in sharded ops (asin,
// linear, embedding_bag), each checked against the dense op on the whole
// tensor. Each test runs in 4 real rank processes on loopback and is
// instantiated for "cpu" and "cuda:N" placements (the latter skip without a
// GPU; see device_ranks_test.h).
//
// Weights are drawn from the same seeded Generator on every rank, so every
// rank can compute the dense result itself; inputs differ per rank, as each
// member of a sharded op brings its own.
#include <cmath>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/sharding_spec.h"
#include "common/tensor/tensor.h"
#include "common/tensor/tensor_ops.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/sharded/module.h"
#include "server/sharded/nn.h"
#include "server/sharded/shard_api.h"
#include "server/sharded/sharded_ops.h"
#include "server/sharded/sharded_tensor.h"
#include "tests/integration/device_ranks_test.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

class TestShardedTensorCustomOps : public DeviceRanksTest {};
class TestShardedOps : public DeviceRanksTest {};

using Types = std::vector<std::string>;
using Group = std::shared_ptr<ProcessGroup>;

// The same uniform tensor on every rank that passes the same seed.
absl::StatusOr<Tensor> Seeded(const Sizes& sizes, uint64_t seed,
                              const Device& device) {
  Generator generator(seed);
  ASSIGN_OR_RETURN(Tensor host, Tensor::Rand(sizes, {}, &generator));
  return host.To(device);
}

// `bags` rows of `per_bag` int64 indices in [0, n).
absl::StatusOr<Tensor> SeededBags(int64_t bags, int64_t per_bag, int64_t n,
                                  uint64_t seed, const Device& device) {
  Generator generator(seed);
  std::vector<int64_t> indices(bags * per_bag);
  for (int64_t& index : indices) index = generator.NextU64() % n;
  ASSIGN_OR_RETURN(Tensor host,
                   Tensor::FromVector<int64_t>(indices, {bags, per_bag}));
  return host.To(device);
}

// Moves a module's dense tensor attributes to `device` (module.cuda(rank)).
absl::Status MoveTo(Module& module, const Device& device) {
  for (const auto& [name, value] : module.attributes()) {
    const Tensor* tensor = std::get_if<Tensor>(&value);
    if (tensor == nullptr || !tensor->defined()) continue;
    ASSIGN_OR_RETURN(Tensor moved, tensor->To(device));
    RETURN_IF_ERROR(module.SetAttribute(name, moved));
  }
  return absl::OkStatus();
}

template <typename T>
absl::StatusOr<T> Get(absl::StatusOr<OpValue> value) {
  if (!value.ok()) return value.status();
  if (T* typed = std::get_if<T>(&*value)) return *typed;
  return absl::InternalError(
      absl::StrCat("unexpected ", OpValueString(*value)));
}

absl::StatusOr<Tensor> Output(absl::StatusOr<Module::ForwardValue> value) {
  if (!value.ok()) return value.status();
  if (Tensor* tensor = std::get_if<Tensor>(&*value)) return *tensor;
  return absl::InternalError("forward returned a ShardedTensor");
}

// Elementwise |expected - actual| <= 1e-5 (1 + |expected|): the sharded ops
// add the same products in another order.
void ExpectClose(const Tensor& expected, const Tensor& actual) {
  ASSERT_EQ(expected.sizes(), actual.sizes());
  ASSERT_EQ(expected.dtype(), actual.dtype());
  ASSERT_EQ(expected.device(), actual.device());
  ASSERT_OK_AND_ASSIGN(Tensor e, expected.To(Device::Cpu()));
  ASSERT_OK_AND_ASSIGN(Tensor a, actual.To(Device::Cpu()));
  for (int64_t i = 0; i < e.numel(); ++i) {
    const float x = e.data<float>()[i];
    ASSERT_NEAR(x, a.data<float>()[i], 1e-5 * (1 + std::fabs(x))) << "at " << i;
  }
}

// Without a ShardedTensor argument CallOp runs the dense kernels (in this
// process only: no ranks are needed).
TEST(DenseDispatchTest, ArgumentsByPositionAndKeyword) {
  ASSERT_OK_AND_ASSIGN(Tensor x, Seeded({3, 4}, 1, Device::Cpu()));
  ASSERT_OK_AND_ASSIGN(Tensor w, Seeded({5, 4}, 2, Device::Cpu()));
  ASSERT_OK_AND_ASSIGN(Tensor b, Seeded({5}, 3, Device::Cpu()));
  ASSERT_OK_AND_ASSIGN(Tensor expected, Linear(x, w, b));
  ASSERT_OK_AND_ASSIGN(Tensor y,
                       Get<Tensor>(CallOp("linear", {x, w}, {{"bias", b}})));
  EXPECT_TRUE(Equal(expected, y));
  ASSERT_OK_AND_ASSIGN(y, Get<Tensor>(CallOp("linear", {x, w, OpValue()})));
  ASSERT_OK_AND_ASSIGN(expected, Linear(x, w));
  EXPECT_TRUE(Equal(expected, y));

  ASSERT_OK_AND_ASSIGN(Tensor bags, SeededBags(2, 3, 5, 4, Device::Cpu()));
  ASSERT_OK_AND_ASSIGN(expected, EmbeddingBag(bags, w, "sum"));
  ASSERT_OK_AND_ASSIGN(y, Get<Tensor>(CallOp("embedding_bag", {bags, w},
                                             {{"mode", std::string("sum")}})));
  EXPECT_TRUE(Equal(expected, y));
  EXPECT_THAT(CallOp("embedding_bag", {bags, w, bags}),
              StatusIs(absl::StatusCode::kUnimplemented,
                       HasSubstr("offsets are not supported")));

  ASSERT_OK_AND_ASSIGN(expected, Cat({x, x}, 1));
  ASSERT_OK_AND_ASSIGN(
      y, Get<Tensor>(CallOp("cat", {x, x}, {{"dim", int64_t{1}}})));
  EXPECT_TRUE(Equal(expected, y));

  EXPECT_THAT(CallOp("linear", {x, std::string("w")}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("linear(): argument 'weight' (position 2) "
                                 "must be Tensor, not str")));
  EXPECT_THAT(CallOp("linear", {x}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("linear() missing required argument "
                                 "'weight'")));
}

TEST_P(TestShardedTensorCustomOps, CustomOp) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms(/*init_rpc=*/false));
  ASSERT_OK_AND_ASSIGN(
      ScopedOpRegistration my_sharded_asin,
      ScopedOpRegistration::Create(
          ShardedOpRegistry::kAnySpec, "asin",
          [](const Types&, const OpArgs& args, const OpKwargs&,
             const Group&) -> absl::StatusOr<Tensor> {
            return Asin(
                std::get<ShardedTensor>(args[0]).local_shards()[0].tensor);
          }));
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {0, 1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(ShardedTensor st, ShardedTensor::Rand(spec, {10, 10}));
  ASSERT_OK_AND_ASSIGN(Tensor res, Get<Tensor>(CallOp("asin", {st})));
  ASSERT_OK_AND_ASSIGN(Tensor expected, Asin(st.local_shards()[0].tensor));
  EXPECT_TRUE(Equal(expected, res));
}

TEST_P(TestShardedTensorCustomOps, CustomOpOverride) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms(/*init_rpc=*/false));
  ASSERT_OK_AND_ASSIGN(Tensor t, Seeded({10, 10}, 7, DeviceOf(rank())));
  auto returns = [](OpValue value) {
    return [value](const Types&, const OpArgs&, const OpKwargs&,
                   const Group&) -> absl::StatusOr<OpValue> { return value; };
  };
  ASSERT_OK_AND_ASSIGN(
      ScopedOpRegistration my_sharded_linear,
      ScopedOpRegistration::Create("chunk", "linear", returns(t)));
  // Registered for the other kind of spec: never called here.
  ASSERT_OK_AND_ASSIGN(
      ScopedOpRegistration enumerable_linear,
      ScopedOpRegistration::Create(
          "enumerable", "linear",
          [](const Types&, const OpArgs&, const OpKwargs&,
             const Group&) -> absl::StatusOr<OpValue> {
            return absl::InternalError("enumerable op called for a chunk spec");
          }));

  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {0, 1, 2, 3}));
  Generator generator(3);
  ASSERT_OK_AND_ASSIGN(auto m, MakeLinear(32, 16, &generator));
  ASSERT_OK(MoveTo(*m, DeviceOf(rank())));
  ASSERT_OK(ShardParameter(*m, "weight", spec));
  ASSERT_OK_AND_ASSIGN(Tensor x,
                       Seeded({15, 32}, 100 + rank(), DeviceOf(rank())));
  ASSERT_OK_AND_ASSIGN(Tensor result, Output(m->Forward({x})));
  EXPECT_TRUE(Equal(t, result));

  // A custom sharded op comes before the spec's.
  ASSERT_OK_AND_ASSIGN(Tensor other, Seeded({2, 2}, 8, DeviceOf(rank())));
  {
    ASSERT_OK_AND_ASSIGN(
        ScopedOpRegistration first,
        ScopedOpRegistration::Create(ShardedOpRegistry::kAnySpec, "linear",
                                     returns(other)));
    ASSERT_OK_AND_ASSIGN(result, Output(m->Forward({x})));
    EXPECT_TRUE(Equal(other, result));
  }
  ASSERT_OK_AND_ASSIGN(result, Output(m->Forward({x})));
  EXPECT_TRUE(Equal(t, result));
}

TEST_P(TestShardedTensorCustomOps, CustomOpErrors) {
  RANKS_TEST_BEGIN();
  ShardedOpRegistry registry;
  auto my_op1 = [](const Types&, const OpArgs&, const OpKwargs&, const Group&,
                   int /*random_param*/) -> absl::StatusOr<OpValue> {
    return OpValue();
  };
  EXPECT_THAT(registry.RegisterShardedOp("linear", my_op1),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("expects signature")));
  auto my_op2 = [](const Types&) -> absl::StatusOr<OpValue> {
    return OpValue();
  };
  EXPECT_THAT(registry.RegisterShardedOp("linear", my_op2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("expects signature")));
  EXPECT_THAT(registry.RegisterShardingSpecOp("chunk", "linear", my_op2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("expects signature")));
  // Callable with the right arguments, but returning no op value.
  auto my_op3 = [](const Types&, const OpArgs&, const OpKwargs&, const Group&) {
    return std::vector<int>{};
  };
  EXPECT_THAT(registry.RegisterShardedOp("linear", my_op3),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("expects signature")));
  EXPECT_FALSE(registry.UnregisterShardedOp("linear"));

  auto good = [](const Types&, const OpArgs&, const OpKwargs&,
                 const Group&) -> absl::StatusOr<OpValue> { return OpValue(); };
  EXPECT_THAT(
      registry.RegisterShardingSpecOp("ChunkShardingSpec", "linear", good),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("unknown sharding spec kind")));
  EXPECT_THAT(
      registry.RegisterShardedOp("", good),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty op")));
  ASSERT_OK(registry.RegisterShardedOp("linear", good));
  EXPECT_TRUE(registry.UnregisterShardedOp("linear"));
  EXPECT_FALSE(registry.UnregisterShardedOp("linear"));
}

// An op that returns `n` (after checking what dispatch passes it).
auto Returns(int64_t n) {
  return [n](const Types& types, const OpArgs&, const OpKwargs&,
             const Group& group) -> absl::StatusOr<OpValue> {
    if (types != Types{"ShardedTensor"} || group == nullptr) {
      return absl::InternalError("bad types or group");
    }
    return OpValue(n);
  };
}

TEST_P(TestShardedTensorCustomOps, DispatchOrder) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms(/*init_rpc=*/false));
  ShardedOpRegistry registry;
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {0, 1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(ShardedTensor st, ShardedTensor::Rand(spec, {10, 20}));
  const OpArgs args = {st};
  auto call = [&]() -> int64_t {
    absl::StatusOr<int64_t> n = Get<int64_t>(registry.Call("asin", args));
    EXPECT_TRUE(n.ok()) << n.status();
    return n.ok() ? *n : -1;
  };

  ASSERT_OK(registry.RegisterShardingSpecOp("chunk", "asin", Returns(2)));
  ASSERT_OK(registry.RegisterShardingSpecOp("enumerable", "asin", Returns(5)));
  EXPECT_EQ(2, call());
  ASSERT_OK(registry.RegisterShardedOp("asin", Returns(1)));
  EXPECT_EQ(1, call());
  {
    ASSERT_OK_AND_ASSIGN(
        ScopedOpRegistration scoped,
        ScopedOpRegistration::Create(ShardedOpRegistry::kAnySpec, "asin",
                                     Returns(3), registry));
    EXPECT_EQ(3, call());
  }
  // The scope restored the registration it replaced.
  EXPECT_EQ(1, call());
  EXPECT_TRUE(registry.UnregisterShardedOp("asin"));
  EXPECT_EQ(2, call());
  EXPECT_TRUE(registry.UnregisterShardingSpecOp("chunk", "asin"));
  // The built-in op.
  ASSERT_OK_AND_ASSIGN(ShardedTensor res,
                       Get<ShardedTensor>(registry.Call("asin", args)));
  EXPECT_EQ(st.size(), res.size());

  // Dense arguments only: the dense kernel, never a sharded op.
  ASSERT_OK(registry.RegisterShardedOp("asin", Returns(1)));
  ASSERT_OK_AND_ASSIGN(Tensor local, st.local_tensor());
  ASSERT_OK_AND_ASSIGN(Tensor dense,
                       Get<Tensor>(registry.Call("asin", {local})));
  ASSERT_OK_AND_ASSIGN(Tensor expected, Asin(local));
  EXPECT_TRUE(Equal(expected, dense));
}

TEST_P(TestShardedTensorCustomOps, DispatchErrors) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms(/*init_rpc=*/false));
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {0, 1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(ShardedTensor st, ShardedTensor::Zeros(spec, {10, 20}));
  EXPECT_THAT(
      CallOp("foo", {st, int64_t{3}}, {{"mode", std::string("sum")}}),
      StatusIs(absl::StatusCode::kUnimplemented,
               HasSubstr(absl::StrCat(
                   "torch function 'foo', with args: (ShardedTensor(",
                   st.tensor_id(),
                   ", float32, [10, 20]), 3) and kwargs: {'mode': 'sum'} not "
                   "supported for ShardedTensor!"))));
  EXPECT_THAT(CallOp("asin", {}), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("No input for 'asin'!")));
  EXPECT_THAT(
      CallOp("foo", {Tensor()}),
      StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("no dense kernel")));

  NewGroupOptions gloo;
  gloo.backend = "gloo";
  ASSERT_OK_AND_ASSIGN(auto pg, rank_runtime()->NewGroup({0, 1, 2, 3}, gloo));
  ASSERT_OK_AND_ASSIGN(
      ShardedTensor other,
      ShardedTensor::Zeros(spec, {10, 20},
                           ShardedTensorOptions().WithProcessGroup(pg)));
  EXPECT_THAT(CallOp("asin", {st}, {{"other", other}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("All distributed tensors should use the "
                                 "same ProcessGroup if used together in an "
                                 "op.")));
  // A wrong argument type is found before any communication.
  EXPECT_THAT(CallOp("linear", {st, st}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("linear(): argument 'input' (position 1) "
                                 "must be Tensor, not ShardedTensor")));
}

TEST_P(TestShardedOps, Asin) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms(/*init_rpc=*/false));
  ASSERT_OK_AND_ASSIGN(ShardingSpec chunk, Chunk(0, {0, 1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(ShardingSpec grid, GridSpec());
  for (const ShardingSpec& spec : {chunk, grid}) {
    ASSERT_OK_AND_ASSIGN(ShardedTensor st, ShardedTensor::Rand(spec, {10, 10}));
    ASSERT_OK_AND_ASSIGN(ShardedTensor res,
                         Get<ShardedTensor>(CallOp("asin", {st})));
    EXPECT_NE(st.tensor_id(), res.tensor_id());
    EXPECT_EQ(st.metadata().shards_metadata, res.metadata().shards_metadata);
    EXPECT_EQ(ShardingSpecKind(st.sharding_spec()),
              ShardingSpecKind(res.sharding_spec()));
    EXPECT_EQ(st.device(), res.device());
    ASSERT_OK_AND_ASSIGN(Tensor full, st.GatherAll());
    ASSERT_OK_AND_ASSIGN(Tensor full_res, res.GatherAll());
    ASSERT_OK_AND_ASSIGN(Tensor expected, Asin(full));
    EXPECT_TRUE(Equal(expected, full_res));
  }
  ASSERT_OK_AND_ASSIGN(
      ShardedTensor ints,
      ShardedTensor::Zeros(chunk, {10, 10},
                           ShardedTensorOptions().WithDType(DType::kInt64)));
  EXPECT_THAT(CallOp("asin", {ints}),
              StatusIs(absl::StatusCode::kUnimplemented,
                       HasSubstr("asin: not implemented for int64")));
}

// linear with the weight of a Linear(30, 17) sharded along `dim`, against
// the dense op before sharding.
void CheckShardedLinear(const DeviceRanksTest& test, int rank, int64_t dim) {
  const Device device = test.DeviceOf(rank);
  const int64_t in = 30;
  const int64_t out = 17;
  Generator generator(1234);
  ASSERT_OK_AND_ASSIGN(auto m, MakeLinear(in, out, &generator));
  ASSERT_OK(MoveTo(*m, device));
  ASSERT_OK_AND_ASSIGN(Tensor weight, m->GetTensor("weight"));
  ASSERT_OK_AND_ASSIGN(Tensor bias, m->GetTensor("bias"));
  // Each rank its own input, of its own length.
  ASSERT_OK_AND_ASSIGN(Tensor x, Seeded({3 + rank, in}, 100 + rank, device));
  ASSERT_OK_AND_ASSIGN(Tensor expected, Linear(x, weight, bias));
  ASSERT_OK_AND_ASSIGN(Tensor no_bias, Linear(x, weight));

  ASSERT_OK_AND_ASSIGN(
      ChunkShardingSpec spec,
      ChunkShardingSpec::Create(
          dim, std::vector<std::string>{test.Placement(0), test.Placement(1),
                                        test.Placement(2), test.Placement(3)}));
  ASSERT_OK(ShardParameter(*m, "weight", spec));
  ASSERT_OK_AND_ASSIGN(ShardedTensor st, m->GetShardedTensor("weight"));
  ASSERT_OK_AND_ASSIGN(Tensor y, Output(m->Forward({x})));
  ExpectClose(expected, y);

  ASSERT_OK_AND_ASSIGN(y, Get<Tensor>(CallOp("linear", {x, st})));
  ExpectClose(no_bias, y);
  ASSERT_OK_AND_ASSIGN(Tensor x3, x.View({1, 3 + rank, in}));
  ASSERT_OK_AND_ASSIGN(
      y, Get<Tensor>(CallOp("linear", {x3, st}, {{"bias", bias}})));
  ASSERT_OK_AND_ASSIGN(Tensor expected3, expected.View({1, 3 + rank, out}));
  ExpectClose(expected3, y);

  // A mistake on rank 1 fails every rank, and the group stays usable.
  Tensor bad = x;
  if (rank == 1) {
    ASSERT_OK_AND_ASSIGN(
        bad, Tensor::Zeros({2, in + 1}, TensorOptions().WithDevice(device)));
  }
  EXPECT_THAT(CallOp("linear", {bad, st, bias}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(absl::StrCat(rank == 1 ? "" : "on rank 1: ",
                                              "mat1 and mat2 shapes cannot be "
                                              "multiplied (2x31 and 30x17)"))));
  ASSERT_OK_AND_ASSIGN(y, Output(m->Forward({x})));
  ExpectClose(expected, y);
}

TEST_P(TestShardedOps, LinearRowwise) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms(/*init_rpc=*/false));
  CheckShardedLinear(*this, rank(), 0);
}

TEST_P(TestShardedOps, LinearColwise) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms(/*init_rpc=*/false));
  CheckShardedLinear(*this, rank(), 1);

  // Equal inputs give the same bits on every rank.
  Generator generator(5);
  ASSERT_OK_AND_ASSIGN(auto m, MakeLinear(30, 17, &generator));
  ASSERT_OK(MoveTo(*m, DeviceOf(rank())));
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(1, {0, 1, 2, 3}));
  ASSERT_OK(ShardParameter(*m, "weight", spec));
  ASSERT_OK_AND_ASSIGN(Tensor x, Seeded({4, 30}, 42, DeviceOf(rank())));
  ASSERT_OK_AND_ASSIGN(Tensor y, Output(m->Forward({x})));
  ASSERT_OK_AND_ASSIGN(Tensor host, y.To(Device::Cpu()));
  const std::string bytes(static_cast<const char*>(host.data_ptr()),
                          host.nbytes());
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> all,
                       AllGatherBytes(*rank_runtime()->default_group(), bytes));
  for (const std::string& theirs : all) EXPECT_EQ(bytes, theirs);
}

// embedding_bag with the weight of an EmbeddingBag(13, 6) sharded along
// `dim`, against the dense op before sharding.
void CheckShardedEmbeddingBag(const DeviceRanksTest& test, int rank,
                              int64_t dim) {
  const Device device = test.DeviceOf(rank);
  Generator generator(99);
  ASSERT_OK_AND_ASSIGN(auto m, MakeEmbeddingBag(13, 6, "sum", &generator));
  ASSERT_OK(MoveTo(*m, device));
  ASSERT_OK_AND_ASSIGN(Tensor weight, m->GetTensor("weight"));
  ASSERT_OK_AND_ASSIGN(Tensor bags,
                       SeededBags(2 + rank, 3, 13, 500 + rank, device));
  ASSERT_OK_AND_ASSIGN(Tensor expected, EmbeddingBag(bags, weight, "sum"));

  ASSERT_OK_AND_ASSIGN(
      ChunkShardingSpec spec,
      ChunkShardingSpec::Create(
          dim, std::vector<std::string>{test.Placement(0), test.Placement(1),
                                        test.Placement(2), test.Placement(3)}));
  ASSERT_OK(ShardParameter(*m, "weight", spec));
  ASSERT_OK_AND_ASSIGN(ShardedTensor st, m->GetShardedTensor("weight"));
  ASSERT_OK_AND_ASSIGN(Tensor y, Output(m->Forward({bags})));
  ExpectClose(expected, y);

  ASSERT_OK_AND_ASSIGN(Tensor bags32, bags.ToDType(DType::kInt32));
  ASSERT_OK_AND_ASSIGN(y, Get<Tensor>(CallOp("embedding_bag", {bags32, st},
                                             {{"mode", std::string("sum")}})));
  ExpectClose(expected, y);
  // PyTorch's default mode is "mean".
  EXPECT_THAT(CallOp("embedding_bag", {bags, st}),
              StatusIs(absl::StatusCode::kUnimplemented,
                       HasSubstr("mode 'mean' is not implemented")));

  // An index past the table on rank 2 fails every rank.
  Tensor bad = bags;
  if (rank == 2) {
    ASSERT_OK_AND_ASSIGN(Tensor host, Tensor::FromVector<int64_t>(
                                          std::vector<int64_t>{0, 13}, {1, 2}));
    ASSERT_OK_AND_ASSIGN(bad, host.To(device));
  }
  EXPECT_THAT(
      CallOp("embedding_bag", {bad, st}, {{"mode", std::string("sum")}}),
      StatusIs(absl::StatusCode::kOutOfRange,
               HasSubstr(absl::StrCat(rank == 2 ? "" : "on rank 2: ",
                                      "index out of range in self"))));
  ASSERT_OK_AND_ASSIGN(y, Output(m->Forward({bags})));
  ExpectClose(expected, y);
}

TEST_P(TestShardedOps, EmbeddingBagRowwise) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms(/*init_rpc=*/false));
  // 13 rows over 4 ranks: 4, 4, 4, 1.
  CheckShardedEmbeddingBag(*this, rank(), 0);
}

TEST_P(TestShardedOps, EmbeddingBagColwise) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms(/*init_rpc=*/false));
  // 6 columns over 4 ranks: 2, 2, 2 and none on rank 3.
  CheckShardedEmbeddingBag(*this, rank(), 1);
}

TESSERA_INSTANTIATE_FOR_DEVICES(TestShardedTensorCustomOps);
TESSERA_INSTANTIATE_FOR_DEVICES(TestShardedOps);

}  // namespace
}  // namespace tessera
