// ShardedTensor tests that need no separate processes: ranks as threads of
// one process sharing a HashStore (real Gloo between them), as the
// reference's spawn_threads_and_init_comms, and the no-process-group mode.
// Ports TestShardedTensorSubGroupInit and TestCreateTensorNoProcessGroupMode.
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/shard_metadata.h"
#include "common/sharding_spec.h"
#include "common/tensor/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/rank/rank.h"
#include "server/sharded/sharded_tensor.h"
#include "server/store/hash_store.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::StatusIs;
using ::testing::_;
using ::testing::HasSubstr;

constexpr int kWorldSize = 4;

// Runs `body(rank)` on kWorldSize threads, each with its own Rank joined
// through one HashStore, and shuts every rank down afterwards.
void SpawnThreadsAndInitComms(
    const std::function<void(const std::shared_ptr<Rank>&)>& body) {
  auto store = std::make_shared<HashStore>();
  store->set_timeout(absl::Seconds(30));
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorldSize; ++r) {
    threads.emplace_back([&, r] {
      RankOptions options;
      options.rank = r;
      options.world_size = kWorldSize;
      options.store = store;
      options.timeout = absl::Seconds(30);
      auto rank = Rank::Init(options);
      ASSERT_TRUE(rank.ok()) << rank.status();
      body(*rank);
      EXPECT_OK((*rank)->Shutdown());
    });
  }
  for (std::thread& t : threads) t.join();
}

// The ranks with the same parity as `rank`.
std::vector<int> ParityGroup(int rank) {
  std::vector<int> ranks;
  for (int r = 0; r < kWorldSize; ++r) {
    if (r % 2 == rank % 2) ranks.push_back(r);
  }
  return ranks;
}

TEST(TestShardedTensorSubGroupInit, SubProcessGroupShardedTensorInit) {
  SpawnThreadsAndInitComms([](const std::shared_ptr<Rank>& rank) {
    const int r = rank->rank();
    NewGroupOptions local;
    local.local_synchronization = true;
    ASSERT_OK_AND_ASSIGN(auto sub_pg, rank->NewGroup(ParityGroup(r), local));
    ASSERT_OK(sub_pg->Barrier());

    ASSERT_OK_AND_ASSIGN(Tensor meta,
                         Tensor::Empty({3}, TensorOptions()
                                                .WithDType(DType::kInt64)
                                                .WithDevice(Device::Meta())));
    ASSERT_OK_AND_ASSIGN(
        ShardMetadata md,
        ShardMetadata::Create({3 * (r / 2)}, {3},
                              absl::StrCat("rank:", r, "/meta")));
    ShardedTensorOptions options;
    options.rank = rank;
    options.process_group = sub_pg;
    ASSERT_OK_AND_ASSIGN(
        ShardedTensor st,
        ShardedTensor::InitFromLocalShards({Shard{meta, md}}, {6}, options));
    EXPECT_EQ(std::vector<int64_t>({6}), st.size());
    ASSERT_EQ(2u, st.metadata().shards_metadata.size());
    EXPECT_EQ(DType::kInt64, st.dtype());
    ASSERT_EQ(1u, st.local_shards().size());
    EXPECT_EQ(Device::Meta(), st.local_shards()[0].tensor.device());
  });
}

TEST(TestShardedTensorSubGroupInit, SubProcessGroupPlacementValidation) {
  SpawnThreadsAndInitComms([](const std::shared_ptr<Rank>& rank) {
    ASSERT_NE(nullptr, rank->default_group());
    std::vector<int> ranks = ParityGroup(rank->rank());
    NewGroupOptions local;
    local.local_synchronization = true;
    ASSERT_OK_AND_ASSIGN(auto sub_pg, rank->NewGroup(ranks, local));
    ASSERT_OK(sub_pg->Barrier());
    for (int r : ranks) {
      ASSERT_OK_AND_ASSIGN(
          RemoteDevice device,
          RemoteDevice::Parse(absl::StrCat("rank:", r, "/cuda:", r % 2)));
      ASSERT_OK_AND_ASSIGN(auto parsed, ParseAndValidateRemoteDevice(
                                            sub_pg->global_ranks(), device));
      EXPECT_EQ(r, parsed.first);
    }
    // A rank of the other parity is not in the sub-group.
    ASSERT_OK_AND_ASSIGN(
        RemoteDevice other,
        RemoteDevice::Parse(
            absl::StrCat("rank:", (rank->rank() + 1) % kWorldSize, "/cpu")));
    EXPECT_THAT(ParseAndValidateRemoteDevice(sub_pg->global_ranks(), other),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("does not exist in input process group")));
  });
}

