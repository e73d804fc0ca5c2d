// Ports of the reference's multi-rank ShardedTensor tests
// (test_sharded_tensor.py): TestShardedTensorChunked (except gather and
// state dicts), TestShardedTensorEnumerable, TestLocalTensor and
// TestShardMetadata. Each test runs in 4 real rank processes on loopback
// (real gRPC store, real Gloo, real shard servers). Every suite is
// instantiated for "cpu" placements and for "cuda:N" placements, which skip
// without a GPU (device_ranks_test.h).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/shard_metadata.h"
#include "common/sharding_spec.h"
#include "common/tensor/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/sharded/sharded_tensor.h"
#include "tests/integration/device_ranks_test.h"
#include "tests/testing/multi_process.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

class TestShardedTensorChunked : public DeviceRanksTest {};
class TestShardedTensorEnumerable : public DeviceRanksTest {};
class TestLocalTensor : public DeviceRanksTest {};
class TestShardMetadata : public DeviceRanksTest {};

template <typename T, typename = void>
struct HasRequiresGradSetter : std::false_type {};
template <typename T>
struct HasRequiresGradSetter<
    T, std::void_t<decltype(std::declval<T&>().set_requires_grad(true))>>
    : std::true_type {};

// test_sharded_tensor_metadata of both suites: the default properties,
// requires_grad, dtype, and pin_memory (on `cpu_spec`).
void CheckProperties(const ShardingSpec& spec, const ShardingSpec& cpu_spec,
                     const Sizes& sizes) {
  ASSERT_OK_AND_ASSIGN(ShardedTensor st,
                       ShardedTensor::Empty(spec, sizes, Rrefs()));
  EXPECT_EQ(sizes, st.metadata().size);
  EXPECT_EQ(sizes, st.size());
  EXPECT_EQ(DType::kFloat32, st.dtype());
  EXPECT_EQ(Layout::kStrided, st.layout());
  EXPECT_FALSE(st.requires_grad());
  EXPECT_TRUE(st.is_contiguous());
  EXPECT_FALSE(st.is_pinned());

  ShardedTensorOptions grad = Rrefs();
  grad.requires_grad = true;
  ASSERT_OK_AND_ASSIGN(st, ShardedTensor::Empty(spec, sizes, grad));
  EXPECT_TRUE(st.requires_grad());

  ASSERT_OK_AND_ASSIGN(
      st,
      ShardedTensor::Empty(spec, sizes, Rrefs().WithDType(DType::kFloat64)));
  EXPECT_EQ(DType::kFloat64, st.dtype());

  ShardedTensorOptions pinned = Rrefs();
  pinned.pin_memory = true;
  ASSERT_OK_AND_ASSIGN(st, ShardedTensor::Empty(cpu_spec, sizes, pinned));
  EXPECT_TRUE(st.is_pinned());
  EXPECT_TRUE(st.local_shards()[0].tensor.is_pinned());
}

TEST_P(TestShardedTensorChunked, ShardedTensorMetadata) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {0, 1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(
      ChunkShardingSpec cpu_spec,
      ChunkShardingSpec::Create(
          0, std::vector<std::string>{"rank:0/cpu", "rank:1/cpu", "rank:2/cpu",
                                      "rank:3/cpu"}));
  CheckProperties(spec, cpu_spec, {10, 20});
  // PyTorch raises on `st.requires_grad = True`; here there is no setter.
  static_assert(!HasRequiresGradSetter<ShardedTensor>::value);
}

TEST_P(TestShardedTensorChunked, CompleteWorldSize) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  for (int64_t dim : {0, -2}) {
    ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(dim, {0, 1, 2, 3}));
    ASSERT_OK_AND_ASSIGN(ShardedTensor st,
                         ShardedTensor::Empty(spec, {10, 20}, Rrefs()));
    ASSERT_EQ(1u, st.local_shards().size());
    const Tensor& local = st.local_shards()[0].tensor;
    EXPECT_EQ(DeviceOf(rank()), local.device());
    EXPECT_EQ(rank() == 3 ? Sizes({1, 20}) : Sizes({3, 20}), local.sizes());

    const auto& shards = st.metadata().shards_metadata;
    ASSERT_EQ(4u, shards.size());
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(Sizes({r * 3, 0}), shards[r].shard_offsets());
      EXPECT_EQ(r == 3 ? Sizes({1, 20}) : Sizes({3, 20}),
                shards[r].shard_sizes());
      EXPECT_EQ(Placement(r), shards[r].placement()->ToString());
    }
    ASSERT_OK_AND_ASSIGN(RemoteShardMap remote, st.remote_shards());
    EXPECT_EQ(3u, remote.size());
    for (const auto& [owner, list] : remote) EXPECT_EQ(1u, list.size());
    ForEachFetched(remote, [&](int owner, const Shard& shard) {
      EXPECT_EQ(Placement(owner), shard.metadata.placement()->ToString());
      EXPECT_EQ(owner == 3 ? Sizes({1, 20}) : Sizes({3, 20}),
                shard.tensor.sizes());
    });
  }
}

// ones/zeros/full: each rank's shard holds the fill value.
void CheckFilled(const DeviceRanksTest& test, const ShardedTensor& st, int rank,
                 int64_t h, int64_t w, double value, DType dtype) {
  ASSERT_EQ(1u, st.local_shards().size());
  const Tensor& local = st.local_shards()[0].tensor;
  int64_t expected_h = rank == 3 ? 1 : (h + 3) / 4;
  EXPECT_EQ(Sizes({expected_h, w}), local.sizes());
  ASSERT_OK_AND_ASSIGN(
      Tensor expected,
      Tensor::Full({expected_h, w}, value, TensorOptions().WithDType(dtype)));
  ASSERT_OK_AND_ASSIGN(Tensor host, local.To(Device::Cpu()));
  EXPECT_TRUE(Equal(expected, host));
}

TEST_P(TestShardedTensorChunked, CreateShardedTensorWithOnes) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {0, 1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(ShardedTensor st, ShardedTensor::Ones(spec, {10, 20}));
  EXPECT_EQ(DeviceOf(rank()), st.local_shards()[0].tensor.device());
  CheckFilled(*this, st, rank(), 10, 20, 1, DType::kFloat32);
}

TEST_P(TestShardedTensorChunked, CreateShardedTensorWithZeros) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {0, 1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(ShardedTensor st, ShardedTensor::Zeros(spec, {10, 20}));
  EXPECT_EQ(DeviceOf(rank()), st.local_shards()[0].tensor.device());
  CheckFilled(*this, st, rank(), 10, 20, 0, DType::kFloat32);
}

TEST_P(TestShardedTensorChunked, CreateShardedTensorWithFull) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {0, 1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(
      ShardedTensor st,
      ShardedTensor::Full(spec, {10, 20}, 1234,
                          ShardedTensorOptions().WithDType(DType::kInt32)));
  EXPECT_EQ(DeviceOf(rank()), st.local_shards()[0].tensor.device());
  CheckFilled(*this, st, rank(), 10, 20, 1234, DType::kInt32);
}

TEST_P(TestShardedTensorChunked, CreateShardedTensorWithRand) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {0, 1, 2, 3}));
  constexpr uint64_t kSeed = 1234;
  TensorOptions expected_options =
      TensorOptions().WithDType(DType::kFloat64).WithDevice(DeviceOf(rank()));
  auto options = ShardedTensorOptions().WithDType(DType::kFloat64);

  ManualSeed(kSeed);
  ASSERT_OK_AND_ASSIGN(Tensor expected, Tensor::Rand({2, 2}, expected_options));
  ManualSeed(kSeed);
  ASSERT_OK_AND_ASSIGN(ShardedTensor st,
                       ShardedTensor::Rand(spec, {8, 2}, options));
  ASSERT_EQ(1u, st.local_shards().size());
  EXPECT_EQ(DeviceOf(rank()), st.local_shards()[0].tensor.device());
  EXPECT_EQ(Sizes({2, 2}), st.local_shards()[0].tensor.sizes());
  EXPECT_TRUE(Equal(expected, st.local_shards()[0].tensor));

  ManualSeed(kSeed);
  ASSERT_OK_AND_ASSIGN(Tensor expected_randn,
                       Tensor::Randn({2, 2}, expected_options));
  ManualSeed(kSeed);
  ASSERT_OK_AND_ASSIGN(ShardedTensor st_randn,
                       ShardedTensor::Randn(spec, {8, 2}, options));
  ASSERT_EQ(1u, st_randn.local_shards().size());
  EXPECT_TRUE(Equal(expected_randn, st_randn.local_shards()[0].tensor));
}

