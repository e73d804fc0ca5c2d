// The daemons' ControlService (server/daemon/control_service.h) in 4 real rank
// processes on loopback: every rank serves the service on its Rank's gRPC
// server, and rank 0 plays the clients, calling all four daemons over real
// gRPC with the generated stub. The operation log runs through the test's
// real gRPC store, and collectives over real Gloo.
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/proto_convert.h"
#include "common/sharding_spec.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "server/daemon/control_service.h"
#include "server/store/prefix_store.h"
#include "tessera/v1/control.grpc.pb.h"
#include "tests/testing/multi_process.h"
#include "tests/testing/status_matchers.h"
#include "wire/auth.h"
#include "wire/grpc_status.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kDoneKey[] = "control_test/done";

v1::ShardingSpec ChunkOn(int64_t dim, std::vector<std::string> placements) {
  absl::StatusOr<ChunkShardingSpec> spec =
      ChunkShardingSpec::Create(dim, placements);
  EXPECT_OK(spec.status());
  return ToProto(ShardingSpec(*spec));
}

v1::ShardingSpec Chunk(int64_t dim, std::vector<int> ranks) {
  std::vector<std::string> placements;
  for (int r : ranks) placements.push_back(absl::StrCat("rank:", r, "/cpu"));
  return ChunkOn(dim, std::move(placements));
}

v1::CreateTensorRequest Create(const std::string& name,
                               std::vector<int64_t> sizes, v1::InitKind init,
                               v1::ShardingSpec spec = Chunk(0, {0, 1, 2, 3})) {
  v1::CreateTensorRequest request;
  request.set_name(name);
  request.mutable_sizes()->Add(sizes.begin(), sizes.end());
  request.set_init(init);
  *request.mutable_spec() = std::move(spec);
  return request;
}

std::vector<float> Floats(const std::string& bytes) {
  std::vector<float> values(bytes.size() / sizeof(float));
  std::memcpy(values.data(), bytes.data(), values.size() * sizeof(float));
  return values;
}

class ControlServiceTest : public testing::MultiProcessTest {
 protected:
  // Every rank: joins the world and serves the control service. Rank 0
  // first checks that its daemon refuses calls until started.
  void StartDaemon() {
    ASSERT_OK(InitPg());
    ControlOptions options;
    options.claim_timeout = absl::Milliseconds(300);
    options.op_timeout = absl::Seconds(30);
    const char* tmp = getenv("TMPDIR");
    ASSERT_OK_AND_ASSIGN(
        options.checkpoint_roots,
        CheckpointRoots::Open({tmp != nullptr ? tmp : "/tmp"}));
    service_ = std::make_unique<ControlServiceImpl>(rank_runtime(), options);
    RpcOptions rpc;
    rpc.services.push_back(service_.get());
    ASSERT_OK(InitRpc(rpc));
    if (rank() == 0) {
      v1::ListTensorsResponse listed;
      EXPECT_THAT(Call(0, &v1::ControlService::Stub::ListTensors,
                       v1::ListTensorsRequest(), &listed),
                  StatusIs(absl::StatusCode::kUnavailable,
                           HasSubstr("daemon is starting")));
    }
    ASSERT_OK(service_->Start());
    // A daemon refuses calls until its own Start() returns: the clients
    // begin once every daemon has started.
    ASSERT_OK(store()->Set(absl::StrCat("control_test/started/", rank()), "1"));
    if (rank() == 0) {
      std::vector<std::string> started;
      for (int r = 0; r < world_size(); ++r) {
        started.push_back(absl::StrCat("control_test/started/", r));
      }
      ASSERT_OK(store()->Wait(started, absl::Seconds(30)));
    }
  }

  // Rank 0 says when its clients are done; every daemon then stops.
  void StopDaemons() {
    if (rank() == 0) {
      ASSERT_OK(store()->Set(kDoneKey, "1"));
    } else {
      ASSERT_OK(store()->Wait({kDoneKey}, absl::Seconds(90)));
    }
    service_->Shutdown();
    if (rank() == 0) {
      // A stopped service refuses calls while its server still runs.
      v1::ListTensorsResponse listed;
      EXPECT_THAT(Call(0, &v1::ControlService::Stub::ListTensors,
                       v1::ListTensorsRequest(), &listed),
                  StatusIs(absl::StatusCode::kUnavailable,
                           HasSubstr("daemon is shutting down")));
      v1::TensorInfo info;
      EXPECT_THAT(Call(0, &v1::ControlService::Stub::CreateTensor,
                       Create("late", {4}, v1::INIT_KIND_ONES), &info),
                  StatusIs(absl::StatusCode::kUnavailable,
                           HasSubstr("daemon is shutting down")));
    }
    ASSERT_OK(DestroyComms());
  }

