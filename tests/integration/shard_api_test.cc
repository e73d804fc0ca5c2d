// Ports of the reference's TestShardTensor, TestShardParameter and
// TestModuleHookApi (test_sharded_tensor.py), and tests of
// ShardedTensor::Reshard beyond them (dimension changes, uneven and empty
// shards, permuted placements, several shards per rank, dtypes, handles,
// the registry). Each test runs in 4 real rank processes on loopback and is
// instantiated for "cpu" and "cuda:N" placements (the latter skip without a
// GPU; see device_ranks_test.h).
//
// Every rank builds the same dense source tensor from the same seeded
// Generator, so each rank can check its shards, and GatherAll the whole
// tensor, against an independent Narrow of the source.
#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/shard_metadata.h"
#include "common/sharding_spec.h"
#include "common/tensor/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/sharded/module.h"
#include "server/sharded/nn.h"
#include "server/sharded/shard_api.h"
#include "server/sharded/sharded_tensor.h"
#include "tests/integration/device_ranks_test.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::StatusIs;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;

class TestShardTensor : public DeviceRanksTest {};
class TestShardParameter : public DeviceRanksTest {};
class TestModuleHookApi : public DeviceRanksTest {};
class TestShardedTensorReshard : public DeviceRanksTest {};

// The same tensor on every rank, drawn from Generator(seed) on the host and
// copied to `device`. Integer tensors take whole 64-bit draws.
absl::StatusOr<Tensor> Seeded(const Sizes& sizes, uint64_t seed, Device device,
                              DType dtype = DType::kFloat32) {
  Generator generator(seed);
  Tensor host;
  if (dtype == DType::kInt64) {
    std::vector<int64_t> values(*CheckedProduct(sizes));
    for (int64_t& v : values) v = static_cast<int64_t>(generator.NextU64());
    ASSIGN_OR_RETURN(
        host, Tensor::FromVector<int64_t>(absl::MakeSpan(values), sizes));
  } else {
    ASSIGN_OR_RETURN(host, Tensor::Rand(sizes, TensorOptions().WithDType(dtype),
                                        &generator));
  }
  return host.To(device);
}

// The box of `source` a shard covers, by narrowing every dimension.
absl::StatusOr<Tensor> Box(const Tensor& source, const ShardMetadata& shard) {
  // torch.chunk may put trailing empty chunks past the end.
  if (shard.numel() == 0) {
    return Tensor::Empty(shard.shard_sizes(),
                         TensorOptions().WithDType(source.dtype()));
  }
  Tensor box = source;
  for (int64_t d = 0; d < shard.dim(); ++d) {
    ASSIGN_OR_RETURN(
        box, box.Narrow(d, shard.shard_offsets()[d], shard.shard_sizes()[d]));
  }
  return box;
}

// _chunk_sharding_specs_list_for_test: one placement list of ranks 0..3,
// shuffled again for spec i by a generator seeded with seed + i.
std::vector<ShardingSpec> ShuffledChunkSpecs(const DeviceRanksTest& test,
                                             const std::vector<int64_t>& dims,
                                             uint32_t seed) {
  std::vector<int> ranks = {0, 1, 2, 3};
  std::vector<ShardingSpec> specs;
  for (size_t i = 0; i < dims.size(); ++i) {
    std::shuffle(ranks.begin(), ranks.end(), std::mt19937(seed + i));
    specs.emplace_back(
        *ChunkShardingSpec::Create(dims[i], test.Placements(ranks)));
  }
  return specs;
}

bool SameSpec(const ShardingSpec& a, const ShardingSpec& b) { return a == b; }