TEST_P(TestShardedTensorChunked, CreateShardedTensorLike) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {0, 1, 2, 3}));
  constexpr uint64_t kSeed = 1234;
  const DType dtype = DType::kFloat64;
  TensorOptions expected_options =
      TensorOptions().WithDType(dtype).WithDevice(DeviceOf(rank()));
  ASSERT_OK_AND_ASSIGN(
      ShardedTensor st,
      ShardedTensor::Rand(spec, {8, 8},
                          ShardedTensorOptions().WithDType(dtype)));
  const Sizes local_sizes = {2, 8};

  ASSERT_OK_AND_ASSIGN(ShardedTensor full,
                       ShardedTensor::FullLike(st, 8.8, dtype));
  ASSERT_OK_AND_ASSIGN(Tensor full_local, full.local_tensor());
  ASSERT_OK_AND_ASSIGN(Tensor full_expected,
                       Tensor::Full(local_sizes, 8.8, expected_options));
  EXPECT_TRUE(Equal(full_expected, full_local));

  ASSERT_OK_AND_ASSIGN(ShardedTensor empty,
                       ShardedTensor::EmptyLike(st, dtype));
  ASSERT_OK_AND_ASSIGN(Tensor empty_local, empty.local_tensor());
  EXPECT_EQ(local_sizes, empty_local.sizes());

  using Like = absl::StatusOr<ShardedTensor> (*)(const ShardedTensor&,
                                                 std::optional<DType>);
  using Plain = absl::StatusOr<Tensor> (*)(absl::Span<const int64_t>,
                                           const TensorOptions&);
  const std::vector<std::pair<Like, Plain>> ops = {
      {&ShardedTensor::ZerosLike, &Tensor::Zeros},
      {&ShardedTensor::OnesLike, &Tensor::Ones},
      {[](const ShardedTensor& t, std::optional<DType> d) {
         return ShardedTensor::RandLike(t, d);
       },
       [](absl::Span<const int64_t> s, const TensorOptions& o) {
         return Tensor::Rand(s, o);
       }},
      {[](const ShardedTensor& t, std::optional<DType> d) {
         return ShardedTensor::RandnLike(t, d);
       },
       [](absl::Span<const int64_t> s, const TensorOptions& o) {
         return Tensor::Randn(s, o);
       }},
  };
  for (const auto& [like, plain] : ops) {
    ManualSeed(kSeed);
    ASSERT_OK_AND_ASSIGN(Tensor expected, plain(local_sizes, expected_options));
    ManualSeed(kSeed);
    ASSERT_OK_AND_ASSIGN(ShardedTensor made, like(st, dtype));
    ASSERT_OK_AND_ASSIGN(Tensor local, made.local_tensor());
    EXPECT_TRUE(Equal(expected, local));
  }
}

// test_partial_world_size and test_new_group share their checks: shards on
// ranks 2 and 3 only, seen from every rank.
void CheckPartialChunks(const DeviceRanksTest& test, const ShardedTensor& st,
                        int rank) {
  if (rank >= 2) {
    ASSERT_EQ(1u, st.local_shards().size());
    EXPECT_EQ(Sizes({5, 20}), st.local_shards()[0].tensor.sizes());
  } else {
    EXPECT_EQ(0u, st.local_shards().size());
  }
  const auto& shards = st.metadata().shards_metadata;
  ASSERT_EQ(2u, shards.size());
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(Sizes({i * 5, 0}), shards[i].shard_offsets());
    EXPECT_EQ(Sizes({5, 20}), shards[i].shard_sizes());
  }
  ASSERT_OK_AND_ASSIGN(RemoteShardMap remote, st.remote_shards());
  EXPECT_EQ(rank >= 2 ? 1u : 2u, remote.size());
  ForEachFetched(remote, [&](int owner, const Shard& shard) {
    EXPECT_EQ(shards[owner - 2].placement(), shard.metadata.placement());
    EXPECT_EQ(Sizes({5, 20}), shard.tensor.sizes());
  });
}

TEST_P(TestShardedTensorChunked, PartialWorldSize) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {2, 3}));
  ASSERT_OK_AND_ASSIGN(ShardedTensor st,
                       ShardedTensor::Empty(spec, {10, 20}, Rrefs()));
  CheckPartialChunks(*this, st, rank());
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(Placement(i + 2),
              st.metadata().shards_metadata[i].placement()->ToString());
  }
}

TEST_P(TestShardedTensorChunked, NewGroup) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {2, 3}));
  ASSERT_OK_AND_ASSIGN(auto pg, rank_runtime()->NewGroup({1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(
      ShardedTensor st,
      ShardedTensor::Empty(spec, {10, 20}, Rrefs().WithProcessGroup(pg)));
  CheckPartialChunks(*this, st, rank());
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(Placement(i + 2),
              st.metadata().shards_metadata[i].placement()->ToString());
  }
}

TEST_P(TestShardedTensorChunked, MultipleLocalShards) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {0, 1, 2, 3, 0, 1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(ShardedTensor st,
                       ShardedTensor::Empty(spec, {16, 20}, Rrefs()));
  ASSERT_EQ(2u, st.local_shards().size());
  for (const Shard& shard : st.local_shards()) {
    EXPECT_EQ(DeviceOf(rank()), shard.tensor.device());
    EXPECT_EQ(Sizes({2, 20}), shard.tensor.sizes());
  }
  const auto& shards = st.metadata().shards_metadata;
  ASSERT_EQ(8u, shards.size());
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(Sizes({i * 2, 0}), shards[i].shard_offsets());
    EXPECT_EQ(Sizes({2, 20}), shards[i].shard_sizes());
    EXPECT_EQ(Placement(i % 4), shards[i].placement()->ToString());
  }
  ASSERT_OK_AND_ASSIGN(RemoteShardMap remote, st.remote_shards());
  EXPECT_EQ(3u, remote.size());
  for (const auto& [owner, list] : remote) EXPECT_EQ(2u, list.size());
  ForEachFetched(remote, [](int, const Shard& shard) {
    EXPECT_EQ(Sizes({2, 20}), shard.tensor.sizes());
  });
}

TEST_P(TestShardedTensorChunked, ShardingColumns) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitPg());
  for (int64_t dim : {1, -1}) {
    ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(dim, {0, 1, 2, 3}));
    ASSERT_OK_AND_ASSIGN(ShardedTensor st,
                         ShardedTensor::Empty(spec, {10, 32}));
    ASSERT_EQ(1u, st.local_shards().size());
    EXPECT_EQ(DeviceOf(rank()), st.local_shards()[0].tensor.device());
    EXPECT_EQ(Sizes({10, 8}), st.local_shards()[0].tensor.sizes());
    const auto& shards = st.metadata().shards_metadata;
    ASSERT_EQ(4u, shards.size());
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(Sizes({0, r * 8}), shards[r].shard_offsets());
      EXPECT_EQ(Sizes({10, 8}), shards[r].shard_sizes());
      EXPECT_EQ(Placement(r), shards[r].placement()->ToString());
    }
  }
}

