// Client::Open's cache against 4 real daemons: a tensor opened before is
// checked with a digest over the data plane and never served stale: after
// a delete and a create of the same name, a reshard, a published version
// and a daemon's restart, Open answers what DescribeTensor answers; and a
// repeated Open of an unchanged tensor makes no gRPC call (the daemon's
// DescribeTensor counter does not move); many tensors (OpenMany, Begin)
// are opened with one ListTensors, or in pages when their metadata is
// large. A view made before a change
// reads the tensor as it is now, or says why it cannot.
#include <signal.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "client/version_writer.h"
#include "common/sharding_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/daemon_cluster.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::DaemonCluster;
using ::tessera::testing::StatusIs;

constexpr int kWorld = 4;

ShardingSpec Rows(int ranks) {
  std::vector<std::string> placements;
  for (int r = 0; r < ranks; ++r) {
    placements.push_back(absl::StrCat("rank:", r, "/cpu"));
  }
  return *ChunkShardingSpec::Create(0, placements);
}

// Calls of ControlService's `method` rank 0 answered so far
// (tessera_rpcs_total).
double Calls(const Client& client, absl::string_view method) {
  const absl::StatusOr<v1::DaemonStats> stats = client.Stats()[0];
  if (!stats.ok()) return -1;
  double total = 0;
  for (absl::string_view line : absl::StrSplit(stats->metrics(), '\n')) {
    if (!absl::StartsWith(line, "tessera_rpcs_total{") ||
        !absl::StrContains(line,
                           absl::StrCat("ControlService/", method, "\""))) {
      continue;
    }
    double value = 0;
    if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &value)) {
      total += value;
    }
  }
  return total;
}

double Describes(const Client& client) {
  return Calls(client, "DescribeTensor");
}

class OpenCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(cluster_,
                         DaemonCluster::Start(testing::QuietClusterOptions(
                             kWorld, TESSERA_SERVER_PATH)));
    ClientOptions options;
    options.timeout = absl::Seconds(20);
    ASSERT_OK_AND_ASSIGN(client_,
                         Client::Connect(cluster_->address(0), options));
    ASSERT_OK_AND_ASSIGN(other_,
                         Client::Connect(cluster_->address(1), options));
  }

  std::unique_ptr<DaemonCluster> cluster_;
  std::shared_ptr<Client> client_;
  // Another process's view of the cluster, changing what client_ cached.
  std::shared_ptr<Client> other_;
};

TEST_F(OpenCacheTest, UnchangedTensorsAreCheckedWithoutAGrpcCall) {
  ASSERT_OK(client_->Create("w", {16, 4}, Rows(4)).status());
  ASSERT_OK_AND_ASSIGN(const ShardedTensorView first, client_->Open("w"));
  const double before = Describes(*client_);
  for (int i = 0; i < 20; ++i) {
    ASSERT_OK_AND_ASSIGN(const ShardedTensorView again, client_->Open("w"));
    EXPECT_EQ(again.tensor_id(), first.tensor_id());
    EXPECT_EQ(again.info().SerializeAsString(),
              first.info().SerializeAsString());
  }
  EXPECT_EQ(Describes(*client_), before);
  // Without a data plane every open asks through gRPC.
  ClientOptions grpc_only;
  grpc_only.data_plane = false;
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Client> plain,
                       Client::Connect(cluster_->address(0), grpc_only));
  for (int i = 0; i < 3; ++i) ASSERT_OK(plain->Open("w").status());
  EXPECT_EQ(Describes(*client_), before + 3);
}