// `st` is `source` laid out by `spec`: the metadata is the spec's, every
// local shard holds its box of the source on its placement's device, and
// GatherAll gives the source back.
void ExpectLayout(const DeviceRanksTest& test, int rank,
                  const ShardedTensor& st, const Tensor& source,
                  const ShardingSpec& spec) {
  // The collective first, so that a failed check below cannot leave the
  // other ranks waiting in it.
  absl::StatusOr<Tensor> all = st.GatherAll();
  EXPECT_TRUE(SameSpec(spec, st.sharding_spec()));
  EXPECT_EQ(source.sizes(), st.size());
  EXPECT_EQ(source.dtype(), st.dtype());
  ASSERT_OK_AND_ASSIGN(ShardedTensorMetadata expected,
                       BuildMetadata(spec, source.sizes()));
  EXPECT_EQ(expected.shards_metadata, st.metadata().shards_metadata);
  size_t next = 0;
  for (const ShardMetadata& md : expected.shards_metadata) {
    if (md.placement()->rank() != rank) continue;
    ASSERT_LT(next, st.local_shards().size());
    const Shard& shard = st.local_shards()[next++];
    EXPECT_EQ(md, shard.metadata);
    EXPECT_EQ(test.DeviceOf(rank), shard.tensor.device());
    ASSERT_OK_AND_ASSIGN(Tensor box, Box(source, md));
    EXPECT_TRUE(Equal(box, shard.tensor)) << md;
  }
  EXPECT_EQ(next, st.local_shards().size());
  ASSERT_OK(all.status());
  ASSERT_OK_AND_ASSIGN(Tensor host, source.To(Device::Cpu()));
  EXPECT_TRUE(Equal(host, *all));
}

ShardingSpec EnumerableForTest(DeviceRanksTest& test) {
  return *EnumerableShardingSpec::Create(
      {test.Md({0, 0}, {5, 5}, test.Placement(0)),
       test.Md({5, 0}, {5, 5}, test.Placement(1))});
}

// A spec of dim 0 whose first placement names this rank: different on
// every rank.
absl::StatusOr<ShardingSpec> DisagreeingSpec(const DeviceRanksTest& test,
                                             int rank) {
  std::vector<std::string> placements = test.Placements({0, 1, 2, 3});
  placements[0] = absl::StrCat("rank:", rank, "/", test.DeviceText(0));
  ASSIGN_OR_RETURN(ChunkShardingSpec spec,
                   ChunkShardingSpec::Create(0, placements));
  return ShardingSpec(spec);
}

TEST_P(TestShardTensor, ShardTensor) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms(/*init_rpc=*/false));
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {0, 1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(Tensor tensor, Seeded({12, 12}, 11, DeviceOf(rank())));
  ASSERT_OK_AND_ASSIGN(ShardedTensor st, ShardTensor(tensor, spec));
  ASSERT_OK_AND_ASSIGN(Tensor local_shard, st.local_tensor());
  EXPECT_EQ(1u, st.local_shards().size());
  EXPECT_EQ(Sizes({3, 12}), local_shard.sizes());
  ASSERT_OK_AND_ASSIGN(Tensor expected, tensor.Narrow(0, 3 * rank(), 3));
  EXPECT_TRUE(Equal(expected, local_shard));
  ExpectLayout(*this, rank(), st, tensor, spec);
}

TEST_P(TestShardTensor, ShardTensorWithEmptyShard) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms(/*init_rpc=*/false));
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {0, 1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(Tensor tensor, Seeded({9, 12}, 12, DeviceOf(rank())));
  ASSERT_OK_AND_ASSIGN(ShardedTensor st, ShardTensor(tensor, spec));
  const auto& sms = st.metadata().shards_metadata;
  EXPECT_EQ(4u, sms.size());
  for (const ShardMetadata& sm : sms) {
    EXPECT_LE(sm.shard_offsets()[0] + sm.shard_sizes()[0], 9);
  }
  ASSERT_OK_AND_ASSIGN(Tensor local_shard, st.local_tensor());
  EXPECT_EQ(1u, st.local_shards().size());
  if (rank() < 3) {
    EXPECT_EQ(Sizes({3, 12}), local_shard.sizes());
    ASSERT_OK_AND_ASSIGN(Tensor expected, tensor.Narrow(0, 3 * rank(), 3));
    EXPECT_TRUE(Equal(expected, local_shard));
  } else {
    EXPECT_EQ(Sizes({0, 12}), local_shard.sizes());
  }
  ExpectLayout(*this, rank(), st, tensor, spec);
}

