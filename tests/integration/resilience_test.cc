// The cluster survives a stall or a death of one daemon without restarting
// the others: real `tessera-server` processes on loopback
// (tests/testing/daemon_cluster.h), a short --timeout, SIGSTOP / SIGCONT /
// SIGKILL.
//
// Covered: a daemon stalled longer than the timeout, then resumed: the
// operation in flight fails, operations meanwhile are refused at once
// naming the stalled rank, and within seconds of the resume the daemons
// form a new generation and every operation works again, with every value
// kept; a killed daemon is named at once by every later operation; with
// the store in a real etcd cluster (--store), rank 0 too restarts into the
// running cluster, and an etcd member's death goes unnoticed.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "client/region_transfer.h"
#include "client/shard_client.h"
#include "common/cancellation.h"
#include "common/sharding_spec.h"
#include "common/status_macros.h"
#include "common/tensor/tensor.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tessera/v1/control.grpc.pb.h"
#include "tests/testing/daemon_cluster.h"
#include "tests/testing/daemon_read.h"
#include "tests/testing/daemon_state.h"
#include "tests/testing/etcd_cluster.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/until_serving.h"
#include "wire/auth.h"
#include "wire/replicas.h"

namespace tessera {
namespace {

using ::tessera::testing::DaemonCluster;
using ::tessera::testing::DaemonClusterOptions;
using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::tessera::testing::StopProcess;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int kWorld = 3;
// The daemons' --timeout: a stall longer than this breaks a generation.
constexpr absl::Duration kTimeout = absl::Seconds(3);
// "At once": well before the clients' 30 s deadline (the bound is loose so
// that sanitizer builds on a busy machine pass; the promptness is measured
// by tests/bench/resilience_bench).
constexpr absl::Duration kAtOnce = absl::Seconds(5);

DaemonClusterOptions Options() {
  DaemonClusterOptions options;
  options.world_size = kWorld;
  options.server_path = TESSERA_SERVER_PATH;
  options.extra_args = {"--timeout",
                        absl::StrCat(absl::ToInt64Seconds(kTimeout)),
                        "--log-level", "warn"};
  return options;
}

ShardingSpec Rows() {
  std::vector<std::string> placements;
  for (int r = 0; r < kWorld; ++r) {
    placements.push_back(absl::StrCat("rank:", r, "/cpu"));
  }
  return *ChunkShardingSpec::Create(0, placements);
}

CreateOptions Sevens() {
  CreateOptions options;
  options.init = TensorInit::kFull;
  options.fill_value = 7;
  return options;
}

// Waits until `rank`'s own description of the cluster satisfies `done`.
bool WaitForState(const DaemonCluster& cluster, int rank,
                  const std::function<bool(const v1::ClusterInfo&)>& done,
                  absl::Duration timeout) {
  return testing::TimeUntilDaemonState(cluster.address(rank), done, absl::Now(),
                                       timeout)
      .ok();
}

// A cluster of Options(), a client of daemon `rank`, and a tensor "kept"
// of sevens over every daemon.
struct WithKept {
  std::unique_ptr<DaemonCluster> cluster;
  std::shared_ptr<Client> client;
};
absl::StatusOr<WithKept> StartWithKept(int rank, absl::Duration timeout) {
  WithKept started;
  ASSIGN_OR_RETURN(started.cluster, DaemonCluster::Start(Options()));
  ClientOptions client_options;
  client_options.timeout = timeout;
  ASSIGN_OR_RETURN(
      started.client,
      Client::Connect(started.cluster->address(rank), client_options));
  RETURN_IF_ERROR(
      started.client->Create("kept", {6, 4}, Rows(), Sevens()).status());
  return started;
}

// A cluster of Options() and a client of rank 0 whose calls end within
// `timeout`, without a tensor.
absl::StatusOr<WithKept> StartWithClient(absl::Duration timeout) {
  WithKept started;
  ASSIGN_OR_RETURN(started.cluster, DaemonCluster::Start(Options()));
  ClientOptions client_options;
  client_options.timeout = timeout;
  ASSIGN_OR_RETURN(started.client, Client::Connect(started.cluster->address(0),
                                                   client_options));
  return started;
}

// Sevens, with a copy of each shard on the next rank.
CreateOptions TwoCopies() {
  CreateOptions options = Sevens();
  options.copies = 2;
  return options;
}

// Re-forming, and past the first look at who is missing.
std::function<bool(const v1::ClusterInfo&)> WaitsFor(int rank) {
  return [rank](const v1::ClusterInfo& info) {
    return absl::StartsWith(info.state(), "re-forming") &&
           absl::StrContains(info.state(),
                             absl::StrCat("waits for ranks [", rank, "]"));
  };
}
const auto WaitsForRank2 = WaitsFor(2);

// Creates "after" (sevens over every daemon) until it works or 30 s after
// `since` pass (testing::UntilServing): the cluster serves again. The last
// error otherwise.
absl::Status CreateAfterUntilServing(Client& client, absl::Time since) {
  return testing::UntilServing(
      [&] {
        return client.Create("after", {6, 4}, Rows(), Sevens()).status();
      },
      since, absl::Seconds(30));
}

// A client of `rank` whose calls end within `timeout`: an operation held
// while the cluster waits for a daemon then ends, not applied.
std::shared_ptr<Client> Impatient(const DaemonCluster& cluster, int rank,
                                  absl::Duration timeout = absl::Seconds(3)) {
  ClientOptions options;
  options.timeout = timeout;
  absl::StatusOr<std::shared_ptr<Client>> client =
      Client::Connect(cluster.address(rank), options);
  EXPECT_OK(client.status());
  return client.ok() ? *client : nullptr;
}

// What a call held past its deadline says: not applied, naming the ranks.
::testing::Matcher<absl::Status> HeldAndNotApplied(const std::string& ranks) {
  return StatusIs(absl::StatusCode::kUnavailable,
                  AllOf(HasSubstr("was not applied"),
                        HasSubstr(absl::StrCat("ranks [", ranks, "]"))));
}

void ExpectAllSevens(const Client& client, const std::string& name) {
  absl::StatusOr<ShardedTensorView> view = client.Open(name);
  ASSERT_OK(view.status());
  absl::StatusOr<Tensor> values = view->Read();
  ASSERT_OK(values.status());
  const float* data = values->data<float>();
  for (int64_t i = 0; i < values->numel(); ++i) {
    ASSERT_EQ(data[i], 7.0f) << name << " element " << i;
  }
}

TEST(ResilienceTest, AStallLongerThanTheTimeoutHealsOnceTheDaemonResumes) {
  ASSERT_OK_AND_ASSIGN(WithKept started, StartWithKept(0, absl::Seconds(30)));
  auto& [cluster, client] = started;
  for (const auto& info : client->Clusters()) {
    ASSERT_OK(info.status());
    EXPECT_EQ(info->generation(), 1);
    EXPECT_EQ(info->state(), "serving");
  }

  const pid_t stalled = cluster->daemon(2).pid();
  ASSERT_OK(StopProcess(stalled));
  const absl::Time stalled_since = absl::Now();
  bool resumed = false;
  absl::Cleanup resume = [&] {
    if (!resumed) kill(stalled, SIGCONT);
  };
  // The operation in flight fails once the collective times out.
  absl::Time start = absl::Now();
  EXPECT_THAT(client->Create("during", {6, 4}, Rows()).status(), Not(IsOk()));
  EXPECT_LT(absl::Now() - start, kTimeout + absl::Seconds(5));
  // The others now wait for rank 2, and say so at once.
  ASSERT_TRUE(WaitForState(*cluster, 0, WaitsForRank2, absl::Seconds(10)))
      << cluster->Log(0);
  // A call meanwhile is held, and ends at its deadline, not applied.
  start = absl::Now();
  EXPECT_THAT(
      Impatient(*cluster, 0)->Create("refused", {6, 4}, Rows()).status(),
      AllOf(HeldAndNotApplied("2"),
            StatusIs(absl::StatusCode::kUnavailable, HasSubstr("re-forming"))));
  EXPECT_LT(absl::Now() - start, kAtOnce);
  // Reads of the shards the others hold go on.
  ASSERT_OK_AND_ASSIGN(ShardedTensorView kept, client->Open("kept"));
  ASSERT_OK_AND_ASSIGN(Tensor top, kept.ReadRegion({0, 0}, {4, 4}));
  EXPECT_EQ(top.data<float>()[15], 7.0f);

  // Resume, after a stall of twice the timeout: operations work again
  // within seconds, nobody restarted.
  absl::SleepFor(std::max(absl::ZeroDuration(),
                          stalled_since + 2 * kTimeout - absl::Now()));
  ASSERT_EQ(kill(stalled, SIGCONT), 0);
  resumed = true;
  start = absl::Now();
  ASSERT_OK(CreateAfterUntilServing(*client, start)) << cluster->Log(2);
  const absl::Duration healed = absl::Now() - start;
  EXPECT_LT(healed, absl::Seconds(10));
  std::cout << "[ resilience ] serving again " << healed
            << " after the stalled daemon resumed\n";
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(WaitForState(
        *cluster, r,
        [](const v1::ClusterInfo& info) {
          return info.generation() >= 2 && info.state() == "serving";
        },
        absl::Seconds(10)))
        << cluster->Log(r);
    // Every daemon lists the same tensors; "during" never took effect.
    ASSERT_OK_AND_ASSIGN(auto seen, Client::Connect(cluster->address(r)));
    ASSERT_OK_AND_ASSIGN(std::vector<ShardedTensorView> tensors, seen->List());
    std::vector<std::string> names;
    for (const ShardedTensorView& view : tensors) names.push_back(view.name());
    EXPECT_THAT(names, ::testing::ElementsAre("after", "kept")) << r;
  }
  ExpectAllSevens(*client, "kept");
  ExpectAllSevens(*client, "after");
  // Collectives, saves and deletes work in the new generation.
  ASSERT_OK_AND_ASSIGN(Tensor gathered, client->Gather("kept"));
  EXPECT_EQ(gathered.numel(), 24);
  ASSERT_OK(client->Save("after_stall").status());
  ASSERT_OK(client->Delete("after"));
}

// A killed daemon delays operations up to their deadline (it may come
// back: launch and systemd restart it); then they end, not applied, naming
// it.
TEST(ResilienceTest, EveryOperationNamesAKilledDaemonByItsDeadline) {
  ASSERT_OK_AND_ASSIGN(WithKept started, StartWithKept(0, absl::Seconds(30)));
  auto& [cluster, client] = started;
  cluster->Kill(2);
  // The first operation finds out (a closed connection, or the timeout).
  absl::Time start = absl::Now();
  EXPECT_THAT(client->Create("first", {6, 4}, Rows()).status(), Not(IsOk()));
  EXPECT_LT(absl::Now() - start, kTimeout + absl::Seconds(5));
  ASSERT_TRUE(WaitForState(*cluster, 0, WaitsForRank2, absl::Seconds(10)))
      << cluster->Log(0);
  const std::shared_ptr<Client> impatient = Impatient(*cluster, 0);
  for (int i = 0; i < 3; ++i) {
    start = absl::Now();
    EXPECT_THAT(impatient->Delete("kept"), HeldAndNotApplied("2"));
    EXPECT_LT(absl::Now() - start, kAtOnce);
  }
  // The dead daemon answers nothing; the live ones say whom they wait for.
  ASSERT_TRUE(WaitForState(*cluster, 1, WaitsForRank2, absl::Seconds(10)))
      << cluster->Log(1);
  std::vector<absl::StatusOr<v1::ClusterInfo>> clusters = client->Clusters();
  EXPECT_THAT(clusters[2].status(), Not(IsOk()));
  for (int r = 0; r < 2; ++r) {
    ASSERT_OK(clusters[r].status());
    EXPECT_THAT(clusters[r]->state(), HasSubstr("waits for ranks [2]"));
  }

  // Restarted after the others noticed: they form the next generation with
  // it, and the tensor whose shard it lost can be deleted.
  const absl::Time restart = absl::Now();
  ASSERT_OK(cluster->Restart(2));
  absl::Status deleted;
  while (absl::Now() - restart < absl::Seconds(20)) {
    deleted = client->Delete("kept");
    if (deleted.ok()) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_OK(deleted);
  EXPECT_LT(absl::Now() - restart, absl::Seconds(10));
  ASSERT_OK_AND_ASSIGN(auto again, Client::Connect(cluster->address(0)));
  ASSERT_OK(again->Create("new", {6, 4}, Rows(), Sevens()).status());
  ExpectAllSevens(*again, "new");
}

// Rank 0 serves the store: with it dead, an operation fails within seconds
// naming the store, not at its deadline.
TEST(ResilienceTest, AnOperationNeedingADeadStoreFailsInSeconds) {
  ASSERT_OK_AND_ASSIGN(WithKept started, StartWithKept(1, absl::Seconds(60)));
  auto& [cluster, client] = started;
  cluster->Kill(0);
  const absl::Time start = absl::Now();
  EXPECT_THAT(client->Create("after", {6, 4}, Rows()).status(),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr(absl::StrCat("store server at ",
                                              cluster->store_address()))));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

// A write spanning a stalled owner is not atomic: the error names every box
// written and every box not written, whether the client fans the write out
// itself or asks one daemon to.
TEST(ResilienceTest, ATornWriteNamesTheBoxesWrittenAndNot) {
  ASSERT_OK_AND_ASSIGN(auto cluster, DaemonCluster::Start(Options()));
  ASSERT_OK_AND_ASSIGN(auto client, Client::Connect(cluster->address(0)));
  ASSERT_OK_AND_ASSIGN(ShardedTensorView view,
                       client->Create("torn", {6, 4}, Rows(), Sevens()));
  ASSERT_OK_AND_ASSIGN(Tensor ones, Tensor::Full({6, 4}, 1.0));

  const pid_t stalled = cluster->daemon(2).pid();
  ASSERT_OK(StopProcess(stalled));
  absl::Cleanup resume = [&] { kill(stalled, SIGCONT); };
  TransferOptions options;
  options.timeout = absl::Seconds(2);
  absl::Status written = view.Write({0, 0}, ones, options);
  EXPECT_THAT(
      written,
      StatusIs(absl::StatusCode::kDeadlineExceeded,
               AllOf(HasSubstr("writing tensor torn: 2 of 3 boxes written"),
                     HasSubstr("not written: [4:6, 0:4] on rank 2 (127.0.0.1:"),
                     HasSubstr("written: [0:2, 0:4] on rank 0 (127.0.0.1:"),
                     HasSubstr("[2:4, 0:4] on rank 1 (127.0.0.1:"))));

  // Through one daemon, which forwards the others' boxes.
  ASSERT_OK_AND_ASSIGN(Tensor twos, Tensor::Full({6, 4}, 2.0));
  std::unique_ptr<v1::ControlService::Stub> stub =
      v1::ControlService::NewStub(CreateTesseraChannel(cluster->address(0)));
  RegionWriteOptions forward;
  forward.deadline = absl::Now() + absl::Seconds(3);
  EXPECT_THAT(
      WriteRegion(*stub, "torn", view.tensor_id(), {0, 0}, twos, forward)
          .status(),
      StatusIs(absl::StatusCode::kDeadlineExceeded,
               AllOf(HasSubstr("2 of 3 boxes written"),
                     HasSubstr("not written: [4:6, 0:4] on rank 2 (127.0.0.1:"),
                     HasSubstr("written: [0:2, 0:4] on rank 0 (this daemon)"),
                     HasSubstr("[2:4, 0:4] on rank 1 (127.0.0.1:"))));

  std::move(resume).Invoke();
  // What the errors said is what the tensor holds.
  ASSERT_OK_AND_ASSIGN(Tensor values, view.Read());
  const float* data = values.data<float>();
  for (int64_t i = 0; i < 24; ++i) {
    EXPECT_EQ(data[i], i < 16 ? 2.0f : 7.0f) << "element " << i;
  }
}

// A killed daemon restarted with the same rank (systemd, Kubernetes) joins
// the running cluster: nobody else restarts, its lost shards are reported,
// not invented, and a checkpoint heals them.
TEST(ResilienceTest, AKilledDaemonRestartsIntoTheRunningCluster) {
  ASSERT_OK_AND_ASSIGN(auto cluster, DaemonCluster::Start(Options()));
  {
    ASSERT_OK_AND_ASSIGN(auto client, Client::Connect(cluster->address(0)));
    ASSERT_OK(client->Create("spread", {6, 4}, Rows(), Sevens()).status());
    ASSERT_OK(client
                  ->Create("elsewhere", {4, 4},
                           *ChunkShardingSpec::Create(
                               0, std::vector<std::string>{"rank:0/cpu",
                                                           "rank:1/cpu"}),
                           Sevens())
                  .status());
    ASSERT_OK(client->Save("before").status());
  }
  cluster->Kill(2);
  const absl::Time killed = absl::Now();
  ASSERT_OK(cluster->Restart(2)) << cluster->Log(2);
  const absl::Time restarted = absl::Now();
  ClientOptions client_options;
  client_options.timeout = absl::Seconds(10);
  ASSERT_OK_AND_ASSIGN(auto client,
                       Client::Connect(cluster->address(0), client_options));
  const absl::Status created = CreateAfterUntilServing(*client, restarted);
  ASSERT_OK(created) << cluster->Log(0) << cluster->Log(2);
  std::cout << "[ resilience ] serving again " << absl::Now() - restarted
            << " after the restart (" << absl::Now() - killed
            << " after the kill)\n";
  EXPECT_LT(absl::Now() - restarted, absl::Seconds(10));

  for (int r = 0; r < kWorld; ++r) {
    ASSERT_OK_AND_ASSIGN(auto seen, Client::Connect(cluster->address(r)));
    EXPECT_GE(seen->cluster().generation(), 2) << r;
    ASSERT_OK_AND_ASSIGN(std::vector<ShardedTensorView> tensors, seen->List());
    std::vector<std::string> names;
    for (const ShardedTensorView& view : tensors) names.push_back(view.name());
    EXPECT_THAT(names, ::testing::ElementsAre("after", "elsewhere", "spread"))
        << r;
    // Tensors without shards on the restarted daemon are whole; the
    // restarted one's shard of "spread" is lost, and says so.
    ExpectAllSevens(*seen, "elsewhere");
    ExpectAllSevens(*seen, "after");
    ASSERT_OK_AND_ASSIGN(ShardedTensorView spread, seen->Open("spread"));
    EXPECT_TRUE(spread.degraded());
    EXPECT_THAT(spread.info().lost_shards(), ::testing::ElementsAre(2));
    ASSERT_OK_AND_ASSIGN(Tensor top, spread.ReadRegion({0, 0}, {4, 4}));
    EXPECT_EQ(top.data<float>()[15], 7.0f);
    EXPECT_THAT(spread.Read().status(),
                StatusIs(absl::StatusCode::kUnavailable,
                         AllOf(HasSubstr("degraded"),
                               HasSubstr("shard 2 [4:6, 0:4] of rank 2"))));
  }
  // Operations that need the lost shard refuse; the rest work.
  EXPECT_THAT(
      client->Gather("spread").status(),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               HasSubstr("shards [2] were lost when rank 2 restarted")));
  EXPECT_THAT(client->Save("all").status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("[spread] are degraded")));
  EXPECT_OK(client->Save("some", {"elsewhere", "after"}).status());
  ASSERT_OK_AND_ASSIGN(Tensor gathered, client->Gather("after"));
  EXPECT_EQ(gathered.numel(), 24);
  // The checkpoint heals it.
  v1::LoadCheckpointRequest load;
  load.set_path("before");
  load.add_names("spread");
  load.set_replace(true);
  ASSERT_OK(client->Load(load).status());
  ASSERT_OK_AND_ASSIGN(ShardedTensorView healed, client->Open("spread"));
  EXPECT_FALSE(healed.degraded());
  ExpectAllSevens(*client, "spread");
}

