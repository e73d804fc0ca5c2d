// The built `tessera-server` as launchers run it: real processes on
// loopback, a real store, Gloo and gRPC. Bad flags, a busy port and an
// unreachable store end quickly with one error line; daemons serve health
// and ControlService.GetCluster; SIGTERM stops them cleanly.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/proto_convert.h"
#include "common/sharding_spec_text.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "io/socket.h"
#include "io/subprocess.h"
#include "tessera/v1/control.grpc.pb.h"
#include "tessera/v1/shard.pb.h"
#include "tests/testing/daemon_cluster.h"
#include "tests/testing/status_matchers.h"
#include "wire/auth.h"
#include "wire/chunk_codec.h"

#ifndef TESSERA_SERVER_PATH
#error "TESSERA_SERVER_PATH must name the tessera-server binary"
#endif

namespace tessera {
namespace {

using ::testing::Contains;
using testing::DaemonCluster;
using testing::DaemonClusterOptions;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::PickFreePort;
using ::testing::SizeIs;
using ::testing::StartsWith;

constexpr absl::Duration kRpcTimeout = absl::Seconds(5);

using Health = ::grpc::health::v1::HealthCheckResponse::ServingStatus;
constexpr Health kServing = ::grpc::health::v1::HealthCheckResponse::SERVING;
constexpr Health kUnknown = ::grpc::health::v1::HealthCheckResponse::UNKNOWN;

// Health.Check for the whole server (service "").
absl::StatusOr<Health> CheckHealth(const std::string& address) {
  auto stub =
      ::grpc::health::v1::Health::NewStub(CreateTesseraChannel(address));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kRpcTimeout));
  ::grpc::health::v1::HealthCheckResponse response;
  grpc::Status status = stub->Check(
      &context, ::grpc::health::v1::HealthCheckRequest(), &response);
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                        status.error_message());
  }
  return response.status();
}

absl::StatusOr<v1::ClusterInfo> GetCluster(const std::string& address) {
  auto stub = v1::ControlService::NewStub(CreateTesseraChannel(address));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kRpcTimeout));
  v1::ClusterInfo info;
  grpc::Status status =
      stub->GetCluster(&context, v1::GetClusterRequest(), &info);
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                        status.error_message());
  }
  return info;
}

std::vector<std::string> Lines(const std::string& text) {
  return absl::StrSplit(text, '\n', absl::SkipEmpty());
}

// The lines of a log that are errors of tessera-server itself.
std::vector<std::string> ErrorLines(const std::string& log) {
  std::vector<std::string> errors;
  for (const std::string& line : Lines(log)) {
    if (absl::StartsWith(line, "tessera-server: error: ")) {
      errors.push_back(line);
    }
  }
  return errors;
}

