// End-to-end tests of the service: 4 real `tessera-server` processes on
// loopback (tests/testing/daemon_cluster.h) and the client library
// (client/client.h) or the raw generated stubs, in this test process.
//
// Covered: every client call; a daemon killed in the middle of a fetch
// (UNAVAILABLE within the deadline, the others keep serving); bad requests
// (unknown tensor, regions out of bounds, absurd sizes and ranks, a wrong
// dtype, a truncated message) get clear gRPC errors and the daemons keep
// running; two clients creating and deleting at once leave every daemon
// with the same, consistent listing.
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "common/proto_convert.h"
#include "common/sharding_spec.h"
#include "common/tensor/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/directory.h"
#include "io/unix_socket.h"
#include "server/checkpoint/checkpoint.h"
#include "tessera/v1/control.grpc.pb.h"
#include "tessera/v1/shard.grpc.pb.h"
#include "tests/testing/daemon_cluster.h"
#include "tests/testing/daemon_cluster_test.h"
#include "tests/testing/iota.h"
#include "tests/testing/raw_call.h"
#include "tests/testing/status_matchers.h"
#include "wire/auth.h"

namespace tessera {
namespace {

using ::tessera::testing::DaemonCluster;
using ::tessera::testing::DaemonClusterOptions;
using ::tessera::testing::ExpectIotaBox;
using ::tessera::testing::Iota;
using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::testing::AnyOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int kWorld = 4;

DaemonClusterOptions ClusterOptions() {
  return ::tessera::testing::QuietClusterOptions(kWorld, TESSERA_SERVER_PATH);
}

absl::StatusOr<std::unique_ptr<DaemonCluster>> StartCluster() {
  return DaemonCluster::Start(ClusterOptions());
}

ShardingSpec RowSpec() {
  std::vector<std::string> placements;
  for (int r = 0; r < kWorld; ++r) {
    placements.push_back(absl::StrCat("rank:", r, "/cpu"));
  }
  return *ChunkShardingSpec::Create(0, placements);
}

ShardingSpec ColumnSpec() {
  // Placements in reverse: rank 3 holds the first columns.
  std::vector<std::string> placements;
  for (int r = kWorld - 1; r >= 0; --r) {
    placements.push_back(absl::StrCat("rank:", r, "/cpu"));
  }
  return *ChunkShardingSpec::Create(1, placements);
}

std::vector<std::string> Names(const std::vector<ShardedTensorView>& views) {
  std::vector<std::string> names;
  for (const ShardedTensorView& v : views) names.push_back(v.name());
  return names;
}

class DaemonTest : public ::tessera::testing::DaemonClusterTest {
 protected:
  static void SetUpTestSuite() { StartSuiteCluster(ClusterOptions()); }

  std::unique_ptr<v1::ControlService::Stub> Stub(int rank) {
    return v1::ControlService::NewStub(
        CreateTesseraChannel(cluster_->address(rank)));
  }
};

TEST_F(DaemonTest, ConnectLearnsTheCluster) {
  const v1::ClusterInfo& info = client_->cluster();
  EXPECT_EQ(info.world_size(), kWorld);
  EXPECT_EQ(info.rank(), 0);
  ASSERT_EQ(info.workers_size(), kWorld);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(info.workers(r).rank(), r);
    EXPECT_EQ(info.workers(r).address(), cluster_->address(r));
    EXPECT_EQ(info.workers(r).device(), "cpu");
  }
  std::vector<absl::Status> health = client_->Health();
  ASSERT_EQ(health.size(), kWorld);
  for (const absl::Status& s : health) EXPECT_THAT(s, IsOk());
}

TEST_F(DaemonTest, EveryClientCallEndToEnd) {
  CreateOptions zeros;
  zeros.init = TensorInit::kZeros;
  ASSERT_OK_AND_ASSIGN(ShardedTensorView view,
                       client_->Create("e2e", {10, 20}, RowSpec(), zeros));
  EXPECT_EQ(view.sizes(), (std::vector<int64_t>{10, 20}));
  EXPECT_EQ(view.dtype(), DType::kFloat32);
  const auto& shards = view.metadata().shards_metadata;
  ASSERT_EQ(shards.size(), 4u);
  EXPECT_EQ(shards[1].shard_offsets(), (std::vector<int64_t>{3, 0}));
  EXPECT_EQ(shards[3].shard_sizes(), (std::vector<int64_t>{1, 20}));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(view.owner_rank(i), i);

  // Write everything, then a region across shards 1..2 again.
  ASSERT_THAT(view.Write({0, 0}, Iota(10, 20)), IsOk());
  ASSERT_OK_AND_ASSIGN(Tensor all, view.Read());
  ExpectIotaBox(all, 0, 0, 20);

  // Each shard whole, fetched from its owner.
  std::vector<RemoteShard> remote = view.remote_shards();
  ASSERT_EQ(remote.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(remote[i].owner().id, i);
    ASSERT_OK_AND_ASSIGN(Shard shard, remote[i].to_here());
    EXPECT_EQ(shard.metadata, shards[i]);
    ExpectIotaBox(shard.tensor, shards[i].shard_offsets()[0], 0, 20);
  }

  // A region spanning three shards, with progress.
  int64_t last_done = -1, total_seen = -1;
  TransferOptions with_progress;
  with_progress.progress = [&](int64_t done, int64_t total) {
    EXPECT_GE(done, last_done);
    last_done = done;
    total_seen = total;
  };
  ASSERT_OK_AND_ASSIGN(Tensor region,
                       view.ReadRegion({2, 5}, {6, 10}, with_progress));
  ExpectIotaBox(region, 2, 5, 20);
  EXPECT_EQ(total_seen, 6 * 10 * 4);
  EXPECT_EQ(last_done, total_seen);

  // The same through another daemon's ControlService.ReadRegion.
  {
    auto stub = Stub(2);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(10));
    v1::ReadRegionRequest request;
    request.set_name("e2e");
    for (int64_t x : {2, 5}) request.add_offsets(x);
    for (int64_t x : {6, 10}) request.add_sizes(x);
    auto reader = stub->ReadRegion(&context, request);
    v1::ShardChunk chunk;
    std::string bytes;
    while (reader->Read(&chunk)) bytes += chunk.data();
    ASSERT_TRUE(reader->Finish().ok());
    ASSERT_EQ(bytes.size(), 6u * 10 * 4);
    Tensor via_daemon = *Tensor::Empty({6, 10});
    std::memcpy(via_daemon.data_ptr(), bytes.data(), bytes.size());
    ExpectIotaBox(via_daemon, 2, 5, 20);
  }

