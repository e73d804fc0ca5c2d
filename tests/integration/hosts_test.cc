// Daemons as separate hosts: 2 network namespaces × 2 real daemons
// (tests/testing/netns.h), joined by a bridge, dialled by this test over
// it. Cross-host reads and writes, the advertised host (each daemon listens
// on its host's address, and rank 0's is the master), the local path's
// fallback between hosts, a resharding checkpoint, a partition (one
// host's link down, then up), and versions read whole across hosts and
// from a cut-off host's copies.
//
// Skipped, with the reason, where network namespaces cannot be made (not
// root, or no iproute2: the message says what to install).
#include <algorithm>
#include <atomic>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "client/version_writer.h"
#include "common/proto_convert.h"
#include "common/sharding_spec.h"
#include "common/status_macros.h"
#include "common/tensor/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tessera/v1/control.pb.h"
#include "tests/testing/daemon_cluster.h"
#include "tests/testing/daemon_state.h"
#include "tests/testing/netns.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/until_serving.h"

namespace tessera {
namespace {

using ::tessera::testing::DaemonCluster;
using ::tessera::testing::DaemonClusterOptions;
using ::tessera::testing::NetnsHosts;
using ::tessera::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int kHosts = 2;
constexpr int kWorld = 4;  // ranks 0, 1 on host 0; ranks 2, 3 on host 1
constexpr absl::Duration kLease = absl::Seconds(1);

ShardingSpec Rows(int world = kWorld) {
  std::vector<std::string> placements;
  for (int r = 0; r < world; ++r) {
    placements.push_back(absl::StrCat("rank:", r, "/cpu"));
  }
  return *ChunkShardingSpec::Create(0, placements);
}

class HostsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<NetnsHosts>> made =
        NetnsHosts::Create(kHosts);
    if (absl::IsFailedPrecondition(made.status())) {
      GTEST_SKIP() << made.status().message();
    }
    ASSERT_OK(made.status());
    hosts_ = *std::move(made);
    DaemonClusterOptions options;
    options.world_size = kWorld;
    options.server_path = TESSERA_SERVER_PATH;
    for (int r = 0; r < kWorld; ++r) {
      const int host = r * kHosts / kWorld;
      options.hosts.push_back({hosts_->netns(host), hosts_->address(host)});
    }
    // Beyond loopback without authentication: a test network.
    options.extra_args = {"--insecure", "--timeout",   "3",   "--lease",
                          "1s",         "--log-level", "warn"};
    absl::StatusOr<std::unique_ptr<DaemonCluster>> cluster =
        DaemonCluster::Start(options);
    ASSERT_OK(cluster.status());
    cluster_ = *std::move(cluster);
  }

  int HostOf(int rank) const { return rank * kHosts / kWorld; }

  std::unique_ptr<NetnsHosts> hosts_;
  std::unique_ptr<DaemonCluster> cluster_;
};

