// Reshard served for any layout: real `tessera-server` processes on
// loopback (tests/testing/daemon_cluster.h) and the client library.
//
// Covered: 3 shards on 4 ranks to 4 shards; 4 to 2 (ranks without shards,
// which still serve reads and gathers); 2 to several shards per rank; rows
// to columns; uneven explicit boxes (EnumerableShardingSpec) both ways; the
// values (iota) equal after each, read from the owners and through a
// shardless daemon's ReadRegion; an equal layout changes nothing; refused
// specs (an unknown rank, boxes that do not cover the tensor) are
// INVALID_ARGUMENT and change nothing; readers running through reshards
// never see a value of the wrong place (old data or a clear error); a
// tensor with 2 copies keeps 2 copies and serves every value with a holder
// killed.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "client/shard_client.h"
#include "common/sharding_spec.h"
#include "common/status_macros.h"
#include "common/tensor/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tessera/v1/control.grpc.pb.h"
#include "tests/testing/daemon_cluster.h"
#include "tests/testing/daemon_cluster_test.h"
#include "tests/testing/daemon_read.h"
#include "tests/testing/iota.h"
#include "tests/testing/status_matchers.h"
#include "wire/auth.h"
#include "wire/replicas.h"

namespace tessera {
namespace {

using ::tessera::testing::DaemonCluster;
using ::tessera::testing::DaemonClusterOptions;
using ::tessera::testing::ExpectIotaBox;
using ::tessera::testing::Iota;
using ::tessera::testing::StatusIs;
using ::testing::AnyOf;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

constexpr int kWorld = 4;

DaemonClusterOptions ClusterOptions(int world) {
  return ::tessera::testing::QuietClusterOptions(world, TESSERA_SERVER_PATH);
}

// Chunks along `dim`, chunk i on rank ranks[i].
ShardingSpec Chunks(int64_t dim, const std::vector<int>& ranks) {
  std::vector<std::string> placements;
  for (int r : ranks) placements.push_back(absl::StrCat("rank:", r, "/cpu"));
  return *ChunkShardingSpec::Create(dim, placements);
}

struct Box {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
  int rank;
};

ShardingSpec Boxes(const std::vector<Box>& boxes) {
  std::vector<ShardMetadata> shards;
  for (const Box& box : boxes) {
    shards.push_back(
        *ShardMetadata::Create(box.offsets, box.sizes,
                               RemoteDevice::ForRank(box.rank, Device::Cpu())));
  }
  return *EnumerableShardingSpec::Create(std::move(shards));
}

std::vector<int> Owners(const ShardedTensorView& view) {
  return std::vector<int>(view.info().shard_ranks().begin(),
                          view.info().shard_ranks().end());
}

class ReshardTest : public ::tessera::testing::DaemonClusterTest {
 protected:
  static void SetUpTestSuite() { StartSuiteCluster(ClusterOptions(kWorld)); }

  // A rows x cols tensor laid out by `spec`, holding Iota(rows, cols).
  absl::StatusOr<ShardedTensorView> CreateIota(const std::string& name,
                                               int64_t rows, int64_t cols,
                                               const ShardingSpec& spec) {
    ASSIGN_OR_RETURN(ShardedTensorView view,
                     client_->Create(name, {rows, cols}, spec));
    RETURN_IF_ERROR(view.Write({0, 0}, Iota(rows, cols)));
    return view;
  }

  // The whole tensor, read from the owners by the client library and
  // through daemon `via`'s ReadRegion, is Iota(*, cols) on both paths.
  void ExpectIota(const ShardedTensorView& view, int via) {
    const int64_t rows = view.sizes()[0];
    const int64_t cols = view.sizes()[1];
    ASSERT_OK_AND_ASSIGN(Tensor read, view.Read());
    ExpectIotaBox(read, 0, 0, cols);

    ASSERT_OK_AND_ASSIGN(
        const std::string bytes,
        testing::ReadRegionThroughDaemon(cluster_->address(via), view.name(),
                                         view.tensor_id(), {0, 0}, {rows, cols},
                                         absl::Seconds(10)));
    ASSERT_EQ(bytes.size(), static_cast<size_t>(rows * cols * 4));
    Tensor via_daemon = *Tensor::Empty({rows, cols});
    std::memcpy(via_daemon.data_ptr(), bytes.data(), bytes.size());
    ExpectIotaBox(via_daemon, 0, 0, cols);
  }