  // Gather on the connected daemon.
  ASSERT_OK_AND_ASSIGN(Tensor gathered, client_->Gather("e2e"));
  ExpectIotaBox(gathered, 0, 0, 20);

  // List and describe on every daemon agree.
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_OK_AND_ASSIGN(auto other, Client::Connect(cluster_->address(r)));
    ASSERT_OK_AND_ASSIGN(ShardedTensorView again, other->Open("e2e"));
    EXPECT_EQ(again.tensor_id(), view.tensor_id());
    EXPECT_EQ(again.metadata(), view.metadata());
    ASSERT_OK_AND_ASSIGN(std::vector<ShardedTensorView> listed, other->List());
    EXPECT_THAT(Names(listed), ::testing::Contains("e2e"));
  }

  // Reshard by columns: the values stay, the layout and id change.
  ASSERT_OK_AND_ASSIGN(ShardedTensorView by_columns,
                       client_->Reshard("e2e", ColumnSpec()));
  EXPECT_NE(by_columns.tensor_id(), view.tensor_id());
  EXPECT_EQ(by_columns.metadata().shards_metadata[0].shard_sizes(),
            (std::vector<int64_t>{10, 5}));
  EXPECT_EQ(by_columns.owner_rank(0), 3);
  ASSERT_OK_AND_ASSIGN(Tensor after, by_columns.Read());
  ExpectIotaBox(after, 0, 0, 20);
  // The old view's layout is gone: it reads the new layout as the new one
  // (each value in its place), never the new shards as if they were old.
  ASSERT_OK_AND_ASSIGN(Tensor through_old, view.Read());
  ExpectIotaBox(through_old, 0, 0, 20);

  // Save, delete, load back (same layout), then load resharded under
  // another name.
  const std::string dir = cluster_->scratch_dir() + "/ckpt";
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> saved,
                       client_->Save(dir, {"e2e"}));
  EXPECT_THAT(saved, ElementsAre("e2e"));
  ASSERT_THAT(client_->Delete("e2e"), IsOk());
  EXPECT_THAT(client_->Open("e2e").status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("e2e")));
  v1::LoadCheckpointRequest load;
  load.set_path(dir);
  ASSERT_OK_AND_ASSIGN(std::vector<ShardedTensorView> loaded,
                       client_->Load(load));
  ASSERT_EQ(loaded.size(), 1u);
  EXPECT_EQ(loaded[0].metadata().shards_metadata,
            by_columns.metadata().shards_metadata);
  ASSERT_OK_AND_ASSIGN(Tensor reloaded, loaded[0].Read());
  ExpectIotaBox(reloaded, 0, 0, 20);

  v1::LoadCheckpointRequest as_rows;
  as_rows.set_path(dir);
  as_rows.add_names("e2e");
  as_rows.add_as_names("e2e_rows");
  *as_rows.mutable_spec() = ToProto(RowSpec());
  ASSERT_OK_AND_ASSIGN(loaded, client_->Load(as_rows));
  ASSERT_EQ(loaded.size(), 1u);
  EXPECT_EQ(loaded[0].name(), "e2e_rows");
  EXPECT_EQ(loaded[0].metadata().shards_metadata[0].shard_sizes(),
            (std::vector<int64_t>{3, 20}));
  ASSERT_OK_AND_ASSIGN(Tensor rows, loaded[0].Read());
  ExpectIotaBox(rows, 0, 0, 20);

  // Loading over an existing name needs `replace`.
  EXPECT_THAT(client_->Load(load).status(),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("e2e")));
  load.set_replace(true);
  EXPECT_THAT(client_->Load(load).status(), IsOk());

  ASSERT_THAT(client_->Delete("e2e"), IsOk());
  ASSERT_THAT(client_->Delete("e2e_rows"), IsOk());
}

