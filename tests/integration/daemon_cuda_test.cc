// The service end to end with CUDA shards: 4 real `tessera-server`
// processes started with `--device cuda` on loopback, spread over the
// visible GPUs. On a one-GPU machine all four share cuda:0, so their
// options pick the gloo backend (NCCL needs a GPU per rank) and collectives
// stage through the host, while shard bytes still cross the daemons' gRPC
// servers and data planes. Skips without a CUDA device.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/read_plan.h"
#include "common/sharding_spec.h"
#include "common/tensor/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/daemon_cluster.h"
#include "tests/testing/daemon_cluster_test.h"
#include "tests/testing/iota.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::DaemonCluster;
using ::tessera::testing::DaemonClusterOptions;
using ::tessera::testing::ExpectIotaBox;
using ::tessera::testing::Iota;
using ::tessera::testing::IsOk;
using ::testing::HasSubstr;

constexpr int kWorld = 4;

// The device daemon `rank` serves its shards from: its local rank spread
// over the visible GPUs (DaemonCluster gives daemon r local rank r).
std::string DeviceText(int rank) {
  return absl::StrCat("cuda:", rank % CudaDeviceCount());
}

// Rows chunked over the ranks, every shard on its owner's GPU; placements
// in reverse when `reversed`, so that rank 3 holds the first rows.
ShardingSpec RowSpec(bool reversed) {
  std::vector<std::string> placements;
  for (int i = 0; i < kWorld; ++i) {
    const int r = reversed ? kWorld - 1 - i : i;
    placements.push_back(absl::StrCat("rank:", r, "/", DeviceText(r)));
  }
  return *ChunkShardingSpec::Create(0, placements);
}

ShardingSpec ColumnSpec() {
  std::vector<std::string> placements;
  for (int r = 0; r < kWorld; ++r) {
    placements.push_back(absl::StrCat("rank:", r, "/", DeviceText(r)));
  }
  return *ChunkShardingSpec::Create(1, placements);
}

class DaemonCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) {
      GTEST_SKIP() << "needs a CUDA device, found 0";
    }
    DaemonClusterOptions options;
    options.world_size = kWorld;
    options.server_path = TESSERA_SERVER_PATH;
    options.device = "cuda";
    options.extra_args = {"--timeout", "20", "--log-level", "info"};
    ASSERT_OK_AND_ASSIGN(cluster_, DaemonCluster::Start(options));
    ASSERT_OK_AND_ASSIGN(client_, Client::Connect(cluster_->address(0)));
  }

  // After the test: every daemon still runs.
  void TearDown() override {
    if (cluster_ != nullptr)
      ::tessera::testing::ExpectDaemonsRunning(*cluster_);
  }

  std::unique_ptr<DaemonCluster> cluster_;
  std::shared_ptr<Client> client_;
};

TEST_F(DaemonCudaTest, DaemonsServeFromTheirGpus) {
  const v1::ClusterInfo& info = client_->cluster();
  ASSERT_EQ(info.workers_size(), kWorld);
  // Fewer GPUs than daemons: they share them over Gloo.
  const std::string backend =
      CudaDeviceCount() < kWorld ? "backend gloo" : "backend nccl";
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(info.workers(r).device(), DeviceText(r));
    EXPECT_THAT(
        cluster_->Log(r, 1 << 16),
        HasSubstr(absl::StrCat("device ", DeviceText(r), ", ", backend)));
  }
  for (const absl::Status& s : client_->Health()) EXPECT_THAT(s, IsOk());
}

TEST_F(DaemonCudaTest, CreateWriteReadGatherOnCudaShards) {
  CreateOptions zeros;
  zeros.init = TensorInit::kZeros;
  ASSERT_OK_AND_ASSIGN(
      ShardedTensorView view,
      client_->Create("gpu", {10, 20}, RowSpec(/*reversed=*/true), zeros));
  const auto& shards = view.metadata().shards_metadata;
  ASSERT_EQ(shards.size(), 4u);
  for (size_t i = 0; i < shards.size(); ++i) {
    EXPECT_EQ(view.owner_rank(i), kWorld - 1 - static_cast<int>(i));
    EXPECT_EQ(shards[i].placement()->device().ToString(),
              DeviceText(view.owner_rank(i)));
  }
  ASSERT_OK_AND_ASSIGN(Tensor before, view.Read());
  ASSERT_OK_AND_ASSIGN(Tensor zeros_host, Tensor::Zeros({10, 20}));
  EXPECT_TRUE(Equal(zeros_host, before));

  // Write everything, then a box across shards 1..2 over it.
  ASSERT_THAT(view.Write({0, 0}, Iota(10, 20)), IsOk());
  ASSERT_OK_AND_ASSIGN(Tensor all, view.Read());
  ExpectIotaBox(all, 0, 0, 20);
  ASSERT_OK_AND_ASSIGN(Tensor patch, Tensor::Full({4, 6}, -1.0));
  ASSERT_THAT(view.Write({2, 7}, patch), IsOk());
  ASSERT_OK_AND_ASSIGN(Tensor region, view.ReadRegion({1, 5}, {6, 10}));
  ASSERT_OK_AND_ASSIGN(Tensor host, region.To(Device::Cpu()));
  for (int64_t r = 0; r < 6; ++r) {
    for (int64_t c = 0; c < 10; ++c) {
      const int64_t i = 1 + r;
      const int64_t j = 5 + c;
      const bool patched = i >= 2 && i < 6 && j >= 7 && j < 13;
      ASSERT_EQ(host.data<float>()[r * 10 + c],
                patched ? -1.0f : static_cast<float>(i * 20 + j))
          << "at " << i << ", " << j;
    }
  }
  // Put the box back from the same rows and columns of Iota.
  ASSERT_OK_AND_ASSIGN(Tensor rows, Iota(10, 20).Narrow(0, 2, 4));
  ASSERT_OK_AND_ASSIGN(Tensor box, rows.Narrow(1, 7, 6));
  ASSERT_OK_AND_ASSIGN(box, box.Contiguous());
  ASSERT_THAT(view.Write({2, 7}, box), IsOk());

  // Each shard whole, fetched from its owner's GPU.
  std::vector<RemoteShard> remote = view.remote_shards();
  ASSERT_EQ(remote.size(), 4u);
  for (size_t i = 0; i < remote.size(); ++i) {
    ASSERT_OK_AND_ASSIGN(Shard shard, remote[i].to_here());
    EXPECT_EQ(shard.metadata, shards[i]);
    ExpectIotaBox(shard.tensor, shards[i].shard_offsets()[0], 0, 20);
  }

  // Gather on two daemons (a collective over the shared GPU), then
  // reshard by columns: values kept.
  ASSERT_OK_AND_ASSIGN(Tensor gathered, client_->Gather("gpu"));
  ExpectIotaBox(gathered, 0, 0, 20);
  ASSERT_OK_AND_ASSIGN(auto other, Client::Connect(cluster_->address(2)));
  ASSERT_OK_AND_ASSIGN(gathered, other->Gather("gpu"));
  ExpectIotaBox(gathered, 0, 0, 20);
  ASSERT_OK_AND_ASSIGN(ShardedTensorView by_columns,
                       client_->Reshard("gpu", ColumnSpec()));
  EXPECT_EQ(by_columns.metadata().shards_metadata[0].shard_sizes(),
            (std::vector<int64_t>{10, 5}));
  ASSERT_OK_AND_ASSIGN(Tensor after, by_columns.Read());
  ExpectIotaBox(after, 0, 0, 20);
  ASSERT_OK_AND_ASSIGN(Tensor columns, by_columns.ReadRegion({3, 4}, {5, 9}));
  ExpectIotaBox(columns, 3, 4, 20);
  EXPECT_THAT(client_->Delete("gpu"), IsOk());
}