int ExitCode(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

class ServerDaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern =
        absl::StrCat(::testing::TempDir(), "tessera-server-test-XXXXXX");
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  // A daemon with exactly `args` and none of the launcher variables.
  absl::StatusOr<Subprocess> Spawn(std::vector<std::string> args) {
    SpawnOptions spawn;
    spawn.program = TESSERA_SERVER_PATH;
    spawn.args = std::move(args);
    spawn.unset_env = {"RANK",         "WORLD_SIZE",   "LOCAL_RANK",
                       "MASTER_ADDR",  "MASTER_PORT",  "SLURM_PROCID",
                       "SLURM_NTASKS", "SLURM_LOCALID"};
    spawn.log_path = absl::StrCat(dir_, "/daemon", spawned_++, ".log");
    return Subprocess::Spawn(std::move(spawn));
  }

  // Waits for `daemon` to exit within `timeout`; its exit code (-1 when it
  // was killed by a signal or is still running, then killed).
  int ExitWithin(Subprocess& daemon, absl::Duration timeout) {
    std::optional<int> status = daemon.WaitFor(timeout);
    if (!status.has_value()) {
      ADD_FAILURE() << "still running after " << timeout << ":\n"
                    << daemon.LogTail();
      daemon.Kill();
      return -1;
    }
    EXPECT_TRUE(WIFEXITED(*status)) << DescribeWaitStatus(*status);
    return ExitCode(*status);
  }

  std::unique_ptr<DaemonCluster> StartCluster(
      int world_size, std::vector<std::string> extra_args = {}) {
    DaemonClusterOptions options;
    options.world_size = world_size;
    options.server_path = TESSERA_SERVER_PATH;
    options.extra_args = std::move(extra_args);
    options.start_timeout = absl::Seconds(30);
    absl::StatusOr<std::unique_ptr<DaemonCluster>> cluster =
        DaemonCluster::Start(options);
    EXPECT_OK(cluster.status());
    return cluster.ok() ? *std::move(cluster) : nullptr;
  }

  // A uint8 tensor of `bytes` zeros in one shard on rank 0.
  static absl::StatusOr<v1::TensorInfo> CreateZeros(const std::string& address,
                                                    int64_t bytes) {
    auto control = v1::ControlService::NewStub(CreateTesseraChannel(address));
    v1::CreateTensorRequest create;
    create.set_name("zeros");
    create.add_sizes(bytes);
    create.set_dtype(v1::DTYPE_UINT8);
    create.set_init(v1::INIT_KIND_ZEROS);
    ASSIGN_OR_RETURN(ShardingSpec spec,
                     ParseShardingSpec("chunk:dim=0:rank:0/cpu"));
    *create.mutable_spec() = ToProto(spec);
    v1::TensorInfo tensor;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    grpc::Status status = control->CreateTensor(&context, create, &tensor);
    if (!status.ok()) return absl::InternalError(status.error_message());
    return tensor;
  }

  // A data-plane fetch of shard 0 of `tensor` from the daemon at `address`
  // (whose data plane is `data_address`), with this user's token: the
  // socket, after the reply's header, which the fetch must have accepted.
  static absl::StatusOr<UniqueFd> StartFetch(const std::string& address,
                                             const std::string& data_address,
                                             const v1::TensorInfo& tensor,
                                             int64_t bytes,
                                             absl::Time deadline) {
    ASSIGN_OR_RETURN(UniqueFd socket, ConnectTcp(data_address, deadline));
    RETURN_IF_ERROR(WriteFull(socket.get(), kDataPlaneTokenMagic.data(),
                              kDataPlaneTokenMagic.size(), deadline));
    ASSIGN_OR_RETURN(const std::string token, ProcessTokenFor(address));
    RETURN_IF_ERROR(WriteFrame(socket.get(), token, deadline));
    v1::FetchShardRequest request;
    request.set_tensor_id(tensor.tensor_id());
    request.set_shard_index(0);
    RETURN_IF_ERROR(
        WriteFrame(socket.get(), request.SerializeAsString(), deadline));
    ASSIGN_OR_RETURN(std::string frame, ReadFrame(socket.get(), deadline));
    v1::BulkFetchReply reply;
    if (!reply.ParseFromString(frame) || reply.code() != 0 ||
        reply.header().total_bytes() != bytes) {
      return absl::InternalError(
          absl::StrCat("fetch refused: ", reply.ShortDebugString()));
    }
    return socket;
  }

  // Reads the `bytes` of a fetch started by StartFetch, checking that its
  // chunks come in order.
  static absl::Status FinishFetch(int socket, int64_t bytes,
                                  absl::Time deadline) {
    int64_t received = 0;
    std::string payload;
    char prefix[kDataPlaneChunkPrefixBytes];
    while (received < bytes) {
      RETURN_IF_ERROR(ReadFull(socket, prefix, sizeof(prefix), deadline));
      const ChunkPrefix chunk = DecodeChunkPrefix(prefix);
      const uint64_t length = static_cast<uint64_t>(chunk.length);
      if (chunk.offset != received || length == 0) {
        return absl::InternalError(absl::StrCat("chunk at ", chunk.offset,
                                                " of ", length, " bytes after ",
                                                received));
      }
      payload.resize(length);
      RETURN_IF_ERROR(ReadFull(socket, payload.data(), length, deadline));
      received += static_cast<int64_t>(length);
    }
    return absl::OkStatus();
  }

  std::string dir_;
  int spawned_ = 0;
};

TEST_F(ServerDaemonTest, BadCommandLinesExitTwoWithOneLine) {
  const std::vector<std::vector<std::string>> bad = {
      {"--rank", "0", "--world-size", "1", "--bogus"},
      {"--world-size", "2"},  // No rank, and none in the environment.
      {"--rank", "2", "--world-size", "2"},
      {"--rank", "0", "--world-size", "1", "--port", "65536"},
      {"--rank", "0", "--world-size", "1", "--device", "tpu"},
  };
  for (const auto& args : bad) {
    ASSERT_OK_AND_ASSIGN(Subprocess daemon, Spawn(args));
    EXPECT_EQ(ExitWithin(daemon, absl::Seconds(10)), 2);
    const std::string log = daemon.LogTail();
    EXPECT_THAT(Lines(log), SizeIs(1)) << log;
    EXPECT_THAT(log, StartsWith("tessera-server: error: "));
  }
}