TEST_F(DaemonTest, SameHostReadsTakeTheLocalPath) {
  const v1::ClusterInfo& info = client_->cluster();
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_THAT(info.workers(r).local_address(),
                ::testing::StartsWith(HostId() + "/"));
  }
  // Shards of 128 KiB: above the daemons' sharing threshold.
  ASSERT_OK_AND_ASSIGN(ShardedTensorView view,
                       client_->Create("local", {512, 256}, RowSpec()));
  ASSERT_THAT(view.Write({0, 0}, Iota(512, 256)), IsOk());
  FetchOptions required;
  required.local_path = LocalPath::kRequired;
  std::vector<RemoteShard> remote = view.remote_shards();
  ASSERT_EQ(remote.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    ASSERT_OK_AND_ASSIGN(Shard shard, remote[i].to_here(required));
    ExpectIotaBox(shard.tensor, 128 * i, 0, 256);
  }
  ASSERT_OK_AND_ASSIGN(Tensor all, view.Read());
  ExpectIotaBox(all, 0, 0, 256);
  // A client that opts out never takes it.
  ClientOptions streams;
  streams.use_local_path = false;
  ASSERT_OK_AND_ASSIGN(auto other,
                       Client::Connect(cluster_->address(1), streams));
  ASSERT_OK_AND_ASSIGN(ShardedTensorView same, other->Open("local"));
  EXPECT_THAT(same.remote_shards()[2].to_here(required).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("no local address")));
  ASSERT_OK_AND_ASSIGN(Shard shard, same.remote_shards()[2].to_here());
  ExpectIotaBox(shard.tensor, 256, 0, 256);
  EXPECT_THAT(client_->Delete("local"), IsOk());
}