TEST_F(OpenCacheTest, ManyTensorsAreOpenedAndBegunWithOneList) {
  // A state dict's worth: one ListTensors of just those names, where each
  // was described (or digest-checked) one by one.
  std::vector<TensorToCreate> tensors;
  std::vector<std::string> names;
  for (int i = 0; i < 40; ++i) {
    TensorToCreate tensor{absl::StrCat("many.", i), {8, 4}, Rows(4), {}};
    tensor.options.versions = 2;
    tensors.push_back(tensor);
    names.insert(names.begin(), tensor.name);  // any order
  }
  ASSERT_OK(client_->CreateMany(tensors).status());
  ASSERT_OK(client_->Create("other", {4}, Rows(1)).status());
  const double describes = Describes(*client_);
  const double lists = Calls(*client_, "ListTensors");
  ASSERT_OK_AND_ASSIGN(const std::vector<ShardedTensorView> views,
                       client_->OpenMany(names));
  ASSERT_EQ(views.size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_EQ(views[i].name(), names[i]);
  }
  ASSERT_OK_AND_ASSIGN(const VersionWriter writer, client_->Begin(names));
  for (const std::string& name : names) {
    ASSERT_OK_AND_ASSIGN(const ShardedTensorView view, writer.view(name));
    EXPECT_EQ(view.name(), name);
  }
  EXPECT_THAT(writer.view("other"),
              StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  ASSERT_OK(writer.Publish().status());
  EXPECT_EQ(Describes(*client_), describes);
  EXPECT_EQ(Calls(*client_, "ListTensors"), lists + 2);
  // A name that does not exist is named.
  names.push_back("many.nope");
  EXPECT_THAT(
      client_->OpenMany(names),
      StatusIs(absl::StatusCode::kNotFound, ::testing::HasSubstr("many.nope")));
}

// Metadata too large for one reply is read in pages (ListTensorsRequest
// after / page_bytes): here pages of about 1,000 bytes, a few tensors
// each, give what one reply gives.
TEST_F(OpenCacheTest, LargeMetadataIsReadInPages) {
  std::vector<TensorToCreate> tensors;
  for (int i = 0; i < 40; ++i) {
    tensors.push_back({absl::StrCat("paged.", 100 + i), {8, 4}, Rows(4), {}});
  }
  ASSERT_OK(client_->CreateMany(tensors).status());
  ASSERT_OK(client_->Create("zzz.last", {4}, Rows(1)).status());
  ClientOptions paging;
  paging.timeout = absl::Seconds(20);
  paging.list_page_bytes = 1000;
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Client> paged,
                       Client::Connect(cluster_->address(0), paging));

  ASSERT_OK_AND_ASSIGN(const std::vector<ShardedTensorView> whole,
                       client_->List());
  const double lists = Calls(*client_, "ListTensors");
  ASSERT_OK_AND_ASSIGN(const std::vector<ShardedTensorView> listed,
                       paged->List());
  const double pages = Calls(*client_, "ListTensors") - lists;
  EXPECT_GE(pages, 5);
  EXPECT_LT(pages, 41);  // several tensors a page
  ASSERT_EQ(listed.size(), whole.size());
  for (size_t i = 0; i < whole.size(); ++i) {
    EXPECT_EQ(listed[i].info().SerializeAsString(),
              whole[i].info().SerializeAsString());
  }

  // A subset, out of order and with a name twice: every page asks only
  // for the names after the last one it had.
  std::vector<std::string> names = {"zzz.last", "paged.139", "paged.101"};
  for (int i = 138; i > 104; i -= 3) names.push_back(absl::StrCat("paged.", i));
  names.push_back("paged.101");
  ASSERT_OK_AND_ASSIGN(const std::vector<ShardedTensorView> opened,
                       paged->OpenMany(names));
  ASSERT_EQ(opened.size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_EQ(opened[i].name(), names[i]);
    ASSERT_OK_AND_ASSIGN(const ShardedTensorView one, client_->Open(names[i]));
    EXPECT_EQ(opened[i].tensor_id(), one.tensor_id());
  }
  names.push_back("paged.999");
  EXPECT_THAT(
      paged->OpenMany(names),
      StatusIs(absl::StatusCode::kNotFound, ::testing::HasSubstr("paged.999")));

  paging.list_page_bytes = 0;
  EXPECT_THAT(Client::Connect(cluster_->address(0), paging),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("list_page_bytes")));
}