  void TearDown() override {
    // A client that failed half-way still releases the other daemons.
    if (rank() == 0 && store() != nullptr) {
      EXPECT_OK(store()->Set(kDoneKey, "1"));
    }
    if (service_ != nullptr) service_->Shutdown();
    MultiProcessTest::TearDown();
  }

  v1::ControlService::Stub& Stub(int r) {
    if (stubs_.empty()) {
      for (int w = 0; w < world_size(); ++w) {
        absl::StatusOr<WorkerInfo> worker = rank_runtime()->Worker(w);
        EXPECT_OK(worker.status());
        stubs_.push_back(v1::ControlService::NewStub(CreateTesseraChannel(
            worker.ok() ? worker->address : "127.0.0.1:1")));
      }
    }
    return *stubs_[r];
  }

  // A unary call to daemon `r`, with a deadline.
  template <typename Request, typename Response>
  absl::Status Call(int r,
                    grpc::Status (v1::ControlService::Stub::*method)(
                        grpc::ClientContext*, const Request&, Response*),
                    const Request& request, Response* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(30));
    return FromGrpcStatus((Stub(r).*method)(&context, request, response));
  }

  absl::StatusOr<v1::TensorInfo> CreateOn(int r,
                                          const v1::CreateTensorRequest& req) {
    v1::TensorInfo info;
    RETURN_IF_ERROR(
        Call(r, &v1::ControlService::Stub::CreateTensor, req, &info));
    return info;
  }
  absl::StatusOr<v1::TensorInfo> DescribeOn(int r, const std::string& name) {
    v1::DescribeNamedTensorRequest request;
    request.set_name(name);
    v1::TensorInfo info;
    RETURN_IF_ERROR(
        Call(r, &v1::ControlService::Stub::DescribeTensor, request, &info));
    return info;
  }
  absl::Status DeleteOn(int r, const std::string& name) {
    v1::DeleteTensorRequest request;
    request.set_name(name);
    v1::DeleteTensorResponse response;
    return Call(r, &v1::ControlService::Stub::DeleteTensor, request, &response);
  }
  // "name=tensor_id" of every tensor daemon `r` lists, in its order.
  std::vector<std::string> ListOn(int r,
                                  const std::vector<std::string>& names = {}) {
    v1::ListTensorsRequest request;
    for (const std::string& name : names) request.add_names(name);
    v1::ListTensorsResponse response;
    EXPECT_OK(
        Call(r, &v1::ControlService::Stub::ListTensors, request, &response));
    std::vector<std::string> listed;
    for (const v1::TensorInfo& info : response.tensors()) {
      listed.push_back(absl::StrCat(info.name(), "=", info.tensor_id()));
    }
    return listed;
  }
  absl::StatusOr<v1::TensorInfo> ReshardOn(int r, const std::string& name,
                                           v1::ShardingSpec spec) {
    v1::ReshardRequest request;
    request.set_name(name);
    *request.mutable_spec() = std::move(spec);
    v1::TensorInfo info;
    RETURN_IF_ERROR(
        Call(r, &v1::ControlService::Stub::Reshard, request, &info));
    return info;
  }

  // The whole tensor, gathered on daemon `r` and streamed back in small
  // chunks; checks the stream's framing.
  absl::StatusOr<std::string> GatherOn(int r, const std::string& name) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(30));
    v1::GatherRequest request;
    request.set_name(name);
    request.set_chunk_bytes(4096);
    std::unique_ptr<grpc::ClientReader<v1::ShardChunk>> reader =
        Stub(r).Gather(&context, request);
    v1::ShardChunk chunk;
    v1::ShardHeader header;
    std::string bytes;
    int chunks = 0;
    while (reader->Read(&chunk)) {
      if (chunks++ == 0) header = chunk.header();
      EXPECT_EQ(chunk.offset(), static_cast<int64_t>(bytes.size()));
      bytes += chunk.data();
    }
    RETURN_IF_ERROR(FromGrpcStatus(reader->Finish()));
    EXPECT_EQ(header.total_bytes(), static_cast<int64_t>(bytes.size()));
    EXPECT_EQ(chunks, std::max<int64_t>(1, (bytes.size() + 4095) / 4096));
    return bytes;
  }

  std::unique_ptr<ControlServiceImpl> service_;
  std::vector<std::unique_ptr<v1::ControlService::Stub>> stubs_;
};