TEST_F(DaemonTest, CreateFillsAsAsked) {
  CreateOptions full;
  full.init = TensorInit::kFull;
  full.fill_value = 2.5;
  full.dtype = DType::kFloat64;
  ASSERT_OK_AND_ASSIGN(ShardedTensorView f,
                       client_->Create("full", {7, 3}, RowSpec(), full));
  ASSERT_OK_AND_ASSIGN(Tensor t, f.Read());
  EXPECT_EQ(t.dtype(), DType::kFloat64);
  for (int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(t.data<double>()[i], 2.5);

  CreateOptions rand;
  rand.init = TensorInit::kRandn;
  rand.seed = 42;
  ASSERT_OK_AND_ASSIGN(ShardedTensorView a,
                       client_->Create("randn_a", {9, 4}, RowSpec(), rand));
  ASSERT_OK_AND_ASSIGN(ShardedTensorView b,
                       client_->Create("randn_b", {9, 4}, RowSpec(), rand));
  ASSERT_OK_AND_ASSIGN(Tensor ta, a.Read());
  ASSERT_OK_AND_ASSIGN(Tensor tb, b.Read());
  EXPECT_TRUE(Equal(ta, tb)) << "same seed, same values";
  bool any_nonzero = false;
  for (int64_t i = 0; i < ta.numel(); ++i) {
    any_nonzero = any_nonzero || ta.data<float>()[i] != 0;
  }
  EXPECT_TRUE(any_nonzero);
  for (const char* name : {"full", "randn_a", "randn_b"}) {
    EXPECT_THAT(client_->Delete(name), IsOk());
  }
}

TEST_F(DaemonTest, BadRequestsGetClearErrors) {
  // Unknown names.
  EXPECT_THAT(client_->Open("nope").status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("nope")));
  EXPECT_THAT(client_->Delete("nope"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("nope")));
  EXPECT_THAT(client_->Gather("nope").status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("nope")));
  EXPECT_THAT(client_->Reshard("nope", RowSpec()).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("nope")));

  ASSERT_OK_AND_ASSIGN(ShardedTensorView view,
                       client_->Create("bad", {10, 20}, RowSpec()));
  EXPECT_THAT(client_->Create("bad", {10, 20}, RowSpec()).status(),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("bad")));

  // Regions out of bounds, of the wrong rank, negative.
  EXPECT_THAT(view.ReadRegion({8, 0}, {3, 20}).status(),
              StatusIs(absl::StatusCode::kOutOfRange, ::testing::_));
  EXPECT_THAT(view.ReadRegion({0}, {1}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  EXPECT_THAT(view.ReadRegion({0, 0}, {-1, 2}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  EXPECT_THAT(view.Write({9, 19}, Iota(2, 2)),
              StatusIs(absl::StatusCode::kOutOfRange, ::testing::_));
  // A wrong dtype.
  Tensor doubles =
      *Tensor::Zeros({2, 2}, TensorOptions().WithDType(DType::kFloat64));
  EXPECT_THAT(view.Write({0, 0}, doubles),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dtype")));

  // Absurd sizes and ranks.
  EXPECT_THAT(
      client_->Create("huge", {int64_t{1} << 40, int64_t{1} << 40}, RowSpec())
          .status(),
      StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  EXPECT_THAT(client_->Create("neg", {-3, 2}, RowSpec()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  auto rank99 = ChunkShardingSpec::Create(
      0, std::vector<std::string>{"rank:0/cpu", "rank:99/cpu"});
  ASSERT_TRUE(rank99.ok());
  EXPECT_THAT(client_->Create("r99", {4, 4}, *rank99).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("99")));
  EXPECT_THAT(client_->Create("bad name!", {4, 4}, RowSpec()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));

  // Raw requests: a region with mismatched lengths, a shard index out of
  // range, and a truncated message.
  {
    auto stub = Stub(1);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(10));
    v1::ReadRegionRequest request;
    request.set_name("bad");
    request.add_offsets(0);
    request.add_sizes(1);
    request.add_sizes(1);
    auto reader = stub->ReadRegion(&context, request);
    v1::ShardChunk chunk;
    while (reader->Read(&chunk)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::INVALID_ARGUMENT);
  }
  {
    auto shard_stub =
        v1::ShardService::NewStub(CreateTesseraChannel(cluster_->address(1)));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(10));
    v1::FetchShardRequest request;
    request.set_tensor_id(view.tensor_id());
    request.set_shard_index(1000000);
    auto reader = shard_stub->FetchShard(&context, request);
    v1::ShardChunk chunk;
    while (reader->Read(&chunk)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::NOT_FOUND);
  }
  {
    v1::CreateTensorRequest request;
    request.set_name("truncated");
    request.add_sizes(4);
    *request.mutable_spec() = ToProto(RowSpec());
    std::string wire = request.SerializeAsString();
    wire.resize(wire.size() / 2);  // cut inside the spec
    const grpc::Status status = ::tessera::testing::RawUnaryCall(
        CreateTesseraChannel(cluster_->address(3)),
        "/tessera.v1.ControlService/CreateTensor", wire);
    EXPECT_EQ(status.error_code(), grpc::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(),
                HasSubstr("CreateTensor: malformed request"));
    EXPECT_FALSE(status.ok());
    EXPECT_NE(status.error_code(), grpc::DEADLINE_EXCEEDED);
  }
  // Nothing of the above was created; the daemons still answer.
  ASSERT_OK_AND_ASSIGN(std::vector<ShardedTensorView> listed, client_->List());
  EXPECT_THAT(Names(listed), ::testing::Not(::testing::Contains("truncated")));
  EXPECT_THAT(client_->Delete("bad"), IsOk());
  for (const absl::Status& s : client_->Health()) EXPECT_THAT(s, IsOk());
}

// TransferOptions::cancel: a cancelled read or write ends with CANCELLED
// at its next chunk; a write cancelled before its bytes left applies
// nothing.
TEST_F(DaemonTest, CancelledTransfersEndWithCancelled) {
  ASSERT_OK_AND_ASSIGN(ShardedTensorView view,
                       client_->Create("cancelled", {8, 4}, RowSpec()));
  ASSERT_OK(view.Write({0, 0}, Iota(8, 4)));
  TransferOptions options;
  auto cancel = std::make_shared<Cancellation>();
  cancel->Cancel();
  options.cancel = cancel;
  EXPECT_THAT(view.Read(options).status(),
              StatusIs(absl::StatusCode::kCancelled, HasSubstr("cancelled")));
  ASSERT_OK_AND_ASSIGN(Tensor zeros, Tensor::Zeros({8, 4}));
  EXPECT_THAT(view.Write({0, 0}, zeros, options),
              StatusIs(absl::StatusCode::kCancelled, HasSubstr("cancelled")));
  options.cancel = nullptr;
  ASSERT_OK_AND_ASSIGN(Tensor values, view.Read(options));
  EXPECT_EQ(values.data<float>()[31], Iota(8, 4).data<float>()[31]);
  EXPECT_OK(client_->Delete("cancelled"));
}

// Requests that once aborted every daemon (issue 14): a save to a path the
// file system refuses, placements without an owner, on the meta device or
// on a device the daemon cannot hold. Each is refused with a clear error;
// TearDown checks that every daemon still runs, and the tensor keeps its
// values.
TEST_F(DaemonTest, BadPathsAndPlacementsAreRefusedNotFatal) {
  ASSERT_OK_AND_ASSIGN(ShardedTensorView view,
                       client_->Create("keep", {8, 4}, RowSpec()));
  const Tensor values = Iota(8, 4);
  ASSERT_OK(view.Write({0, 0}, values));

  // Paths: too long a name (ENAMETOOLONG), a symlink loop (ELOOP).
  const std::string long_name =
      cluster_->scratch_dir() + "/" + std::string(300, 'x');
  absl::Status saved = client_->Save(long_name, {"keep"}).status();
  EXPECT_FALSE(saved.ok());
  EXPECT_THAT(saved.message(), HasSubstr("File name too long"));
  const std::string loop = cluster_->scratch_dir() + "/loop";
  ASSERT_EQ(symlink((loop + "_b").c_str(), (loop + "_a").c_str()), 0);
  ASSERT_EQ(symlink((loop + "_a").c_str(), (loop + "_b").c_str()), 0);
  saved = client_->Save(loop + "_a/ckpt", {"keep"}).status();
  EXPECT_FALSE(saved.ok());
  EXPECT_THAT(saved.message(), HasSubstr("symbolic link"));

  // Placements, as a gRPC client may send them (the CLI cannot).
  const auto spec_with =
      [](const std::function<void(v1::RemoteDevice*)>& change) {
        v1::ShardingSpec spec = ToProto(RowSpec());
        change(spec.mutable_chunk()->mutable_placements(1));
        return spec;
      };
  const std::vector<std::pair<v1::ShardingSpec, std::string>> bad = {
      {spec_with([](v1::RemoteDevice* d) { d->clear_rank(); }),
       "names no owner"},
      {spec_with([](v1::RemoteDevice* d) {
         d->mutable_device()->set_type(v1::DEVICE_TYPE_META);
       }),
       "meta device"},
      {spec_with([](v1::RemoteDevice* d) {
         d->mutable_device()->set_type(v1::DEVICE_TYPE_CUDA);
         d->mutable_device()->set_index(0);
       }),
       "cannot hold CUDA shards"},
      {spec_with([](v1::RemoteDevice* d) { d->set_rank(-1); }), "rank"},
      {spec_with([](v1::RemoteDevice* d) { d->set_worker_name("nobody"); }),
       "Invalid worker name: nobody"},
      {spec_with([](v1::RemoteDevice* d) { d->set_rank(9); }),
       "Global rank 9 does not exist"},
  };
  for (const auto& [spec, message] : bad) {
    SCOPED_TRACE(message);
    auto stub = Stub(2);
    {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() +
                           std::chrono::seconds(30));
      v1::CreateTensorRequest request;
      request.set_name("placed");
      request.add_sizes(8);
      request.add_sizes(4);
      *request.mutable_spec() = spec;
      v1::TensorInfo info;
      const grpc::Status status = stub->CreateTensor(&context, request, &info);
      EXPECT_EQ(status.error_code(), grpc::INVALID_ARGUMENT)
          << status.error_message();
      EXPECT_THAT(status.error_message(), HasSubstr(message));
    }
    {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() +
                           std::chrono::seconds(30));
      v1::ReshardRequest request;
      request.set_name("keep");
      *request.mutable_spec() = spec;
      v1::TensorInfo info;
      const grpc::Status status = stub->Reshard(&context, request, &info);
      EXPECT_EQ(status.error_code(), grpc::INVALID_ARGUMENT)
          << status.error_message();
      EXPECT_THAT(status.error_message(), HasSubstr(message));
    }
  }
  EXPECT_THAT(client_->Open("placed").status(),
              StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  // Nothing was lost, and the cluster still works as a whole.
  ASSERT_OK_AND_ASSIGN(view, client_->Open("keep"));
  ASSERT_OK_AND_ASSIGN(Tensor read, view.Read());
  EXPECT_TRUE(Equal(read, values));
  ASSERT_OK(client_->Reshard("keep", ColumnSpec()).status());
  ASSERT_OK_AND_ASSIGN(view, client_->Open("keep"));
  ASSERT_OK_AND_ASSIGN(read, view.Read());
  EXPECT_TRUE(Equal(read, values));
  ASSERT_OK(client_->Delete("keep"));
}

TEST_F(DaemonTest, ConcurrentClientsKeepListingsConsistent) {
  constexpr int kRounds = 8;
  std::atomic<int> unexpected{0};
  auto worker = [&](int id) {
    auto client = Client::Connect(cluster_->address(id == 0 ? 1 : 3));
    if (!client.ok()) {
      ++unexpected;
      return;
    }
    for (int i = 0; i < kRounds; ++i) {
      // Own names: must always work.
      const std::string own = absl::StrCat("c", id, "_", i);
      if (!(*client)->Create(own, {8, 4}, RowSpec()).ok()) ++unexpected;
      // A contended name: one of the two wins each round.
      absl::Status created =
          (*client)->Create("contended", {4, 4}, RowSpec()).status();
      if (!created.ok() && !absl::IsAlreadyExists(created)) ++unexpected;
      absl::Status deleted = (*client)->Delete("contended");
      if (!deleted.ok() && !absl::IsNotFound(deleted)) ++unexpected;
      if (i % 2 == 1 &&
          !(*client)->Delete(absl::StrCat("c", id, "_", i - 1)).ok()) {
        ++unexpected;
      }
    }
  };
  std::thread a(worker, 0), b(worker, 1);
  a.join();
  b.join();
  EXPECT_EQ(unexpected.load(), 0);

  // Every daemon lists exactly the survivors: c{0,1}_{1,3,5,7}.
  std::set<std::string> expected;
  for (int id = 0; id < 2; ++id) {
    for (int i = 1; i < kRounds; i += 2) {
      expected.insert(absl::StrCat("c", id, "_", i));
    }
  }
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_OK_AND_ASSIGN(auto client, Client::Connect(cluster_->address(r)));
    ASSERT_OK_AND_ASSIGN(std::vector<ShardedTensorView> listed, client->List());
    std::vector<std::string> names = Names(listed);
    EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), expected)
        << "on daemon " << r;
    EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  }
  for (const std::string& name : expected) {
    EXPECT_THAT(client_->Delete(name), IsOk());
  }
}