TEST_F(HostsTest, ReadsWritesAndCheckpointsCrossHosts) {
  for (int r = 0; r < kWorld; ++r) {
    // Each daemon advertises its own host's address.
    EXPECT_TRUE(absl::StartsWith(cluster_->address(r),
                                 hosts_->address(HostOf(r)) + ":"))
        << cluster_->address(r);
  }
  ClientOptions client_options;
  client_options.timeout = absl::Seconds(10);
  ASSERT_OK_AND_ASSIGN(auto client,
                       Client::Connect(cluster_->address(0), client_options));
  for (const absl::Status& health : client->Health()) EXPECT_OK(health);
  CreateOptions randn;
  randn.init = TensorInit::kRandn;
  randn.seed = 7;
  ASSERT_OK_AND_ASSIGN(ShardedTensorView w,
                       client->Create("w", {8, 6}, Rows(), randn));
  // The same values through a daemon of each host, whole and as a box
  // spanning both hosts.
  ASSERT_OK_AND_ASSIGN(Tensor whole, w.Read());
  ASSERT_OK_AND_ASSIGN(auto other,
                       Client::Connect(cluster_->address(3), client_options));
  ASSERT_OK_AND_ASSIGN(ShardedTensorView w3, other->Open("w"));
  ASSERT_OK_AND_ASSIGN(Tensor again, w3.Read());
  ASSERT_EQ(again.numel(), whole.numel());
  EXPECT_TRUE(std::equal(whole.data<float>(),
                         whole.data<float>() + whole.numel(),
                         again.data<float>()));
  ASSERT_OK_AND_ASSIGN(Tensor box, w3.ReadRegion({3, 1}, {3, 4}));
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t j = 0; j < 4; ++j) {
      EXPECT_EQ(box.data<float>()[i * 4 + j],
                whole.data<float>()[(3 + i) * 6 + 1 + j]);
    }
  }
  // Every shard fetched whole from its owner (the local path is offered
  // only on a daemon's own host; from here it falls back to the network).
  std::vector<RemoteShard> shards = w.remote_shards();
  for (size_t s = 0; s < shards.size(); ++s) {
    ASSERT_OK_AND_ASSIGN(Shard shard, shards[s].to_here());
    EXPECT_EQ(shard.tensor.data<float>()[0], whole.data<float>()[s * 2 * 6])
        << s;
  }
  // A write across the hosts' boundary (rows 3..4: ranks 1 and 2).
  ASSERT_OK_AND_ASSIGN(Tensor twos, Tensor::Full({2, 6}, 2.0));
  ASSERT_OK(w3.Write({3, 0}, twos));
  ASSERT_OK_AND_ASSIGN(Tensor written, w.ReadRegion({2, 0}, {4, 6}));
  for (int64_t i = 0; i < 24; ++i) {
    const bool in_box = i >= 6 && i < 18;
    EXPECT_EQ(written.data<float>()[i],
              in_box ? 2.0f : whole.data<float>()[12 + i])
        << i;
  }
  ASSERT_OK_AND_ASSIGN(Tensor after, w.Read());
  // A checkpoint written by both hosts, loaded under another layout.
  ASSERT_OK(client->Save("ckpt").status());
  v1::LoadCheckpointRequest load;
  load.set_path("ckpt");
  load.add_names("w");
  load.add_as_names("w_cols");
  *load.mutable_spec() = ToProto(ShardingSpec(*ChunkShardingSpec::Create(
      1, std::vector<std::string>{"rank:3/cpu", "rank:0/cpu"})));
  ASSERT_OK(client->Load(load).status());
  ASSERT_OK_AND_ASSIGN(ShardedTensorView cols, other->Open("w_cols"));
  ASSERT_OK_AND_ASSIGN(Tensor loaded, cols.Read());
  EXPECT_TRUE(std::equal(after.data<float>(),
                         after.data<float>() + after.numel(),
                         loaded.data<float>()));
}