TEST_F(ControlServiceTest, CreateListDescribeDelete) {
  TESSERA_RUN_IN_RANKS();
  StartDaemon();
  if (rank() == 0) {
    v1::ClusterInfo cluster;
    ASSERT_OK(Call(2, &v1::ControlService::Stub::GetCluster,
                   v1::GetClusterRequest(), &cluster));
    EXPECT_EQ(cluster.world_size(), 4);
    EXPECT_EQ(cluster.rank(), 2);
    EXPECT_EQ(cluster.version(), "0.1.0");
    ASSERT_EQ(cluster.workers_size(), 4);
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(cluster.workers(r).rank(), r);
      EXPECT_EQ(cluster.workers(r).name(), absl::StrCat("worker", r));
      EXPECT_EQ(cluster.workers(r).address(),
                rank_runtime()->Worker(r)->address);
      EXPECT_EQ(cluster.workers(r).device(), "cpu");
    }

    // Created through daemon 1, visible everywhere with the same id.
    ASSERT_OK_AND_ASSIGN(v1::TensorInfo a,
                         CreateOn(1, Create("a", {8, 6}, v1::INIT_KIND_ZEROS)));
    EXPECT_EQ(a.name(), "a");
    EXPECT_THAT(a.shard_ranks(), ElementsAre(0, 1, 2, 3));
    EXPECT_THAT(a.metadata().size(), ElementsAre(8, 6));
    EXPECT_EQ(a.metadata().shards_metadata_size(), 4);
    for (int r = 0; r < 4; ++r) {
      EXPECT_THAT(ListOn(r), ElementsAre(absl::StrCat("a=", a.tensor_id())));
      ASSERT_OK_AND_ASSIGN(v1::TensorInfo described, DescribeOn(r, "a"));
      EXPECT_EQ(described.SerializeAsString(), a.SerializeAsString());
    }
    // Worker names place shards too.
    ASSERT_OK_AND_ASSIGN(
        v1::TensorInfo by_worker,
        CreateOn(3, Create("by_worker", {4}, v1::INIT_KIND_ONES,
                           ChunkOn(0, {"worker3/cpu", "worker1/cpu"}))));
    EXPECT_THAT(by_worker.shard_ranks(), ElementsAre(3, 1));
    // Named: only those that exist, sorted, each once.
    EXPECT_THAT(ListOn(2, {"by_worker", "nope", "a", "by_worker"}),
                ElementsAre(absl::StrCat("a=", a.tensor_id()),
                            absl::StrCat("by_worker=", by_worker.tensor_id())));
    EXPECT_THAT(ListOn(2, {"nope"}), ElementsAre());
    EXPECT_THAT(ListOn(2, {"a"}),
                ElementsAre(absl::StrCat("a=", a.tensor_id())));

    // Name errors agree on every daemon.
    EXPECT_THAT(CreateOn(2, Create("a", {2}, v1::INIT_KIND_ONES)).status(),
                StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("\"a\"")));
    EXPECT_THAT(DescribeOn(3, "nope").status(),
                StatusIs(absl::StatusCode::kNotFound, HasSubstr("nope")));
    EXPECT_THAT(DeleteOn(2, "nope"),
                StatusIs(absl::StatusCode::kNotFound, HasSubstr("nope")));

    // Bad requests.
    EXPECT_THAT(CreateOn(1, Create("bad name", {4}, v1::INIT_KIND_ONES)),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("invalid tensor name")));
    EXPECT_THAT(
        CreateOn(1, Create(std::string(129, 'x'), {4}, v1::INIT_KIND_ONES)),
        StatusIs(absl::StatusCode::kInvalidArgument,
                 HasSubstr("invalid tensor name")));
    EXPECT_THAT(
        CreateOn(0, Create("b", {4}, v1::INIT_KIND_ONES, Chunk(0, {0, 7}))),
        StatusIs(absl::StatusCode::kInvalidArgument,
                 HasSubstr("Global rank 7 does not exist")));
    EXPECT_THAT(
        CreateOn(0, Create("b", {4}, v1::INIT_KIND_ONES, Chunk(3, {0, 1}))),
        StatusIs(absl::StatusCode::kInvalidArgument,
                 HasSubstr("Invalid sharding dim")));
    EXPECT_THAT(
        CreateOn(0, Create("b", {4}, v1::INIT_KIND_ONES, v1::ShardingSpec())),
        StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
    EXPECT_THAT(CreateOn(3, Create("b", {-4}, v1::INIT_KIND_ONES)),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("negative size")));
    EXPECT_THAT(
        CreateOn(3, Create("b", {int64_t{1} << 40, int64_t{1} << 40},
                           v1::INIT_KIND_ONES)),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("int64")));
    EXPECT_THAT(
        CreateOn(3, Create("b", {int64_t{1} << 61}, v1::INIT_KIND_ONES)),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("int64")));

    // More than the hosts' memory: refused before allocating.
    EXPECT_THAT(
        CreateOn(2, Create("huge", {4, int64_t{1} << 40}, v1::INIT_KIND_ZEROS)),
        StatusIs(absl::StatusCode::kResourceExhausted,
                 HasSubstr("bytes of host memory")));

    // A log number claimed by a coordinator that died before writing it:
    // rank 0 marks it skipped and the log goes on.
    PrefixStore log("control", rank_runtime()->store());
    ASSERT_OK(log.Add("seq", 1).status());
    ASSERT_OK_AND_ASSIGN(v1::TensorInfo b,
                         CreateOn(2, Create("b", {4}, v1::INIT_KIND_ONES)));
    // A garbled entry is skipped by every daemon alike.
    ASSERT_OK_AND_ASSIGN(int64_t garbled, log.Add("seq", 1));
    ASSERT_OK(log.Set(absl::StrCat("op/", garbled), "op:\xff\xff\x01garbage"));
    ASSERT_OK(CreateOn(1, Create("c", {4}, v1::INIT_KIND_ZEROS)).status());
    ASSERT_OK(DeleteOn(2, "c"));
    // An op whose call gave up before the daemons reached it (here: while
    // the log waits out another unwritten number) runs nowhere.
    ASSERT_OK(log.Add("seq", 1).status());
    {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() +
                           std::chrono::milliseconds(100));
      v1::TensorInfo info;
      EXPECT_EQ(
          Stub(1)
              .CreateTensor(&context,
                            Create("expired", {4}, v1::INIT_KIND_ONES), &info)
              .error_code(),
          grpc::StatusCode::DEADLINE_EXCEEDED);
    }
    ASSERT_OK(CreateOn(1, Create("c", {4}, v1::INIT_KIND_ZEROS)).status());
    for (int r = 0; r < 4; ++r) {
      EXPECT_THAT(DescribeOn(r, "expired").status(),
                  StatusIs(absl::StatusCode::kNotFound, HasSubstr("expired")));
    }
    ASSERT_OK(DeleteOn(0, "c"));
    // After all those failures the daemons still agree on tensor ids.
    for (int r = 0; r < 4; ++r) {
      ASSERT_OK_AND_ASSIGN(v1::TensorInfo described, DescribeOn(r, "b"));
      EXPECT_EQ(described.tensor_id(), b.tensor_id());
    }
    ASSERT_OK_AND_ASSIGN(std::string ones, GatherOn(3, "b"));
    EXPECT_THAT(Floats(ones), ElementsAre(1, 1, 1, 1));

    ASSERT_OK(DeleteOn(0, "a"));
    EXPECT_THAT(DeleteOn(1, "a"),
                StatusIs(absl::StatusCode::kNotFound, HasSubstr("\"a\"")));
    ASSERT_OK(DeleteOn(3, "b"));
    ASSERT_OK(DeleteOn(1, "by_worker"));
    for (int r = 0; r < 4; ++r) EXPECT_THAT(ListOn(r), ::testing::IsEmpty());
  }
  StopDaemons();
}