TEST_P(TestShardedTensorChunked, InvalidSharding) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitPg());
  EXPECT_THAT(ChunkShardingSpec::CreateNamed("H", {Placement(1)}),
              StatusIs(absl::StatusCode::kUnimplemented,
                       HasSubstr("does not support named dimension")));
  for (int64_t dim : {2, 3, 4, -3, -4, -5}) {
    ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(dim, {1}));
    EXPECT_THAT(ShardedTensor::Empty(spec, {10, 20}),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("Invalid sharding dim")));
  }
  auto spec_of = [](const std::string& placement) {
    return ShardingSpec(*ChunkShardingSpec::Create(0, {placement}));
  };
  EXPECT_THAT(
      ShardedTensor::Empty(spec_of("rank:5/" + DeviceText(1)), {10, 20}),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("Global rank 5 does not exist in input "
                         "process group")));

  ShardingSpec on_rank0 = spec_of("rank:0/" + DeviceText(0));
  ASSERT_OK(ShardedTensor::Empty(on_rank0, {10, 20}).status());
  // `torch.add(st, tensor)` ("not supported for ShardedTensor!") has no
  // counterpart: ShardedTensor offers no arithmetic to call.

  ShardedTensorOptions sparse;
  sparse.layout = Layout::kSparseCoo;
  EXPECT_THAT(ShardedTensor::Empty(on_rank0, {10, 20}, sparse),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("Only torch.strided layout is currently "
                                 "supported")));
  ShardedTensorOptions channels_last;
  channels_last.memory_format = MemoryFormat::kChannelsLast;
  EXPECT_THAT(ShardedTensor::Empty(on_rank0, {10, 20}, channels_last),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("Only torch.contiguous_format memory_format "
                                 "is currently supported")));

  EXPECT_THAT(
      ShardedTensor::Empty(spec_of("worker0/" + DeviceText(0)), {10, 20}),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               HasSubstr("RPC framework needs to be initialized")));
  EXPECT_THAT(ShardedTensor::Empty(on_rank0, {10, 20}, Rrefs()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("RPC Framework needs to be initialized")));
  ASSERT_OK_AND_ASSIGN(ShardedTensor st,
                       ShardedTensor::Empty(on_rank0, {10, 20}));
  EXPECT_THAT(
      st.remote_shards(),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               HasSubstr("ShardedTensor created with init_rrefs=False")));

  ASSERT_OK(InitRpc());
  EXPECT_THAT(ShardedTensor::Empty(spec_of("workerfoo/" + DeviceText(1)),
                                   {10, 20}, Rrefs()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("Invalid worker name")));
}

TEST_P(TestShardedTensorChunked, InvalidPgRpcRanks) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitPg());
  RpcOptions shifted;
  shifted.rank = (rank() + 1) % world_size();
  ASSERT_OK(InitRpc(shifted));
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {1}));
  EXPECT_THAT(ShardedTensor::Empty(spec, {10, 20}, Rrefs()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("Default ProcessGroup and RPC ranks must be "
                                 "the same")));
}

TEST_P(TestShardedTensorChunked, InsufficientShardingDims) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitPg());
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {0, 1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(ShardedTensor st, ShardedTensor::Empty(spec, {2, 20}));
  ASSERT_EQ(1u, st.local_shards().size());
  const Tensor& local = st.local_shards()[0].tensor;
  EXPECT_EQ(DeviceOf(rank()), local.device());
  if (rank() <= 1) {
    EXPECT_EQ(Sizes({1, 20}), local.sizes());
  } else {
    EXPECT_EQ(0, local.numel());
  }
  const auto& shards = st.metadata().shards_metadata;
  ASSERT_EQ(4u, shards.size());
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(Sizes({r, 0}), shards[r].shard_offsets());
    EXPECT_EQ(Placement(r), shards[r].placement()->ToString());
    EXPECT_EQ(r <= 1 ? Sizes({1, 20}) : Sizes({0, 20}),
              shards[r].shard_sizes());
  }
}

TEST_P(TestShardedTensorChunked, ShardedTensorSizes) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {0, 1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(ShardedTensor st,
                       ShardedTensor::Empty(spec, {10, 20}, Rrefs()));
  EXPECT_EQ(Sizes({10, 20}), st.size());
  ASSERT_OK_AND_ASSIGN(ShardedTensor st1,
                       ShardedTensor::Empty(spec, {10}, Rrefs()));
  EXPECT_EQ(Sizes({10}), st1.size());
  EXPECT_EQ(10, *st.size(0));
  EXPECT_EQ(20, *st.size(1));
  EXPECT_EQ(20, *st.size(-1));
  EXPECT_EQ(2, st.dim());
  EXPECT_EQ(2, st.ndim());
  EXPECT_THAT(st.size(-3), StatusIs(absl::StatusCode::kOutOfRange,
                                    HasSubstr("Dimension out of range")));
  EXPECT_THAT(st.size(2), StatusIs(absl::StatusCode::kOutOfRange,
                                   HasSubstr("Dimension out of range")));
  // sharded_tensor.empty(spec, "foo") is a TypeError in Python and does not
  // compile here.
}

TEST_P(TestShardedTensorChunked, Cleanup) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {0, 1, 2, 3}));
  std::string id;
  {
    ASSERT_OK_AND_ASSIGN(ShardedTensor st1,
                         ShardedTensor::Empty(spec, {10, 20}, Rrefs()));
    ASSERT_OK_AND_ASSIGN(ShardedTensor st2,
                         ShardedTensor::Empty(spec, {10, 20}));
    EXPECT_EQ(2u, rank_runtime()->registry().size());
    id = st1.tensor_id();
  }
  EXPECT_EQ(0u, rank_runtime()->registry().size());
  // st1's shards are retired (peers might still fetch them) until every
  // rank has passed a barrier; then they are gone everywhere.
  ASSERT_OK(rank_runtime()->Barrier());
  EXPECT_EQ(0u, rank_runtime()->registry().retired_size());
  // ... and once every rank has released them, no one serves them.
  ASSERT_OK(rank_runtime()->default_group()->Barrier());
  ASSERT_OK_AND_ASSIGN(auto client,
                       rank_runtime()->ClientFor((rank() + 1) % world_size()));
  EXPECT_THAT(client->FetchShard(id, (rank() + 1) % world_size()),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(id)));
}

// Shards fetched across many chunks arrive intact, and every rank sees the
// same values for the same shard.
TEST_P(TestShardedTensorChunked, RemoteShardsCrossManyChunks) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitPg());
  RpcOptions tiny_chunks;
  tiny_chunks.chunk_bytes = 4096;
  ASSERT_OK(InitRpc(tiny_chunks));
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {0, 1, 2, 3}));
  ManualSeed(7);
  ASSERT_OK_AND_ASSIGN(ShardedTensor st,
                       ShardedTensor::Rand(spec, {403, 129}, Rrefs()));
  ASSERT_OK_AND_ASSIGN(RemoteShardMap remote, st.remote_shards());
  ForEachFetched(remote, [&](int owner, const Shard& shard) {
    // Every rank drew its shard first from seed 7, so the owner's bytes are
    // what this rank would draw for that shape.
    ManualSeed(7);
    auto expected = Tensor::Rand(shard.metadata.shard_sizes(),
                                 TensorOptions().WithDevice(DeviceOf(owner)));
    ASSERT_TRUE(expected.ok());
    EXPECT_TRUE(Equal(*expected, shard.tensor)) << "shard of rank " << owner;
    EXPECT_GT(shard.tensor.nbytes(), 10u * 4096);
  });
}

// test_gather_even / test_gather_uneven: ones() gathered on `dst` equal
// ones; the other ranks pass no output.
void GatherOnesAndCheck(const ShardedTensor& st, int rank, int dst,
                        const Device& device) {
  const std::vector<int64_t>& size = st.size();
  Tensor full;
  if (rank == dst) {
    ASSERT_OK_AND_ASSIGN(
        full, Tensor::Zeros(size, TensorOptions().WithDevice(device)));
  }
  ASSERT_OK(st.Gather(dst, full));
  if (rank == dst) {
    ASSERT_OK_AND_ASSIGN(Tensor ones, Tensor::Ones(size));
    ASSERT_OK_AND_ASSIGN(Tensor host, full.To(Device::Cpu()));
    EXPECT_TRUE(Equal(ones, host));
  } else {
    EXPECT_FALSE(full.defined());
  }
}