// A read plan from CUDA shards into CUDA outs, over the local path (CUDA
// IPC: a dense run of an out is copied into it device to device) and over
// the data plane (through host staging), with a strided out and a cast
// (through host staging on both).
TEST_F(DaemonCudaTest, ReadPlansFillCudaOutsFromCudaShards) {
  CreateOptions zeros;
  zeros.init = TensorInit::kZeros;
  ASSERT_OK_AND_ASSIGN(
      ShardedTensorView view,
      client_->Create("planned", {16, 20}, RowSpec(/*reversed=*/false), zeros));
  ASSERT_THAT(view.Write({0, 0}, Iota(16, 20)), IsOk());
  const auto on_gpu = [](std::vector<int64_t> sizes,
                         DType dtype = DType::kFloat32) {
    return *Tensor::Full(
        std::move(sizes), -7.0,
        TensorOptions().WithDType(dtype).WithDevice(Device::Cuda(0)));
  };
  for (const bool local : {true, false}) {
    SCOPED_TRACE(local ? "local path" : "data plane");
    ClientOptions options;
    options.use_local_path = local;
    options.local_min_bytes = 0;
    ASSERT_OK_AND_ASSIGN(auto client,
                         Client::Connect(cluster_->address(0), options));
    const Tensor whole = on_gpu({16, 20});
    const Tensor half = on_gpu({16, 10});  // Columns 10..19: dense rows.
    const Tensor cast = on_gpu({16, 4}, DType::kFloat64);
    ReadItem fused;               // Columns 0..2 and 5..7 side by
    fused.out = on_gpu({16, 6});  // side: strided pieces.
    fused.sources = {{"planned", {0, 0}, {16, 3}, {0, 0}},
                     {"planned", {0, 5}, {16, 3}, {0, 3}}};
    ASSERT_OK_AND_ASSIGN(
        std::shared_ptr<ReadPlan> plan,
        client->PlanReads({ReadItem::Box("planned", {0, 0}, whole),
                           ReadItem::Box("planned", {0, 10}, half),
                           ReadItem::Box("planned", {0, 16}, cast), fused}));
    for (int run = 0; run < 2; ++run) {
      ASSERT_OK(plan->Run().status());
      ASSERT_OK_AND_ASSIGN(const Tensor all, whole.To(Device::Cpu()));
      ExpectIotaBox(all, 0, 0, 20);
      ASSERT_OK_AND_ASSIGN(const Tensor right, half.To(Device::Cpu()));
      ExpectIotaBox(right, 0, 10, 20);
      ASSERT_OK_AND_ASSIGN(Tensor last, cast.To(Device::Cpu()));
      ASSERT_OK_AND_ASSIGN(last, last.ToDType(DType::kFloat32));
      ExpectIotaBox(last, 0, 16, 20);
      ASSERT_OK_AND_ASSIGN(const Tensor both, fused.out.To(Device::Cpu()));
      ASSERT_OK_AND_ASSIGN(Tensor left, both.Narrow(1, 0, 3));
      ASSERT_OK_AND_ASSIGN(left, left.Contiguous());
      ExpectIotaBox(left, 0, 0, 20);
      ASSERT_OK_AND_ASSIGN(Tensor middle, both.Narrow(1, 3, 3));
      ASSERT_OK_AND_ASSIGN(middle, middle.Contiguous());
      ExpectIotaBox(middle, 0, 5, 20);
      // The next run must write them again.
      for (const Tensor& out : {whole, half, cast, fused.out}) {
        ASSERT_OK(CopyInto(on_gpu(out.sizes(), out.dtype()), out));
      }
    }
  }
  EXPECT_THAT(client_->Delete("planned"), IsOk());
}

}  // namespace
}  // namespace tessera