// Holes and garbage in the log's keys (docs/control_log.md): numbers taken
// and never written, a few or a trillion, cost one claim timeout (300 ms
// here) in all, not one each; an op claimed among them is not lost; a
// "seq" that is not a log number is repaired; forged skip markers are
// honoured alike. Every daemon ends with the same table.
TEST_F(ControlServiceTest, HolesAndGarbageCostOneClaimTimeout) {
  TESSERA_RUN_IN_RANKS();
  StartDaemon();
  if (rank() == 0) {
    PrefixStore log("control", rank_runtime()->store());
    // 40 holes at 300 ms each would be 12 s.
    constexpr absl::Duration kBound = absl::Seconds(4);
    std::vector<std::string> created;
    int r = 0;
    auto timed_create = [&](const std::string& name) -> absl::Duration {
      const absl::Time start = absl::Now();
      EXPECT_OK(
          CreateOn(r++ % 4, Create(name, {4}, v1::INIT_KIND_ONES)).status())
          << name;
      created.push_back(name);
      return absl::Now() - start;
    };
    EXPECT_LT(timed_create("first"), kBound);
    ASSERT_OK(log.Add("seq", 40).status());
    EXPECT_LT(timed_create("after_forty"), kBound);
    ASSERT_OK(log.Add("seq", int64_t{1} << 40).status());
    EXPECT_LT(timed_create("after_jump"), kBound);
    // An op claimed right after many holes: rank 0 finds it at the top of
    // the range.
    ASSERT_OK(log.Add("seq", 3 * 64).status());
    EXPECT_LT(timed_create("after_holes"), kBound);
    // An op written in the middle of a long range of holes, past the
    // numbers rank 0 looks at: the log jumps over it, and its coordinator
    // submits it again under a new number.
    {
      ASSERT_OK_AND_ASSIGN(const int64_t before, log.Add("seq", 200));
      const absl::Time start = absl::Now();
      absl::StatusOr<v1::TensorInfo> middle;
      std::thread submit([&] {
        middle = CreateOn(2, Create("middle", {4}, v1::INIT_KIND_ONES));
      });
      while (absl::Now() - start < absl::Seconds(10)) {
        absl::StatusOr<int64_t> seq = log.Add("seq", 0);
        if (!seq.ok() || *seq > before) break;
        absl::SleepFor(absl::Milliseconds(1));
      }
      EXPECT_OK(log.Add("seq", 200).status());
      submit.join();
      EXPECT_OK(middle.status());
      EXPECT_LT(absl::Now() - start, kBound);
      created.push_back("middle");
    }

    for (const std::string garbage :
         {"garbage", "", "-7", "9223372036854775807", "4611686018427387905",
          "2"}) {
      SCOPED_TRACE(garbage);
      ASSERT_OK(log.Set("seq", garbage));
      EXPECT_LT(timed_create(absl::StrCat("after_", created.size())), kBound);
      ASSERT_OK_AND_ASSIGN(std::string seq, log.Get("seq"));
      int64_t value = -1;
      EXPECT_TRUE(absl::SimpleAtoi(seq, &value)) << seq;
      EXPECT_GE(value, 0);
      EXPECT_LE(value, int64_t{1} << 62);
    }

    ASSERT_OK_AND_ASSIGN(int64_t n, log.Add("seq", 1));
    ASSERT_OK(log.Set(absl::StrCat("op/", n),
                      absl::StrCat("skip-to ", n + (int64_t{1} << 50))));
    EXPECT_LT(timed_create("after_skip_to"), kBound);
    for (const std::string marker : {"skip-to -5", "skip-to x", "skip-to"}) {
      ASSERT_OK_AND_ASSIGN(int64_t m, log.Add("seq", 1));
      ASSERT_OK(log.Set(absl::StrCat("op/", m), marker));
    }
    EXPECT_LT(timed_create("after_bad_markers"), kBound);

    const std::vector<std::string> listed = ListOn(0);
    EXPECT_EQ(listed.size(), created.size());
    for (int d = 1; d < 4; ++d) EXPECT_EQ(ListOn(d), listed) << "rank " << d;
    for (const std::string& name : created) ASSERT_OK(DeleteOn(1, name));
    for (int d = 0; d < 4; ++d) EXPECT_THAT(ListOn(d), ::testing::IsEmpty());
  }
  StopDaemons();
}