TEST_P(TestShardedTensorChunked, GatherEven) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {0, 1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(ShardedTensor st, ShardedTensor::Ones(spec, {10, 20}));
  GatherOnesAndCheck(st, rank(), 1, DeviceOf(1));
}

TEST_P(TestShardedTensorChunked, GatherUneven) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {0, 0, 1, 1, 2}));
  ASSERT_OK_AND_ASSIGN(ShardedTensor st, ShardedTensor::Ones(spec, {10, 20}));
  GatherOnesAndCheck(st, rank(), 1, DeviceOf(1));
}

TEST_P(TestShardedTensorEnumerable, GatherEven) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, GridSpec());
  ASSERT_OK_AND_ASSIGN(ShardedTensor st,
                       ShardedTensor::Ones(spec, {10, 10}, Rrefs()));
  GatherOnesAndCheck(st, rank(), 0, DeviceOf(0));
}

TEST_P(TestShardedTensorEnumerable, GatherUneven) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  const std::vector<int> owners = {0, 1, 0, 3};
  std::vector<ShardMetadata> shards;
  for (int i = 0; i < 4; ++i) {
    shards.push_back(Md({i / 2 * 5, i % 2 * 5}, {5, 5}, Placement(owners[i])));
  }
  ASSERT_OK_AND_ASSIGN(EnumerableShardingSpec spec,
                       EnumerableShardingSpec::Create(shards));
  ASSERT_OK_AND_ASSIGN(ShardedTensor st,
                       ShardedTensor::Ones(spec, {10, 10}, Rrefs()));
  GatherOnesAndCheck(st, rank(), 0, DeviceOf(0));
}

// Beyond the reference: every value lands in its place, empty shards take
// part, the dtype is kept exactly (an int64 beyond float32's precision),
// and gather_all gives every rank the same tensor.
TEST_P(TestShardedTensorChunked, GatherKeepsValuesAndDType) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  // 3 rows over 4 ranks: rank 3's shard is empty.
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {0, 1, 2, 3}));
  const int64_t big = (int64_t{1} << 40) + 1;
  ASSERT_OK_AND_ASSIGN(
      ShardedTensor st,
      ShardedTensor::Full(spec, {3, 5}, static_cast<double>(big),
                          ShardedTensorOptions().WithDType(DType::kInt64)));
  // Make every element distinct: local element (r, c) of global row g.
  for (const Shard& shard : st.local_shards()) {
    ASSERT_OK_AND_ASSIGN(Tensor host, shard.tensor.To(Device::Cpu()));
    int64_t* data = host.data<int64_t>();
    for (int64_t e = 0; e < host.numel(); ++e) {
      data[e] = big + shard.metadata.shard_offsets()[0] * 5 + e;
    }
    ASSERT_OK(CopyInto(host, shard.tensor));
  }
  ASSERT_OK_AND_ASSIGN(Tensor all, st.GatherAll());
  ASSERT_EQ(DType::kInt64, all.dtype());
  for (int64_t e = 0; e < 15; ++e) EXPECT_EQ(big + e, all.data<int64_t>()[e]);

  Tensor out;
  if (rank() == 2) {
    ASSERT_OK_AND_ASSIGN(
        out, Tensor::Zeros({3, 5}, TensorOptions().WithDType(DType::kInt64)));
  }
  ASSERT_OK(st.Gather(2, out));
  if (rank() == 2) {
    EXPECT_TRUE(Equal(all, out));
  }
}

// Gather receives a rank's bytes straight into `out` where its shard is
// one contiguous run there (row chunks), into a buffer otherwise (column
// chunks, a strided `out`): every value lands in its place either way.
TEST_P(TestShardedTensorChunked, GatherPlacesEveryValueForEveryLayout) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  for (const int64_t dim : {0, 1}) {
    SCOPED_TRACE(absl::StrCat("chunks along dim ", dim));
    ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(dim, {0, 1, 2, 3}));
    ASSERT_OK_AND_ASSIGN(ShardedTensor st, ShardedTensor::Zeros(spec, {8, 6}));
    // Element (i, j) holds 6 * i + j.
    for (const Shard& shard : st.local_shards()) {
      ASSERT_OK_AND_ASSIGN(Tensor host, shard.tensor.To(Device::Cpu()));
      const absl::Span<const int64_t> at = shard.metadata.shard_offsets();
      const int64_t columns = host.sizes()[1];
      for (int64_t e = 0; e < host.numel(); ++e) {
        host.data<float>()[e] =
            static_cast<float>(6 * (at[0] + e / columns) + at[1] + e % columns);
      }
      ASSERT_OK(CopyInto(host, shard.tensor));
    }
    Tensor dense, wide, strided;
    if (rank() == 1) {
      const TensorOptions on = TensorOptions().WithDevice(DeviceOf(1));
      ASSERT_OK_AND_ASSIGN(dense, Tensor::Zeros({8, 6}, on));
      ASSERT_OK_AND_ASSIGN(wide, Tensor::Zeros({8, 12}, on));
      ASSERT_OK_AND_ASSIGN(strided, wide.Narrow(1, 3, 6));
    }
    ASSERT_OK(st.Gather(1, dense));
    ASSERT_OK(st.Gather(1, strided));
    ASSERT_OK_AND_ASSIGN(Tensor all, st.GatherAll());
    for (const Tensor* out : {&dense, &strided, &all}) {
      if (!out->defined()) continue;
      ASSERT_OK_AND_ASSIGN(Tensor host, out->To(Device::Cpu()));
      ASSERT_OK_AND_ASSIGN(host, host.Contiguous());
      for (int64_t e = 0; e < 48; ++e) {
        ASSERT_EQ(host.data<float>()[e], static_cast<float>(e)) << e;
      }
    }
    if (rank() == 1) {  // The columns around the strided view are untouched.
      ASSERT_OK_AND_ASSIGN(Tensor host, wide.To(Device::Cpu()));
      for (int64_t r = 0; r < 8; ++r) {
        EXPECT_EQ(host.data<float>()[r * 12], 0.0f);
        EXPECT_EQ(host.data<float>()[r * 12 + 11], 0.0f);
      }
    }
  }
}