TEST_P(TestShardTensor, ShardTensorErrors) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms(/*init_rpc=*/false));
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {0, 1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(Tensor tensor, Seeded({12, 12}, 13, DeviceOf(rank())));

  EXPECT_THAT(ShardTensor(tensor, spec, /*src_rank=*/rank()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("does not match with src_rank")));

  ASSERT_OK_AND_ASSIGN(Tensor tensor_t, tensor.T());
  EXPECT_THAT(ShardTensor(tensor_t, spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("not a contiguous Tensor")));

  ASSERT_OK_AND_ASSIGN(ShardingSpec disagreeing,
                       DisagreeingSpec(*this, rank()));
  EXPECT_THAT(ShardTensor(tensor, disagreeing),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("does not match with sharding_spec")));

  EXPECT_THAT(ShardTensor(tensor, EnumerableForTest(*this)),
              StatusIs(absl::StatusCode::kUnimplemented,
                       HasSubstr("not implemented yet!")));

  // The group survives every mistake.
  ASSERT_OK_AND_ASSIGN(ShardedTensor st, ShardTensor(tensor, spec));
  ExpectLayout(*this, rank(), st, tensor, spec);
}

// PyTorch's exact mismatch messages, naming both ranks.
TEST_P(TestShardTensor, ShardTensorMismatchMessages) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms(/*init_rpc=*/false));
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {0, 1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(Tensor tensor, Seeded({8, 4}, 14, DeviceOf(rank())));
  const int other = rank() == 0 ? 1 : 0;
  EXPECT_THAT(
      ShardTensor(tensor, spec, rank()),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr(absl::StrCat("src_rank=", rank(), " on rank: ", rank(),
                                      " does not match with src_rank=", other,
                                      " on rank: ", other))));
  ASSERT_OK_AND_ASSIGN(ShardingSpec disagreeing,
                       DisagreeingSpec(*this, rank()));
  const std::string mine = absl::StrCat(
      "sharding_spec=ChunkShardingSpec(dim=0, placements=[rank:", rank(), "/",
      DeviceText(0), ", ", Placement(1), ", ", Placement(2), ", ", Placement(3),
      "]) on rank: ", rank(), " does not match with ");
  EXPECT_THAT(ShardTensor(tensor, disagreeing),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(mine)));
}

// A mistake on one rank fails every rank; nobody waits for it.
TEST_P(TestShardTensor, ShardTensorOneRanksMistakeFailsEveryRank) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms(/*init_rpc=*/false));
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {0, 1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(Tensor tensor, Seeded({12, 12}, 15, DeviceOf(rank())));
  Tensor input = tensor;
  if (rank() == 2) {
    ASSERT_OK_AND_ASSIGN(input, tensor.T());
  }
  EXPECT_THAT(
      ShardTensor(input, spec),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr(rank() == 2 ? "input tensor is not a contiguous Tensor"
                                     : "on rank 2: input tensor is not a "
                                       "contiguous Tensor")));
}

// Values come from src_rank alone: every rank's tensor differs here.
TEST_P(TestShardTensor, ShardTensorFromSourceRank) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms(/*init_rpc=*/false));
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(1, {3, 2, 1, 0}));
  constexpr int kSource = 2;
  ASSERT_OK_AND_ASSIGN(Tensor mine,
                       Seeded({5, 10}, 100 + rank(), DeviceOf(rank())));
  ASSERT_OK_AND_ASSIGN(Tensor source,
                       Seeded({5, 10}, 100 + kSource, DeviceOf(rank())));
  ASSERT_OK_AND_ASSIGN(ShardedTensor st, ShardTensor(mine, spec, kSource));
  ExpectLayout(*this, rank(), st, source, spec);
}