TEST_F(OpenCacheTest, EveryChangeIsSeenAtTheNextOpen) {
  ASSERT_OK(client_->Create("c", {16, 4}, Rows(4)).status());
  ASSERT_OK_AND_ASSIGN(ShardedTensorView opened, client_->Open("c"));
  const std::string first_id = opened.tensor_id();

  // Deleted and created again, with another shape, by another client.
  ASSERT_OK(other_->Delete("c"));
  EXPECT_THAT(client_->Open("c"),
              StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  ASSERT_OK(other_->Create("c", {8, 2}, Rows(2)).status());
  ASSERT_OK_AND_ASSIGN(opened, client_->Open("c"));
  EXPECT_NE(opened.tensor_id(), first_id);
  EXPECT_EQ(opened.sizes(), (std::vector<int64_t>{8, 2}));

  // Resharded.
  ASSERT_OK(other_->Reshard("c", Rows(4)).status());
  ASSERT_OK_AND_ASSIGN(opened, client_->Open("c"));
  EXPECT_EQ(opened.metadata().shards_metadata.size(), 4u);

  // A versioned tensor: each publish is seen.
  CreateOptions versioned;
  versioned.versions = 3;
  ASSERT_OK(client_->Create("v", {8, 2}, Rows(4), versioned).status());
  ASSERT_OK_AND_ASSIGN(opened, client_->Open("v"));
  const int64_t published = opened.version();
  for (int step = 1; step <= 3; ++step) {
    ASSERT_OK_AND_ASSIGN(VersionWriter writer, other_->Begin({"v"}));
    ASSERT_OK(writer.Publish().status());
    ASSERT_OK_AND_ASSIGN(opened, client_->Open("v"));
    EXPECT_EQ(opened.version(), published + step);
  }
}

// A view made before another client changed the tensor is never read
// stale: resharded (or created again alike), its reads and writes go to
// the new layout, as a read plan's do; deleted, or created again with
// another shape, they say so.
TEST_F(OpenCacheTest, AViewMadeBeforeAChangeReadsTheTensorAsItIsNow) {
  ASSERT_OK_AND_ASSIGN(ShardedTensorView made,
                       client_->Create("s", {16, 4}, Rows(4)));
  ASSERT_OK_AND_ASSIGN(Tensor sevens, Tensor::Full({16, 4}, 7.0));
  ASSERT_OK(made.Write({0, 0}, sevens));
  ASSERT_OK(other_->Reshard("s", Rows(2)).status());
  // The old layout leaves once every daemon confirmed the reshard.
  for (int i = 0; i < 100; ++i) {
    ASSERT_OK_AND_ASSIGN(Tensor box, made.ReadRegion({3, 1}, {10, 3}));
    ASSERT_EQ(box.data<float>()[0], 7);
    ASSERT_EQ(box.data<float>()[29], 7);
    absl::SleepFor(absl::Milliseconds(20));
  }
  // Written through the old view: into the new layout.
  ASSERT_OK_AND_ASSIGN(Tensor eights, Tensor::Full({2, 4}, 8.0));
  ASSERT_OK(made.Write({5, 0}, eights));
  ASSERT_OK_AND_ASSIGN(ShardedTensorView now_view, client_->Open("s"));
  ASSERT_OK_AND_ASSIGN(Tensor row, now_view.ReadRegion({6, 0}, {1, 4}));
  EXPECT_EQ(row.data<float>()[3], 8);
  // Created again alike by another client: read as it is now.
  ASSERT_OK(other_->Delete("s"));
  EXPECT_THAT(made.Read(), StatusIs(absl::StatusCode::kNotFound,
                                    ::testing::HasSubstr("deleted")));
  CreateOptions ones;
  ones.init = TensorInit::kOnes;
  ASSERT_OK(other_->Create("s", {16, 4}, Rows(3), ones).status());
  ASSERT_OK_AND_ASSIGN(Tensor now, made.Read());
  EXPECT_EQ(now.data<float>()[63], 1);
  // Created again with another shape: refused, naming both.
  ASSERT_OK(other_->Delete("s"));
  ASSERT_OK(other_->Create("s", {8, 4}, Rows(4)).status());
  EXPECT_THAT(
      made.Read(),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               ::testing::AllOf(::testing::HasSubstr("[8, 4]"),
                                ::testing::HasSubstr("[16, 4]"),
                                ::testing::HasSubstr("open it again"))));
  EXPECT_THAT(made.Write({0, 0}, eights),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       ::testing::HasSubstr("open it again")));
}

TEST_F(OpenCacheTest, ADaemonRestartedIsAskedAgain) {
  ASSERT_OK(client_->Create("r", {16, 4}, Rows(4)).status());
  ASSERT_OK_AND_ASSIGN(const ShardedTensorView before, client_->Open("r"));
  // Rank 2 restarts and lost its shard: the tensor's description changes
  // (its lost shards) without any operation on it.
  cluster_->Kill(2);
  ASSERT_OK(cluster_->Restart(2));
  std::string fresh;
  for (absl::Time end = absl::Now() + absl::Seconds(20); absl::Now() < end;
       absl::SleepFor(absl::Milliseconds(100))) {
    // A new client has nothing cached: it asks through gRPC.
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<Client> fresh_client,
                         Client::Connect(cluster_->address(0)));
    absl::StatusOr<ShardedTensorView> described = fresh_client->Open("r");
    if (described.ok()) fresh = described->info().SerializeAsString();
    if (!fresh.empty() && fresh != before.info().SerializeAsString()) break;
  }
  ASSERT_NE(fresh, before.info().SerializeAsString());
  ASSERT_OK_AND_ASSIGN(const ShardedTensorView after, client_->Open("r"));
  EXPECT_EQ(after.info().SerializeAsString(), fresh);
}

TEST_F(OpenCacheTest, AStalledDaemonCostsOneDeadlineNotTwo) {
  ASSERT_OK(client_->Create("s", {16, 4}, Rows(4)).status());
  ClientOptions brief;
  brief.timeout = absl::Seconds(2);
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Client> impatient,
                       Client::Connect(cluster_->address(0), brief));
  ASSERT_OK(impatient->Open("s").status());  // Cached from now on.
  absl::Cleanup resume = [&] { cluster_->Resume(0); };
  ASSERT_OK(cluster_->Stop(0));
  const absl::Time start = absl::Now();
  const absl::Status stalled = impatient->Open("s").status();
  const absl::Duration took = absl::Now() - start;
  std::move(resume).Invoke();
  // The digest's wait spent the call's deadline: no gRPC call after it.
  EXPECT_THAT(stalled,
              StatusIs(absl::StatusCode::kDeadlineExceeded, ::testing::_));
  EXPECT_LT(took, absl::Seconds(3)) << stalled;
  // Once the daemon runs again the cached open works again.
  EXPECT_OK(impatient->Open("s").status());
}

}  // namespace
}  // namespace tessera