// Reshard to a layout that names no owner, or puts data on the meta
// device, is refused on every rank before anything moves (it used to index
// the plan with rank -1, or return OK with the data gone); the tensor keeps
// its values.
TEST(ReshardPlacements, OwnerlessOrMetaTargetsAreRefused) {
  SpawnThreadsAndInitComms([](const std::shared_ptr<Rank>& rank) {
    std::vector<std::string> rows;
    for (int r = 0; r < kWorldSize; ++r) {
      rows.push_back(absl::StrCat("rank:", r, "/cpu"));
    }
    ShardedTensorOptions options;
    options.rank = rank;
    ASSERT_OK_AND_ASSIGN(ChunkShardingSpec row_spec,
                         ChunkShardingSpec::Create(0, rows));
    ASSERT_OK_AND_ASSIGN(ShardedTensor st,
                         ShardedTensor::Ones(row_spec, {8, 4}, options));

    std::vector<RemoteDevice> ownerless;
    for (int r = 0; r < kWorldSize; ++r) {
      ownerless.push_back(r == 2 ? RemoteDevice::Local(Device::Cpu())
                                 : *RemoteDevice::Parse(rows[r]));
    }
    ASSERT_OK_AND_ASSIGN(ChunkShardingSpec columns,
                         ChunkShardingSpec::Create(1, ownerless));
    EXPECT_THAT(st.Reshard(columns).status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("names no rank or worker")));

    std::vector<std::string> meta = rows;
    meta[1] = "rank:1/meta";
    ASSERT_OK_AND_ASSIGN(ChunkShardingSpec to_meta,
                         ChunkShardingSpec::Create(1, meta));
    EXPECT_THAT(
        st.Reshard(to_meta).status(),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("meta device")));

    ASSERT_EQ(st.local_shards().size(), 1u);
    const Tensor& local = st.local_shards()[0].tensor;
    EXPECT_EQ(local.sizes(), (std::vector<int64_t>{2, 4}));
    ASSERT_OK_AND_ASSIGN(Tensor ones, Tensor::Ones({2, 4}));
    EXPECT_TRUE(Equal(local, ones));
  });
}

// Each rank passing another rank's shard is refused, not mistaken for its
// own.
TEST(InitFromLocalShardsAndGlobalMetadata, ShardOfAnotherRankIsRefused) {
  SpawnThreadsAndInitComms([](const std::shared_ptr<Rank>& rank) {
    ShardedTensorMetadata metadata;
    for (int r = 0; r < kWorldSize; ++r) {
      ASSERT_OK_AND_ASSIGN(
          ShardMetadata md,
          ShardMetadata::Create({r, 0}, {1, 2},
                                absl::StrCat("rank:", r, "/cpu")));
      metadata.shards_metadata.push_back(md);
    }
    metadata.size = {kWorldSize, 2};
    const int other = (rank->rank() + 1) % kWorldSize;
    ASSERT_OK_AND_ASSIGN(Tensor zeros, Tensor::Zeros({1, 2}));
    ShardedTensorOptions options;
    options.rank = rank;
    EXPECT_THAT(
        ShardedTensor::InitFromLocalShardsAndGlobalMetadata(
            {Shard{zeros, metadata.shards_metadata[other]}}, metadata, options),
        StatusIs(absl::StatusCode::kInvalidArgument,
                 HasSubstr("is not in the global metadata")));
    ASSERT_OK_AND_ASSIGN(
        ShardedTensor st,
        ShardedTensor::InitFromLocalShardsAndGlobalMetadata(
            {Shard{zeros, metadata.shards_metadata[rank->rank()]}}, metadata,
            options));
    EXPECT_EQ(1u, st.local_shards().size());
  });
}