// One host's link down: the other host's daemons notice within the lease
// and refuse operations naming the cut-off ranks, while reads of their own
// shards go on; link up: serving again within about a lease, every value
// kept.
TEST_F(HostsTest, APartitionedHostHealsWithinALease) {
  ClientOptions client_options;
  client_options.timeout = absl::Seconds(10);
  ASSERT_OK_AND_ASSIGN(auto client,
                       Client::Connect(cluster_->address(0), client_options));
  CreateOptions sevens;
  sevens.init = TensorInit::kFull;
  sevens.fill_value = 7;
  ASSERT_OK(client->Create("kept", {8, 4}, Rows(), sevens).status());

  ASSERT_OK(hosts_->SetLink(1, false));
  const absl::Time cut = absl::Now();
  ASSERT_OK(testing::TimeUntilDaemonState(
                cluster_->address(0),
                [](const v1::ClusterInfo& info) {
                  return absl::StrContains(info.state(),
                                           "waits for ranks [2, 3]");
                },
                cut, absl::Seconds(15))
                .status())
      << cluster_->Log(0);
  std::cout << "[ hosts ] partition noticed after " << absl::Now() - cut
            << " (lease " << kLease << ")\n";
  // A create meanwhile is held; with a short deadline it ends, not
  // applied, naming the hosts' ranks.
  ClientOptions impatient_options;
  impatient_options.timeout = absl::Seconds(3);
  ASSERT_OK_AND_ASSIGN(
      auto impatient, Client::Connect(cluster_->address(0), impatient_options));
  EXPECT_THAT(impatient->Create("held", {8, 4}, Rows()).status(),
              StatusIs(absl::StatusCode::kUnavailable,
                       ::testing::AllOf(HasSubstr("was not applied"),
                                        HasSubstr("ranks [2, 3]"))));
  ASSERT_OK_AND_ASSIGN(ShardedTensorView kept, client->Open("kept"));
  ASSERT_OK_AND_ASSIGN(Tensor near, kept.ReadRegion({0, 0}, {4, 4}));
  EXPECT_EQ(near.data<float>()[15], 7.0f);

  ASSERT_OK(hosts_->SetLink(1, true));
  const absl::Time healed = absl::Now();
  const absl::Status created = testing::UntilServing(
      [&] {
        return client->Create("after", {8, 4}, Rows(), sevens).status();
      },
      healed, absl::Seconds(30));
  ASSERT_OK(created) << cluster_->Log(0) << cluster_->Log(2);
  const absl::Duration back = absl::Now() - healed;
  std::cout << "[ hosts ] serving again " << back << " after the link came "
            << "back\n";
  EXPECT_LT(back, kLease + absl::Seconds(9));
  for (const char* name : {"kept", "after"}) {
    ASSERT_OK_AND_ASSIGN(ShardedTensorView view, client->Open(name));
    ASSERT_OK_AND_ASSIGN(Tensor values, view.Read());
    for (int64_t i = 0; i < values.numel(); ++i) {
      ASSERT_EQ(values.data<float>()[i], 7.0f) << name << " " << i;
    }
  }
}

// Replicas go to the other host first; when a host is cut off, its shards
// are read from their copies on the host still reachable.
TEST_F(HostsTest, ReplicasLiveOnTheOtherHostAndServeAPartitionedOnesShards) {
  ClientOptions client_options;
  client_options.timeout = absl::Seconds(10);
  ASSERT_OK_AND_ASSIGN(auto client,
                       Client::Connect(cluster_->address(0), client_options));
  CreateOptions two;
  two.init = TensorInit::kRandn;
  two.seed = 3;
  two.copies = 2;
  ASSERT_OK_AND_ASSIGN(ShardedTensorView view,
                       client->Create("r", {8, 4}, Rows(), two));
  ASSERT_EQ(view.info().replicas_size(), kWorld);
  for (int shard = 0; shard < kWorld; ++shard) {
    ASSERT_EQ(view.info().replicas(shard).ranks_size(), 1);
    const int replica = view.info().replicas(shard).ranks(0);
    EXPECT_NE(HostOf(replica), HostOf(view.owner_rank(shard)))
        << "shard " << shard << " has its copy on rank " << replica;
  }
  ASSERT_OK_AND_ASSIGN(Tensor before, view.Read());

  ASSERT_OK(hosts_->SetLink(1, false));
  absl::Cleanup heal = [&] { hosts_->SetLink(1, true).IgnoreError(); };
  TransferOptions quick;
  quick.timeout = absl::Seconds(6);
  const absl::Time start = absl::Now();
  ASSERT_OK_AND_ASSIGN(Tensor during, view.Read(quick));
  std::cout << "[ hosts ] read with host 1 cut off in " << absl::Now() - start
            << "\n";
  for (int64_t i = 0; i < before.numel(); ++i) {
    ASSERT_EQ(during.data<float>()[i], before.data<float>()[i]) << i;
  }
}