TEST_F(ServerDaemonTest, WorldOfOneServesAndStopsOnSigterm) {
  std::unique_ptr<DaemonCluster> cluster = StartCluster(1);
  ASSERT_NE(cluster, nullptr);
  const std::string address = cluster->address(0);
  EXPECT_THAT(address, StartsWith("127.0.0.1:"));

  EXPECT_EQ(CheckHealth(address).value_or(kUnknown), kServing);
  ASSERT_OK_AND_ASSIGN(v1::ClusterInfo info, GetCluster(address));
  EXPECT_EQ(info.world_size(), 1);
  EXPECT_EQ(info.rank(), 0);
  ASSERT_THAT(info.workers(), SizeIs(1));
  EXPECT_EQ(info.workers(0).address(), address);
  EXPECT_EQ(info.workers(0).device(), "cpu");
  EXPECT_THAT(info.workers(0).data_address(), StartsWith("127.0.0.1:"));
  EXPECT_THAT(cluster->Log(0), HasSubstr(absl::StrCat("rank 0/1 serving on ",
                                                      address, " (data ")));

  const absl::Time start = absl::Now();
  std::optional<int> status = cluster->Terminate(0, absl::Seconds(10));
  ASSERT_TRUE(status.has_value()) << cluster->Log(0);
  EXPECT_EQ(ExitCode(*status), 0) << DescribeWaitStatus(*status) << "\n"
                                  << cluster->Log(0);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_THAT(cluster->Log(0), HasSubstr("rank 0/1 stopped"));
  EXPECT_THAT(ErrorLines(cluster->Log(0)), SizeIs(0));
  // The address file is gone with the daemon, and nothing answers.
  EXPECT_FALSE(std::filesystem::exists(
      absl::StrCat(cluster->scratch_dir(), "/rank0.address")));
  EXPECT_THAT(CheckHealth(address).status(),
              ::tessera::testing::StatusIs(absl::StatusCode::kUnavailable,
                                           ::testing::_));
}

TEST_F(ServerDaemonTest, SigtermLetsARunningFetchFinish) {
  std::unique_ptr<DaemonCluster> cluster = StartCluster(1);
  ASSERT_NE(cluster, nullptr);
  const std::string address = cluster->address(0);
  // A shard bigger than the loopback socket buffers, so that serving it
  // blocks until the client reads.
  constexpr int64_t kBytes = int64_t{64} << 20;
  ASSERT_OK_AND_ASSIGN(v1::TensorInfo tensor, CreateZeros(address, kBytes));
  ASSERT_OK_AND_ASSIGN(v1::ClusterInfo info, GetCluster(address));
  ASSERT_THAT(info.workers(), SizeIs(1));

  // A data-plane fetch, left unread after its header.
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  ASSERT_OK_AND_ASSIGN(UniqueFd socket,
                       StartFetch(address, info.workers(0).data_address(),
                                  tensor, kBytes, deadline));
  absl::SleepFor(absl::Milliseconds(100));

  cluster->daemon(0).Signal(SIGTERM);
  absl::SleepFor(absl::Milliseconds(300));
  // Draining: still alive for the fetch, but refusing new calls.
  EXPECT_TRUE(cluster->daemon(0).running()) << cluster->Log(0);
  EXPECT_NE(CheckHealth(address).value_or(kUnknown), kServing);
  ASSERT_OK(FinishFetch(socket.get(), kBytes, deadline));
  std::optional<int> status = cluster->daemon(0).WaitFor(absl::Seconds(5));
  ASSERT_TRUE(status.has_value()) << cluster->Log(0);
  EXPECT_EQ(ExitCode(*status), 0) << cluster->Log(0);
}