// The 4x2 tensor of two 2x2 shards used by TestCreateTensorNoProcessGroupMode.
ShardedTensorMetadata TwoShardMetadata() {
  ShardedTensorMetadata metadata;
  metadata.shards_metadata = {
      *ShardMetadata::Create({0, 0}, {2, 2}, "rank:0/cpu"),
      *ShardMetadata::Create({2, 0}, {2, 2}, "rank:1/cpu")};
  metadata.size = {4, 2};
  return metadata;
}

TEST(TestCreateTensorNoProcessGroupMode, InitFromLocalShardsAndGlobalMetadata) {
  ShardedTensorMetadata metadata = TwoShardMetadata();
  std::vector<Shard> local_shards;
  for (const ShardMetadata& md : metadata.shards_metadata) {
    ASSERT_OK_AND_ASSIGN(
        Tensor zeros,
        Tensor::Zeros(md.shard_sizes(),
                      TensorOptions().WithDevice(md.placement()->device())));
    local_shards.push_back(Shard{zeros, md});
  }
  ASSERT_OK_AND_ASSIGN(ShardedTensor st,
                       ShardedTensor::InitFromLocalShardsAndGlobalMetadata(
                           local_shards, metadata));
  EXPECT_EQ(2u, st.local_shards().size());
  EXPECT_EQ(metadata, st.metadata());
  // The layout is the tiling of the shards (built on first use, once, also
  // when many threads ask at the same moment).
  std::vector<const ShardingSpec*> seen(8);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < seen.size(); ++t) {
    threads.emplace_back([&, t] { seen[t] = &st.sharding_spec(); });
  }
  for (std::thread& thread : threads) thread.join();
  for (const ShardingSpec* spec : seen) EXPECT_EQ(spec, seen.front());
  ASSERT_TRUE(std::holds_alternative<EnumerableShardingSpec>(*seen.front()));
  EXPECT_EQ(std::get<EnumerableShardingSpec>(*seen.front()).shards(),
            metadata.shards_metadata);
  // A malformed layout is still refused when the tensor is made.
  ShardedTensorMetadata overlapping = metadata;
  overlapping.shards_metadata[1] =
      *ShardMetadata::Create({1, 0}, {2, 2}, "rank:1/cpu");
  EXPECT_THAT(ShardedTensor::InitFromLocalShardsAndGlobalMetadata(local_shards,
                                                                  overlapping),
              StatusIs(absl::StatusCode::kInvalidArgument, _));
  ShardedTensorMetadata empty = metadata;
  empty.shards_metadata.clear();
  EXPECT_THAT(
      ShardedTensor::InitFromLocalShardsAndGlobalMetadata({}, empty),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("Empty shard")));
}

TEST(TestCreateTensorNoProcessGroupMode, NonContiguousLocalShards) {
  ShardedTensorMetadata metadata = TwoShardMetadata();
  ASSERT_OK_AND_ASSIGN(Tensor src, Tensor::Randn({4, 2}));
  std::vector<Shard> local_shards;
  for (const ShardMetadata& md : metadata.shards_metadata) {
    const auto& offsets = md.shard_offsets();
    const auto& sizes = md.shard_sizes();
    ASSERT_OK_AND_ASSIGN(Tensor rows, src.Narrow(0, offsets[0], sizes[0]));
    ASSERT_OK_AND_ASSIGN(Tensor box, rows.Narrow(1, offsets[1], sizes[1]));
    local_shards.push_back(Shard{box, md});
  }
  ASSERT_OK_AND_ASSIGN(ShardedTensor st,
                       ShardedTensor::InitFromLocalShardsAndGlobalMetadata(
                           local_shards, metadata));
  // The shards are the caller's views, not copies.
  EXPECT_EQ(src.data_ptr(), st.local_shards()[0].tensor.data_ptr());
}

TEST(TestCreateTensorNoProcessGroupMode, NoRankForCollectiveFactories) {
  ASSERT_OK_AND_ASSIGN(
      ChunkShardingSpec spec,
      ChunkShardingSpec::Create(0, std::vector<std::string>{"rank:0/cpu"}));
  EXPECT_THAT(
      ShardedTensor::Empty(spec, {10, 20}),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               HasSubstr("Default process group has not been initialized")));
}

}  // namespace
}  // namespace tessera