// Its own cluster: one daemon dies.
TEST(DaemonFailureTest, DaemonKilledMidFetch) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DaemonCluster> cluster, StartCluster());
  // Streams only: the local path copies a whole shard at once (the
  // first progress report comes after it), and a dead owner's lent memory
  // stays readable, so there is no "mid-fetch" to cut there.
  ClientOptions streams;
  streams.use_local_path = false;
  ASSERT_OK_AND_ASSIGN(auto client,
                       Client::Connect(cluster->address(0), streams));
  // 4 x 16 MiB of rows; rank 3's shard is the one that dies.
  const int64_t rows = 4 * 1024, cols = 4096;
  ASSERT_OK_AND_ASSIGN(ShardedTensorView view,
                       client->Create("big", {rows, cols}, RowSpec()));

  // Pause the transfer at its first progress report, kill rank 3 then.
  absl::Notification started, killed;
  TransferOptions options;
  options.timeout = absl::Seconds(20);
  options.chunk_bytes = 64 << 10;
  options.progress = [&](int64_t done, int64_t total) {
    if (!started.HasBeenNotified()) {
      started.Notify();
      killed.WaitForNotificationWithTimeout(absl::Seconds(10));
    }
  };
  absl::Status read_status;
  absl::Duration took;
  std::thread reader([&] {
    const absl::Time start = absl::Now();
    read_status = view.Read(options).status();
    took = absl::Now() - start;
  });
  ASSERT_TRUE(started.WaitForNotificationWithTimeout(absl::Seconds(20)));
  cluster->Kill(3);
  killed.Notify();
  reader.join();
  EXPECT_THAT(read_status,
              StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
  EXPECT_LT(took, options.timeout);

  // The others keep serving their shards.
  ASSERT_OK_AND_ASSIGN(Tensor first, view.ReadRegion({0, 0}, {3 * 1024, 8}));
  EXPECT_EQ(first.sizes(), (std::vector<int64_t>{3 * 1024, 8}));
  ASSERT_OK_AND_ASSIGN(auto other, Client::Connect(cluster->address(1)));
  ASSERT_OK_AND_ASSIGN(ShardedTensorView again, other->Open("big"));
  EXPECT_EQ(again.tensor_id(), view.tensor_id());
  std::vector<absl::Status> health = client->Health();
  ASSERT_EQ(health.size(), 4u);
  EXPECT_THAT(health[0], IsOk());
  EXPECT_THAT(health[1], IsOk());
  EXPECT_THAT(health[2], IsOk());
  EXPECT_FALSE(health[3].ok());

  // A collective operation now fails within its deadline instead of
  // hanging: rank 3 cannot take part.
  const absl::Time start = absl::Now();
  absl::Status created = client->Create("after", {8, 8}, RowSpec()).status();
  EXPECT_FALSE(created.ok());
  EXPECT_THAT(created.code(), AnyOf(absl::StatusCode::kUnavailable,
                                    absl::StatusCode::kDeadlineExceeded));
  EXPECT_LT(absl::Now() - start, absl::Seconds(65));
  for (int r = 0; r < 3; ++r) {
    EXPECT_FALSE(cluster->daemon(r).WaitFor(absl::ZeroDuration()))
        << "daemon " << r << " died:\n"
        << cluster->Log(r);
  }
}

