// The reference's ShardedTensor cases that fit one GPU, on a world of one
// rank whose default group is NCCL on cuda:0 (rendezvous through a real
// gRPC store): shard_tensor, gather, init_from_local_shards, reshard, the
// full tensor (GatherAll), full/rand/randn, and moves between the CPU and
// the GPU. Every value is checked against a dense CPU reference. Test names
// are the reference's where a case corresponds; suites carry "Nccl". Skips
// without a CUDA device or a build with NCCL.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/device.h"
#include "common/shard_metadata.h"
#include "common/sharding_spec.h"
#include "common/tensor/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/collective/process_group.h"
#include "server/rank/rank.h"
#include "server/sharded/shard_api.h"
#include "server/sharded/sharded_tensor.h"
#include "server/store/grpc_store.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;
using Sizes = std::vector<int64_t>;

constexpr absl::Duration kTimeout = absl::Seconds(30);
constexpr char kPlacement[] = "rank:0/cuda:0";

bool NcclBuilt() {
  const std::vector<std::string> names = ProcessGroupBackends();
  return std::find(names.begin(), names.end(), "nccl") != names.end();
}

// One rank, world size 1, default group "nccl" on cuda:0, the default rank
// for the test's duration.
class NcclSingleGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) {
      GTEST_SKIP() << "needs a CUDA device, found 0";
    }
    if (!NcclBuilt()) GTEST_SKIP() << "needs a build with NCCL";
    ASSERT_OK_AND_ASSIGN(store_server_, StoreServer::Start("127.0.0.1:0"));
    ASSERT_OK_AND_ASSIGN(
        std::shared_ptr<GrpcStore> store,
        GrpcStore::Connect(store_server_->address(), kTimeout));
    store->set_timeout(kTimeout);
    RankOptions options;
    options.rank = 0;
    options.world_size = 1;
    options.store = store;
    options.backend = "nccl";
    options.device_index = 0;
    options.timeout = kTimeout;
    ASSERT_OK_AND_ASSIGN(rank_, Rank::Init(options));
    SetDefaultRank(rank_);
    ASSERT_EQ(rank_->default_group()->backend(), "nccl");
    ASSERT_EQ(rank_->default_group()->device(), Device::Cuda(0));
  }

  void TearDown() override {
    SetDefaultRank(nullptr);
    if (rank_ != nullptr) {
      EXPECT_OK(rank_->Shutdown());
    }
    rank_.reset();
    if (store_server_ != nullptr) store_server_->Shutdown();
  }

  // A chunk spec along `dim` with `shards` placements, all on cuda:0.
  static ShardingSpec Chunk(int64_t dim, int shards) {
    return ShardingSpec(*ChunkShardingSpec::Create(
        dim, std::vector<std::string>(shards, kPlacement)));
  }

  std::unique_ptr<StoreServer> store_server_;
  std::shared_ptr<Rank> rank_;
};

class TestShardTensorNccl : public NcclSingleGpuTest {};
class TestShardedTensorChunkedNccl : public NcclSingleGpuTest {};
class TestShardedTensorFromLocalShardsNccl : public NcclSingleGpuTest {};
class TestShardedTensorReshardNccl : public NcclSingleGpuTest {};
class TestShardedTensorEnumerableNccl : public NcclSingleGpuTest {};

// The dense CPU reference: Generator(seed)'s uniform draws.
Tensor Reference(const Sizes& sizes, uint64_t seed) {
  Generator generator(seed);
  return *Tensor::Rand(sizes, TensorOptions(), &generator);
}

Tensor OnCuda(const Tensor& host) { return *host.To(Device::Cuda(0)); }

// The box of `source` a shard covers (torch.chunk may put trailing empty
// shards past the end).
Tensor Box(const Tensor& source, const ShardMetadata& shard) {
  if (shard.numel() == 0) return *Tensor::Empty(shard.shard_sizes());
  Tensor box = source;
  for (int64_t d = 0; d < shard.dim(); ++d) {
    box = *box.Narrow(d, shard.shard_offsets()[d], shard.shard_sizes()[d]);
  }
  return box;
}

