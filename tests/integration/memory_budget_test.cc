// The daemons' memory budget (server/daemon/memory_budget.h) with 4 real
// `tessera-server` processes started with a small --memory-limit: creates,
// reshards, loads, gathers and region reads and writes that do not fit are
// refused with RESOURCE_EXHAUSTED on every daemon, before anything is
// allocated, and the daemons keep serving; freeing a tensor gives its
// bytes back. Tried as the hostile user: the request that once
// OOM-killed every daemon ([2147483647, 16] bool zeros) and readers that
// stage big regions.
#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "common/proto_convert.h"
#include "common/sharding_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tessera/v1/control.grpc.pb.h"
#include "tests/testing/daemon_cluster_test.h"
#include "tests/testing/iota.h"
#include "tests/testing/status_matchers.h"
#include "wire/auth.h"

namespace tessera {
namespace {

using ::tessera::testing::DaemonClusterOptions;
using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int kWorld = 4;
// Per daemon; rank 0 sets a quarter aside for the store, so 48 MiB remain
// there and 64 MiB on the others.
constexpr int64_t kLimit = int64_t{64} << 20;
constexpr int64_t kMiB = int64_t{1} << 20;

ShardingSpec Rows() {
  return *ChunkShardingSpec::Create(
      0, {"rank:0/cpu", "rank:1/cpu", "rank:2/cpu", "rank:3/cpu"});
}

ShardingSpec OnRank(int rank) {
  return *ChunkShardingSpec::Create(0, {absl::StrCat("rank:", rank, "/cpu")});
}

// A float32 tensor of `mib_per_rank` MiB on each daemon, in rows.
std::vector<int64_t> SizesFor(int64_t mib_per_rank) {
  return {kWorld * mib_per_rank * 256, 1024};
}

class DaemonMemoryBudgetTest : public ::tessera::testing::DaemonClusterTest {
 protected:
  static void SetUpTestSuite() {
    DaemonClusterOptions options;
    options.world_size = kWorld;
    options.server_path = TESSERA_SERVER_PATH;
    options.extra_args = {"--timeout",      "20",   "--log-level", "warn",
                          "--memory-limit", "64MiB"};
    StartSuiteCluster(std::move(options));
  }

  // Every test leaves the cluster empty.
  void TearDown() override {
    DaemonClusterTest::TearDown();
    absl::StatusOr<std::vector<ShardedTensorView>> listed = client_->List();
    ASSERT_OK(listed.status());
    for (const ShardedTensorView& view : *listed) {
      EXPECT_OK(client_->Delete(view.name()));
    }
  }
};

TEST_F(DaemonMemoryBudgetTest, CreatesBeyondTheBudgetAreRefusedEverywhere) {
  // 8 MiB per daemon: rank 0 fits six (48 MiB), the seventh is refused on
  // every daemon, naming rank 0's budget.
  for (int i = 0; i < 6; ++i) {
    ASSERT_OK(
        client_->Create(absl::StrCat("t", i), SizesFor(8), Rows()).status())
        << i;
  }
  EXPECT_THAT(client_->Create("t6", SizesFor(8), Rows()).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       ::testing::AllOf(HasSubstr("CreateTensor \"t6\""),
                                        HasSubstr("rank 0"),
                                        HasSubstr("--memory-limit"))));
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_OK_AND_ASSIGN(auto other, Client::Connect(cluster_->address(r)));
    EXPECT_THAT(other->Open("t6").status(),
                StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  }
  // Deleting one gives its bytes back.
  ASSERT_OK(client_->Delete("t0"));
  ASSERT_OK(client_->Create("t6", SizesFor(8), Rows()).status());
  // A tensor that would sit on rank 1 alone fits there, not on rank 0.
  EXPECT_OK(client_->Create("on1", {16 * 256, 1024}, OnRank(1)).status());
  EXPECT_THAT(client_->Create("on0", {16 * 256, 1024}, OnRank(0)).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, ::testing::_));
}

TEST_F(DaemonMemoryBudgetTest, AbsurdCreatesAreRefusedNotOomKilled) {
  // Once OOM-killed all four daemons (issue 14).
  CreateOptions zeros;
  zeros.dtype = DType::kBool;
  zeros.init = TensorInit::kZeros;
  EXPECT_THAT(
      client_->Create("absurd", {2147483647, 16}, Rows(), zeros).status(),
      StatusIs(absl::StatusCode::kResourceExhausted,
               HasSubstr("bytes of host memory")));
  // "Empty" tensors count too: their pages commit on first touch.
  CreateOptions empty;
  empty.init = TensorInit::kEmpty;
  for (int i = 0; i < 3; ++i) {
    EXPECT_THAT(
        client_->Create(absl::StrCat("e", i), SizesFor(1024), Rows(), empty)
            .status(),
        StatusIs(absl::StatusCode::kResourceExhausted, ::testing::_));
  }
}

TEST_F(DaemonMemoryBudgetTest, ReshardsGathersAndRegionsStageWithinTheBudget) {
  ASSERT_OK_AND_ASSIGN(ShardedTensorView big,
                       client_->Create("big", SizesFor(16), Rows()));
  // Gathering 64 MiB on rank 0 (48 - 16 MiB left) does not fit.
  EXPECT_THAT(client_->Gather("big").status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("Gather \"big\"")));
  // Nor does a reshard that puts all of it on rank 0.
  EXPECT_THAT(client_->Reshard("big", OnRank(0)).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("Reshard \"big\"")));
  // The tensor kept its layout and values.
  ASSERT_OK_AND_ASSIGN(ShardedTensorView again, client_->Open("big"));
  EXPECT_EQ(again.tensor_id(), big.tensor_id());

  // A region read through rank 0's ControlService stages the region there.
  auto stub =
      v1::ControlService::NewStub(CreateTesseraChannel(cluster_->address(0)));
  auto read = [&](int64_t rows) {
    v1::ReadRegionRequest request;
    request.set_name("big");
    for (int64_t x : {int64_t{0}, int64_t{0}}) request.add_offsets(x);
    for (int64_t x : {rows, int64_t{1024}}) request.add_sizes(x);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
    auto reader = stub->ReadRegion(&context, request);
    v1::ShardChunk chunk;
    int64_t bytes = 0;
    while (reader->Read(&chunk)) bytes += chunk.data().size();
    const grpc::Status status = reader->Finish();
    return std::make_pair(status, bytes);
  };
  auto [refused, none] = read(SizesFor(16)[0]);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << refused.error_message();
  EXPECT_THAT(refused.error_message(), HasSubstr("ReadRegion"));
  EXPECT_EQ(none, 0);
  auto [fits, bytes] = read(1024);
  EXPECT_TRUE(fits.ok()) << fits.error_message();
  EXPECT_EQ(bytes, 1024 * 1024 * 4);

  // Small writes and reads still go through.
  ASSERT_OK_AND_ASSIGN(ShardedTensorView small,
                       client_->Create("small", {8, 4}, Rows()));
  ASSERT_OK(small.Write({0, 0}, ::tessera::testing::Iota(8, 4)));
  ASSERT_OK_AND_ASSIGN(Tensor values, small.Read());
  ::tessera::testing::ExpectIotaBox(values, 0, 0, 4);
  // After all of it, the budget is whole again: the same creates fit.
  ASSERT_OK(client_->Delete("big"));
  ASSERT_OK(client_->Create("again", SizesFor(40), Rows()).status());
}

}  // namespace
}  // namespace tessera