// Replicas (create --copies 2): every shard has a copy on another daemon.
// A stalled owner's shard is read from its replica; a dead owner's shard is
// read and written through its replica; the restarted owner refills its
// shard and its own replicas from the others and serves them again.
// The client's three ways to a daemon's bytes, for tests run over each.
struct Transport {
  const char* name;
  bool data_plane;
  bool local_path;
};
constexpr Transport kTransports[] = {
    {"grpc", false, false}, {"data plane", true, false}, {"local", true, true}};
// A client that takes `transport` for every box, however small.
ClientOptions OptionsFor(const Transport& transport) {
  ClientOptions options;
  options.data_plane = transport.data_plane;
  options.use_local_path = transport.local_path;
  options.local_min_bytes = 0;
  return options;
}

Tensor Rows6x4(float base) {
  std::vector<float> values(24);
  for (int i = 0; i < 24; ++i) values[i] = base + static_cast<float>(i);
  return *Tensor::FromVector<float>(absl::MakeConstSpan(values), {6, 4});
}

std::vector<float> Floats(const Tensor& t) {
  absl::StatusOr<Tensor> dense = t.Contiguous();
  const float* data = dense->data<float>();
  return std::vector<float>(data, data + dense->numel());
}

TEST(ResilienceTest, ReplicasServeADeadOrStalledOwnersShardsAndRefillIt) {
  ASSERT_OK_AND_ASSIGN(WithKept started, StartWithClient(absl::Seconds(10)));
  DaemonCluster* cluster = started.cluster.get();
  const std::shared_ptr<Client>& client = started.client;
  const CreateOptions two = TwoCopies();
  for (const int bad : {-1, kWorld + 1}) {
    CreateOptions wrong = two;
    wrong.copies = bad;
    EXPECT_THAT(client->Create("wrong", {6, 4}, Rows(), wrong).status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("copies must be between 1 and the 3")));
  }
  // Random values come from the owners, so copies are equal to them.
  CreateOptions randn;
  randn.init = TensorInit::kRandn;
  randn.seed = 7;
  randn.copies = 2;
  ASSERT_OK_AND_ASSIGN(ShardedTensorView noise,
                       client->Create("noise", {6, 4}, Rows(), randn));
  ASSERT_OK_AND_ASSIGN(ShardedTensorView view,
                       client->Create("r", {6, 4}, Rows(), two));
  ASSERT_EQ(view.info().replicas_size(), kWorld);
  for (int shard = 0; shard < kWorld; ++shard) {
    // One host: the next rank holds the copy.
    EXPECT_THAT(view.info().replicas(shard).ranks(),
                ::testing::ElementsAre((shard + 1) % kWorld));
  }
  ASSERT_OK_AND_ASSIGN(Tensor noise_values, noise.Read());
  auto replica_of = [&](int holder, const ShardedTensorView& v,
                        int shard) -> absl::StatusOr<Tensor> {
    ASSIGN_OR_RETURN(Shard copy,
                     ShardClient::Create(cluster->address(holder))
                         ->FetchShard(ReplicaTensorId(v.tensor_id()), shard));
    return copy.tensor;
  };
  ASSERT_OK_AND_ASSIGN(Tensor noise_copy, replica_of(0, noise, 2));
  ASSERT_OK_AND_ASSIGN(Tensor noise_rows, noise.ReadRegion({4, 0}, {2, 4}));
  EXPECT_EQ(Floats(noise_copy), Floats(noise_rows));

  // Writes reach every copy.
  const Tensor first = Rows6x4(100);
  ASSERT_OK(view.Write({0, 0}, first));
  ASSERT_OK_AND_ASSIGN(Tensor copy_of_2, replica_of(0, view, 2));
  ASSERT_OK_AND_ASSIGN(Tensor rows_4_6, first.Narrow(0, 4, 2));
  EXPECT_EQ(Floats(copy_of_2), Floats(rows_4_6));

  // A stalled owner: its shard comes from the replica within the deadline.
  {
    absl::Cleanup resume = [&] { cluster->Resume(1); };
    ASSERT_OK(cluster->Stop(1));
    TransferOptions quick;
    quick.timeout = absl::Seconds(4);
    const absl::Time start = absl::Now();
    ASSERT_OK_AND_ASSIGN(Tensor read, view.ReadRegion({2, 0}, {2, 4}, quick));
    ASSERT_OK_AND_ASSIGN(Tensor rows_2_4, first.Narrow(0, 2, 2));
    EXPECT_EQ(Floats(read), Floats(rows_2_4));
    EXPECT_LT(absl::Now() - start, absl::Seconds(4));
  }

  // A dead owner: reads and writes go through its replica.
  cluster->Kill(2);
  ASSERT_OK_AND_ASSIGN(Tensor whole, view.Read());
  EXPECT_EQ(Floats(whole), Floats(first));
  const Tensor second = Rows6x4(200);
  ASSERT_OK(view.Write({0, 0}, second));
  ASSERT_OK_AND_ASSIGN(whole, view.Read());
  EXPECT_EQ(Floats(whole), Floats(second));

  // The restarted owner refills its shard and its replica of shard 1.
  ASSERT_OK(cluster->Restart(2)) << cluster->Log(2);
  const absl::Time restarted = absl::Now();
  ASSERT_OK(CreateAfterUntilServing(*client, restarted))
      << cluster->Log(0) << cluster->Log(2);
  ASSERT_OK_AND_ASSIGN(auto from2, Client::Connect(cluster->address(2)));
  ASSERT_OK_AND_ASSIGN(ShardedTensorView seen, from2->Open("r"));
  EXPECT_FALSE(seen.degraded());
  ASSERT_OK_AND_ASSIGN(Shard own, ShardClient::Create(cluster->address(2))
                                      ->FetchShard(seen.tensor_id(), 2));
  ASSERT_OK_AND_ASSIGN(Tensor second_4_6, second.Narrow(0, 4, 2));
  EXPECT_EQ(Floats(own.tensor), Floats(second_4_6));
  ASSERT_OK_AND_ASSIGN(Tensor copy_of_1, replica_of(2, seen, 1));
  ASSERT_OK_AND_ASSIGN(Tensor second_2_4, second.Narrow(0, 2, 2));
  EXPECT_EQ(Floats(copy_of_1), Floats(second_2_4));
  ASSERT_OK_AND_ASSIGN(Tensor noise_again, client->Open("noise")->Read());
  EXPECT_EQ(Floats(noise_again), Floats(noise_values));

  // Resharding keeps two copies of each new shard.
  ASSERT_OK_AND_ASSIGN(
      ShardedTensorView columns,
      client->Reshard(
          "r", *ChunkShardingSpec::Create(
                   1, std::vector<std::string>{"rank:0/cpu", "rank:1/cpu"})));
  EXPECT_EQ(CopiesOf(columns.info()), 2);
  ASSERT_OK_AND_ASSIGN(Tensor copy_of_cols, replica_of(1, columns, 0));
  ASSERT_OK_AND_ASSIGN(Tensor left, second.Narrow(1, 0, 2));
  EXPECT_EQ(Floats(copy_of_cols), Floats(left));
}