// Every local shard is on cuda:0 and holds its box of `reference` (a CPU
// tensor), and the full tensor gathered over NCCL equals `reference`.
void ExpectShardsOf(const ShardedTensor& st, const Tensor& reference,
                    const Device& device = Device::Cuda(0)) {
  EXPECT_EQ(reference.sizes(), st.size());
  ASSERT_EQ(st.local_shards().size(), st.metadata().shards_metadata.size());
  for (const Shard& shard : st.local_shards()) {
    EXPECT_EQ(device, shard.tensor.device()) << shard.metadata;
    EXPECT_TRUE(Equal(Box(reference, shard.metadata), shard.tensor))
        << shard.metadata;
  }
}

void ExpectGathersTo(const ShardedTensor& st, const Tensor& reference) {
  ASSERT_OK_AND_ASSIGN(Tensor full, st.GatherAll());
  EXPECT_TRUE(full.device().is_cpu());
  EXPECT_TRUE(Equal(reference, full));
}

TEST_F(TestShardTensorNccl, ShardTensor) {
  const Tensor reference = Reference({12, 12}, 11);
  for (int64_t dim : {0, 1}) {
    SCOPED_TRACE(dim);
    ASSERT_OK_AND_ASSIGN(ShardedTensor st,
                         ShardTensor(OnCuda(reference), Chunk(dim, 4)));
    ASSERT_EQ(st.local_shards().size(), 4u);
    EXPECT_EQ(st.local_shards()[1].metadata.shard_offsets(),
              dim == 0 ? Sizes({3, 0}) : Sizes({0, 3}));
    ExpectShardsOf(st, reference);
    ExpectGathersTo(st, reference);
  }
}

TEST_F(TestShardTensorNccl, ShardTensorWithEmptyShard) {
  // Four rows over five placements: torch.chunk leaves the last one empty.
  const Tensor reference = Reference({4, 6}, 12);
  ASSERT_OK_AND_ASSIGN(ShardedTensor st,
                       ShardTensor(OnCuda(reference), Chunk(0, 5)));
  const auto& shards = st.metadata().shards_metadata;
  ASSERT_EQ(shards.size(), 5u);
  EXPECT_EQ(shards[4].numel(), 0);
  ExpectShardsOf(st, reference);
  ExpectGathersTo(st, reference);
}

TEST_F(TestShardedTensorChunkedNccl, GatherEven) {
  ASSERT_OK_AND_ASSIGN(ShardedTensor st,
                       ShardedTensor::Ones(Chunk(0, 2), {10, 20}));
  ASSERT_OK_AND_ASSIGN(Tensor ones, Tensor::Ones({10, 20}));
  for (const Device& device : {Device::Cuda(0), Device::Cpu()}) {
    ASSERT_OK_AND_ASSIGN(
        Tensor full,
        Tensor::Zeros({10, 20}, TensorOptions().WithDevice(device)));
    ASSERT_OK(st.Gather(0, full));
    EXPECT_TRUE(Equal(ones, full)) << device;
  }
}

TEST_F(TestShardedTensorChunkedNccl, GatherUneven) {
  // 10 rows over 3 placements: 4, 4 and 2, with distinct values.
  const Tensor reference = Reference({10, 20}, 13);
  ASSERT_OK_AND_ASSIGN(ShardedTensor st,
                       ShardTensor(OnCuda(reference), Chunk(0, 3)));
  EXPECT_EQ(st.local_shards()[2].metadata.shard_sizes(), Sizes({2, 20}));
  for (const Device& device : {Device::Cuda(0), Device::Cpu()}) {
    ASSERT_OK_AND_ASSIGN(
        Tensor full,
        Tensor::Zeros({10, 20}, TensorOptions().WithDevice(device)));
    ASSERT_OK(st.Gather(0, full));
    EXPECT_TRUE(Equal(reference, full)) << device;
  }
  // A wrong destination size fails before anything moves.
  ASSERT_OK_AND_ASSIGN(
      Tensor small,
      Tensor::Zeros({4, 4}, TensorOptions().WithDevice(Device::Cuda(0))));
  EXPECT_THAT(st.Gather(0, small), StatusIs(absl::StatusCode::kInvalidArgument,
                                            HasSubstr("dst_tensor")));
}

TEST_F(TestShardedTensorChunkedNccl, GatherAll) {
  const Tensor reference = Reference({7, 9}, 14);
  ASSERT_OK_AND_ASSIGN(ShardedTensor st,
                       ShardTensor(OnCuda(reference), Chunk(1, 4)));
  ExpectGathersTo(st, reference);
}