TEST(DaemonFailureTest, SigtermStopsADaemonPromptly) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DaemonCluster> cluster, StartCluster());
  std::optional<int> status = cluster->Terminate(2, absl::Seconds(15));
  ASSERT_TRUE(status.has_value()) << cluster->Log(2);
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
      << DescribeWaitStatus(*status) << "\n"
      << cluster->Log(2);
  ASSERT_OK_AND_ASSIGN(auto client, Client::Connect(cluster->address(0)));
  std::vector<absl::Status> health = client->Health();
  ASSERT_EQ(health.size(), 4u);
  EXPECT_THAT(health[2], StatusIs(absl::StatusCode::kUnavailable,
                                  HasSubstr(cluster->address(2))));
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteFile(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << contents;
  ASSERT_TRUE(out.good()) << path;
}

bool Exists(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

// Sets a file's modification time `seconds` from now.
void SetMtime(const std::string& path, int seconds) {
  const struct timespec times[2] = {{time(nullptr) + seconds, 0},
                                    {time(nullptr) + seconds, 0}};
  ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), times, AT_SYMLINK_NOFOLLOW), 0)
      << path << ": " << strerror(errno);
}

// An hour back: a leftover of a save that was killed before this one
// began.
void MakeOld(const std::string& path) { SetMtime(path, -3600); }