TEST_P(TestShardTensor, ShardTensorTwoShardsPerRank) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms(/*init_rpc=*/false));
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {0, 1, 2, 3, 3, 2, 1, 0}));
  ASSERT_OK_AND_ASSIGN(Tensor tensor, Seeded({15, 6}, 16, DeviceOf(rank())));
  ASSERT_OK_AND_ASSIGN(ShardedTensor st, ShardTensor(tensor, spec));
  EXPECT_EQ(2u, st.local_shards().size());
  ExpectLayout(*this, rank(), st, tensor, spec);
  EXPECT_THAT(st.local_tensor(),
              StatusIs(absl::StatusCode::kUnimplemented,
                       HasSubstr("Only single local shard is supported.")));
}

TEST_P(TestShardTensor, ShardTensorKeepsDType) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms(/*init_rpc=*/false));
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {2, 0, 3, 1}));
  ASSERT_OK_AND_ASSIGN(ShardingSpec by_column, Chunk(1, {1, 3, 0, 2}));
  for (DType dtype : {DType::kInt64, DType::kFloat16}) {
    SCOPED_TRACE(DTypeName(dtype));
    ASSERT_OK_AND_ASSIGN(Tensor tensor,
                         Seeded({10, 7}, 17, DeviceOf(rank()), dtype));
    ASSERT_OK_AND_ASSIGN(ShardedTensor st, ShardTensor(tensor, spec));
    EXPECT_EQ(dtype, st.dtype());
    ExpectLayout(*this, rank(), st, tensor, spec);
    ASSERT_OK(st.Reshard(by_column).status());
    ExpectLayout(*this, rank(), st, tensor, by_column);
  }
}

// torch.nn.Linear(12, 12) on `device` (server/sharded/nn.h's, from a seeded
// generator).
absl::StatusOr<std::shared_ptr<Module>> MakeLinear(Device device,
                                                   uint64_t seed) {
  Generator generator(seed);
  ASSIGN_OR_RETURN(std::shared_ptr<Module> fc,
                   tessera::MakeLinear(12, 12, &generator));
  for (const char* name : {"weight", "bias"}) {
    ASSIGN_OR_RETURN(Tensor t, fc->GetTensor(name));
    ASSIGN_OR_RETURN(t, t.To(device));
    RETURN_IF_ERROR(fc->SetAttribute(name, t));
  }
  return fc;
}

TEST_P(TestShardParameter, ShardParameter) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms(/*init_rpc=*/false));
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {0, 1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Module> fc,
                       MakeLinear(DeviceOf(rank()), 21));
  ASSERT_OK_AND_ASSIGN(Tensor weight, fc->GetTensor("weight"));
  ASSERT_OK_AND_ASSIGN(Tensor weight_og, weight.Clone());
  ASSERT_OK(ShardParameter(*fc, "weight", spec));

  ASSERT_OK_AND_ASSIGN(ShardedTensor sharded, fc->GetShardedTensor("weight"));
  const std::vector<Shard>& local_shards = sharded.local_shards();
  ASSERT_EQ(1u, local_shards.size());
  EXPECT_EQ(Sizes({3, 12}), local_shards[0].tensor.sizes());
  EXPECT_EQ(3, *local_shards[0].tensor.size(0));
  EXPECT_EQ(12, *local_shards[0].tensor.size(1));
  ASSERT_OK_AND_ASSIGN(Tensor expected, weight_og.Narrow(0, 3 * rank(), 3));
  EXPECT_TRUE(Equal(expected, local_shards[0].tensor));
  // The rest of the module is as it was.
  EXPECT_OK(fc->GetTensor("bias").status());
  EXPECT_EQ("weight", fc->attributes()[0].first);
  ASSERT_EQ(2u, fc->StateDict().size());
  EXPECT_TRUE(std::holds_alternative<ShardedTensor>(fc->StateDict()[0].second));
}