TEST_F(TestShardedTensorFromLocalShardsNccl, InitFromLocalShards) {
  const Tensor reference = Reference({10, 5}, 15);
  std::vector<Shard> shards;
  for (int64_t row : {0, 6}) {
    const int64_t rows = row == 0 ? 6 : 4;
    ASSERT_OK_AND_ASSIGN(ShardMetadata md,
                         ShardMetadata::Create({row, 0}, {rows, 5},
                                               absl::string_view(kPlacement)));
    ASSERT_OK_AND_ASSIGN(Tensor host, reference.Narrow(0, row, rows));
    ASSERT_OK_AND_ASSIGN(Tensor local, host.To(Device::Cuda(0)));
    ASSERT_OK_AND_ASSIGN(Shard shard, Shard::Create(local, md));
    shards.push_back(shard);
  }
  ASSERT_OK_AND_ASSIGN(ShardedTensor st,
                       ShardedTensor::InitFromLocalShards(shards, {10, 5}));
  EXPECT_EQ(st.device(), Device::Cuda(0));
  ExpectShardsOf(st, reference);
  ExpectGathersTo(st, reference);

  // A CPU tensor for a CUDA placement is refused.
  ASSERT_OK_AND_ASSIGN(Tensor on_cpu, Tensor::Zeros({6, 5}));
  EXPECT_THAT(Shard::Create(on_cpu, shards[0].metadata),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("Local shard tensor device does not match")));
}

TEST_F(TestShardedTensorReshardNccl, ReshardDim0ToDim1AndBack) {
  const Tensor reference = Reference({9, 8}, 16);
  ASSERT_OK_AND_ASSIGN(ShardedTensor st,
                       ShardTensor(OnCuda(reference), Chunk(0, 1)));
  ASSERT_OK_AND_ASSIGN(ShardedTensor by_columns, st.Reshard(Chunk(1, 1)));
  EXPECT_TRUE(by_columns.sharding_spec() == Chunk(1, 1));
  ExpectShardsOf(by_columns, reference);
  ExpectGathersTo(by_columns, reference);
  ASSERT_OK_AND_ASSIGN(ShardedTensor back, by_columns.Reshard(Chunk(0, 1)));
  EXPECT_TRUE(back.sharding_spec() == Chunk(0, 1));
  ExpectShardsOf(back, reference);
  // And into several shards (uneven: 3, 3, 2 columns).
  ASSERT_OK_AND_ASSIGN(ShardedTensor split, back.Reshard(Chunk(1, 3)));
  ASSERT_EQ(split.local_shards().size(), 3u);
  EXPECT_EQ(split.local_shards()[2].metadata.shard_sizes(), Sizes({9, 2}));
  ExpectShardsOf(split, reference);
  ExpectGathersTo(split, reference);
}

// test_create_sharded_tensor_with_full / _with_rand, and randn: the same
// seed gives the same numbers on two runs, equal to CPU draws of each
// shard in shard order (CUDA tensors are drawn on the host).
TEST_F(TestShardedTensorChunkedNccl, CreateShardedTensorWithFull) {
  ASSERT_OK_AND_ASSIGN(ShardedTensor st,
                       ShardedTensor::Full(Chunk(0, 3), {10, 20}, 3.5));
  ASSERT_OK_AND_ASSIGN(Tensor expected, Tensor::Full({10, 20}, 3.5));
  ExpectShardsOf(st, expected);
  ExpectGathersTo(st, expected);
}