TEST_F(ControlServiceTest, GatherAndReshardKeepValues) {
  TESSERA_RUN_IN_RANKS();
  StartDaemon();
  if (rank() == 0) {
    // 30 x 20 floats: 2400 bytes per shard, several 4 KiB chunks in all.
    v1::CreateTensorRequest full = Create("full", {30, 20}, v1::INIT_KIND_FULL);
    full.set_fill_value(2.5);
    ASSERT_OK(CreateOn(1, full).status());
    ASSERT_OK_AND_ASSIGN(std::string full_bytes, GatherOn(2, "full"));
    ASSERT_EQ(full_bytes.size(), 30 * 20 * sizeof(float));
    for (float v : Floats(full_bytes)) ASSERT_EQ(v, 2.5f);

    // The same seed gives the same values; another seed others.
    v1::CreateTensorRequest rand = Create("r1", {30, 20}, v1::INIT_KIND_RAND);
    rand.set_seed(7);
    ASSERT_OK(CreateOn(0, rand).status());
    rand.set_name("r2");
    ASSERT_OK(CreateOn(3, rand).status());
    rand.set_name("r3");
    rand.set_seed(8);
    ASSERT_OK(CreateOn(2, rand).status());
    ASSERT_OK_AND_ASSIGN(std::string r1, GatherOn(1, "r1"));
    ASSERT_OK_AND_ASSIGN(std::string r2, GatherOn(3, "r2"));
    ASSERT_OK_AND_ASSIGN(std::string r3, GatherOn(0, "r3"));
    EXPECT_EQ(r1, r2);
    EXPECT_NE(r1, r3);
    std::vector<float> values = Floats(r1);
    std::set<float> distinct(values.begin(), values.end());
    EXPECT_GT(distinct.size(), values.size() / 2);  // Shards differ too.
    for (float v : values) {
      ASSERT_GE(v, 0.0f);
      ASSERT_LT(v, 1.0f);
    }

    // Reshard in place: new id and owners everywhere, same values.
    ASSERT_OK_AND_ASSIGN(v1::TensorInfo before, DescribeOn(0, "r1"));
    ASSERT_OK_AND_ASSIGN(v1::TensorInfo after,
                         ReshardOn(2, "r1", Chunk(1, {3, 2, 1, 0})));
    EXPECT_NE(after.tensor_id(), before.tensor_id());
    EXPECT_THAT(after.shard_ranks(), ElementsAre(3, 2, 1, 0));
    for (int r = 0; r < 4; ++r) {
      ASSERT_OK_AND_ASSIGN(v1::TensorInfo described, DescribeOn(r, "r1"));
      EXPECT_EQ(described.SerializeAsString(), after.SerializeAsString());
    }
    ASSERT_OK_AND_ASSIGN(std::string resharded, GatherOn(3, "r1"));
    EXPECT_EQ(resharded, r1);

    EXPECT_THAT(ReshardOn(1, "nope", Chunk(0, {0, 1})).status(),
                StatusIs(absl::StatusCode::kNotFound, HasSubstr("nope")));
    EXPECT_THAT(ReshardOn(1, "r2", Chunk(5, {0, 1})).status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("Invalid sharding dim")));
    EXPECT_THAT(GatherOn(2, "nope").status(),
                StatusIs(absl::StatusCode::kNotFound, HasSubstr("nope")));
    // The failed reshard left r2 as it was.
    ASSERT_OK_AND_ASSIGN(std::string r2_again, GatherOn(1, "r2"));
    EXPECT_EQ(r2_again, r1);
  }
  StopDaemons();
}