// A daemon killed while a reshard of a tensor with two copies runs, at
// several moments: the tensor is never lost (a reshard that committed on
// some daemons only was dropped everywhere before ops in doubt were
// decided, docs/control_log.md), its values are the same, and once the
// daemon is back its layout is the new one exactly when GetOperation says
// the reshard committed.
TEST(ResilienceTest, AReshardDuringADeathEndsOneWayEverywhere) {
  ASSERT_OK_AND_ASSIGN(WithKept started, StartWithClient(absl::Seconds(30)));
  DaemonCluster* cluster = started.cluster.get();
  Client& patient = *started.client;
  const Tensor values = Rows6x4(100);
  const ShardingSpec columns = *ChunkShardingSpec::Create(
      1, std::vector<std::string>{"rank:0/cpu", "rank:1/cpu"});
  for (const int delay_ms : {0, 1, 3, 6}) {
    SCOPED_TRACE(absl::StrCat("killed after ", delay_ms, " ms"));
    const std::string name = absl::StrCat("r", delay_ms);
    ASSERT_OK_AND_ASSIGN(ShardedTensorView view,
                         patient.Create(name, {6, 4}, Rows(), TwoCopies()));
    ASSERT_OK(view.Write({0, 0}, values));
    ClientOptions options;
    options.timeout = absl::Seconds(4);
    options.request_id = absl::StrCat("reshard-", delay_ms);
    ASSERT_OK_AND_ASSIGN(auto impatient,
                         Client::Connect(cluster->address(0), options));
    absl::StatusOr<ShardedTensorView> resharded;
    std::thread reshard([&] { resharded = impatient->Reshard(name, columns); });
    absl::SleepFor(absl::Milliseconds(delay_ms));
    cluster->Kill(2);
    reshard.join();
    std::cout << "[ resilience ] reshard with rank 2 killed after " << delay_ms
              << " ms: "
              << (resharded.ok() ? "committed"
                                 : resharded.status().ToString().substr(0, 90))
              << "\n";
    ASSERT_OK(cluster->Restart(2)) << cluster->Log(2);
    ASSERT_OK(CreateAfterUntilServing(patient, absl::Now())) << cluster->Log(0);
    ASSERT_OK(patient.Delete("after"));
    // Never dropped; the values whatever the layout.
    absl::StatusOr<ShardedTensorView> opened = patient.Open(name);
    ASSERT_OK(opened.status()) << cluster->Log(0);
    const ShardedTensorView& now = *opened;
    ASSERT_OK_AND_ASSIGN(Tensor read, now.Read());
    EXPECT_EQ(Floats(read), Floats(values));
    const bool new_layout = now.info().shard_ranks_size() == 2;
    ASSERT_OK_AND_ASSIGN(v1::OperationStatus op,
                         patient.Operation(options.request_id));
    // Not committed: failed, or never logged (held until its deadline).
    if (new_layout) {
      EXPECT_EQ(op.state(), v1::OperationStatus::STATE_COMMITTED)
          << op.DebugString();
    } else {
      EXPECT_NE(op.state(), v1::OperationStatus::STATE_COMMITTED)
          << op.DebugString();
    }
    if (resharded.ok()) {
      EXPECT_TRUE(new_layout);
    } else if (!absl::IsDeadlineExceeded(resharded.status())) {
      EXPECT_FALSE(new_layout) << resharded.status();
    }
    // Every daemon describes the same layout.
    for (int rank = 0; rank < kWorld; ++rank) {
      ASSERT_OK_AND_ASSIGN(auto there, Client::Connect(cluster->address(rank)));
      ASSERT_OK_AND_ASSIGN(ShardedTensorView seen, there->Open(name));
      EXPECT_EQ(seen.tensor_id(), now.tensor_id()) << rank;
    }
  }
}