// --data-port: the data plane listens where it is told, the daemon
// publishes that address, shard bytes move through it; a port in use
// exits 1 at once, naming it.
TEST_F(ServerDaemonTest, ANamedDataPortIsServedAndPublished) {
  ASSERT_OK_AND_ASSIGN(const int data_port, PickFreePort());
  std::unique_ptr<DaemonCluster> cluster =
      StartCluster(1, {"--data-port", absl::StrCat(data_port)});
  ASSERT_NE(cluster, nullptr);
  const std::string address = cluster->address(0);
  const std::string data_address = absl::StrCat("127.0.0.1:", data_port);
  ASSERT_OK_AND_ASSIGN(v1::ClusterInfo info, GetCluster(address));
  ASSERT_THAT(info.workers(), SizeIs(1));
  EXPECT_EQ(info.workers(0).data_address(), data_address);
  EXPECT_THAT(cluster->Log(0), HasSubstr(absl::StrCat("(data ", data_address)));

  constexpr int64_t kBytes = int64_t{3} << 20;
  ASSERT_OK_AND_ASSIGN(v1::TensorInfo tensor, CreateZeros(address, kBytes));
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  ASSERT_OK_AND_ASSIGN(UniqueFd socket, StartFetch(address, data_address,
                                                   tensor, kBytes, deadline));
  EXPECT_OK(FinishFetch(socket.get(), kBytes, deadline));

  ASSERT_OK_AND_ASSIGN(Subprocess second,
                       Spawn({"--rank", "0", "--world-size", "1", "--host",
                              "127.0.0.1", "--port", "0", "--data-port",
                              absl::StrCat(data_port), "--device", "cpu"}));
  const absl::Time start = absl::Now();
  EXPECT_EQ(ExitWithin(second, absl::Seconds(10)), 1);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_THAT(ErrorLines(second.LogTail()),
              ElementsAre(HasSubstr(
                  absl::StrCat("cannot listen on ", data_address,
                               ": Address already in use (port in use)"))))
      << second.LogTail();
  EXPECT_EQ(CheckHealth(address).value_or(kUnknown), kServing);
}

TEST_F(ServerDaemonTest, AddressFileIsWrittenOnceServing) {
  const std::string file = absl::StrCat(dir_, "/address");
  std::ofstream(file) << "stale:1\n";  // Left by an earlier daemon.
  ASSERT_OK_AND_ASSIGN(Subprocess daemon,
                       Spawn({"--rank", "0", "--world-size", "1", "--host",
                              "127.0.0.1", "--port", "0", "--device", "cpu",
                              "--address-file", file, "--log-level", "debug"}));
  std::string line;
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (absl::Now() < deadline && daemon.running()) {
    std::ifstream in(file);
    if (std::getline(in, line) && line != "stale:1") break;
    line.clear();
    daemon.WaitFor(absl::Milliseconds(10));
  }
  ASSERT_THAT(line, StartsWith("127.0.0.1:")) << daemon.LogTail();
  EXPECT_EQ(CheckHealth(line).value_or(kUnknown), kServing);
  daemon.Signal(SIGINT);
  EXPECT_EQ(ExitWithin(daemon, absl::Seconds(10)), 0) << daemon.LogTail();
}

TEST_F(ServerDaemonTest, BusyPortsExitOneQuickly) {
  std::unique_ptr<DaemonCluster> cluster = StartCluster(1);
  ASSERT_NE(cluster, nullptr);
  const std::string taken =
      std::string(absl::StripPrefix(cluster->address(0), "127.0.0.1:"));

  // The gRPC port.
  ASSERT_OK_AND_ASSIGN(
      Subprocess second,
      Spawn({"--rank", "0", "--world-size", "1", "--host", "127.0.0.1",
             "--port", taken, "--device", "cpu"}));
  absl::Time start = absl::Now();
  EXPECT_EQ(ExitWithin(second, absl::Seconds(10)), 1);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_THAT(ErrorLines(second.LogTail()),
              ElementsAre(HasSubstr("port in use")))
      << second.LogTail();

  // The store's port, for rank 0 of a bigger world; the metrics port,
  // before joining a world that would wait for the daemon.
  const struct {
    std::vector<std::string> args;
    std::string error;
  } cases[] = {
      {{"--rank", "0", "--master-port", taken},
       absl::StrCat("cannot serve the store on 127.0.0.1:", taken)},
      {{"--rank", "1", "--metrics-port", taken},
       absl::StrCat("cannot serve metrics on 127.0.0.1:", taken)},
  };
  for (const auto& c : cases) {
    std::vector<std::string> args = c.args;
    for (const char* more : {"--world-size", "2", "--host", "127.0.0.1",
                             "--port", "0", "--device", "cpu"}) {
      args.push_back(more);
    }
    ASSERT_OK_AND_ASSIGN(Subprocess daemon, Spawn(args));
    start = absl::Now();
    EXPECT_EQ(ExitWithin(daemon, absl::Seconds(10)), 1);
    EXPECT_LT(absl::Now() - start, absl::Seconds(5));
    EXPECT_THAT(ErrorLines(daemon.LogTail()), ElementsAre(HasSubstr(c.error)))
        << daemon.LogTail();
  }
  // The daemon that held the port is unharmed.
  EXPECT_EQ(CheckHealth(cluster->address(0)).value_or(kUnknown), kServing);
}