// Versions across hosts: a writer on host 0's side publishes versions of a
// tensor with its copies on the other host while a reader of host 1's
// daemons reads it whole; no read mixes two versions, and the versions it
// sees never go back. With host 1 cut off, the latest version is read
// whole from its shards' copies on host 0.
TEST_F(HostsTest, VersionsAreReadWholeAcrossHostsAndFromTheOtherHostsCopies) {
  ClientOptions client_options;
  client_options.timeout = absl::Seconds(10);
  ASSERT_OK_AND_ASSIGN(auto writer_client,
                       Client::Connect(cluster_->address(0), client_options));
  ASSERT_OK_AND_ASSIGN(auto reader_client,
                       Client::Connect(cluster_->address(2), client_options));
  CreateOptions versioned;
  versioned.init = TensorInit::kOnes;  // version 1 holds 1
  versioned.versions = 2;
  versioned.copies = 2;
  constexpr int64_t kRows = 64;
  constexpr int64_t kCols = 256;
  ASSERT_OK(
      writer_client->Create("v", {kRows, kCols}, Rows(), versioned).status());
  // Whether every element of `t` is `version` (float32).
  const auto whole = [](const Tensor& t, int64_t version) {
    const float* data = t.data<float>();
    return std::all_of(data, data + t.numel(), [&](float value) {
      return value == static_cast<float>(version);
    });
  };
  std::atomic<bool> stop{false};
  std::atomic<int64_t> published{1};
  absl::Status wrote;
  std::thread writer([&] {
    for (float value = 2; !stop.load() && wrote.ok(); ++value) {
      wrote = [&]() -> absl::Status {
        ASSIGN_OR_RETURN(VersionWriter version, writer_client->Begin({"v"}));
        for (const int64_t begin : {int64_t{0}, kRows / 2}) {
          ASSIGN_OR_RETURN(Tensor half,
                           Tensor::Full({kRows / 2, kCols}, value));
          RETURN_IF_ERROR(version.view("v")->Write({begin, 0}, half));
        }
        ASSIGN_OR_RETURN(v1::VersionGroup group, version.Publish());
        published = group.versions(0).number();
        return absl::OkStatus();
      }();
    }
  });
  int64_t reads = 0;
  int64_t last = 0;
  absl::Status read_status;
  ASSERT_OK_AND_ASSIGN(ShardedTensorView view, reader_client->Open("v"));
  for (const absl::Time until = absl::Now() + absl::Seconds(3);
       absl::Now() < until && read_status.ok(); ++reads) {
    int64_t version = 0;
    TransferOptions options;
    options.version = &version;
    absl::StatusOr<Tensor> read = view.Read(options);
    if (!read.ok()) {
      read_status = read.status();
    } else if (!whole(*read, version) || version < last) {
      read_status = absl::DataLossError(
          absl::StrCat("read ", reads, " as version ", version, " after ", last,
                       " is not that version throughout"));
    }
    last = version;
  }
  stop = true;
  writer.join();
  ASSERT_OK(wrote);
  ASSERT_OK(read_status);
  std::cout << "[ hosts ] " << reads << " reads across hosts under "
            << published.load() - 1 << " publishes, 0 mixed\n";
  EXPECT_GT(published.load(), 2);

  ASSERT_OK(hosts_->SetLink(1, false));
  absl::Cleanup heal = [&] { hosts_->SetLink(1, true).IgnoreError(); };
  ASSERT_OK_AND_ASSIGN(ShardedTensorView latest, writer_client->Open("v"));
  int64_t version = 0;
  TransferOptions quick;
  quick.timeout = absl::Seconds(6);
  quick.version = &version;
  ASSERT_OK_AND_ASSIGN(Tensor during, latest.Read(quick));
  EXPECT_EQ(version, published.load());
  EXPECT_TRUE(whole(during, version));
}

}  // namespace
}  // namespace tessera