// A write to a tensor with two copies while the holder of one copy is
// stalled for less than the holder patience (2 s) waits for it and
// succeeds; once it resumes, both copies hold the new bytes (a longer
// stall: AWriteOutlivesAHolderStalledPastItsDeadline).
TEST(ResilienceTest, AReplicatedWriteWaitsOutABriefStallOfAHolder) {
  DaemonClusterOptions options = Options();
  options.extra_args = {"--timeout", "10", "--log-level", "warn"};
  ASSERT_OK_AND_ASSIGN(auto cluster, DaemonCluster::Start(options));
  ClientOptions client_options;
  client_options.timeout = absl::Seconds(25);
  ASSERT_OK_AND_ASSIGN(auto client,
                       Client::Connect(cluster->address(0), client_options));
  CreateOptions two = Sevens();
  two.copies = 2;
  ASSERT_OK_AND_ASSIGN(ShardedTensorView view,
                       client->Create("r", {6, 4}, Rows(), two));
  // Rank 2 holds shard 2 and the copy of shard 1; rank 1 the copy of 0.
  // A stall shorter than the holder patience (2 s) is waited out: every
  // copy takes the write.
  for (const int stalled : {2, 1}) {
    const Tensor values = Rows6x4(100 * stalled);
    ASSERT_OK(StopProcess(cluster->daemon(stalled).pid()));
    absl::Cleanup resume = [&] {
      kill(cluster->daemon(stalled).pid(), SIGCONT);
    };
    std::thread resumer([&] {
      absl::SleepFor(absl::Milliseconds(700));
      kill(cluster->daemon(stalled).pid(), SIGCONT);
    });
    const absl::Time start = absl::Now();
    EXPECT_OK(view.Write({0, 0}, values)) << "rank " << stalled << " stalled";
    resumer.join();
    std::cout << "[ resilience ] a write with rank " << stalled
              << " stalled for 0.7 s took " << absl::Now() - start << "\n";
    ASSERT_OK_AND_ASSIGN(Tensor read, view.Read());
    EXPECT_EQ(Floats(read), Floats(values));
    for (int shard = 0; shard < kWorld; ++shard) {
      const int holder = (shard + 1) % kWorld;
      ASSERT_OK_AND_ASSIGN(
          Shard copy,
          ShardClient::Create(cluster->address(holder))
              ->FetchShard(ReplicaTensorId(view.tensor_id()), shard));
      ASSERT_OK_AND_ASSIGN(Tensor rows, values.Narrow(0, 2 * shard, 2));
      EXPECT_EQ(Floats(copy.tensor), Floats(rows)) << "copy of " << shard;
    }
  }
}

