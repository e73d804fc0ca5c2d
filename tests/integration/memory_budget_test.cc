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
#include "client/version_writer.h"
#include "common/proto_convert.h"
#include "common/sharding_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tessera/v1/control.grpc.pb.h"
#include "tests/testing/daemon_cluster_test.h"
#include "tests/testing/gauge.h"
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
constexpr int64_t kShardMetadata = 1024;  // tensor_table.h

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

  // What rank 0's budget has reserved (its tessera_memory_budget_used_bytes
  // gauge); -1 when it cannot say.
  int64_t BudgetUsed() {
    std::vector<absl::StatusOr<v1::DaemonStats>> stats = client_->Stats();
    if (stats.empty() || !stats[0].ok()) return -1;
    return ::tessera::testing::GaugeValue(stats[0]->metrics(),
                                          "tessera_memory_budget_used_bytes");
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
  // 8 MiB per daemon: rank 0 fits five and one of 7 MiB (47 MiB, and a few
  // KiB of metadata, of its 48 MiB); the next is refused on every daemon,
  // naming rank 0's budget.
  for (int i = 0; i < 5; ++i) {
    ASSERT_OK(
        client_->Create(absl::StrCat("t", i), SizesFor(8), Rows()).status())
        << i;
  }
  ASSERT_OK(client_->Create("t5", SizesFor(7), Rows()).status());
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

TEST_F(DaemonMemoryBudgetTest, MetadataOfManyShardsCountsInTheBudget) {
  // A tensor of one float a shard needs no shard memory to speak of, but
  // every daemon holds the metadata of every shard (tensor_table.h,
  // EntryMetadataBytes: about 1 KiB each). 30,000 shards fit in rank 0's
  // 48 MiB; 60,000 do not, nor do 30,000 more once the first are held.
  const auto spread = [](int shards) {
    std::vector<std::string> placements;
    placements.reserve(shards);
    for (int i = 0; i < shards; ++i) {
      placements.push_back(absl::StrCat("rank:", i % kWorld, "/cpu"));
    }
    return *ChunkShardingSpec::Create(0, placements);
  };
  const int64_t before = BudgetUsed();
  ASSERT_OK(client_->Create("fine", {30000}, spread(30000)).status());
  EXPECT_GE(BudgetUsed() - before, 30000 * kShardMetadata);
  for (const char* name : {"more", "wide"}) {
    const int shards = std::string(name) == "more" ? 30000 : 60000;
    EXPECT_THAT(
        client_->Create(name, {shards}, spread(shards)).status(),
        StatusIs(
            absl::StatusCode::kResourceExhausted,
            ::testing::AllOf(
                HasSubstr(absl::StrCat("CreateTensor \"", name, "\"")),
                HasSubstr(absl::StrCat("metadata of its ", shards, " shards")),
                HasSubstr("rank 0"))))
        << name;
    EXPECT_THAT(client_->Open(name).status(),
                StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  }
  // A reshard into that many shards is refused the same way, and the
  // tensor keeps its layout.
  ASSERT_OK_AND_ASSIGN(ShardedTensorView small,
                       client_->Create("small", {60000}, Rows()));
  EXPECT_THAT(client_->Reshard("small", spread(60000)).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("Reshard \"small\" (its new layout)")));
  ASSERT_OK_AND_ASSIGN(ShardedTensorView again, client_->Open("small"));
  EXPECT_EQ(again.tensor_id(), small.tensor_id());
  EXPECT_EQ(again.metadata().shards_metadata.size(), 4u);
  // Deleting gives the metadata's share back.
  ASSERT_OK(client_->Delete("fine"));
  ASSERT_OK(client_->Create("more", {30000}, spread(30000)).status());
  ASSERT_OK(client_->Delete("more"));
  ASSERT_OK(client_->Delete("small"));

  // Each version of a versioned tensor holds its own copy (512 bytes a
  // shard): with 15,000 shards, the entry (14.6 MiB) and version 1
  // (7.3 MiB) leave room on rank 0 for three versions more, and the fourth
  // is refused.
  CreateOptions versioned;
  versioned.versions = 8;
  ASSERT_OK(client_->Create("v", {15000}, spread(15000), versioned).status());
  std::vector<VersionWriter> open;
  absl::Status refused;
  while (refused.ok() && open.size() < 8) {
    absl::StatusOr<VersionWriter> begun = client_->Begin({"v"});
    if (begun.ok()) {
      open.push_back(*std::move(begun));
    } else {
      refused = begun.status();
    }
  }
  EXPECT_EQ(open.size(), 3u);
  EXPECT_THAT(refused,
              StatusIs(absl::StatusCode::kResourceExhausted,
                       ::testing::AllOf(HasSubstr("BeginVersion of \"v\""),
                                        HasSubstr("shards and metadata"))));
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