// Large CPU gathers (shards of 1 MiB and more, 8 MiB outside dst) are
// pulled by dst from the owners' shard servers, several at once, straight
// into `out`: every value lands in its place for row and column chunks,
// several shards per rank and a strided `out`.
TEST_P(TestShardedTensorChunked, LargeGathersPlaceEveryValue) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  constexpr int64_t kRows = 4096, kColumns = 1024;  // 16 MiB of float32.
  struct Layout {
    int64_t dim;
    std::vector<int> ranks;
  };
  for (const Layout& layout : {Layout{0, {0, 1, 2, 3}}, Layout{1, {3, 2, 1, 0}},
                               Layout{0, {0, 1, 2, 3, 0, 1, 2, 3}}}) {
    SCOPED_TRACE(absl::StrCat("chunks along dim ", layout.dim, " over ",
                              layout.ranks.size(), " shards"));
    ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(layout.dim, layout.ranks));
    ASSERT_OK_AND_ASSIGN(ShardedTensor st,
                         ShardedTensor::Zeros(spec, {kRows, kColumns}));
    // Element (i, j) holds kColumns * i + j (exact in float32: < 2^24).
    for (const Shard& shard : st.local_shards()) {
      ASSERT_OK_AND_ASSIGN(Tensor host, shard.tensor.To(Device::Cpu()));
      const absl::Span<const int64_t> at = shard.metadata.shard_offsets();
      const int64_t columns = host.sizes()[1];
      float* data = host.data<float>();
      for (int64_t e = 0; e < host.numel(); ++e) {
        data[e] = static_cast<float>(kColumns * (at[0] + e / columns) + at[1] +
                                     e % columns);
      }
      ASSERT_OK(CopyInto(host, shard.tensor));
    }
    Tensor dense, wide, strided;
    if (rank() == 2) {
      const TensorOptions on = TensorOptions().WithDevice(DeviceOf(2));
      ASSERT_OK_AND_ASSIGN(dense, Tensor::Zeros({kRows, kColumns}, on));
      ASSERT_OK_AND_ASSIGN(wide, Tensor::Zeros({kRows, kColumns + 2}, on));
      ASSERT_OK_AND_ASSIGN(strided, wide.Narrow(1, 1, kColumns));
    }
    ASSERT_OK(st.Gather(2, dense));
    ASSERT_OK(st.Gather(2, strided));
    if (rank() != 2) continue;
    for (const Tensor* out : {&dense, &strided}) {
      ASSERT_OK_AND_ASSIGN(Tensor host, out->To(Device::Cpu()));
      ASSERT_OK_AND_ASSIGN(host, host.Contiguous());
      const float* data = host.data<float>();
      for (int64_t e = 0; e < kRows * kColumns; ++e) {
        ASSERT_EQ(data[e], static_cast<float>(e)) << e;
      }
    }
    ASSERT_OK_AND_ASSIGN(Tensor host, wide.To(Device::Cpu()));
    for (int64_t r = 0; r < kRows; ++r) {
      ASSERT_EQ(host.data<float>()[r * (kColumns + 2)], 0.0f);
      ASSERT_EQ(host.data<float>()[r * (kColumns + 2) + kColumns + 1], 0.0f);
    }
  }
}

// When dst cannot pull a shard (here its owner withdrew it from its shard
// server before the gather), every member fails with dst's error instead
// of returning as if the gather had worked.
TEST_P(TestShardedTensorChunked, LargeGatherFailsEveryMemberTogether) {
  // With one GPU per rank, CUDA tensors gather over NCCL, which pulls
  // nothing.
  if (cuda()) GTEST_SKIP() << "a CUDA group may gather over NCCL";
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {0, 1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(ShardedTensor st,
                       ShardedTensor::Ones(spec, {4096, 1024}));
  Tensor out;
  if (rank() == 0) {
    ASSERT_OK_AND_ASSIGN(out, Tensor::Zeros({4096, 1024}));
  }
  if (rank() == 3) {
    ASSERT_TRUE(rank_runtime()->registry().Unregister(st.tensor_id()));
  }
  EXPECT_THAT(
      st.Gather(0, out),
      StatusIs(
          absl::StatusCode::kNotFound,
          AllOf(HasSubstr("on rank 0"),
                HasSubstr(absl::StrCat("unknown tensor ", st.tensor_id())))));
}

TEST_P(TestShardedTensorChunked, GatherArgumentErrors) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {0, 1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(ShardedTensor st, ShardedTensor::Ones(spec, {10, 20}));
  // Every rank makes the same mistake, so no rank waits for another.
  if (rank() == 1) {
    EXPECT_THAT(st.Gather(1), StatusIs(absl::StatusCode::kInvalidArgument,
                                       HasSubstr("Argument ``dst_tensor`` must "
                                                 "be specified on destination "
                                                 "rank 1")));
    ASSERT_OK_AND_ASSIGN(Tensor small, Tensor::Zeros({4, 4}));
    EXPECT_THAT(st.Gather(1, small),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("Argument ``dst_tensor`` have size (4, "
                                   "4),but should be (10, 20)")));
  } else {
    ASSERT_OK_AND_ASSIGN(Tensor extra, Tensor::Zeros({10, 20}));
    EXPECT_THAT(st.Gather(1, extra),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("Argument ``dst_tensor`` must NOT be "
                                   "specified on non-destination ranks.")));
  }
  EXPECT_THAT(st.Gather(7),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dst")));
}

// A peer that dies: fetching its shard fails promptly with UNAVAILABLE (or
// DEADLINE_EXCEEDED), never hangs, and the survivors' own shard servers keep
// serving each other.
TEST_P(TestShardedTensorChunked, DeadPeerFailsFetchesNotRanks) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {0, 1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(ShardedTensor st,
                       ShardedTensor::Ones(spec, {8, 8}, Rrefs()));
  if (rank() == 3) std::_Exit(0);  // Dies without any goodbye.

  ASSERT_OK_AND_ASSIGN(RemoteShardMap remote, st.remote_shards());
  FetchOptions options;
  options.timeout = absl::Seconds(2);
  absl::Status status;
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  // The owner's socket closes when its process is gone.
  while (status.ok() && absl::Now() < give_up) {
    const absl::Time start = absl::Now();
    status = remote.at(3).front().to_here(options).status();
    EXPECT_LT(absl::Now() - start, absl::Seconds(5));
    if (status.ok()) absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_THAT(status.code(),
              ::testing::AnyOf(absl::StatusCode::kUnavailable,
                               absl::StatusCode::kDeadlineExceeded))
      << status;
  for (const auto& [owner, shards] : remote) {
    if (owner == 3) continue;
    EXPECT_OK(shards.front().to_here(options).status());
  }
  // Survivors finish together through the store (the world group has lost
  // a member, so its barrier could only time out).
  ASSERT_OK(store()->Add("dead_peer/done", 1).status());
  for (int i = 0; i < 100 && *store()->Add("dead_peer/done", 0) < 3; ++i) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  AbandonComms();
}

TEST_P(TestShardedTensorEnumerable, ShardedTensorMetadata) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, GridSpec());
  std::vector<ShardMetadata> cpu_shards;
  for (int r = 0; r < 4; ++r) {
    cpu_shards.push_back(
        Md({r / 2 * 5, r % 2 * 5}, {5, 5}, absl::StrCat("rank:", r, "/cpu")));
  }
  ASSERT_OK_AND_ASSIGN(EnumerableShardingSpec cpu_spec,
                       EnumerableShardingSpec::Create(cpu_shards));
  CheckProperties(spec, cpu_spec, {10, 10});
}

// test_grid_sharding and test_with_rpc_names: the 2x2 grid, by rank or by
// worker name.
void CheckGrid(DeviceRanksTest& test, const ShardedTensor& st, int rank,
               const std::string& owner_prefix) {
  EXPECT_EQ(Sizes({10, 10}), st.size());
  ASSERT_EQ(1u, st.local_shards().size());
  const Shard& local = st.local_shards()[0];
  EXPECT_EQ(Sizes({5, 5}), local.tensor.sizes());
  EXPECT_EQ(Sizes({rank / 2 * 5, rank % 2 * 5}),
            local.metadata.shard_offsets());
  EXPECT_EQ(Sizes({5, 5}), local.metadata.shard_sizes());
  const auto& shards = st.metadata().shards_metadata;
  ASSERT_EQ(4u, shards.size());
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(Sizes({r / 2 * 5, r % 2 * 5}), shards[r].shard_offsets());
    EXPECT_EQ(Sizes({5, 5}), shards[r].shard_sizes());
    EXPECT_EQ(absl::StrCat(owner_prefix, r, "/", test.DeviceText(r)),
              shards[r].placement()->ToString());
  }
  EXPECT_EQ(absl::StrCat(owner_prefix, rank, "/", test.DeviceText(rank)),
            local.metadata.placement()->ToString());
  ASSERT_OK_AND_ASSIGN(RemoteShardMap remote, st.remote_shards());
  EXPECT_EQ(3u, remote.size());
  for (const auto& [owner, list] : remote) EXPECT_EQ(1u, list.size());
  ForEachFetched(remote, [](int, const Shard& shard) {
    EXPECT_EQ(Sizes({5, 5}), shard.tensor.sizes());
  });
}