  // Reshards `name` through four layouts (columns, fewer shards, several
  // per rank, back to rows on ranks 0-2), `rounds` times, pausing `pause`
  // after each.
  absl::Status ReshardRounds(const std::string& name, int rounds,
                             absl::Duration pause) {
    const std::vector<ShardingSpec> layouts = {
        Chunks(1, {3, 2, 1, 0}), Chunks(0, {1, 2}),
        Chunks(0, {0, 1, 2, 3, 0, 1}), Chunks(0, {0, 1, 2})};
    for (int round = 0; round < rounds; ++round) {
      for (const ShardingSpec& spec : layouts) {
        RETURN_IF_ERROR(client_->Reshard(name, spec).status());
        absl::SleepFor(pause);
      }
    }
    return absl::OkStatus();
  }

  // Reshards `name` to `spec` and checks the new layout's id, shards
  // (those BuildMetadata gives), owners and values.
  absl::StatusOr<ShardedTensorView> ReshardAndCheck(
      const ShardedTensorView& before, const ShardingSpec& spec,
      const std::vector<int>& owners, int via) {
    ASSIGN_OR_RETURN(ShardedTensorView after,
                     client_->Reshard(before.name(), spec));
    EXPECT_NE(after.tensor_id(), before.tensor_id());
    ASSIGN_OR_RETURN(ShardedTensorMetadata expected,
                     BuildMetadata(spec, before.sizes()));
    EXPECT_EQ(after.metadata().shards_metadata, expected.shards_metadata);
    EXPECT_THAT(Owners(after), ElementsAreArray(owners));
    ExpectIota(after, via);
    // Every daemon names the new layout.
    for (int r = 0; r < kWorld; ++r) {
      ASSIGN_OR_RETURN(auto other, Client::Connect(cluster_->address(r)));
      ASSIGN_OR_RETURN(ShardedTensorView seen, other->Open(before.name()));
      EXPECT_EQ(seen.tensor_id(), after.tensor_id()) << "on rank " << r;
      EXPECT_EQ(seen.metadata(), after.metadata()) << "on rank " << r;
    }
    // The old layout's shards are gone: a view of it reads the new layout
    // as the new one (every value in its place), never the new shards as
    // if they were the old ones; a daemon's ReadRegion naming the old id
    // is refused.
    ASSIGN_OR_RETURN(Tensor stale, before.Read());
    ExpectIotaBox(stale, 0, 0, before.sizes()[1]);
    EXPECT_THAT(testing::ReadRegionThroughDaemon(
                    cluster_->address(via), before.name(), before.tensor_id(),
                    {0, 0}, {1, 1}, absl::Seconds(10)),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         HasSubstr("resharded")));
    return after;
  }
};

TEST_F(ReshardTest, ThreeShardsOnFourRanksBecomeFour) {
  ASSERT_OK_AND_ASSIGN(ShardedTensorView three,
                       CreateIota("three", 10, 7, Chunks(0, {0, 1, 2})));
  EXPECT_THAT(Owners(three), ElementsAre(0, 1, 2));
  ASSERT_OK_AND_ASSIGN(
      ShardedTensorView four,
      ReshardAndCheck(three, Chunks(0, {3, 2, 1, 0}), {3, 2, 1, 0}, 0));
  EXPECT_EQ(four.metadata().shards_metadata[3].shard_sizes(),
            (std::vector<int64_t>{1, 7}));
  ASSERT_OK(client_->Delete("three"));
}

TEST_F(ReshardTest, FourShardsToTwoLeaveRanksWithoutShards) {
  ASSERT_OK_AND_ASSIGN(ShardedTensorView four,
                       CreateIota("four", 9, 5, Chunks(0, {0, 1, 2, 3})));
  // Ranks 0 and 2 hold nothing afterwards; rank 0 still serves reads
  // (from the others) and gathers.
  ASSERT_OK_AND_ASSIGN(ShardedTensorView two,
                       ReshardAndCheck(four, Chunks(0, {3, 1}), {3, 1}, 0));
  ExpectIota(two, 2);
  ASSERT_OK_AND_ASSIGN(Tensor gathered, client_->Gather("four"));
  ExpectIotaBox(gathered, 0, 0, 5);
  // And back onto every rank.
  ASSERT_OK_AND_ASSIGN(
      ShardedTensorView again,
      ReshardAndCheck(two, Chunks(0, {0, 1, 2, 3}), {0, 1, 2, 3}, 2));
  ASSERT_OK(client_->Delete("four"));
}

TEST_F(ReshardTest, TwoShardsToSeveralShardsPerRank) {
  ASSERT_OK_AND_ASSIGN(ShardedTensorView two,
                       CreateIota("many", 13, 4, Chunks(0, {1, 2})));
  // 13 rows in chunks of 3: six shards, three per rank, the last one
  // (rank 1's) empty.
  ASSERT_OK_AND_ASSIGN(ShardedTensorView six,
                       ReshardAndCheck(two, Chunks(0, {0, 1, 0, 1, 0, 1}),
                                       {0, 1, 0, 1, 0, 1}, 3));
  EXPECT_EQ(six.metadata().shards_metadata[5].shard_sizes(),
            (std::vector<int64_t>{0, 4}));
  // Several shards per rank on both sides, columns now.
  ASSERT_OK_AND_ASSIGN(
      ShardedTensorView columns,
      ReshardAndCheck(six, Chunks(1, {2, 3, 2, 3}), {2, 3, 2, 3}, 1));
  ASSERT_OK(client_->Delete("many"));
}

TEST_F(ReshardTest, RowsToColumnsAndUnevenBoxes) {
  ASSERT_OK_AND_ASSIGN(ShardedTensorView rows,
                       CreateIota("grid", 10, 11, Chunks(0, {0, 1, 2, 3})));
  ASSERT_OK_AND_ASSIGN(
      ShardedTensorView columns,
      ReshardAndCheck(rows, Chunks(1, {1, 2, 3, 0}), {1, 2, 3, 0}, 0));
  EXPECT_EQ(columns.metadata().shards_metadata[0].shard_sizes(),
            (std::vector<int64_t>{10, 3}));
  // Uneven explicit boxes: a 3 x 5 corner, its neighbour, a tall strip and
  // a one-row shard, two of them on rank 2, none on rank 0.
  const ShardingSpec uneven = Boxes({{{0, 0}, {3, 5}, 2},
                                     {{0, 5}, {3, 6}, 3},
                                     {{3, 0}, {6, 11}, 2},
                                     {{9, 0}, {1, 11}, 1}});
  ASSERT_OK_AND_ASSIGN(ShardedTensorView boxes,
                       ReshardAndCheck(columns, uneven, {2, 3, 2, 1}, 0));
  // And from explicit boxes back to rows.
  ASSERT_OK_AND_ASSIGN(
      ShardedTensorView back,
      ReshardAndCheck(boxes, Chunks(0, {2, 0, 1}), {2, 0, 1}, 3));
  ASSERT_OK(client_->Delete("grid"));
}

TEST_F(ReshardTest, AnEqualLayoutChangesNothing) {
  ASSERT_OK_AND_ASSIGN(ShardedTensorView view,
                       CreateIota("same", 6, 6, Chunks(0, {0, 1, 0})));
  ASSERT_OK_AND_ASSIGN(ShardedTensorView same,
                       client_->Reshard("same", Chunks(0, {0, 1, 0})));
  EXPECT_EQ(same.tensor_id(), view.tensor_id());
  ExpectIota(view, 2);
  ASSERT_OK(client_->Delete("same"));
}

TEST_F(ReshardTest, ARefusedSpecChangesNothing) {
  ASSERT_OK_AND_ASSIGN(ShardedTensorView view,
                       CreateIota("kept", 8, 6, Chunks(0, {0, 1, 2})));
  // A rank that does not exist.
  EXPECT_THAT(client_->Reshard("kept", Chunks(0, {0, 7})).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("7")));
  // Boxes that leave a part of the tensor uncovered.
  EXPECT_THAT(
      client_
          ->Reshard("kept", Boxes({{{0, 0}, {4, 6}, 0}, {{4, 0}, {3, 6}, 1}}))
          .status(),
      StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  // Boxes larger than the tensor.
  EXPECT_THAT(
      client_
          ->Reshard("kept", Boxes({{{0, 0}, {4, 6}, 0}, {{4, 0}, {5, 6}, 1}}))
          .status(),
      StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  // A chunk dimension the tensor lacks.
  EXPECT_THAT(client_->Reshard("kept", Chunks(2, {0, 1})).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  // No spec at all.
  {
    auto stub =
        v1::ControlService::NewStub(CreateTesseraChannel(cluster_->address(1)));
    grpc::ClientContext context;
    v1::ReshardRequest request;
    request.set_name("kept");
    v1::TensorInfo info;
    EXPECT_EQ(stub->Reshard(&context, request, &info).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  EXPECT_THAT(client_->Reshard("absent", Chunks(0, {0, 1})).status(),
              StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  // The same id, layout and values everywhere.
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_OK_AND_ASSIGN(auto other, Client::Connect(cluster_->address(r)));
    ASSERT_OK_AND_ASSIGN(ShardedTensorView seen, other->Open("kept"));
    EXPECT_EQ(seen.tensor_id(), view.tensor_id());
    EXPECT_EQ(seen.metadata(), view.metadata());
  }
  ExpectIota(view, 3);
  ASSERT_OK(client_->Delete("kept"));
}

// Readers that keep reading while the tensor is resharded back and forth:
// each read returns the whole iota (old layout or new) or fails with a
// clear error (the view's layout is gone), and never gives a value of
// another place.
TEST_F(ReshardTest, ReadersDuringReshardsSeeWholeValuesOrAClearError) {
  constexpr int64_t kRows = 256;
  constexpr int64_t kCols = 1024;
  ASSERT_OK_AND_ASSIGN(ShardedTensorView view,
                       CreateIota("busy", kRows, kCols, Chunks(0, {0, 1, 2})));
  std::atomic<bool> stop{false};
  std::atomic<int> whole{0};
  std::atomic<int> refused{0};
  std::atomic<int> refused_by_daemon{0};
  auto reader_loop = [&](int via, bool through_daemon) {
    ASSERT_OK_AND_ASSIGN(auto client, Client::Connect(cluster_->address(via)));
    auto stub = v1::ControlService::NewStub(
        CreateTesseraChannel(cluster_->address(via)));
    while (!stop.load()) {
      absl::StatusOr<ShardedTensorView> opened = client->Open("busy");
      ASSERT_OK(opened.status());
      if (!through_daemon) {
        absl::StatusOr<Tensor> read = opened->Read();
        if (read.ok()) {
          ExpectIotaBox(*read, 0, 0, kCols);
          ++whole;
        } else {
          EXPECT_THAT(read.status().code(),
                      AnyOf(absl::StatusCode::kNotFound,
                            absl::StatusCode::kFailedPrecondition))
              << read.status();
          ++refused;
        }
        continue;
      }
      // By name only, not pinned: the daemon resolves the layout itself.
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() +
                           std::chrono::seconds(10));
      v1::ReadRegionRequest request;
      request.set_name("busy");
      request.add_offsets(0);
      request.add_offsets(0);
      request.add_sizes(kRows);
      request.add_sizes(kCols);
      auto reader = stub->ReadRegion(&context, request);
      v1::ShardChunk chunk;
      std::string bytes;
      while (reader->Read(&chunk)) bytes += chunk.data();
      const grpc::Status finished = reader->Finish();
      if (finished.ok()) {
        ASSERT_EQ(bytes.size(), static_cast<size_t>(kRows * kCols * 4));
        Tensor got = *Tensor::Empty({kRows, kCols});
        std::memcpy(got.data_ptr(), bytes.data(), bytes.size());
        ExpectIotaBox(got, 0, 0, kCols);
        ++whole;
      } else {
        EXPECT_EQ(finished.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
            << finished.error_message();
        EXPECT_THAT(finished.error_message(), HasSubstr("resharded"));
        ++refused;
        ++refused_by_daemon;
      }
    }
  };
  std::thread direct(reader_loop, 1, false);
  std::thread via_daemon(reader_loop, 3, true);
  ASSERT_OK(ReshardRounds("busy", 5, absl::ZeroDuration()));
  stop = true;
  direct.join();
  via_daemon.join();
  EXPECT_GT(whole.load(), 0);
  std::cout << "reads: " << whole.load() << " whole, " << refused.load()
            << " refused (" << refused_by_daemon.load()
            << " by a daemon's ReadRegion)\n";
  ASSERT_OK_AND_ASSIGN(ShardedTensorView last, client_->Open("busy"));
  ExpectIota(last, 0);
  ASSERT_OK(client_->Delete("busy"));
}

// Writers that keep writing while the tensor is resharded back and forth
// (one over the data plane and the local path, one over gRPC streams, each
// its own half; with one copy of each shard, then two): a write answered
// OK is never lost (the reshard fences the
// old layout's writes on every daemon before any daemon copies it), and a
// write that is not answered OK says it was not applied.
TEST_F(ReshardTest, WritesDuringReshardsAreNeverLost) {
  constexpr int64_t kRows = 256;
  constexpr int64_t kCols = 1024;  // 512 KiB halves: the local path takes
                                   // each owner's part.
  // Unreplicated, then with a copy of each shard on another daemon (a
  // holder refused by the fence fails the piece: the others' taking it
  // would not do).
  for (const int copies : {1, 2}) {
    SCOPED_TRACE(absl::StrCat(copies, " copies"));
    CreateOptions create;
    create.copies = copies;
    ASSERT_OK(
        client_->Create("written", {kRows, kCols}, Chunks(0, {0, 1, 2}), create)
            .status());
    std::atomic<bool> stop{false};
    std::atomic<int> applied{0};
    std::atomic<int> refused{0};
    std::atomic<int> lost{0};
    auto writer_loop = [&](int via, bool streams, int64_t first_row) {
      ClientOptions options;
      options.data_plane = !streams;
      options.use_local_path = !streams;
      ASSERT_OK_AND_ASSIGN(auto client,
                           Client::Connect(cluster_->address(via), options));
      for (float value = 1; !stop.load(); ++value) {
        absl::StatusOr<ShardedTensorView> view = client->Open("written");
        ASSERT_OK(view.status());
        ASSERT_OK_AND_ASSIGN(Tensor half,
                             Tensor::Full({kRows / 2, kCols}, value));
        const absl::Status written = view->Write({first_row, 0}, half);
        if (!written.ok()) {
          EXPECT_THAT(written.code(),
                      AnyOf(absl::StatusCode::kAborted,
                            absl::StatusCode::kFailedPrecondition,
                            absl::StatusCode::kNotFound))
              << written;
          ++refused;
          continue;
        }
        ++applied;
        // Read back by name, from whatever layout the tensor has now.
        ASSERT_OK_AND_ASSIGN(ShardedTensorView now, client->Open("written"));
        ASSERT_OK_AND_ASSIGN(
            Tensor got, now.ReadRegion({first_row, 0}, {kRows / 2, kCols}));
        const float* data = got.data<float>();
        if (!std::all_of(data, data + got.numel(),
                         [&](float v) { return v == value; })) {
          ++lost;
        }
      }
    };
    std::thread fast(writer_loop, 1, false, 0);
    std::thread streamed(writer_loop, 2, true, kRows / 2);
    ASSERT_OK(ReshardRounds("written", 4, absl::Milliseconds(20)));
    stop = true;
    fast.join();
    streamed.join();
    std::cout << "writes: " << applied.load() << " applied, " << refused.load()
              << " refused, " << lost.load() << " lost\n";
    EXPECT_GT(applied.load(), 0);
    EXPECT_EQ(lost.load(), 0);
    ASSERT_OK(client_->Delete("written"));
  }
}

// A tensor with two copies keeps two after a reshard to any layout: every
// new shard has a replica holding its values, and with one daemon killed
// every value is still read.
TEST(ReshardReplicasTest, KeepsTwoCopiesThroughAKilledHolder) {
  constexpr int kThree = 3;
  DaemonClusterOptions options = ClusterOptions(kThree);
  options.extra_args = {"--timeout", "3", "--log-level", "warn"};
  ASSERT_OK_AND_ASSIGN(auto cluster, DaemonCluster::Start(options));
  ClientOptions client_options;
  client_options.timeout = absl::Seconds(20);
  ASSERT_OK_AND_ASSIGN(auto client,
                       Client::Connect(cluster->address(0), client_options));
  CreateOptions two;
  two.copies = 2;
  ASSERT_OK_AND_ASSIGN(ShardedTensorView rows,
                       client->Create("r", {9, 8}, Chunks(0, {0, 1, 2}), two));
  ASSERT_OK(rows.Write({0, 0}, Iota(9, 8)));
  // Several shards per rank, none on rank 1, in columns.
  ASSERT_OK_AND_ASSIGN(ShardedTensorView columns,
                       client->Reshard("r", Chunks(1, {0, 2, 0, 2})));
  EXPECT_EQ(CopiesOf(columns.info()), 2);
  ASSERT_EQ(columns.info().replicas_size(), 4);
  for (int shard = 0; shard < 4; ++shard) {
    ASSERT_EQ(columns.info().replicas(shard).ranks_size(), 1);
    const int replica = columns.info().replicas(shard).ranks(0);
    EXPECT_NE(replica, columns.owner_rank(shard));
    // The replica holds the new shard's values.
    ASSERT_OK_AND_ASSIGN(
        Shard copy,
        ShardClient::Create(cluster->address(replica))
            ->FetchShard(ReplicaTensorId(columns.tensor_id()), shard));
    ExpectIotaBox(copy.tensor, 0, 2 * shard, 8);
  }
  // The old copies are gone with the old layout.
  EXPECT_THAT(ShardClient::Create(cluster->address(1))
                  ->FetchShard(ReplicaTensorId(rows.tensor_id()), 0)
                  .status(),
              StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  ASSERT_OK_AND_ASSIGN(Tensor read, columns.Read());
  ExpectIotaBox(read, 0, 0, 8);

  // Rank 2 owns half the shards: killed, its shards come from replicas.
  cluster->Kill(2);
  ASSERT_OK_AND_ASSIGN(read, columns.Read());
  ExpectIotaBox(read, 0, 0, 8);
}

}  // namespace
}  // namespace tessera
