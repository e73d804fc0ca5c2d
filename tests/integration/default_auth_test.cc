// Authenticated by default (wire/user_token.h): real `tessera-server`
// processes started with no credential flag at all make the per-user token
// file (directory 0700, file 0600, one cluster token) and check every
// caller against it. Their user's client needs no setting: it creates,
// writes, reads (local path and data plane), saves, loads and deletes. A
// real second user (`nobody`: this test binary run again under setpriv, as
// DefaultAuthStranger) is refused by every surface: each ControlService,
// ShardService and StoreService method, the data plane, the local path and
// the token file itself; and nothing it tried changed anything.
#include <grpcpp/grpcpp.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/client.h"
#include "common/sharding_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/file.h"
#include "io/subprocess.h"
#include "io/unix_socket.h"
#include "tessera/v1/control.pb.h"
#include "tessera/v1/local.pb.h"
#include "tessera/v1/shard.pb.h"
#include "tessera/v1/store.pb.h"
#include "tests/testing/daemon_cluster.h"
#include "tests/testing/iota.h"
#include "tests/testing/raw_call.h"
#include "tests/testing/raw_data_plane.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "wire/auth.h"
#include "wire/chunk_codec.h"
#include "wire/user_token.h"

namespace tessera {
namespace {

namespace tt = ::tessera::testing;
using ::testing::HasSubstr;

// Set in the stranger's environment: what to attack, "key=value" pairs
// separated by ';'. Absent: DefaultAuthStranger skips.
constexpr char kStrangerEnv[] = "TESSERA_TEST_STRANGER";
constexpr uid_t kNobody = 65534;

class DefaultAuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(tmp_.ok());
    home_ = tmp_.path();
    // A home as most users have one: others may look in (so only the
    // token's own directory and file keep them out).
    ASSERT_EQ(chmod(home_.c_str(), 0755), 0);
    // Nothing Tessera-specific: the owner's client uses no setting.
    setenv("HOME", home_.c_str(), 1);
    for (const char* name :
         {"TESSERA_HOME", "TESSERA_TOKEN", "TESSERA_TOKEN_FILE",
          "TESSERA_TLS_CA", "TESSERA_TLS_CERT", "TESSERA_TLS_KEY"}) {
      unsetenv(name);
    }
  }
  tt::ScopedTempDir tmp_{"tessera-default-auth"};
  std::string home_;
};