TEST_P(TestShardedTensorEnumerable, GridSharding) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, GridSpec());
  ASSERT_OK_AND_ASSIGN(ShardedTensor st,
                       ShardedTensor::Empty(spec, {10, 10}, Rrefs()));
  EXPECT_EQ(DeviceOf(rank()), st.local_shards()[0].tensor.device());
  CheckGrid(*this, st, rank(), "rank:");
}

TEST_P(TestShardedTensorEnumerable, WithRpcNames) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, GridSpec(/*worker_names=*/true));
  ASSERT_OK_AND_ASSIGN(ShardedTensor st,
                       ShardedTensor::Empty(spec, {10, 10}, Rrefs()));
  CheckGrid(*this, st, rank(), "worker");
}

TEST_P(TestShardedTensorEnumerable, CreateShardedTensorWithOnes) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, GridSpec());
  ASSERT_OK_AND_ASSIGN(ShardedTensor st, ShardedTensor::Ones(spec, {10, 10}));
  EXPECT_EQ(Sizes({10, 10}), st.size());
  ASSERT_EQ(1u, st.local_shards().size());
  const Tensor& local = st.local_shards()[0].tensor;
  EXPECT_EQ(DeviceOf(rank()), local.device());
  ASSERT_OK_AND_ASSIGN(Tensor ones, Tensor::Ones({5, 5}));
  ASSERT_OK_AND_ASSIGN(Tensor host, local.To(Device::Cpu()));
  EXPECT_TRUE(Equal(ones, host));
}

TEST_P(TestShardedTensorEnumerable, UnevenShards) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitPg());
  const std::vector<Sizes> offsets = {{0, 0}, {0, 4}, {2, 0}, {4, 4}};
  const std::vector<Sizes> sizes = {{2, 4}, {4, 2}, {4, 4}, {2, 2}};
  std::vector<ShardMetadata> shards;
  for (int r = 0; r < 4; ++r)
    shards.push_back(Md(offsets[r], sizes[r], Placement(r)));
  ASSERT_OK_AND_ASSIGN(EnumerableShardingSpec spec,
                       EnumerableShardingSpec::Create(shards));
  ASSERT_OK_AND_ASSIGN(ShardedTensor st, ShardedTensor::Empty(spec, {6, 6}));
  EXPECT_EQ(Sizes({6, 6}), st.size());
  ASSERT_EQ(1u, st.local_shards().size());
  const Shard& local = st.local_shards()[0];
  EXPECT_EQ(DeviceOf(rank()), local.tensor.device());
  EXPECT_EQ(sizes[rank()], local.tensor.sizes());
  EXPECT_EQ(offsets[rank()], local.metadata.shard_offsets());
  EXPECT_EQ(sizes[rank()], local.metadata.shard_sizes());
  EXPECT_EQ(Placement(rank()), local.metadata.placement()->ToString());
  const auto& all = st.metadata().shards_metadata;
  ASSERT_EQ(4u, all.size());
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(offsets[r], all[r].shard_offsets());
    EXPECT_EQ(sizes[r], all[r].shard_sizes());
    EXPECT_EQ(Placement(r), all[r].placement()->ToString());
  }
}

// test_partial_world_size (owners 0, 1) and test_new_group (owners 1, 3 in
// group [1, 2, 3]): two 5x5 shards stacked in a 10x5 tensor.
void CheckTwoOwners(DeviceRanksTest& test, const ShardedTensor& st, int rank,
                    std::vector<int> owners) {
  EXPECT_EQ(Sizes({10, 5}), st.size());
  bool owns = rank == owners[0] || rank == owners[1];
  ASSERT_EQ(owns ? 1u : 0u, st.local_shards().size());
  if (owns) {
    const Shard& local = st.local_shards()[0];
    EXPECT_EQ(test.DeviceOf(rank), local.tensor.device());
    EXPECT_EQ(Sizes({5, 5}), local.tensor.sizes());
    EXPECT_EQ(Sizes({rank == owners[0] ? 0 : 5, 0}),
              local.metadata.shard_offsets());
    EXPECT_EQ(test.Placement(rank), local.metadata.placement()->ToString());
  }
  const auto& shards = st.metadata().shards_metadata;
  ASSERT_EQ(2u, shards.size());
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(Sizes({i * 5, 0}), shards[i].shard_offsets());
    EXPECT_EQ(Sizes({5, 5}), shards[i].shard_sizes());
    EXPECT_EQ(test.Placement(owners[i]), shards[i].placement()->ToString());
  }
  ASSERT_OK_AND_ASSIGN(RemoteShardMap remote, st.remote_shards());
  EXPECT_EQ(owns ? 1u : 2u, remote.size());
  for (const auto& [owner, list] : remote) EXPECT_EQ(1u, list.size());
  ForEachFetched(remote, [](int, const Shard& shard) {
    EXPECT_EQ(Sizes({5, 5}), shard.tensor.sizes());
  });
}

absl::StatusOr<ShardingSpec> TwoOwnerSpec(DeviceRanksTest& test,
                                          std::vector<int> owners) {
  std::vector<ShardMetadata> shards;
  for (int i = 0; i < 2; ++i) {
    ASSIGN_OR_RETURN(
        ShardMetadata md,
        ShardMetadata::Create({i * 5, 0}, {5, 5},
                              absl::string_view(test.Placement(owners[i]))));
    shards.push_back(md);
  }
  ASSIGN_OR_RETURN(EnumerableShardingSpec spec,
                   EnumerableShardingSpec::Create(shards));
  return ShardingSpec(spec);
}

TEST_P(TestShardedTensorEnumerable, PartialWorldSize) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, TwoOwnerSpec(*this, {0, 1}));
  ASSERT_OK_AND_ASSIGN(ShardedTensor st,
                       ShardedTensor::Empty(spec, {10, 5}, Rrefs()));
  CheckTwoOwners(*this, st, rank(), {0, 1});
}

TEST_P(TestShardedTensorEnumerable, NewGroup) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, TwoOwnerSpec(*this, {1, 3}));
  ASSERT_OK_AND_ASSIGN(auto pg, rank_runtime()->NewGroup({1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(
      ShardedTensor st,
      ShardedTensor::Empty(spec, {10, 5}, Rrefs().WithProcessGroup(pg)));
  CheckTwoOwners(*this, st, rank(), {1, 3});
}

TEST_P(TestLocalTensor, LocalTensor) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitPg());
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {0, 1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(ShardedTensor st, ShardedTensor::Rand(spec, {24, 12}));
  ASSERT_OK_AND_ASSIGN(Tensor local, st.local_tensor());
  EXPECT_EQ(Sizes({6, 12}), local.sizes());
  ASSERT_OK_AND_ASSIGN(Tensor again, st.local_tensor());
  EXPECT_TRUE(Equal(again, local));
}

TEST_P(TestLocalTensor, LocalTensorError) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitPg());
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec,
                       Chunk(0, {0, 0, 1, 1, 1, 2, 2, 2, 3, 3}));
  ASSERT_OK_AND_ASSIGN(ShardedTensor st, ShardedTensor::Rand(spec, {24, 12}));
  EXPECT_THAT(st.local_tensor(),
              StatusIs(absl::StatusCode::kUnimplemented,
                       HasSubstr("Only single local shard is supported.")));
}

TEST_P(TestShardMetadata, ShardMetadataInit) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  const std::vector<int>& group =
      rank_runtime()->default_group()->global_ranks();
  ASSERT_OK_AND_ASSIGN(ShardMetadata md, ShardMetadata::Create({10}, {0}));
  EXPECT_FALSE(md.placement().has_value());
  EXPECT_THAT(ParseAndValidateRemoteDevice(group, md.placement()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("remote device is None")));
  ASSERT_OK_AND_ASSIGN(md, ShardMetadata::Create({10}, {0}, "rank:0/cpu"));
  ASSERT_OK_AND_ASSIGN(auto parsed,
                       ParseAndValidateRemoteDevice(group, md.placement()));
  EXPECT_EQ(0, parsed.first);
  EXPECT_EQ(Device::Cpu(), parsed.second);
}