template <typename Draw, typename DrawDense>
void CheckSameSeedDraws(const ShardingSpec& spec, Draw draw,
                        DrawDense draw_dense) {
  Generator first(1234);
  ASSERT_OK_AND_ASSIGN(ShardedTensor a, draw(spec, &first));
  Generator second(1234);
  ASSERT_OK_AND_ASSIGN(ShardedTensor b, draw(spec, &second));
  Generator host(1234);
  ASSERT_EQ(a.local_shards().size(), b.local_shards().size());
  for (size_t i = 0; i < a.local_shards().size(); ++i) {
    const Shard& shard = a.local_shards()[i];
    EXPECT_EQ(Device::Cuda(0), shard.tensor.device());
    EXPECT_TRUE(Equal(shard.tensor, b.local_shards()[i].tensor)) << i;
    ASSERT_OK_AND_ASSIGN(Tensor expected,
                         draw_dense(shard.metadata.shard_sizes(), &host));
    EXPECT_TRUE(expected.device().is_cpu());
    EXPECT_TRUE(Equal(expected, shard.tensor)) << i;
  }
  // The default generator too: ManualSeed makes runs repeat.
  ManualSeed(77);
  ASSERT_OK_AND_ASSIGN(ShardedTensor c, draw(spec, nullptr));
  ManualSeed(77);
  ASSERT_OK_AND_ASSIGN(ShardedTensor d, draw(spec, nullptr));
  ASSERT_OK_AND_ASSIGN(Tensor full_c, c.GatherAll());
  ASSERT_OK_AND_ASSIGN(Tensor full_d, d.GatherAll());
  EXPECT_TRUE(Equal(full_c, full_d));
}

TEST_F(TestShardedTensorChunkedNccl, CreateShardedTensorWithRand) {
  CheckSameSeedDraws(
      Chunk(0, 3),
      [](const ShardingSpec& spec, Generator* g) {
        return ShardedTensor::Rand(spec, {10, 20}, {}, g);
      },
      [](absl::Span<const int64_t> sizes, Generator* g) {
        return Tensor::Rand(sizes, TensorOptions(), g);
      });
}

TEST_F(TestShardedTensorChunkedNccl, CreateShardedTensorWithRandn) {
  // Odd shard sizes, so that Box-Muller's spare value crosses shards.
  CheckSameSeedDraws(
      Chunk(1, 3),
      [](const ShardingSpec& spec, Generator* g) {
        return ShardedTensor::Randn(
            spec, {3, 7}, ShardedTensorOptions().WithDType(DType::kFloat64), g);
      },
      [](absl::Span<const int64_t> sizes, Generator* g) {
        return Tensor::Randn(sizes, TensorOptions().WithDType(DType::kFloat64),
                             g);
      });
}

// test_sharded_tensor_to_cuda's round trip on one GPU: to("cpu") moves
// every shard to the host with its values, cuda() brings them back.
TEST_F(TestShardedTensorEnumerableNccl, ShardedTensorToCuda) {
  const Tensor reference = Reference({10, 20}, 17);
  ASSERT_OK_AND_ASSIGN(ShardedTensor st,
                       ShardTensor(OnCuda(reference), Chunk(0, 4)));
  EXPECT_EQ(st.device(), Device::Cuda(0));
  ASSERT_OK_AND_ASSIGN(ShardedTensor st_cpu, st.To("cpu"));
  EXPECT_FALSE(st_cpu.is_same(st));
  EXPECT_EQ(st_cpu.device(), Device::Cpu());
  for (const ShardMetadata& md : st_cpu.metadata().shards_metadata) {
    EXPECT_EQ(md.placement()->ToString(), "rank:0/cpu");
  }
  ExpectShardsOf(st_cpu, reference, Device::Cpu());

  ASSERT_OK_AND_ASSIGN(ShardedTensor st_cuda, st_cpu.Cuda());
  EXPECT_EQ(st_cuda.device(), Device::Cuda(0));
  for (const ShardMetadata& md : st_cuda.metadata().shards_metadata) {
    EXPECT_EQ(md.placement()->ToString(), kPlacement);
  }
  ExpectShardsOf(st_cuda, reference);
  ExpectGathersTo(st_cuda, reference);
  EXPECT_THAT(st_cuda.Cuda(1), StatusIs(absl::StatusCode::kInvalidArgument,
                                        HasSubstr("Only device without")));

  // The dense round trip underneath: host -> device -> host, bit for bit.
  ASSERT_OK_AND_ASSIGN(Tensor on_device, reference.To(Device::Cuda(0)));
  EXPECT_EQ(on_device.device(), Device::Cuda(0));
  ASSERT_OK_AND_ASSIGN(Tensor back, on_device.To(Device::Cpu()));
  EXPECT_TRUE(back.device().is_cpu());
  EXPECT_EQ(0, std::memcmp(back.data_ptr(), reference.data_ptr(),
                           reference.nbytes()));
}

}  // namespace
}  // namespace tessera