TEST_P(TestShardParameter, ShardParameterErrors) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms(/*init_rpc=*/false));
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {0, 1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Module> fc,
                       MakeLinear(DeviceOf(rank()), 22));
  Module& module = *fc;

  EXPECT_THAT(ShardParameter(module, "weight", spec, /*src_rank=*/rank()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("does not match with src_rank")));

  EXPECT_THAT(
      ShardParameter(module, "foo", spec),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("has no attribute")));

  ASSERT_OK(module.DeleteAttribute("bias"));
  ASSERT_OK(module.SetAttribute("bias", std::string("foo")));
  EXPECT_THAT(
      ShardParameter(module, "bias", spec),
      StatusIs(
          absl::StatusCode::kInvalidArgument,
          HasSubstr("Expected Linear.bias to be a Tensor, but found str")));

  ASSERT_OK_AND_ASSIGN(Tensor square, Seeded({10, 10}, 23, DeviceOf(rank())));
  ASSERT_OK_AND_ASSIGN(Tensor transposed, square.T());
  ASSERT_OK(module.SetAttribute("bias", transposed));
  EXPECT_THAT(ShardParameter(module, "bias", spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("not a contiguous Tensor")));

  ASSERT_OK_AND_ASSIGN(ShardingSpec disagreeing,
                       DisagreeingSpec(*this, rank()));
  EXPECT_THAT(ShardParameter(module, "weight", disagreeing),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("does not match with sharding_spec")));

  EXPECT_THAT(ShardParameter(module, "weight", EnumerableForTest(*this)),
              StatusIs(absl::StatusCode::kUnimplemented,
                       HasSubstr("not implemented yet!")));

  // Nothing was replaced.
  EXPECT_OK(module.GetTensor("weight").status());
}

// Only rank 1 lacks the parameter; all four ranks fail, none hangs.
TEST_P(TestShardParameter, ShardParameterOneRanksMistakeFailsEveryRank) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms(/*init_rpc=*/false));
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {0, 1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Module> fc,
                       MakeLinear(DeviceOf(rank()), 24));
  if (rank() == 1) {
    ASSERT_OK(fc->DeleteAttribute("weight"));
  }
  EXPECT_THAT(
      ShardParameter(*fc, "weight", spec),
      StatusIs(absl::StatusCode::kNotFound,
               HasSubstr(rank() == 1 ? "Linear has no attribute `weight`"
                                     : "on rank 1: Linear has no attribute")));
}

// TestModuleHookApi.DummyNNModule: forward returns its attribute `st`.
std::shared_ptr<Module> DummyNNModule(const ShardedTensor& st) {
  auto module = Module::Create(
      "DummyNNModule",
      [](Module& self, const std::vector<Module::ForwardValue>&)
          -> absl::StatusOr<Module::ForwardValue> {
        ASSIGN_OR_RETURN(ShardedTensor st, self.GetShardedTensor("st"));
        return Module::ForwardValue(std::move(st));
      });
  EXPECT_OK(module->SetAttribute("st", st));
  return module;
}

absl::StatusOr<ShardedTensor> AsSharded(
    absl::StatusOr<Module::ForwardValue> output) {
  RETURN_IF_ERROR(output.status());
  if (!std::holds_alternative<ShardedTensor>(*output)) {
    return absl::InternalError("forward did not return a ShardedTensor");
  }
  return std::get<ShardedTensor>(*std::move(output));
}