TEST_F(ControlServiceTest, SaveAndLoadCheckpoints) {
  TESSERA_RUN_IN_RANKS();
  StartDaemon();
  std::string dir;
  if (rank() == 0) {
    const char* tmp = getenv("TMPDIR");
    dir =
        absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/tessera_control_XXXXXX");
    ASSERT_NE(nullptr, mkdtemp(dir.data()));
    const std::string path = absl::StrCat(dir, "/ckpt");

    v1::CreateTensorRequest rand = Create("w", {16, 12}, v1::INIT_KIND_RANDN);
    rand.set_seed(3);
    ASSERT_OK(CreateOn(1, rand).status());
    v1::CreateTensorRequest full =
        Create("bias", {12}, v1::INIT_KIND_FULL, Chunk(0, {2, 3}));
    full.set_fill_value(-1);
    ASSERT_OK(CreateOn(2, full).status());
    ASSERT_OK_AND_ASSIGN(std::string w, GatherOn(0, "w"));

    v1::SaveCheckpointRequest save;
    save.set_path(path);
    v1::SaveCheckpointResponse saved;
    ASSERT_OK(Call(3, &v1::ControlService::Stub::SaveCheckpoint, save, &saved));
    EXPECT_THAT(saved.names(), ElementsAre("bias", "w"));
    save.add_names("nope");
    EXPECT_THAT(
        Call(3, &v1::ControlService::Stub::SaveCheckpoint, save, &saved),
        StatusIs(absl::StatusCode::kNotFound, HasSubstr("nope")));

    // Loaded under a new name, same layout.
    v1::LoadCheckpointRequest load;
    load.set_path(path);
    load.add_names("w");
    load.add_as_names("w2");
    v1::LoadCheckpointResponse loaded;
    ASSERT_OK(
        Call(2, &v1::ControlService::Stub::LoadCheckpoint, load, &loaded));
    ASSERT_EQ(loaded.tensors_size(), 1);
    EXPECT_EQ(loaded.tensors(0).name(), "w2");
    EXPECT_THAT(loaded.tensors(0).shard_ranks(), ElementsAre(0, 1, 2, 3));
    ASSERT_OK_AND_ASSIGN(std::string w2, GatherOn(3, "w2"));
    EXPECT_EQ(w2, w);

    // A name in use, unless replaced; then resharded while loading.
    EXPECT_THAT(
        Call(1, &v1::ControlService::Stub::LoadCheckpoint, load, &loaded),
        StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("w2")));
    load.set_replace(true);
    *load.mutable_spec() = Chunk(1, {1, 0});
    ASSERT_OK(
        Call(1, &v1::ControlService::Stub::LoadCheckpoint, load, &loaded));
    EXPECT_THAT(loaded.tensors(0).shard_ranks(), ElementsAre(1, 0));
    ASSERT_OK_AND_ASSIGN(w2, GatherOn(2, "w2"));
    EXPECT_EQ(w2, w);

    // Everything, replacing the originals after they were deleted.
    ASSERT_OK(DeleteOn(0, "w"));
    ASSERT_OK(DeleteOn(1, "bias"));
    v1::LoadCheckpointRequest all;
    all.set_path(path);
    ASSERT_OK(Call(0, &v1::ControlService::Stub::LoadCheckpoint, all, &loaded));
    ASSERT_EQ(loaded.tensors_size(), 2);
    ASSERT_OK_AND_ASSIGN(std::string w_again, GatherOn(1, "w"));
    EXPECT_EQ(w_again, w);
    ASSERT_OK_AND_ASSIGN(std::string bias, GatherOn(1, "bias"));
    EXPECT_THAT(Floats(bias), ::testing::Each(-1.0f));
    for (int r = 0; r < 4; ++r) EXPECT_EQ(ListOn(r).size(), 3u);

    // Missing entries and checkpoints.
    all.add_names("nope");
    EXPECT_THAT(
        Call(3, &v1::ControlService::Stub::LoadCheckpoint, all, &loaded),
        StatusIs(absl::StatusCode::kNotFound, HasSubstr("nope")));
    all.clear_names();
    all.set_path(absl::StrCat(dir, "/missing"));
    EXPECT_THAT(
        Call(3, &v1::ControlService::Stub::LoadCheckpoint, all, &loaded),
        StatusIs(absl::StatusCode::kNotFound, ::testing::_));
    all.set_path(path);
    all.add_names("w");
    all.add_as_names("x");
    all.add_as_names("y");
    EXPECT_THAT(
        Call(3, &v1::ControlService::Stub::LoadCheckpoint, all, &loaded),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("as_names")));
    v1::LoadCheckpointRequest renamed_only;
    renamed_only.set_path(path);
    renamed_only.add_as_names("x");
    EXPECT_THAT(
        Call(3, &v1::ControlService::Stub::LoadCheckpoint, renamed_only,
             &loaded),
        StatusIs(absl::StatusCode::kInvalidArgument,
                 HasSubstr("as_names renames the entries listed in names")));
    // Failed loads left the daemons in step.
    ASSERT_OK(CreateOn(3, Create("after", {4}, v1::INIT_KIND_ZEROS)).status());
    std::vector<std::string> listed = ListOn(0);
    EXPECT_EQ(listed.size(), 4u);
    for (int r = 1; r < 4; ++r) EXPECT_EQ(ListOn(r), listed);
  }
  StopDaemons();
  if (!dir.empty()) std::filesystem::remove_all(dir);
}

