// A gtest fixture of two ranks as threads of this process, each serving a
// ControlService that holds only the region calls (ReadRegion and
// WriteRegion of server/daemon/region_io.h, wired as the daemon wires them)
// plus GetCluster and DescribeTensor (enough for the client library's
// reads and writes), on its real shard server (gRPC and the data plane) on
// 127.0.0.1. One tensor, kName: a 2 x 2 grid of shards, two on each rank,
// so that every region mixes local copies and remote transfers.
//
// Shared by the tests of the region calls (tests/server/daemon/) and of the
// client library's Client (tests/client/). Header-only: the tests that use
// it link tessera_region_io.
#ifndef TESSERA_TESTS_TESTING_REGION_RANKS_TEST_H_
#define TESSERA_TESTS_TESTING_REGION_RANKS_TEST_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/proto_convert.h"
#include "common/region.h"
#include "grpcpp/server_context.h"
#include "gtest/gtest.h"
#include "server/daemon/region_io.h"
#include "server/rank/rank.h"
#include "server/store/hash_store.h"
#include "tessera/v1/control.grpc.pb.h"
#include "tests/testing/run_threads.h"
#include "tests/testing/shard_box.h"
#include "tests/testing/status_matchers.h"
#include "wire/grpc_status.h"

namespace tessera::testing {

// A ControlService with the region calls as the daemon wires them, plus
// GetCluster and DescribeTensor answered from the test's table, enough for
// the client library's reads and writes.
class RegionService final
    : public v1::ControlService::WithRawCallbackMethod_ReadRegion<
          v1::ControlService::CallbackService> {
 public:
  explicit RegionService(RegionEnv env) : env_(std::move(env)) {}

  // Set once every rank listens, before any client connects.
  void set_cluster(v1::ClusterInfo cluster) { cluster_ = std::move(cluster); }

  grpc::ServerUnaryReactor* GetCluster(grpc::CallbackServerContext* context,
                                       const v1::GetClusterRequest* request,
                                       v1::ClusterInfo* response) override {
    *response = cluster_;
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  grpc::ServerUnaryReactor* DescribeTensor(
      grpc::CallbackServerContext* context,
      const v1::DescribeNamedTensorRequest* request,
      v1::TensorInfo* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    absl::StatusOr<v1::TensorInfo> info = env_.resolve(request->name());
    if (info.ok()) *response = *info;
    reactor->Finish(ToGrpcStatus(info.status()));
    return reactor;
  }

  grpc::ServerWriteReactor<grpc::ByteBuffer>* ReadRegion(
      grpc::CallbackServerContext* context,
      const grpc::ByteBuffer* request) override {
    ShardServiceOptions chunks;
    chunks.default_chunk_bytes = 4096;
    return StartReadRegion(context, request, env_, chunks);
  }

  grpc::ServerReadReactor<v1::WriteRegionChunk>* WriteRegion(
      grpc::CallbackServerContext* context,
      v1::WriteRegionResponse* response) override {
    return StartWriteRegion(context, response, env_);
  }

 private:
  const RegionEnv env_;
  v1::ClusterInfo cluster_;
};

// SetUp starts both ranks with the grid registered (its bytes are
// Pattern(kSizes, 1), kept in global_); TearDown shuts them down.
class RegionRanksTest : public ::testing::Test {
 protected:
  static constexpr int kWorldSize = 2;
  static constexpr char kName[] = "w";
  static constexpr char kTensorId[] = "w/0";
  // 40 x 300 float32 (48000 bytes); shards of 20 x 150.
  inline static const std::vector<int64_t> kSizes = {40, 300};
  // Below the whole tensor, above every box the tests move.
  static constexpr int64_t kMaxRegionBytes = 32 << 10;

  // Bytes that differ from element to element and from seed to seed.
  static Tensor Pattern(const std::vector<int64_t>& sizes, uint32_t seed) {
    Tensor tensor = *Tensor::Empty(sizes);
    float* values = tensor.data<float>();
    for (int64_t i = 0; i < tensor.numel(); ++i) {
      values[i] = static_cast<float>(seed * 100000 + i);
    }
    return tensor;
  }

  static ShardMetadata Box(std::vector<int64_t> offsets,
                           std::vector<int64_t> sizes, int rank = -1) {
    return ShardBox(std::move(offsets), std::move(sizes), rank);
  }

  // The 2 x 2 grid: shards 0 and 3 on rank 0, shards 1 and 2 on rank 1.
  static v1::TensorInfo GridInfo() {
    ShardedTensorMetadata metadata;
    metadata.size = kSizes;
    const int ranks[] = {0, 1, 1, 0};
    v1::TensorInfo info;
    info.set_name(kName);
    info.set_tensor_id(kTensorId);
    for (int i = 0; i < 4; ++i) {
      metadata.shards_metadata.push_back(
          Box({20 * (i / 2), 150 * (i % 2)}, {20, 150}, ranks[i]));
      info.add_shard_ranks(ranks[i]);
    }
    *info.mutable_metadata() = ToProto(metadata);
    return info;
  }

  void SetUp() override {
    global_ = Pattern(kSizes, 1);
    info_ = GridInfo();
    ranks_.resize(kWorldSize);
    services_.resize(kWorldSize);
    auto store = std::make_shared<HashStore>();
    store->set_timeout(absl::Seconds(30));
    RunThreads(kWorldSize, [&](int r) {
      RankOptions options;
      options.rank = r;
      options.world_size = kWorldSize;
      options.store = store;
      options.timeout = absl::Seconds(30);
      ASSERT_OK_AND_ASSIGN(ranks_[r], Rank::Init(options));
      RegionEnv env;
      env.rank = ranks_[r];
      env.resolve =
          [this](const std::string& name) -> absl::StatusOr<v1::TensorInfo> {
        if (name != kName) {
          return absl::NotFoundError(absl::StrCat("no tensor named ", name));
        }
        return info_;
      };
      env.max_region_bytes = kMaxRegionBytes;
      env.budget = BudgetOf(r);
      services_[r] = std::make_unique<RegionService>(std::move(env));
      RpcOptions rpc;
      rpc.services = {services_[r].get()};
      rpc.health_and_reflection = true;
      ASSERT_OK(ranks_[r]->InitRpc(rpc));
      ASSERT_OK(ranks_[r]->registry().Register(kTensorId, LocalShards(r)));
    });
    for (int r = 0; r < kWorldSize; ++r) ASSERT_NE(ranks_[r], nullptr);
    v1::ClusterInfo cluster;
    cluster.set_world_size(kWorldSize);
    for (int r = 0; r < kWorldSize; ++r) {
      ASSERT_OK_AND_ASSIGN(WorkerInfo worker, ranks_[r]->Worker(r));
      v1::WorkerAddress* address = cluster.add_workers();
      address->set_rank(r);
      address->set_name(worker.name);
      address->set_address(worker.address);
      address->set_data_address(worker.data_plane_address);
      address->set_device("cpu");
    }
    for (int r = 0; r < kWorldSize; ++r) {
      cluster.set_rank(r);
      services_[r]->set_cluster(cluster);
    }
  }

  void TearDown() override {
    RunThreads(kWorldSize, [&](int r) {
      if (ranks_[r] != nullptr) {
        EXPECT_OK(ranks_[r]->Shutdown());
      }
    });
  }

  // The memory budget of rank r's region calls; none unless a test's
  // fixture says otherwise.
  virtual std::shared_ptr<MemoryBudget> BudgetOf(int r) { return nullptr; }

  // Rank r's shards of the grid, cut from global_.
  std::shared_ptr<RegisteredTensor> LocalShards(int r) {
    auto registered = std::make_shared<RegisteredTensor>();
    registered->metadata = std::make_shared<const ShardedTensorMetadata>(
        *FromProto(info_.metadata()));
    for (int i = 0; i < info_.shard_ranks_size(); ++i) {
      if (info_.shard_ranks(i) != r) continue;
      const ShardMetadata& shard = registered->metadata->shards_metadata[i];
      Tensor bytes =
          *RegionView(global_, shard.shard_offsets(), shard.shard_sizes())
               ->Clone();
      registered->local_shards.push_back(LocalShard{i, bytes});
    }
    return registered;
  }

  // The tensor as the ranks hold it now, assembled from their registries.
  Tensor Held() {
    Tensor held = *Tensor::Zeros(kSizes);
    for (const auto& rank : ranks_) {
      const auto registered = rank->registry().Find(kTensorId);
      for (const LocalShard& local : registered->local_shards) {
        const ShardMetadata& shard =
            registered->metadata->shards_metadata[local.index];
        EXPECT_OK(CopyBox(local.tensor, std::vector<int64_t>(kSizes.size(), 0),
                          held, shard.shard_offsets(), shard.shard_sizes()));
      }
    }
    return held;
  }

  Tensor global_;
  v1::TensorInfo info_;
  std::vector<std::shared_ptr<Rank>> ranks_;
  std::vector<std::unique_ptr<RegionService>> services_;
};

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TESTING_REGION_RANKS_TEST_H_