TEST_F(ServerDaemonTest, UnreachableStoreExitsOneAfterStoreTimeout) {
  ASSERT_OK_AND_ASSIGN(int port, PickFreePort());
  ASSERT_OK_AND_ASSIGN(
      Subprocess daemon,
      Spawn({"--rank", "1", "--world-size", "2", "--master-port",
             absl::StrCat(port), "--host", "127.0.0.1", "--port", "0",
             "--device", "cpu", "--store-timeout", "2"}));
  const absl::Time start = absl::Now();
  EXPECT_EQ(ExitWithin(daemon, absl::Seconds(10)), 1);
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, absl::Milliseconds(1900));
  EXPECT_LT(took, absl::Milliseconds(3500));
  EXPECT_THAT(ErrorLines(daemon.LogTail()),
              ElementsAre(absl::StrCat("tessera-server: error: store at "
                                       "127.0.0.1:",
                                       port, " unreachable after 2s")))
      << daemon.LogTail();
}

TEST_F(ServerDaemonTest, SignalDuringStartupExitsAtOnce) {
  ASSERT_OK_AND_ASSIGN(int port, PickFreePort());
  ASSERT_OK_AND_ASSIGN(
      Subprocess daemon,
      Spawn({"--rank", "1", "--world-size", "2", "--master-port",
             absl::StrCat(port), "--host", "127.0.0.1", "--port", "0",
             "--device", "cpu", "--store-timeout", "60s"}));
  // Wait until it waits for the store, then stop it.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline &&
         daemon.LogTail().find("for the store") == std::string::npos) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  const absl::Time start = absl::Now();
  daemon.Signal(SIGTERM);
  std::optional<int> status = daemon.WaitFor(absl::Seconds(5));
  ASSERT_TRUE(status.has_value()) << daemon.LogTail();
  EXPECT_EQ(ExitCode(*status), 128 + SIGTERM) << DescribeWaitStatus(*status);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

TEST_F(ServerDaemonTest, WorldOfTwoJoinsAndListsBoth) {
  std::unique_ptr<DaemonCluster> cluster = StartCluster(2);
  ASSERT_NE(cluster, nullptr);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(CheckHealth(cluster->address(rank)).value_or(kUnknown), kServing);
    ASSERT_OK_AND_ASSIGN(v1::ClusterInfo info,
                         GetCluster(cluster->address(rank)));
    EXPECT_EQ(info.world_size(), 2);
    EXPECT_EQ(info.rank(), rank);
    ASSERT_THAT(info.workers(), SizeIs(2));
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(info.workers(r).rank(), r);
      EXPECT_EQ(info.workers(r).name(), absl::StrCat("worker", r));
      EXPECT_EQ(info.workers(r).address(), cluster->address(r));
      EXPECT_EQ(info.workers(r).device(), "cpu");
    }
  }
  EXPECT_THAT(cluster->Log(0), HasSubstr("store serving on 127.0.0.1:"));
  // Each stops on its own, without waiting for the other: rank 1 first,
  // then rank 0 (which serves the store).
  for (int rank : {1, 0}) {
    const absl::Time start = absl::Now();
    std::optional<int> status = cluster->Terminate(rank, absl::Seconds(15));
    ASSERT_TRUE(status.has_value()) << cluster->Log(rank);
    EXPECT_EQ(ExitCode(*status), 0) << cluster->Log(rank);
    EXPECT_LT(absl::Now() - start, absl::Seconds(8)) << cluster->Log(rank);
  }
}

}  // namespace
}  // namespace tessera