TEST_F(ControlServiceTest, ConcurrentClientsAgree) {
  TESSERA_RUN_IN_RANKS();
  StartDaemon();
  if (rank() == 0) {
    // Two clients, each through two daemons, creating and deleting at once;
    // both race for one name.
    Stub(0);  // Creates the stubs before the threads share them.
    std::vector<absl::Status> shared(2);
    auto client = [&](const std::string& prefix, int first, int second,
                      absl::Status* race) {
      for (int i = 0; i < 6; ++i) {
        const std::string name = absl::StrCat(prefix, i);
        EXPECT_OK(CreateOn(i % 2 == 0 ? first : second,
                           Create(name, {8, 2}, v1::INIT_KIND_ONES))
                      .status());
        if (i == 2) {
          *race = CreateOn(first, Create("shared", {4}, v1::INIT_KIND_ZEROS))
                      .status();
        }
        if (i % 3 == 0) {
          EXPECT_OK(DeleteOn(second, name));
        }
      }
    };
    std::thread a(client, "a", 1, 2, &shared[0]);
    std::thread b(client, "b", 3, 0, &shared[1]);
    a.join();
    b.join();
    EXPECT_NE(shared[0].ok(), shared[1].ok())
        << shared[0] << " / " << shared[1];
    for (const absl::Status& status : shared) {
      if (!status.ok()) {
        EXPECT_THAT(status, StatusIs(absl::StatusCode::kAlreadyExists,
                                     HasSubstr("shared")));
      }
    }
    std::vector<std::string> listed = ListOn(0);
    std::vector<std::string> names;
    for (const std::string& entry : listed) {
      names.push_back(entry.substr(0, entry.find('=')));
    }
    EXPECT_THAT(names, ElementsAre("a1", "a2", "a4", "a5", "b1", "b2", "b4",
                                   "b5", "shared"));
    for (int r = 1; r < 4; ++r) EXPECT_EQ(ListOn(r), listed);
    std::set<std::string> ids;
    for (const std::string& entry : listed) {
      ids.insert(entry.substr(entry.find('=') + 1));
    }
    EXPECT_EQ(ids.size(), listed.size());
  }
  StopDaemons();
}