// A holder stalled past a write's deadline: the write succeeds once the
// other holder of each piece took it and the stalled one is marked stale
// (docs/control_log.md, "Replicas"); the stalled daemon, resumed, never
// serves the bytes it missed, and serves again once refilled.
TEST(ResilienceTest, AWriteOutlivesAHolderStalledPastItsDeadline) {
  ASSERT_OK_AND_ASSIGN(WithKept started, StartWithClient(absl::Seconds(20)));
  DaemonCluster* cluster = started.cluster.get();
  // 8 MiB a shard: its refill takes long enough to be asked during it.
  const std::vector<int64_t> sizes = {4 * 1024, 2048};
  ASSERT_OK_AND_ASSIGN(ShardedTensorView view,
                       started.client->Create("r", sizes, Rows(), TwoCopies()));
  const auto filled = [&](float value) {
    return *Tensor::Full(sizes, value,
                         TensorOptions().WithDType(DType::kFloat32));
  };
  // Rank 2 owns shard 2 and holds the copy of shard 1.
  const int stalled = 2;
  ASSERT_OK(view.Write({0, 0}, filled(1)));

  ASSERT_OK(StopProcess(cluster->daemon(stalled).pid()));
  absl::Cleanup resume = [&] { kill(cluster->daemon(stalled).pid(), SIGCONT); };
  TransferOptions eight;
  eight.timeout = absl::Seconds(8);
  const absl::Time start = absl::Now();
  ASSERT_OK(view.Write({0, 0}, filled(2), eight));
  const absl::Duration took = absl::Now() - start;
  std::cout << "[ resilience ] a write with rank 2 stalled took " << took
            << "\n";
  EXPECT_LT(took, eight.timeout);

  // Asks rank 2 for its shard and its copy until both hold the write;
  // they must never give a byte from before it.
  std::atomic<int> old_bytes{0};
  std::atomic<int> refused{0};
  std::atomic<bool> refilled{false};
  const auto ask = [&](const std::string& id, int shard) {
    const std::shared_ptr<ShardClient> shards =
        ShardClient::Create(cluster->address(stalled));
    const absl::Time give_up = absl::Now() + absl::Seconds(40);
    while (absl::Now() < give_up && !refilled) {
      FetchOptions quick;
      quick.timeout = absl::Seconds(8);
      absl::StatusOr<Shard> got = shards->FetchShard(id, shard, quick);
      if (!got.ok()) {
        ++refused;
        absl::SleepFor(absl::Milliseconds(5));
        continue;
      }
      const std::vector<float> values = Floats(got->tensor);
      if (std::count(values.begin(), values.end(), 1.0f) > 0) ++old_bytes;
      if (std::count(values.begin(), values.end(), 2.0f) ==
          static_cast<int64_t>(values.size())) {
        return true;
      }
    }
    return false;
  };
  std::atomic<int> done{0};
  std::thread own_asker([&] { done += ask(view.tensor_id(), 2); });
  std::thread copy_asker(
      [&] { done += ask(ReplicaTensorId(view.tensor_id()), 1); });
  // Their first requests wait in the stalled daemon's sockets; it stays
  // stalled past the write's deadline.
  absl::SleepFor(std::max(absl::Milliseconds(300), eight.timeout - took));
  ASSERT_EQ(kill(cluster->daemon(stalled).pid(), SIGCONT), 0);
  own_asker.join();
  copy_asker.join();
  EXPECT_EQ(old_bytes.load(), 0) << cluster->Log(stalled);
  EXPECT_EQ(done.load(), 2) << cluster->Log(stalled);
  std::cout << "[ resilience ] the resumed daemon refused " << refused.load()
            << " reads before it was refilled\n";
  ASSERT_OK_AND_ASSIGN(Tensor read, view.ReadRegion({2048, 0}, {2048, 2048}));
  const std::vector<float> values = Floats(read);
  EXPECT_EQ(std::count(values.begin(), values.end(), 2.0f),
            static_cast<int64_t>(values.size()));
  // And it takes later writes like any holder.
  ASSERT_OK(view.Write({0, 0}, filled(3)));
  ASSERT_OK_AND_ASSIGN(Shard copy,
                       ShardClient::Create(cluster->address(stalled))
                           ->FetchShard(ReplicaTensorId(view.tensor_id()), 1));
  const std::vector<float> copied = Floats(copy.tensor);
  EXPECT_EQ(std::count(copied.begin(), copied.end(), 3.0f),
            static_cast<int64_t>(copied.size()));
}

// Four daemons, the tensor "r" (6x4 rows, two copies of each shard)
// written through rank 1, then rank 0, which serves the store, stalled:
// nobody can look at their stale marks. Resumed when this goes.
struct StalledStore {
  ~StalledStore() { Resume(); }
  void Resume() {
    if (cluster != nullptr) kill(cluster->daemon(0).pid(), SIGCONT);
  }
  std::unique_ptr<DaemonCluster> cluster;
  std::shared_ptr<Client> client;
  std::optional<ShardedTensorView> view;
  Tensor values = Rows6x4(100);
};

absl::StatusOr<std::unique_ptr<StalledStore>> StallTheStoreOfCopies() {
  DaemonClusterOptions options = Options();
  options.extra_args = {"--timeout", "30", "--log-level", "warn"};
  auto stalled = std::make_unique<StalledStore>();
  ASSIGN_OR_RETURN(stalled->cluster, DaemonCluster::Start(options));
  ClientOptions client_options;
  client_options.timeout = absl::Seconds(25);
  ASSIGN_OR_RETURN(
      stalled->client,
      Client::Connect(stalled->cluster->address(1), client_options));
  ASSIGN_OR_RETURN(stalled->view,
                   stalled->client->Create("r", {6, 4}, Rows(), TwoCopies()));
  RETURN_IF_ERROR(stalled->view->Write({0, 0}, stalled->values));
  RETURN_IF_ERROR(stalled->cluster->Stop(0));
  return stalled;
}