TEST_P(TestShardMetadata, CreateShardWithNoPlacement) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  ASSERT_OK_AND_ASSIGN(ShardMetadata md, ShardMetadata::Create({0}, {10}));
  ASSERT_OK_AND_ASSIGN(Tensor zeros, Tensor::Zeros({10}));
  Shard shard{zeros, md};
  EXPECT_FALSE(shard.metadata.placement().has_value());
}

class TestShardedTensorFromLocalShards : public DeviceRanksTest {
 protected:
  // The 2x2 grid's shard of rank r, sized `sizes`, on `device_text`.
  ShardMetadata GridShard(int r, Sizes sizes, const std::string& device_text) {
    return Md({r / 2 * 5, r % 2 * 5}, std::move(sizes),
              absl::StrCat("rank:", r, "/", device_text));
  }
  absl::StatusOr<Tensor> Randn(Sizes sizes, TensorOptions options = {}) {
    return Tensor::Randn(sizes, options.WithDevice(DeviceOf(rank())));
  }
  absl::StatusOr<ShardedTensor> FromShards(std::vector<Shard> shards,
                                           Sizes size) {
    return ShardedTensor::InitFromLocalShards(std::move(shards), size, Rrefs());
  }
};
class TestShardedTensorFromLocalTensor : public DeviceRanksTest {};

TEST_P(TestShardedTensorFromLocalShards, LocalShards) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms(/*init_rpc=*/false));
  const Sizes offsets = {rank() / 2 * 5, rank() % 2 * 5};
  ASSERT_OK_AND_ASSIGN(Tensor local, Randn({5, 5}));
  ASSERT_OK_AND_ASSIGN(
      Shard shard,
      Shard::Create(local, GridShard(rank(), {5, 5}, DeviceText(rank()))));
  ASSERT_OK_AND_ASSIGN(Shard from_offsets,
                       Shard::FromTensorAndOffsets(local, offsets, rank()));
  EXPECT_EQ(shard.metadata, from_offsets.metadata);
  EXPECT_THAT(
      Shard::Create(local, GridShard(rank(), {6, 5}, DeviceText(rank()))),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("Shard tensor size does not match")));
}

TEST_P(TestShardedTensorFromLocalShards, InitFromLocalShards) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  ASSERT_OK_AND_ASSIGN(Tensor local, Randn({5, 5}));
  ASSERT_OK_AND_ASSIGN(
      ShardedTensor st,
      FromShards({Shard{local, GridShard(rank(), {5, 5}, DeviceText(rank()))}},
                 {10, 10}));
  ASSERT_OK_AND_ASSIGN(ShardingSpec grid, GridSpec());
  ASSERT_OK_AND_ASSIGN(ShardedTensor expected_layout,
                       ShardedTensor::Empty(grid, {10, 10}, Rrefs()));
  EXPECT_EQ(expected_layout.metadata().shards_metadata,
            st.metadata().shards_metadata);
  EXPECT_EQ(DeviceOf(rank()), st.local_shards()[0].tensor.device());
  CheckGrid(*this, st, rank(), "rank:");
}

TEST_P(TestShardedTensorFromLocalShards,
       StBaseInitFromLocalShardsAndGlobalMetadata) {
  RANKS_TEST_BEGIN();
  if (rank() != 0) return;  // The reference runs this in one process.
  ShardedTensorMetadata metadata;
  std::vector<Shard> shards;
  for (int r = 0; r < 4; ++r) {
    ShardMetadata md = GridShard(r, {5, 5}, DeviceText(r));
    metadata.shards_metadata.push_back(md);
    ASSERT_OK_AND_ASSIGN(
        Tensor tensor,
        Tensor::Randn({5, 5}, TensorOptions().WithDevice(DeviceOf(r))));
    shards.push_back(Shard{tensor, md});
  }
  metadata.size = {10, 10};
  ASSERT_OK_AND_ASSIGN(
      ShardedTensor st,
      ShardedTensor::InitFromLocalShardsAndGlobalMetadata(shards, metadata));
  ASSERT_EQ(4u, st.local_shards().size());
  EXPECT_EQ(DeviceOf(0), st.local_shards()[0].tensor.device());
  EXPECT_EQ(Sizes({0, 0}), st.local_shards()[0].metadata.shard_offsets());
  EXPECT_EQ(Placement(0),
            st.local_shards()[0].metadata.placement()->ToString());
  EXPECT_EQ(metadata.shards_metadata, st.metadata().shards_metadata);
}

TEST_P(TestShardedTensorFromLocalShards, InitFromLocalShardsNewGroup) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  ASSERT_OK_AND_ASSIGN(auto new_pg, rank_runtime()->NewGroup({1, 2, 3}));
  if (rank() == 0) return;
  ASSERT_OK_AND_ASSIGN(Tensor local, Randn({5, 5}));
  ShardMetadata md = Md({5 * (rank() - 1), 0}, {5, 5}, Placement(rank()));
  ShardedTensorOptions options;
  options.process_group = new_pg;
  ASSERT_OK_AND_ASSIGN(
      ShardedTensor st,
      ShardedTensor::InitFromLocalShards({Shard{local, md}}, {15, 5}, options));
  const Shard& shard = st.local_shards()[0];
  EXPECT_EQ(DeviceOf(rank()), shard.tensor.device());
  EXPECT_EQ(Sizes({(rank() - 1) * 5, 0}), shard.metadata.shard_offsets());
  const auto& all = st.metadata().shards_metadata;
  ASSERT_EQ(3u, all.size());
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(Sizes({i * 5, 0}), all[i].shard_offsets());
    EXPECT_EQ(Sizes({5, 5}), all[i].shard_sizes());
    EXPECT_EQ(Placement(i + 1), all[i].placement()->ToString());
  }
}

TEST_P(TestShardedTensorFromLocalShards,
       InitFromLocalShardsInvalidLocalShards) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  ShardMetadata md = GridShard(rank(), {5, 5}, DeviceText(rank()));
  EXPECT_THAT(FromShards({}, {10, 10}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("have no local shards on all ranks")));
  // A sparse local tensor ("Only torch.strided layout") cannot be built:
  // Tessera tensors are strided.
  ASSERT_OK_AND_ASSIGN(Tensor square, Randn({5, 5}));
  ASSERT_OK_AND_ASSIGN(Tensor transposed, square.T());
  EXPECT_THAT(FromShards({Shard{transposed, md}}, {10, 10}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("Only torch.contiguous_format memory_format "
                                 "is currently supported")));
  ASSERT_OK_AND_ASSIGN(Tensor wrong_size, Randn({2, 3}));
  EXPECT_THAT(Shard::Create(wrong_size, md),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("Shard tensor size does not match")));
  if (cuda()) {
    ASSERT_OK_AND_ASSIGN(Tensor on_cpu, Tensor::Randn({5, 5}));
    EXPECT_THAT(
        Shard::Create(on_cpu, md),
        StatusIs(absl::StatusCode::kInvalidArgument,
                 HasSubstr("Local shard tensor device does not match")));
  }
  // A CPU variant of the device check: a meta tensor for a CPU placement.
  ASSERT_OK_AND_ASSIGN(
      Tensor meta,
      Tensor::Empty({5, 5}, TensorOptions().WithDevice(Device::Meta())));
  EXPECT_THAT(Shard::Create(meta, GridShard(rank(), {5, 5}, "cpu")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("Local shard tensor device does not match")));
}