TEST_P(TestModuleHookApi, ReshardOutput) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms(/*init_rpc=*/false));
  std::vector<ShardingSpec> specs = ShuffledChunkSpecs(*this, {0, 1}, 5);
  const ShardingSpec& spec = specs[0];
  const ShardingSpec& reshard_spec = specs[1];
  Generator generator(31 + rank());
  ASSERT_OK_AND_ASSIGN(ShardedTensor created,
                       ShardedTensor::Rand(spec, {24, 12}, {}, &generator));
  std::shared_ptr<Module> test_module = DummyNNModule(created);
  ASSERT_OK_AND_ASSIGN(ShardedTensor st, AsSharded(test_module->Forward()));
  ASSERT_OK_AND_ASSIGN(Tensor whole, st.GatherAll());

  std::vector<Shard> copies;
  for (const Shard& shard : st.local_shards()) {
    ASSERT_OK_AND_ASSIGN(Tensor copy, shard.tensor.Clone());
    copies.push_back(Shard{copy, shard.metadata});
  }
  ASSERT_OK_AND_ASSIGN(ShardedTensor st_compare,
                       ShardedTensor::InitFromLocalShardsWithSpec(
                           std::move(copies), st.metadata(), spec));
  ASSERT_OK(st_compare.Reshard(reshard_spec).status());

  ReshardOutput(*test_module, reshard_spec);
  ASSERT_OK_AND_ASSIGN(st, AsSharded(test_module->Forward()));
  ASSERT_OK_AND_ASSIGN(Tensor local_shard, st.local_tensor());
  ASSERT_OK_AND_ASSIGN(Tensor local_shard_compare, st_compare.local_tensor());
  EXPECT_TRUE(Equal(local_shard, local_shard_compare));
  EXPECT_EQ(24, *local_shard.size(0));
  EXPECT_EQ(3, *local_shard.size(1));
  ExpectLayout(*this, rank(), st, whole, reshard_spec);
}

TEST_P(TestModuleHookApi, CollectLocalShard) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms(/*init_rpc=*/false));
  const ShardingSpec spec = ShuffledChunkSpecs(*this, {0}, 5)[0];
  Generator generator(41 + rank());
  ASSERT_OK_AND_ASSIGN(ShardedTensor created,
                       ShardedTensor::Rand(spec, {23, 15}, {}, &generator));
  std::shared_ptr<Module> test_module = DummyNNModule(created);
  ASSERT_OK_AND_ASSIGN(ShardedTensor st, AsSharded(test_module->Forward()));
  ASSERT_OK_AND_ASSIGN(Tensor local_shard, st.local_tensor());

  CollectLocalShard(*test_module);
  ASSERT_OK_AND_ASSIGN(Module::ForwardValue output, test_module->Forward());
  ASSERT_TRUE(std::holds_alternative<Tensor>(output));
  EXPECT_TRUE(Equal(local_shard, std::get<Tensor>(output)));
}

// A [4, 16] tensor over 4 ranks gives each rank a [16] tensor; a dense
// output passes through.
TEST_P(TestModuleHookApi, CollectLocalShardSqueezesChunkDim) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms(/*init_rpc=*/false));
  const std::vector<int> order = {3, 1, 2, 0};
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, order));
  ASSERT_OK_AND_ASSIGN(Tensor source, Seeded({4, 16}, 42, DeviceOf(rank())));
  ASSERT_OK_AND_ASSIGN(ShardedTensor st, ShardTensor(source, spec));
  std::shared_ptr<Module> test_module = DummyNNModule(st);
  CollectLocalShard(*test_module);
  ASSERT_OK_AND_ASSIGN(Module::ForwardValue output, test_module->Forward());
  ASSERT_TRUE(std::holds_alternative<Tensor>(output));
  const Tensor& row = std::get<Tensor>(output);
  EXPECT_EQ(Sizes({16}), row.sizes());
  // Chunk c is placed on rank order[c].
  const int64_t chunk =
      std::find(order.begin(), order.end(), rank()) - order.begin();
  ASSERT_OK_AND_ASSIGN(Tensor expected, source.Narrow(0, chunk, 1));
  ASSERT_OK_AND_ASSIGN(Tensor expected_row, expected.View({16}));
  EXPECT_TRUE(Equal(expected_row, row));

  auto dense = Module::Create(
      "Dense",
      [&source](Module&, const std::vector<Module::ForwardValue>&)
          -> absl::StatusOr<Module::ForwardValue> { return source; });
  CollectLocalShard(*dense);
  ASSERT_OK_AND_ASSIGN(output, dense->Forward());
  ASSERT_TRUE(std::holds_alternative<Tensor>(output));
  EXPECT_TRUE(Equal(source, std::get<Tensor>(output)));
}