TEST_F(DefaultAuthTest, TheOwnerNeedsNoSettingAndNobodyElseGetsIn) {
  tt::DaemonClusterOptions options;
  options.world_size = 2;
  options.server_path = TESSERA_SERVER_PATH;
  options.extra_args = {"--log-level", "error"};
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<tt::DaemonCluster> cluster,
                       tt::DaemonCluster::Start(options));

  // The daemons made one private token file and share it.
  const std::string token_dir = home_ + "/.tessera";
  const std::string token_path = token_dir + "/token";
  EXPECT_EQ(tt::FileMode(token_dir), "0700");
  EXPECT_EQ(tt::FileMode(token_path), "0600");
  ASSERT_OK_AND_ASSIGN(const std::string text, ReadFileToString(token_path));
  std::string cluster_token;
  ASSERT_OK_AND_ASSIGN(std::vector<TokenTable::Entry> entries,
                       TokenTable::Parse(text, token_path, &cluster_token));
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].role, Role::kCluster);
  EXPECT_EQ(cluster_token.size(), 64u);
  ASSERT_THAT(ProcessToken(), tt::IsOkAndHolds(std::string()));
  ASSERT_THAT(ProcessTokenFor(cluster->address(0)),
              tt::IsOkAndHolds(cluster_token));
  // Never sent beyond this host.
  EXPECT_THAT(ProcessTokenFor("192.0.2.1:5"), tt::IsOkAndHolds(std::string()));

  // The owner: everything, with no setting.
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Client> client,
                       Client::Connect(cluster->address(0)));
  const ShardingSpec rows = *ChunkShardingSpec::Create(
      0, std::vector<std::string>{"rank:0/cpu", "rank:1/cpu"});
  ASSERT_OK_AND_ASSIGN(ShardedTensorView view,
                       client->Create("weights", {16, 8}, rows));
  ASSERT_OK(view.Write({0, 0}, tt::Iota(16, 8)));
  ASSERT_OK_AND_ASSIGN(Tensor local, view.Read());  // the local path
  tt::ExpectIotaBox(local, 0, 0, 8);
  ClientOptions data_plane;
  data_plane.use_local_path = false;
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Client> remote,
                       Client::Connect(cluster->address(1), data_plane));
  ASSERT_OK_AND_ASSIGN(ShardedTensorView seen, remote->Open("weights"));
  ASSERT_OK_AND_ASSIGN(Tensor streamed, seen.Read());
  tt::ExpectIotaBox(streamed, 0, 0, 8);
  ASSERT_OK(client->Save("owner-checkpoint").status());

  // The stranger: this binary again, as nobody, pointed at this user's
  // home and at every surface of the cluster.
  const v1::WorkerAddress& rank0 = client->cluster().workers(0);
  const std::vector<std::string> local_address =
      absl::StrSplit(rank0.local_address(), absl::MaxSplits('/', 1));
  ASSERT_EQ(local_address.size(), 2u) << rank0.local_address();
  const std::string stolen = cluster->scratch_dir() + "/stolen";
  const std::string target = absl::StrCat(
      "control=", cluster->address(1), ";store=", cluster->store_address(),
      ";data=", rank0.data_address(), ";local=", local_address[1],
      ";tensor=", view.tensor_id(), ";token=", token_path, ";save=", stolen,
      ";load=", cluster->scratch_dir(), "/owner-checkpoint");
  char exe[4096];
  const ssize_t length = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  ASSERT_GT(length, 0);
  exe[length] = '\0';
  SpawnOptions spawn;
  spawn.program = "setpriv";
  spawn.search_path = true;
  spawn.args = {absl::StrCat("--reuid=", kNobody),
                absl::StrCat("--regid=", kNobody), "--clear-groups", exe,
                "--gtest_filter=DefaultAuthStranger.*"};
  spawn.env = {{kStrangerEnv, target}, {"HOME", home_}};
  spawn.log_path = home_ + "/stranger.log";
  spawn.stdin_null = true;
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a client as nobody";
  ASSERT_OK_AND_ASSIGN(Subprocess stranger, Subprocess::Spawn(spawn));
  const std::optional<int> status = stranger.WaitFor(absl::Seconds(120));
  ASSERT_TRUE(status.has_value()) << "the stranger did not finish";
  const std::string log = ReadTail(spawn.log_path, 1 << 16);
  if (WIFEXITED(*status) && WEXITSTATUS(*status) == 127) {
    GTEST_SKIP() << "nobody cannot run this test binary (a directory above "
                    "it is private): "
                 << log;
  }
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << log;
  EXPECT_THAT(log, HasSubstr("[  PASSED  ] 1 test")) << log;
  EXPECT_THAT(log, ::testing::Not(HasSubstr("SKIPPED"))) << log;

  // Nothing the stranger tried happened.
  ASSERT_OK_AND_ASSIGN(std::vector<ShardedTensorView> all, client->List());
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].name(), "weights");
  ASSERT_OK_AND_ASSIGN(Tensor after, view.Read());
  tt::ExpectIotaBox(after, 0, 0, 8);
  EXPECT_EQ(tt::FileMode(stolen), "missing");
  // And the owner still loads and deletes.
  v1::LoadCheckpointRequest load;
  load.set_path("owner-checkpoint");
  load.add_names("weights");
  load.add_as_names("copy");
  ASSERT_OK(client->Load(load).status());
  ASSERT_OK(client->Delete("copy"));
  ASSERT_OK(client->Delete("weights"));
}