// Copies are served only while their daemon has looked at its stale marks
// within the fence; with the store's daemon (rank 0) stalled, nobody can
// look, so reads of a tensor with copies wait for the store instead of
// failing, and complete once it is back.
TEST(ResilienceTest, AReadOfCopiesWaitsOutAStalledStore) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<StalledStore> stalled,
                       StallTheStoreOfCopies());
  std::thread resumer([&] {
    absl::SleepFor(absl::Seconds(4));
    stalled->Resume();
  });
  const absl::Time start = absl::Now();
  absl::StatusOr<Tensor> read = stalled->view->Read();
  const absl::Duration took = absl::Now() - start;
  resumer.join();
  ASSERT_OK(read.status()) << stalled->cluster->Log(1);
  EXPECT_EQ(Floats(*read), Floats(stalled->values));
  std::cout << "[ resilience ] a read of copies with the store stalled 4 s "
               "took "
            << took << "\n";
}

// A gRPC fetch of a copy that waits for its daemon to look at the store
// waits on a thread of its own call, not on gRPC's callback threads: with
// many such fetches waiting, the daemon's other callback methods still
// answer at once, and the fetches complete once the store is back.
TEST(ResilienceTest, FetchesWaitingForTheStoreHoldNoGrpcCallbackThread) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<StalledStore> stalled,
                       StallTheStoreOfCopies());
  DaemonCluster* const cluster = stalled->cluster.get();
  const ShardedTensorView& view = *stalled->view;
  absl::SleepFor(absl::Seconds(3));  // past the 2 s fence
  // Rank 1 owns shard 1 and holds the copy of shard 0; over gRPC alone.
  const std::shared_ptr<ShardClient> grpc_only =
      ShardClient::Create(cluster->address(1));
  constexpr int kWaiting = 64;
  std::atomic<int> fetched{0};
  std::vector<std::thread> waiting;
  for (int i = 0; i < kWaiting; ++i) {
    waiting.emplace_back([&, i] {
      FetchOptions patient;
      patient.timeout = absl::Seconds(25);
      const std::string id =
          i % 2 == 0 ? view.tensor_id() : ReplicaTensorId(view.tensor_id());
      absl::StatusOr<Shard> got =
          grpc_only->FetchShard(id, i % 2 == 0 ? 1 : 0, patient);
      if (got.ok()) ++fetched;
    });
  }
  absl::SleepFor(absl::Seconds(1));  // every fetch is waiting by now
  const absl::Time asked = absl::Now();
  EXPECT_OK(
      grpc_only->DescribeTensor(view.tensor_id(), absl::Seconds(5)).status());
  const absl::Duration answered = absl::Now() - asked;
  EXPECT_LT(answered, absl::Seconds(1)) << cluster->Log(1);
  EXPECT_EQ(fetched.load(), 0);  // still waiting for the store
  stalled->Resume();
  for (std::thread& thread : waiting) thread.join();
  EXPECT_EQ(fetched.load(), kWaiting) << cluster->Log(1);
  std::cout << "[ resilience ] with " << kWaiting
            << " gRPC fetches waiting for the store, DescribeTensor took "
            << answered << "\n";
}

// With replicas, a read whose owner is stalled moves to the replica once
// the owner moved no byte for the client's holder_patience (2 s by
// default), over every transport, even with the default transfer deadline
// of 300 s; with every holder stalled, the read still ends at its deadline.
TEST(ResilienceTest, AStalledOwnerCostsThePatienceNotTheDeadline) {
  DaemonClusterOptions options = Options();
  options.extra_args = {"--timeout", "30", "--log-level", "warn"};
  ASSERT_OK_AND_ASSIGN(auto cluster, DaemonCluster::Start(options));
  std::vector<std::shared_ptr<Client>> clients;
  for (const Transport& transport : kTransports) {
    ASSERT_OK_AND_ASSIGN(
        clients.emplace_back(),
        Client::Connect(cluster->address(0), OptionsFor(transport)));
  }
  CreateOptions two = Sevens();
  two.copies = 2;
  ASSERT_OK_AND_ASSIGN(ShardedTensorView created,
                       clients[0]->Create("r", {6, 4}, Rows(), two));
  const Tensor values = Rows6x4(300);
  ASSERT_OK(created.Write({0, 0}, values));
  std::vector<ShardedTensorView> views;
  for (const auto& client : clients) {
    ASSERT_OK_AND_ASSIGN(ShardedTensorView view, client->Open("r"));
    views.push_back(view);
  }

  // Rank 1 owns rows 2-4; rank 2 holds their copy.
  {
    ASSERT_OK(StopProcess(cluster->daemon(1).pid()));
    absl::Cleanup resume = [&] { kill(cluster->daemon(1).pid(), SIGCONT); };
    for (size_t t = 0; t < views.size(); ++t) {
      const absl::Time start = absl::Now();
      SCOPED_TRACE(kTransports[t].name);
      ASSERT_OK_AND_ASSIGN(Tensor read, views[t].Read());
      const absl::Duration took = absl::Now() - start;
      EXPECT_EQ(Floats(read), Floats(values)) << kTransports[t].name;
      std::cout << "[ resilience ] a read over " << kTransports[t].name
                << " with its owner stalled took " << took << "\n";
      // About the patience (2 s) when the owner's transport waits on it;
      // less when it fails at once (a gRPC channel that was never
      // connected). Never the deadline's share (150 s).
      EXPECT_LT(took, absl::Seconds(10)) << kTransports[t].name;
    }

    // A daemon reading for a client (ControlService.ReadRegion) moves on
    // the same way.
    {
      const absl::Time start = absl::Now();
      ASSERT_OK_AND_ASSIGN(const std::string bytes,
                           testing::ReadRegionThroughDaemon(
                               cluster->address(0), "r", created.tensor_id(),
                               {2, 0}, {2, 4}, absl::Seconds(20)));
      EXPECT_LT(absl::Now() - start, absl::Seconds(10));
      ASSERT_OK_AND_ASSIGN(Tensor rows, values.Narrow(0, 2, 2));
      ASSERT_OK_AND_ASSIGN(Tensor dense, rows.Contiguous());
      ASSERT_EQ(bytes.size(), dense.nbytes());
      EXPECT_EQ(std::memcmp(bytes.data(), dense.data_ptr(), bytes.size()), 0);
    }

    // Both holders of rows 2-4 stalled: the deadline ends the read.
    ASSERT_OK(StopProcess(cluster->daemon(2).pid()));
    absl::Cleanup resume2 = [&] { kill(cluster->daemon(2).pid(), SIGCONT); };
    TransferOptions quick;
    quick.timeout = absl::Seconds(5);
    const absl::Time start = absl::Now();
    EXPECT_THAT(views[1].ReadRegion({2, 0}, {2, 4}, quick).status(),
                StatusIs(absl::StatusCode::kDeadlineExceeded,
                         HasSubstr("replica rank 2")));
    EXPECT_LT(absl::Now() - start, absl::Seconds(9));
  }
  // Once resumed, the owner serves again.
  ASSERT_OK_AND_ASSIGN(Tensor again, views[1].ReadRegion({2, 0}, {2, 4}));
  ASSERT_OK_AND_ASSIGN(Tensor rows, values.Narrow(0, 2, 2));
  EXPECT_EQ(Floats(again), Floats(rows));
}