TEST_P(TestShardedTensorReshard, ReshardDim0To1AndBack) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms(/*init_rpc=*/false));
  std::vector<ShardingSpec> specs = ShuffledChunkSpecs(*this, {0, 1, 0}, 9);
  ASSERT_OK_AND_ASSIGN(Tensor source, Seeded({24, 12}, 51, DeviceOf(rank())));
  ASSERT_OK_AND_ASSIGN(ShardedTensor st, ShardTensor(source, specs[0]));
  ExpectLayout(*this, rank(), st, source, specs[0]);
  ShardedTensor alias = st;
  for (size_t i = 1; i < specs.size(); ++i) {
    const std::string old_id = st.tensor_id();
    ASSERT_OK_AND_ASSIGN(ShardedTensor returned, st.Reshard(specs[i]));
    ExpectLayout(*this, rank(), st, source, specs[i]);
    // Every handle sees the new layout.
    ExpectLayout(*this, rank(), alias, source, specs[i]);
    ExpectLayout(*this, rank(), returned, source, specs[i]);
    EXPECT_NE(old_id, st.tensor_id());
    EXPECT_EQ(st.tensor_id(), alias.tensor_id());
    // The old shards left the registry; the new ones are in it.
    std::vector<std::string> ids = rank_runtime()->registry().TensorIds();
    EXPECT_THAT(ids, Not(Contains(old_id)));
    EXPECT_THAT(ids, Contains(st.tensor_id()));
  }
}