// Run only as the stranger of the test above (as nobody).
TEST(DefaultAuthStranger, IsRefusedEverywhere) {
  const char* spec = std::getenv(kStrangerEnv);
  if (spec == nullptr) GTEST_SKIP() << "run by DefaultAuthTest as nobody";
  ASSERT_NE(geteuid(), 0u);
  std::map<std::string, std::string> target;
  for (absl::string_view pair : absl::StrSplit(spec, ';')) {
    const std::vector<std::string> kv =
        absl::StrSplit(pair, absl::MaxSplits('=', 1));
    ASSERT_EQ(kv.size(), 2u) << pair;
    target[kv[0]] = kv[1];
  }

  // The owner's token file stays closed, so this process has no token.
  EXPECT_THAT(ReadFileToString(target["token"]).status(),
              tt::StatusIs(absl::StatusCode::kPermissionDenied, ::testing::_));
  EXPECT_THAT(ProcessTokenFor(target["control"]),
              tt::IsOkAndHolds(std::string()));

  // The client library says what to set.
  absl::StatusOr<std::shared_ptr<Client>> client =
      Client::Connect(target["control"]);
  EXPECT_THAT(client.status(), tt::StatusIs(absl::StatusCode::kUnauthenticated,
                                            HasSubstr("accept the token in")));

  // Every method, with well-formed requests that would do harm, without a
  // token and with a guessed one.
  v1::CreateTensorRequest create;
  create.set_name("planted");
  v1::DeleteTensorRequest remove;
  remove.set_name("weights");
  v1::SaveCheckpointRequest save;
  save.set_path(target["save"]);
  v1::LoadCheckpointRequest load;
  load.set_path(target["load"]);
  load.set_replace(true);
  v1::StoreSetRequest forge;
  forge.set_key("control/seq");
  forge.set_value("not a number");
  v1::StoreAddRequest skip;
  skip.set_key("control/seq");
  skip.set_delta(12);
  v1::FetchShardRequest fetch;
  fetch.set_tensor_id(target["tensor"]);
  const std::vector<std::pair<std::string, std::string>> calls = {
      {"ControlService/ListTensors", ""},
      {"ControlService/DescribeTensor", ""},
      {"ControlService/ReadRegion", ""},
      {"ControlService/WriteRegion", ""},
      {"ControlService/CreateTensor", create.SerializeAsString()},
      {"ControlService/DeleteTensor", remove.SerializeAsString()},
      {"ControlService/Reshard", ""},
      {"ControlService/Gather", ""},
      {"ControlService/SaveCheckpoint", save.SerializeAsString()},
      {"ControlService/LoadCheckpoint", load.SerializeAsString()},
      {"ControlService/GetStats", ""},
      {"ShardService/FetchShard", fetch.SerializeAsString()},
      {"StoreService/Set", forge.SerializeAsString()},
      {"StoreService/Add", skip.SerializeAsString()},
      {"StoreService/Get", ""},
  };
  for (const auto& [method, request] : calls) {
    SCOPED_TRACE(method);
    const bool store = absl::StartsWith(method, "StoreService/");
    const std::shared_ptr<grpc::Channel> channel =
        grpc::CreateChannel(store ? target["store"] : target["control"],
                            grpc::InsecureChannelCredentials());
    const std::string path = absl::StrCat("/tessera.v1.", method);
    grpc::Status none = tt::RawUnaryCall(channel, path, request);
    EXPECT_EQ(none.error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << none.error_message();
    EXPECT_THAT(none.error_message(), HasSubstr("requires a token"));
    grpc::Status guessed = tt::RawUnaryCall(
        channel, path, request, absl::Seconds(10),
        {{"authorization", "Bearer 0123456789abcdef0123456789abcdef"}});
    EXPECT_EQ(guessed.error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << guessed.error_message();
  }

  // The data plane: fetches and writes alike.
  const auto code = [](const auto& reply) {
    return reply.ok() ? reply->code()
                      : static_cast<int>(absl::StatusCode::kUnauthenticated);
  };
  EXPECT_EQ(
      code(tt::RawFetch(target["data"], target["tensor"], kDataPlaneMagic)),
      static_cast<int>(absl::StatusCode::kUnauthenticated));
  EXPECT_EQ(code(tt::RawFetch(target["data"], target["tensor"],
                              kDataPlaneTokenMagic, "guessed-token-0123456")),
            static_cast<int>(absl::StatusCode::kUnauthenticated));
  EXPECT_EQ(code(tt::RawWrite(target["data"], target["tensor"], 8,
                              "guessed-token-0123456")),
            static_cast<int>(absl::StatusCode::kUnauthenticated));
  EXPECT_EQ(code(tt::RawDescribeDigest(target["data"], "any-name",
                                       "guessed-token-0123456")),
            static_cast<int>(absl::StatusCode::kUnauthenticated));

  // The local path: refused by the kernel's word on who is calling, for a
  // read and for a write.
  for (const bool write : {false, true}) {
    SCOPED_TRACE(write ? "local write" : "local read");
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    ASSERT_OK_AND_ASSIGN(UniqueFd socket,
                         ConnectLocal(target["local"], deadline));
    ASSERT_OK(SendLocalMessage(socket.get(), kLocalMagic, deadline));
    v1::LocalFetchRequest request;
    request.mutable_request()->set_tensor_id(target["tensor"]);
    request.set_write(write);
    ASSERT_OK(
        SendLocalMessage(socket.get(), request.SerializeAsString(), deadline));
    UniqueFd lent;
    absl::StatusOr<std::string> message =
        ReceiveLocalMessage(socket.get(), deadline, &lent);
    EXPECT_FALSE(lent.valid());
    if (message.ok()) {
      v1::LocalFetchReply reply;
      ASSERT_TRUE(reply.ParseFromString(*message));
      EXPECT_EQ(reply.code(),
                static_cast<int>(absl::StatusCode::kFailedPrecondition))
          << reply.message();
    }
  }
}

}  // namespace
}  // namespace tessera