TEST_P(TestShardedTensorFromLocalShards,
       InitFromLocalShardsInvalidPropertyCrossRanks) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  ShardMetadata md = GridShard(rank(), {5, 5}, DeviceText(rank()));
  ASSERT_OK_AND_ASSIGN(
      Tensor ones,
      Tensor::Ones({5, 5}, TensorOptions().WithDevice(DeviceOf(rank()))));
  EXPECT_THAT(
      FromShards({Shard{ones, md}}, rank() == 0 ? Sizes{10, 10} : Sizes{10, 5}),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("ShardedTensor global_size property does not "
                         "match from different ranks!")));
  ASSERT_OK_AND_ASSIGN(
      Tensor typed,
      Tensor::Ones({5, 5},
                   TensorOptions()
                       .WithDType(rank() == 0 ? DType::kInt32 : DType::kFloat32)
                       .WithDevice(DeviceOf(rank()))));
  EXPECT_THAT(FromShards({Shard{typed, md}}, {10, 10}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("ShardedTensor dtype property does not match "
                                 "from different ranks!")));
  ASSERT_OK_AND_ASSIGN(
      Tensor grad,
      Randn({5, 5}, TensorOptions().WithRequiresGrad(rank() == 0)));
  EXPECT_THAT(FromShards({Shard{grad, md}}, {10, 10}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("ShardedTensor requires_grad property does "
                                 "not match from different ranks!")));
}

TEST_P(TestShardedTensorFromLocalShards, InitFromLocalShardsInvalidPinMemory) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  // Pinned memory exists on the CPU only, as in the reference.
  ShardMetadata md = GridShard(rank(), {5, 5}, "cpu");
  auto cpu_randn = [](bool pinned) {
    return Tensor::Randn({5, 5}, TensorOptions().WithPinMemory(pinned));
  };
  ASSERT_OK_AND_ASSIGN(Tensor pinned, cpu_randn(true));
  ASSERT_OK_AND_ASSIGN(Tensor pageable, cpu_randn(false));
  EXPECT_THAT(FromShards({Shard{pinned, md}, Shard{pageable, md}}, {10, 10}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("Local shards' tensor pin_memory property "
                                 "need to be the same")));
  EXPECT_THAT(
      FromShards({Shard{rank() == 0 ? pinned : pageable, md}}, {10, 10}),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("ShardedTensor pin_memory property does not "
                         "match from different ranks!")));
}

TEST_P(TestShardedTensorFromLocalShards,
       InitFromLocalShardsInvalidShardsOverlap) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  Sizes sizes = rank() == 0 ? Sizes{6, 6} : Sizes{5, 5};
  ASSERT_OK_AND_ASSIGN(Tensor local, Randn(sizes));
  EXPECT_THAT(
      FromShards({Shard{local, GridShard(rank(), sizes, DeviceText(rank()))}},
                 {10, 10}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("overlap")));
}

TEST_P(TestShardedTensorFromLocalShards, InitFromLocalShardsInvalidShardsGaps) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  Sizes sizes = rank() == 0 ? Sizes{4, 4} : Sizes{5, 5};
  ASSERT_OK_AND_ASSIGN(Tensor local, Randn(sizes));
  EXPECT_THAT(
      FromShards({Shard{local, GridShard(rank(), sizes, DeviceText(rank()))}},
                 {10, 10}),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("does not match tensor volume")));
}

// Beyond the reference: a mistake on one rank only fails every rank
// (through the all-gather) instead of leaving the others waiting.
TEST_P(TestShardedTensorFromLocalShards, OneRanksMistakeFailsEveryRank) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  ASSERT_OK_AND_ASSIGN(Tensor local, Randn({5, 5}));
  ASSERT_OK_AND_ASSIGN(Tensor transposed, local.T());
  const Shard shard{rank() == 2 ? transposed : local,
                    GridShard(rank(), {5, 5}, DeviceText(rank()))};
  const absl::Time start = absl::Now();
  EXPECT_THAT(FromShards({shard}, {10, 10}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("contiguous_format")));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

// PyTorch's _chunk_sharding_specs_list_for_test: one chunk spec per dim,
// placements in a seeded random order (std::mt19937 here, so the orders
// differ from Python's but are as fixed).
std::vector<ShardingSpec> ChunkSpecsForTest(const DeviceRanksTest& test,
                                            std::vector<int64_t> dims,
                                            uint32_t seed) {
  std::mt19937 random(seed);
  std::vector<ShardingSpec> specs;
  for (int64_t dim : dims) {
    std::vector<int> ranks = {0, 1, 2, 3};
    std::shuffle(ranks.begin(), ranks.end(), random);
    specs.push_back(*ChunkShardingSpec::Create(dim, test.Placements(ranks)));
  }
  return specs;
}

TEST_P(TestShardedTensorFromLocalTensor, InitFromLocalTensor) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  for (const ShardingSpec& spec : ChunkSpecsForTest(*this, {0, 1, 1, 0}, 31)) {
    for (const Sizes& size :
         std::vector<Sizes>{{20, 10}, {21, 11}, {23, 16}, {44, 16, 8}}) {
      ASSERT_OK_AND_ASSIGN(ShardedTensorMetadata expected,
                           BuildMetadata(spec, size));
      const ShardMetadata* mine = nullptr;
      for (const ShardMetadata& md : expected.shards_metadata) {
        if (md.placement()->rank() == rank()) mine = &md;
      }
      ASSERT_NE(nullptr, mine);
      ASSERT_OK_AND_ASSIGN(
          Tensor local,
          Tensor::Rand(mine->shard_sizes(),
                       TensorOptions().WithDevice(DeviceOf(rank()))));
      ASSERT_OK_AND_ASSIGN(ShardedTensor st, ShardedTensor::InitFromLocalTensor(
                                                 local, spec, size, Rrefs()));
      EXPECT_EQ(size, st.size());
      ASSERT_EQ(1u, st.local_shards().size());
      ASSERT_OK_AND_ASSIGN(Tensor st_local, st.local_tensor());
      EXPECT_TRUE(Equal(local, st_local));
      EXPECT_EQ(DeviceOf(rank()), st_local.device());
      EXPECT_EQ(*mine, st.local_shards()[0].metadata);
      EXPECT_EQ(expected.shards_metadata, st.metadata().shards_metadata);
      ASSERT_OK_AND_ASSIGN(RemoteShardMap remote, st.remote_shards());
      EXPECT_EQ(3u, remote.size());
      ForEachFetched(remote, [&](int owner, const Shard& shard) {
        EXPECT_EQ(shard.metadata.shard_sizes(), shard.tensor.sizes());
      });
    }
  }
}

TEST_P(TestShardedTensorFromLocalTensor, InitFromLocalTensorErrors) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  ASSERT_OK_AND_ASSIGN(
      EnumerableShardingSpec enumerable,
      EnumerableShardingSpec::Create({Md({0, 0}, {5, 5}, Placement(0)),
                                      Md({5, 0}, {5, 5}, Placement(1))}));
  const Sizes size = {24, 12};
  ASSERT_OK_AND_ASSIGN(
      Tensor local,
      Tensor::Rand(size, TensorOptions().WithDevice(DeviceOf(rank()))));
  EXPECT_THAT(ShardedTensor::InitFromLocalTensor(local, enumerable, size),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("do not cover the entire tensor")));
  ASSERT_OK_AND_ASSIGN(Tensor transposed, local.T());
  EXPECT_THAT(ShardedTensor::InitFromLocalTensor(
                  transposed, ChunkSpecsForTest(*this, {0}, 31)[0], size),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("local_tensor is not a contiguous Tensor.")));
}

TESSERA_INSTANTIATE_FOR_DEVICES(TestShardedTensorChunked);
TESSERA_INSTANTIATE_FOR_DEVICES(TestShardedTensorEnumerable);
TESSERA_INSTANTIATE_FOR_DEVICES(TestLocalTensor);
TESSERA_INSTANTIATE_FOR_DEVICES(TestShardMetadata);
TESSERA_INSTANTIATE_FOR_DEVICES(TestShardedTensorFromLocalShards);
TESSERA_INSTANTIATE_FOR_DEVICES(TestShardedTensorFromLocalTensor);

}  // namespace
}  // namespace tessera