TEST_F(ControlServiceTest, DeadPeerFailsOperationsWithoutHanging) {
  TESSERA_RUN_IN_RANKS();
  StartDaemon();
  constexpr char kDieKey[] = "control_test/die";
  if (rank() == 3) {
    // Dies without a word once the first tensor exists.
    ASSERT_OK(store()->Wait({kDieKey}, absl::Seconds(60)));
    _exit(0);
  }
  if (rank() == 0) {
    ASSERT_OK_AND_ASSIGN(v1::TensorInfo x,
                         CreateOn(1, Create("x", {8}, v1::INIT_KIND_ONES)));
    ASSERT_OK(store()->Set(kDieKey, "1"));
    // Wait for rank 3's server to go away.
    v1::ClusterInfo cluster;
    while (Call(3, &v1::ControlService::Stub::GetCluster,
                v1::GetClusterRequest(), &cluster)
               .ok()) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    const absl::Time start = absl::Now();
    absl::Status failed =
        CreateOn(2, Create("y", {8}, v1::INIT_KIND_ONES)).status();
    EXPECT_TRUE(absl::IsUnavailable(failed) ||
                absl::IsDeadlineExceeded(failed) ||
                absl::IsFailedPrecondition(failed))
        << failed;
    EXPECT_LT(absl::Now() - start, absl::Seconds(20));
    // The survivors still answer, and agree that "y" does not exist.
    for (int r = 0; r < 3; ++r) {
      EXPECT_THAT(ListOn(r), ElementsAre(absl::StrCat("x=", x.tensor_id())));
    }
    ASSERT_OK(store()->Set(kDoneKey, "1"));
  } else {
    ASSERT_OK(store()->Wait({kDoneKey}, absl::Seconds(90)));
  }
  // No closing barrier: a peer is gone.
  service_->Shutdown();
  RankShutdownOptions no_barrier;
  no_barrier.barrier = false;
  EXPECT_OK(rank_runtime()->Shutdown(no_barrier));
  AbandonComms();
}

}  // namespace
}  // namespace tessera
