// The client library's Client and ShardedTensorView (client/client.h)
// against two ranks as threads of this process, each serving the region
// calls of a daemon on its real shard server (gRPC and the data plane) on
// 127.0.0.1 (tests/testing/region_ranks_test.h): a 2 x 2 grid of shards, two
// on each rank, read and written through either plane.
#include "client/client.h"

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/region.h"
#include "gmock/gmock.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server.h"
#include "gtest/gtest.h"
#include "tests/testing/region_ranks_test.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class ClientRegionTest : public ::tessera::testing::RegionRanksTest,
                         public ::testing::WithParamInterface<bool> {
 protected:
  std::shared_ptr<Client> Connect(int r) {
    ClientOptions options;
    options.data_plane = GetParam();
    options.timeout = absl::Seconds(20);
    absl::StatusOr<std::shared_ptr<Client>> client =
        Client::Connect(ranks_[r]->rpc_address(), options);
    EXPECT_OK(client.status());
    return client.ok() ? *client : nullptr;
  }
};

// Progress reports as client/client.h promises them: serialized, growing,
// ending at the total.
struct ProgressLog {
  absl::Mutex mu;
  bool concurrent = false;
  bool inside = false;
  std::vector<std::pair<int64_t, int64_t>> calls;

  ProgressFn Fn() {
    return [this](int64_t done, int64_t total) {
      {
        absl::MutexLock lock(&mu);
        concurrent |= inside;
        inside = true;
        calls.emplace_back(done, total);
      }
      absl::SleepFor(absl::Microseconds(50));
      absl::MutexLock lock(&mu);
      inside = false;
    };
  }

  void ExpectComplete(int64_t total) {
    absl::MutexLock lock(&mu);
    EXPECT_FALSE(concurrent);
    ASSERT_FALSE(calls.empty());
    for (size_t i = 1; i < calls.size(); ++i) {
      EXPECT_GE(calls[i].first, calls[i - 1].first);
    }
    EXPECT_EQ(calls.back(), std::make_pair(total, total));
  }
};

TEST_P(ClientRegionTest, ReadsRegionsStraightFromTheOwners) {
  std::shared_ptr<Client> client = Connect(1);
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(client->world_size(), kWorldSize);
  ASSERT_OK_AND_ASSIGN(ShardedTensorView view, client->Open(kName));
  EXPECT_EQ(view.tensor_id(), kTensorId);
  EXPECT_EQ(view.owner_rank(2), 1);
  TransferOptions options;
  options.chunk_bytes = 4096;
  ProgressLog log;
  options.progress = log.Fn();
  ASSERT_OK_AND_ASSIGN(Tensor read,
                       view.ReadRegion({12, 100}, {20, 120}, options));
  ASSERT_OK_AND_ASSIGN(Tensor box, RegionView(global_, {12, 100}, {20, 120}));
  EXPECT_TRUE(Equal(read, *box.Contiguous()));
  log.ExpectComplete(20 * 120 * 4);
  // The whole tensor, beyond what one daemon call may carry.
  ASSERT_OK_AND_ASSIGN(Tensor all, view.Read());
  EXPECT_TRUE(Equal(all, global_));
  // Into a strided destination.
  ASSERT_OK_AND_ASSIGN(Tensor tall, Tensor::Zeros({300, 40}));
  ASSERT_OK_AND_ASSIGN(Tensor transposed, tall.T());
  ASSERT_OK(view.ReadRegionInto({0, 0}, transposed));
  EXPECT_TRUE(Equal(*transposed.Contiguous(), global_));
  // A whole remote shard.
  ASSERT_OK_AND_ASSIGN(Shard shard, view.remote_shards()[3].to_here());
  ASSERT_OK_AND_ASSIGN(Tensor fourth,
                       RegionView(global_, {20, 150}, {20, 150}));
  EXPECT_TRUE(Equal(shard.tensor, *fourth.Contiguous()));
  EXPECT_EQ(view.remote_shards()[3].owner().id, 0);

  EXPECT_THAT(view.ReadRegion({0, 290}, {1, 11}),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("leaves")));
  EXPECT_THAT(
      view.ReadRegion({0}, {1}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("2 dimensions")));
  ASSERT_OK_AND_ASSIGN(
      Tensor wrong,
      Tensor::Zeros({2, 2}, TensorOptions().WithDType(DType::kInt32)));
  EXPECT_THAT(
      view.ReadRegionInto({0, 0}, wrong),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dtype float32")));
  EXPECT_THAT(client->Open("nope"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("nope")));
}

TEST_P(ClientRegionTest, WritesEachOwnerItsPart) {
  std::shared_ptr<Client> client = Connect(0);
  ASSERT_NE(client, nullptr);
  ASSERT_OK_AND_ASSIGN(ShardedTensorView view, client->Open(kName));
  const Tensor data = Pattern({30, 200}, 11);
  TransferOptions options;
  options.chunk_bytes = 4096;
  options.parallelism = 2;
  ProgressLog log;
  options.progress = log.Fn();
  ASSERT_OK(view.Write({5, 50}, data, options));
  log.ExpectComplete(30 * 200 * 4);
  Tensor expected = *global_.Clone();
  ASSERT_OK(CopyBox(data, {0, 0}, expected, {5, 50}, {30, 200}));
  EXPECT_TRUE(Equal(Held(), expected));
  ASSERT_OK_AND_ASSIGN(Tensor all, view.Read());
  EXPECT_TRUE(Equal(all, expected));

  EXPECT_THAT(view.Write({20, 0}, data),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("leaves")));
  const Tensor doubles =
      *Tensor::Zeros({2, 2}, TensorOptions().WithDType(DType::kFloat64));
  EXPECT_THAT(
      view.Write({0, 0}, doubles),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dtype float32")));
  EXPECT_TRUE(Equal(Held(), expected));
}

TEST_P(ClientRegionTest, HealthOfEveryDaemon) {
  std::shared_ptr<Client> client = Connect(0);
  ASSERT_NE(client, nullptr);
  // A rank's health service starts NOT_SERVING until its owner is ready.
  ranks_[0]->rpc_server()->GetHealthCheckService()->SetServingStatus(true);
  std::vector<absl::Status> health = client->Health();
  ASSERT_EQ(health.size(), 2u);
  EXPECT_OK(health[0]);
  EXPECT_THAT(
      health[1],
      StatusIs(absl::StatusCode::kUnavailable,
               HasSubstr(absl::StrCat("rank 1) at ", ranks_[1]->rpc_address(),
                                      ": NOT_SERVING"))));
  ranks_[1]->rpc_server()->GetHealthCheckService()->SetServingStatus(true);
  EXPECT_THAT(client->Health(), ElementsAre(IsOk(), IsOk()));
}

INSTANTIATE_TEST_SUITE_P(Planes, ClientRegionTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "DataPlane" : "Grpc";
                         });

}  // namespace
}  // namespace tessera