// Every value of a tensor with two copies survives owners killed while
// reads and writes run, and the restarted owners' refills (in the
// background: writes that arrive meanwhile are kept).
TEST(ResilienceTest,
     ReplicasKeepEveryValueThroughKillsMidReadMidWriteAndRefill) {
  ASSERT_OK_AND_ASSIGN(auto cluster, DaemonCluster::Start(Options()));
  ClientOptions client_options;
  client_options.timeout = absl::Seconds(20);
  ASSERT_OK_AND_ASSIGN(auto client,
                       Client::Connect(cluster->address(0), client_options));
  constexpr int64_t kRows = 3 * 512;  // 2 MiB per shard
  constexpr int64_t kColumns = 1024;
  CreateOptions two;
  two.copies = 2;
  ASSERT_OK_AND_ASSIGN(ShardedTensorView view,
                       client->Create("big", {kRows, kColumns}, Rows(), two));
  auto pattern = [&](float base) {
    Tensor t = *Tensor::Empty({kRows, kColumns});
    float* data = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      data[i] = base + static_cast<float>(i % 4099);
    }
    return t;
  };
  TransferOptions transfer;
  transfer.timeout = absl::Seconds(20);
  const Tensor a = pattern(1);
  ASSERT_OK(view.Write({0, 0}, a, transfer));

  // Rank 1 killed while reads run: every read returns every value.
  {
    std::atomic<bool> stop{false};
    std::atomic<int> reads{0};
    absl::Status failed;
    std::thread reader([&] {
      while (!stop.load()) {
        absl::StatusOr<Tensor> read = view.Read(transfer);
        if (!read.ok() || Floats(*read) != Floats(a)) {
          failed =
              read.ok() ? absl::DataLossError("values differ") : read.status();
          return;
        }
        ++reads;
      }
    });
    absl::SleepFor(absl::Milliseconds(50));
    cluster->Kill(1);
    const int before = reads.load();
    while (reads.load() < before + 3 && failed.ok()) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    stop = true;
    reader.join();
    ASSERT_OK(failed) << "after " << reads.load() << " reads";
  }
  // Restarted, it refills in the background; a write meanwhile is kept.
  ASSERT_OK(cluster->Restart(1)) << cluster->Log(1);
  ASSERT_OK(CreateAfterUntilServing(*client, absl::Now()))
      << cluster->Log(0) << cluster->Log(1);
  ASSERT_OK(client->Delete("after"));
  const Tensor b = pattern(2);
  ASSERT_OK(view.Write({0, 0}, b, transfer));

  // Rank 2 killed while a write runs: the write reaches the live copies.
  const Tensor c = pattern(3);
  {
    absl::Status written;
    std::thread writer([&] { written = view.Write({0, 0}, c, transfer); });
    absl::SleepFor(absl::Milliseconds(5));
    cluster->Kill(2);
    writer.join();
    ASSERT_OK(written);
  }
  ASSERT_OK_AND_ASSIGN(Tensor read, view.Read(transfer));
  EXPECT_EQ(Floats(read), Floats(c));

  ASSERT_OK(cluster->Restart(2)) << cluster->Log(2);
  ASSERT_OK(CreateAfterUntilServing(*client, absl::Now()))
      << cluster->Log(0) << cluster->Log(2);
  // Each restarted owner serves its own shard again, refilled: ask it alone.
  for (const int owner : {1, 2}) {
    absl::StatusOr<Shard> own;
    const absl::Time until = absl::Now() + absl::Seconds(20);
    do {
      own = ShardClient::Create(cluster->address(owner))
                ->FetchShard(view.tensor_id(), owner);
      if (own.ok()) break;
      absl::SleepFor(absl::Milliseconds(50));
    } while (absl::Now() < until);
    ASSERT_OK(own.status()) << cluster->Log(owner);
    ASSERT_OK_AND_ASSIGN(Tensor rows, c.Narrow(0, owner * 512, 512));
    EXPECT_EQ(Floats(own->tensor), Floats(rows)) << "rank " << owner;
  }
  ASSERT_OK_AND_ASSIGN(read, view.Read(transfer));
  EXPECT_EQ(Floats(read), Floats(c));
  ASSERT_OK_AND_ASSIGN(ShardedTensorView after, client->Open("big"));
  EXPECT_FALSE(after.degraded());
}

// With nothing running, a daemon that goes silent is noticed within its
// lease: the others stop waiting for it and refuse operations naming it.
TEST(ResilienceTest, AnIdleClusterNoticesASilentDaemonWithinTheLease) {
  constexpr absl::Duration kLease = absl::Seconds(1);
  DaemonClusterOptions options = Options();
  options.extra_args.push_back("--lease");
  options.extra_args.push_back("1s");
  options.extra_args.push_back("--log-format");
  options.extra_args.push_back("json");
  ASSERT_OK_AND_ASSIGN(auto cluster, DaemonCluster::Start(options));
  const pid_t stalled = cluster->daemon(2).pid();
  ASSERT_OK(StopProcess(stalled));
  absl::Cleanup resume = [&] { kill(stalled, SIGCONT); };
  const absl::Time start = absl::Now();
  ASSERT_TRUE(WaitForState(*cluster, 0, WaitsForRank2, absl::Seconds(10)))
      << cluster->Log(0);
  const absl::Duration detected = absl::Now() - start;
  std::cout << "[ resilience ] a silent daemon noticed after " << detected
            << " (lease " << kLease << ")\n";
  EXPECT_LT(detected, kLease + absl::Seconds(4));
  // Rank 0, a watcher, logged it as a line about the silent daemon.
  EXPECT_THAT(cluster->Log(0),
              HasSubstr("\"peer\":2,\"message\":\"control: the lease of rank 2 "
                        "expired"));
  ASSERT_OK_AND_ASSIGN(auto client, Client::Connect(cluster->address(1)));
  EXPECT_THAT(Impatient(*cluster, 1)->Create("held", {6, 4}, Rows()).status(),
              AllOf(HeldAndNotApplied("2"),
                    StatusIs(absl::StatusCode::kUnavailable,
                             HasSubstr("lease of ranks [2] expired"))));
  std::move(resume).Invoke();
  ASSERT_TRUE(WaitForState(
      *cluster, 0,
      [](const v1::ClusterInfo& info) { return info.state() == "serving"; },
      absl::Seconds(10)));
  EXPECT_OK(client->Create("after", {6, 4}, Rows()).status());
}

// A stall shorter than a call's deadline delays the call and fails
// nothing: the operation in flight when rank 2 stops, and one submitted
// while it is silent (held before the log), both complete once it resumes,
// whichever daemon coordinated them; health says whom the cluster waits
// for meanwhile, and reads of the other daemons' shards go on.
TEST(ResilienceTest, AStallShorterThanTheDeadlineDelaysCallsAndFailsNone) {
  DaemonClusterOptions options = Options();
  options.extra_args = {"--timeout", "30",          "--lease",
                        "1s",        "--log-level", "warn"};
  ASSERT_OK_AND_ASSIGN(auto cluster, DaemonCluster::Start(options));
  ClientOptions client_options;
  client_options.timeout = absl::Seconds(25);
  // Rank 1 coordinates; rank 0 watches the stalled rank 2.
  ASSERT_OK_AND_ASSIGN(auto client,
                       Client::Connect(cluster->address(1), client_options));
  ASSERT_OK(client->Create("kept", {6, 4}, Rows(), Sevens()).status());
  const pid_t stalled = cluster->daemon(2).pid();
  ASSERT_OK(StopProcess(stalled));
  absl::Cleanup resume = [&] { kill(stalled, SIGCONT); };
  const absl::Time start = absl::Now();
  absl::Status in_flight;
  std::thread first([&] {
    in_flight = client->Create("in_flight", {6, 4}, Rows(), Sevens()).status();
  });
  // Health says why.
  EXPECT_TRUE(WaitForState(
      *cluster, 1,
      [](const v1::ClusterInfo& info) {
        return absl::StartsWith(info.state(),
                                "waiting: the lease of ranks [2]");
      },
      kAtOnce));
  absl::Status held;
  std::thread second([&] {
    held = client->Create("held", {6, 4}, Rows(), Sevens()).status();
  });
  // Reads of the other daemons' shards go on.
  ASSERT_OK_AND_ASSIGN(ShardedTensorView kept, client->Open("kept"));
  ASSERT_OK_AND_ASSIGN(Tensor top, kept.ReadRegion({0, 0}, {4, 4}));
  EXPECT_EQ(top.data<float>()[15], 7.0f);

  // Resumed after 4 s: 4 leases, well within the 25 s deadline.
  absl::SleepFor(start + absl::Seconds(4) - absl::Now());
  std::move(resume).Invoke();
  const absl::Time resumed = absl::Now();
  first.join();
  second.join();
  EXPECT_OK(in_flight) << cluster->Log(1);
  EXPECT_OK(held) << cluster->Log(1);
  std::cout << "[ resilience ] calls during a 4 s stall completed "
            << absl::Now() - resumed << " after the resume (lease 1s)\n";
  ExpectAllSevens(*client, "in_flight");
  ExpectAllSevens(*client, "held");
  ASSERT_OK(client->Create("after", {6, 4}, Rows(), Sevens()).status());
}