TEST_P(TestShardedTensorReshard, ReshardUnevenPermuted) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms(/*init_rpc=*/false));
  ASSERT_OK_AND_ASSIGN(ShardingSpec rows, Chunk(0, {0, 1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(ShardingSpec rows_permuted, Chunk(0, {3, 1, 0, 2}));
  ASSERT_OK_AND_ASSIGN(ShardingSpec columns, Chunk(1, {2, 0, 3, 1}));
  ASSERT_OK_AND_ASSIGN(ShardingSpec columns_negative, Chunk(-1, {1, 2, 3, 0}));
  for (const Sizes& size : std::vector<Sizes>{{23, 15}, {9, 3}, {2, 5}}) {
    SCOPED_TRACE(::testing::PrintToString(size));
    ASSERT_OK_AND_ASSIGN(Tensor source, Seeded(size, 52, DeviceOf(rank())));
    ASSERT_OK_AND_ASSIGN(ShardedTensor st, ShardTensor(source, rows));
    for (const ShardingSpec* next :
         {&rows_permuted, &columns, &columns_negative, &rows}) {
      ASSERT_OK(st.Reshard(*next).status());
      ExpectLayout(*this, rank(), st, source, *next);
    }
  }
}

// The new layout may hold several shards per rank; the old one may not.
TEST_P(TestShardedTensorReshard, ReshardToSeveralShardsPerRank) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms(/*init_rpc=*/false));
  ASSERT_OK_AND_ASSIGN(ShardingSpec rows, Chunk(0, {1, 3, 0, 2}));
  ASSERT_OK_AND_ASSIGN(ShardingSpec eight, Chunk(1, {0, 1, 2, 3, 0, 1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(Tensor source, Seeded({13, 17}, 53, DeviceOf(rank())));
  ASSERT_OK_AND_ASSIGN(ShardedTensor st, ShardTensor(source, rows));
  ASSERT_OK(st.Reshard(eight).status());
  ExpectLayout(*this, rank(), st, source, eight);
  EXPECT_EQ(2u, st.local_shards().size());
  EXPECT_THAT(st.Reshard(rows),
              StatusIs(absl::StatusCode::kUnimplemented,
                       HasSubstr("Only single local shard supported for "
                                 "reshard.")));
  ExpectLayout(*this, rank(), st, source, eight);
}

TEST_P(TestShardedTensorReshard, ReshardErrors) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms(/*init_rpc=*/false));
  std::vector<ShardingSpec> specs = ShuffledChunkSpecs(*this, {0, 1}, 6);
  Generator generator(61 + rank());
  ASSERT_OK_AND_ASSIGN(ShardedTensor st,
                       ShardedTensor::Rand(specs[0], {24, 12}, {}, &generator));
  EXPECT_THAT(st.Reshard(EnumerableForTest(*this)),
              StatusIs(absl::StatusCode::kUnimplemented,
                       HasSubstr("Only ChunkShardingSpec supported for "
                                 "reshard.")));
  // A tensor built from local shards has an enumerable spec.
  std::vector<Shard> shards = st.local_shards();
  ASSERT_OK_AND_ASSIGN(ShardedTensor from_shards,
                       ShardedTensor::InitFromLocalShards(shards, {24, 12}));
  EXPECT_THAT(from_shards.Reshard(specs[1]),
              StatusIs(absl::StatusCode::kUnimplemented,
                       HasSubstr("Only ChunkShardingSpec supported for "
                                 "reshard.")));
  // The same spec changes nothing.
  const std::string id = st.tensor_id();
  ASSERT_OK_AND_ASSIGN(Tensor before, st.local_tensor());
  ASSERT_OK(st.Reshard(specs[0]).status());
  EXPECT_EQ(id, st.tensor_id());
  ASSERT_OK_AND_ASSIGN(Tensor after, st.local_tensor());
  EXPECT_EQ(before.data_ptr(), after.data_ptr());
}

// With init_rrefs the resharded tensor's remote shards are the new ones,
// and the old shards are retired until the next barrier.
TEST_P(TestShardedTensorReshard, ReshardWithRemoteShards) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  ASSERT_OK_AND_ASSIGN(ShardingSpec rows, Chunk(0, {2, 3, 0, 1}));
  ASSERT_OK_AND_ASSIGN(ShardingSpec columns, Chunk(1, {3, 2, 1, 0}));
  ASSERT_OK_AND_ASSIGN(Tensor source, Seeded({11, 10}, 71, DeviceOf(rank())));
  ASSERT_OK_AND_ASSIGN(ShardedTensor st,
                       ShardTensor(source, rows, /*src_rank=*/3, Rrefs()));
  const std::string old_id = st.tensor_id();
  ASSERT_OK(st.Reshard(columns).status());
  ExpectLayout(*this, rank(), st, source, columns);
  EXPECT_EQ(1u, rank_runtime()->registry().retired_size());
  ASSERT_OK_AND_ASSIGN(RemoteShardMap remote, st.remote_shards());
  EXPECT_EQ(3u, remote.size());
  ForEachFetched(remote, [&](int owner, const Shard& shard) {
    ASSERT_OK_AND_ASSIGN(Tensor box, Box(source, shard.metadata));
    EXPECT_TRUE(Equal(box, shard.tensor)) << shard.metadata;
    EXPECT_EQ(owner, shard.metadata.placement()->rank());
  });
  ASSERT_OK(rank_runtime()->Barrier());
  EXPECT_EQ(0u, rank_runtime()->registry().retired_size());
  EXPECT_EQ(std::vector<std::string>{st.tensor_id()},
            rank_runtime()->registry().TensorIds());
}

TESSERA_INSTANTIATE_FOR_DEVICES(TestShardTensor);
TESSERA_INSTANTIATE_FOR_DEVICES(TestShardParameter);
TESSERA_INSTANTIATE_FOR_DEVICES(TestModuleHookApi);
TESSERA_INSTANTIATE_FOR_DEVICES(TestShardedTensorReshard);

}  // namespace
}  // namespace tessera