// Checkpoint paths as a hostile local user would send them (issue 14): the
// daemons run with the cluster's scratch directory as --checkpoint-root and
// never read, write, create or remove anything outside it, never follow a
// symbolic link, never replace a checkpoint without overwrite, and remove
// only their own leftovers.
TEST_F(DaemonTest, CheckpointPathsStayInsideTheRoot) {
  ASSERT_OK_AND_ASSIGN(ShardedTensorView view,
                       client_->Create("guarded", {8, 4}, RowSpec()));
  ASSERT_OK(view.Write({0, 0}, Iota(8, 4)));
  const std::string root = cluster_->scratch_dir();
  char outside_template[] = "/tmp/tessera-outside-XXXXXX";
  ASSERT_NE(mkdtemp(outside_template), nullptr);
  const std::string outside = outside_template;
  WriteFile(outside + "/secret", "root-only secret");

  // Paths that leave the root: refused, nothing created anywhere.
  for (const std::string& path :
       {std::string("../escape"), std::string("a/../../escape"),
        root + "/../escape", outside + "/ckpt", std::string("/escape"),
        std::string("/")}) {
    SCOPED_TRACE(path);
    EXPECT_THAT(client_->Save(path, {"guarded"}).status(),
                StatusIs(absl::StatusCode::kPermissionDenied,
                         AnyOf(HasSubstr("outside the daemon's checkpoint "
                                         "roots"),
                               HasSubstr("\"..\""))));
    v1::LoadCheckpointRequest load;
    load.set_path(path);
    EXPECT_THAT(client_->Load(load).status(),
                StatusIs(absl::StatusCode::kPermissionDenied, ::testing::_));
  }
  EXPECT_FALSE(Exists(outside + "/ckpt"));
  EXPECT_FALSE(Exists(root + "/../escape"));
  EXPECT_FALSE(Exists(root + "/a"));
  EXPECT_FALSE(Exists("/escape"));

  // A symbolic link inside the root, to a directory outside: refused for
  // save and load, relative or absolute, at any depth.
  ASSERT_EQ(symlink(outside.c_str(), (root + "/link").c_str()), 0);
  for (const std::string& path :
       {std::string("link/ckpt"), root + "/link/ckpt", std::string("link")}) {
    SCOPED_TRACE(path);
    EXPECT_THAT(client_->Save(path, {"guarded"}).status(),
                StatusIs(absl::StatusCode::kPermissionDenied,
                         HasSubstr("symbolic link")));
  }
  v1::LoadCheckpointRequest through_link;
  through_link.set_path("link");
  EXPECT_THAT(client_->Load(through_link).status(),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("symbolic link")));
  EXPECT_FALSE(Exists(outside + "/ckpt"));
  EXPECT_FALSE(Exists(outside + "/manifest.pb"));

  // A relative path is beneath the root; a second save needs overwrite.
  ASSERT_OK(client_->Save("rel/ckpt", {"guarded"}).status());
  const std::string ckpt = root + "/rel/ckpt";
  const std::string first_manifest = ReadFile(ckpt + "/manifest.pb");
  ASSERT_FALSE(first_manifest.empty());
  const std::set<std::string> first_files = [&] {
    std::set<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(ckpt)) {
      names.insert(e.path().filename().string());
    }
    return names;
  }();
  EXPECT_THAT(
      client_->Save("rel/ckpt", {"guarded"}).status(),
      StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("overwrite")));
  EXPECT_THAT(client_->Save(ckpt, {"guarded"}).status(),
              StatusIs(absl::StatusCode::kAlreadyExists, ::testing::_));
  EXPECT_EQ(ReadFile(ckpt + "/manifest.pb"), first_manifest);

  // Files that are not this save's to remove survive an overwrite: other
  // names, names of the format's old loose patterns, files modified since
  // the save began, another user's files. Leftovers of a killed save (this
  // format's names, not in any manifest, older than the save) are removed.
  const std::vector<std::string> survivors = {
      "notes.txt", "rank7.shards", "dense.x.bin",
      "rank2.0123456789abcdef.shards.tmp.77.0"};
  for (const std::string& name : survivors) WriteFile(ckpt + "/" + name, "x");
  MakeOld(ckpt + "/notes.txt");
  MakeOld(ckpt + "/rank7.shards");
  // Still being written (by a save this one must not disturb).
  SetMtime(ckpt + "/rank2.0123456789abcdef.shards.tmp.77.0", 3600);
  const std::vector<std::string> leftovers = {
      "rank1.0123456789abcdef.shards.tmp.4242.0", "dense.fedcba9876543210.bin",
      "manifest.pb.tmp.4242.1"};
  for (const std::string& name : leftovers) {
    WriteFile(ckpt + "/" + name, "left over");
    MakeOld(ckpt + "/" + name);
  }
  const bool root_user = geteuid() == 0;
  const std::string foreign = "rank3.00000000deadbeef.shards";
  if (root_user) {
    WriteFile(ckpt + "/" + foreign, "another user's");
    ASSERT_EQ(chown((ckpt + "/" + foreign).c_str(), 65534, 65534), 0);
    MakeOld(ckpt + "/" + foreign);
  }
  ASSERT_OK(
      client_->Save("rel/ckpt", {"guarded"}, /*overwrite=*/true).status());
  EXPECT_NE(ReadFile(ckpt + "/manifest.pb"), first_manifest);
  for (const std::string& name : survivors) {
    EXPECT_TRUE(Exists(ckpt + "/" + name)) << name;
  }
  if (root_user) {
    EXPECT_TRUE(Exists(ckpt + "/" + foreign));
  }
  for (const std::string& name : leftovers) {
    EXPECT_FALSE(Exists(ckpt + "/" + name)) << name;
  }
  // The replaced checkpoint's data files are gone (its manifest named them).
  for (const std::string& name : first_files) {
    if (name == "manifest.pb") continue;
    EXPECT_FALSE(Exists(ckpt + "/" + name)) << name;
  }

  // The next load removes a killed save's leftovers too.
  WriteFile(ckpt + "/rank0.00112233445566ff.shards", "left over");
  MakeOld(ckpt + "/rank0.00112233445566ff.shards");
  v1::LoadCheckpointRequest load;
  load.set_path("rel/ckpt");
  load.add_names("guarded");
  load.add_as_names("guarded_copy");
  ASSERT_OK_AND_ASSIGN(std::vector<ShardedTensorView> loaded,
                       client_->Load(load));
  ASSERT_EQ(loaded.size(), 1u);
  ASSERT_OK_AND_ASSIGN(Tensor copy, loaded[0].Read());
  ExpectIotaBox(copy, 0, 0, 4);
  EXPECT_FALSE(Exists(ckpt + "/rank0.00112233445566ff.shards"));

  // A manifest.pb planted as a symbolic link to a file outside: an
  // overwriting save replaces the link, never writes through it.
  ASSERT_EQ(mkdir((root + "/rel/planted").c_str(), 0755), 0);
  ASSERT_EQ(symlink((outside + "/secret").c_str(),
                    (root + "/rel/planted/manifest.pb").c_str()),
            0);
  EXPECT_THAT(client_->Save("rel/planted", {"guarded"}).status(),
              StatusIs(absl::StatusCode::kAlreadyExists, ::testing::_));
  ASSERT_OK(
      client_->Save("rel/planted", {"guarded"}, /*overwrite=*/true).status());
  EXPECT_EQ(ReadFile(outside + "/secret"), "root-only secret");
  struct stat st;
  ASSERT_EQ(lstat((root + "/rel/planted/manifest.pb").c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));

  // A crafted manifest whose data extents are a symbolic link to a secret:
  // the load fails without reading through it (no checksum oracle).
  ASSERT_EQ(mkdir((root + "/rel/crafted").c_str(), 0755), 0);
  ASSERT_EQ(symlink((outside + "/secret").c_str(),
                    (root + "/rel/crafted/stolen").c_str()),
            0);
  ASSERT_OK_AND_ASSIGN(Directory source, Directory::Open(ckpt));
  ASSERT_OK_AND_ASSIGN(v1::CheckpointManifest manifest,
                       ReadCheckpointManifest(source));
  for (v1::CheckpointEntry& entry : *manifest.mutable_entries()) {
    for (v1::SavedShard& shard : *entry.mutable_sharded()->mutable_shards()) {
      shard.mutable_data()->set_file("stolen");
    }
  }
  ASSERT_OK_AND_ASSIGN(Directory crafted,
                       Directory::Open(root + "/rel/crafted"));
  ASSERT_OK(WriteCheckpointManifest(crafted, manifest));
  v1::LoadCheckpointRequest steal;
  steal.set_path("rel/crafted");
  steal.add_names("guarded");
  steal.add_as_names("stolen");
  const absl::Status stolen = client_->Load(steal).status();
  EXPECT_FALSE(stolen.ok());
  EXPECT_THAT(stolen.message(), HasSubstr("stolen"));
  for (const char* name : {"../x", "/etc/passwd", "."}) {
    for (v1::CheckpointEntry& entry : *manifest.mutable_entries()) {
      for (v1::SavedShard& shard : *entry.mutable_sharded()->mutable_shards()) {
        shard.mutable_data()->set_file(name);
      }
    }
    ASSERT_OK(WriteCheckpointManifest(crafted, manifest));
    EXPECT_THAT(
        client_->Load(steal).status(),
        StatusIs(absl::StatusCode::kDataLoss, HasSubstr("bad file name")))
        << name;
  }
  EXPECT_THAT(client_->Open("stolen").status(),
              StatusIs(absl::StatusCode::kNotFound, ::testing::_));

  // The tensor kept its values through all of it.
  ASSERT_OK_AND_ASSIGN(Tensor after, view.Read());
  ExpectIotaBox(after, 0, 0, 4);
  std::filesystem::remove_all(outside);
}

// Without --checkpoint-root a daemon refuses every save and load, saying
// how to enable them.
TEST(DaemonCheckpointRootTest, NoRootRefusesSaveAndLoad) {
  DaemonClusterOptions options;
  options.world_size = 1;
  options.server_path = TESSERA_SERVER_PATH;
  options.checkpoint_root = false;
  options.extra_args = {"--log-level", "warn"};
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DaemonCluster> cluster,
                       DaemonCluster::Start(options));
  ASSERT_OK_AND_ASSIGN(auto client, Client::Connect(cluster->address(0)));
  ASSERT_OK(
      client->Create("t", {4}, *ChunkShardingSpec::Create(0, {"rank:0/cpu"}))
          .status());
  const std::string path = cluster->scratch_dir() + "/ckpt";
  EXPECT_THAT(client->Save(path, {"t"}).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("--checkpoint-root")));
  v1::LoadCheckpointRequest load;
  load.set_path(path);
  EXPECT_THAT(client->Load(load).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("--checkpoint-root")));
  EXPECT_FALSE(Exists(path));
  EXPECT_FALSE(cluster->daemon(0).WaitFor(absl::ZeroDuration()));
}

}  // namespace
}  // namespace tessera