// TransferOptions::cancel (a user's Ctrl-C) ends a transfer that waits on
// a stalled daemon at once, with CANCELLED, over every transport and for a
// write, not at its deadline; the client and the cluster go on.
TEST(ResilienceTest, CancellingATransferThatWaitsOnAStalledDaemonEndsIt) {
  DaemonClusterOptions options = Options();
  options.extra_args = {"--timeout", "30", "--log-level", "warn"};
  ASSERT_OK_AND_ASSIGN(auto cluster, DaemonCluster::Start(options));
  std::vector<std::shared_ptr<Client>> clients;
  std::vector<ShardedTensorView> views;
  for (const Transport& transport : kTransports) {
    ASSERT_OK_AND_ASSIGN(
        clients.emplace_back(),
        Client::Connect(cluster->address(0), OptionsFor(transport)));
    if (views.empty()) {
      ASSERT_OK(clients[0]->Create("kept", {6, 4}, Rows(), Sevens()).status());
    }
    ASSERT_OK_AND_ASSIGN(ShardedTensorView view, clients.back()->Open("kept"));
    views.push_back(std::move(view));
  }
  const pid_t stalled = cluster->daemon(2).pid();
  ASSERT_OK(StopProcess(stalled));
  absl::Cleanup resume = [&] { kill(stalled, SIGCONT); };
  // Runs `transfer` with a 60 s deadline, cancelled 300 ms in.
  const auto cancelled_after =
      [](const std::string& what,
         const std::function<absl::Status(const TransferOptions&)>& transfer) {
        SCOPED_TRACE(what);
        TransferOptions options;
        options.timeout = absl::Seconds(60);
        options.cancel = std::make_shared<Cancellation>();
        std::thread canceller([cancel = options.cancel] {
          absl::SleepFor(absl::Milliseconds(300));
          cancel->Cancel();
        });
        const absl::Time start = absl::Now();
        const absl::Status status = transfer(options);
        const absl::Duration took = absl::Now() - start;
        canceller.join();
        EXPECT_THAT(status, StatusIs(absl::StatusCode::kCancelled,
                                     HasSubstr("cancelled by the caller")));
        EXPECT_LT(took, kAtOnce);
        std::cout << "[ resilience ] " << what << " cancelled after " << took
                  << "\n";
      };
  for (size_t t = 0; t < views.size(); ++t) {
    cancelled_after(absl::StrCat("read over ", kTransports[t].name),
                    [&](const TransferOptions& transfer) {
                      return views[t].Read(transfer).status();
                    });
  }
  const std::vector<RemoteShard> remote = views[1].remote_shards();
  cancelled_after("to_here of the stalled daemon's shard",
                  [&](const TransferOptions& transfer) {
                    FetchOptions fetch;
                    fetch.timeout = transfer.timeout;
                    fetch.cancel = transfer.cancel;
                    return remote[2].to_here(fetch).status();
                  });
  ASSERT_OK_AND_ASSIGN(Tensor ones, Tensor::Full({6, 4}, 1.0));
  cancelled_after("write", [&](const TransferOptions& transfer) {
    return views[0].Write({0, 0}, ones, transfer);
  });

  // Resumed, every client reads again. The cancelled write reached ranks
  // 0 and 1; rank 2 applied all of its box or none of it.
  std::move(resume).Invoke();
  for (size_t t = 0; t < views.size(); ++t) {
    SCOPED_TRACE(kTransports[t].name);
    ASSERT_OK_AND_ASSIGN(Tensor values, views[t].Read());
    const float* data = values.data<float>();
    for (int64_t i = 0; i < 24; ++i) {
      if (i < 16) {
        EXPECT_EQ(data[i], 1.0f) << "element " << i;
      } else {
        EXPECT_EQ(data[i], data[16]) << "element " << i;
      }
    }
  }
}

// With the store in etcd (--store), no daemon is special: an etcd member
// may die unnoticed, and rank 0, killed, is noticed within the lease (rank
// 1 watches it), then restarts into the running cluster like any other;
// the names and the other daemons' shards live on, its own are reported
// lost.
TEST(ResilienceTest, WithEtcdRankZeroRestartsIntoTheRunningCluster) {
  ASSERT_OK_AND_ASSIGN(auto etcd, testing::EtcdCluster::Start(3));
  DaemonClusterOptions options = Options();
  for (const std::string& flag :
       {std::string("--store"), etcd->Url("resilience"), std::string("--lease"),
        std::string("1s")}) {
    options.extra_args.push_back(flag);
  }
  ASSERT_OK_AND_ASSIGN(auto cluster, DaemonCluster::Start(options));
  ClientOptions client_options;
  client_options.timeout = absl::Seconds(10);
  ASSERT_OK_AND_ASSIGN(auto client,
                       Client::Connect(cluster->address(1), client_options));
  ASSERT_OK(client->Create("spread", {6, 4}, Rows(), Sevens()).status());
  ASSERT_OK(
      client
          ->Create("elsewhere", {4, 4},
                   *ChunkShardingSpec::Create(
                       0, std::vector<std::string>{"rank:1/cpu", "rank:2/cpu"}),
                   Sevens())
          .status());

  etcd->Kill(0);
  EXPECT_OK(client->Create("during", {6, 4}, Rows(), Sevens()).status());
  ASSERT_OK(etcd->Restart(0)) << etcd->Log(0);

  cluster->Kill(0);
  ASSERT_TRUE(WaitForState(*cluster, 1, WaitsFor(0), absl::Seconds(10)))
      << cluster->Log(1);
  EXPECT_THAT(Impatient(*cluster, 1)->Create("held", {6, 4}, Rows()).status(),
              HeldAndNotApplied("0"));
  ASSERT_OK(cluster->Restart(0)) << cluster->Log(0);
  const absl::Time restarted = absl::Now();
  const absl::Status created = CreateAfterUntilServing(*client, restarted);
  ASSERT_OK(created) << cluster->Log(0) << cluster->Log(1);
  std::cout << "[ resilience ] with etcd, rank 0 serving again "
            << absl::Now() - restarted << " after its restart\n";
  EXPECT_LT(absl::Now() - restarted, absl::Seconds(10));

  for (int r = 0; r < kWorld; ++r) {
    ASSERT_OK_AND_ASSIGN(auto seen, Client::Connect(cluster->address(r)));
    ASSERT_OK_AND_ASSIGN(std::vector<ShardedTensorView> tensors, seen->List());
    std::vector<std::string> names;
    for (const ShardedTensorView& view : tensors) names.push_back(view.name());
    EXPECT_THAT(
        names, ::testing::ElementsAre("after", "during", "elsewhere", "spread"))
        << r;
    ExpectAllSevens(*seen, "elsewhere");
    ExpectAllSevens(*seen, "after");
    ASSERT_OK_AND_ASSIGN(ShardedTensorView spread, seen->Open("spread"));
    EXPECT_THAT(spread.info().lost_shards(), ::testing::ElementsAre(0)) << r;
    ASSERT_OK_AND_ASSIGN(Tensor rest, spread.ReadRegion({2, 0}, {4, 4}));
    EXPECT_EQ(rest.data<float>()[15], 7.0f);
  }
}

}  // namespace
}  // namespace tessera
