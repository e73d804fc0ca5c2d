// Tokens and roles (wire/auth.h) on real `tessera-server` processes with
// mutual TLS and an --auth-token-file: every method of every service
// refuses a call without a token, with an unknown or malformed one, and
// with a role below its own, with the right code and a message naming the
// method; each role's client does what its role allows end to end; the
// store refuses forged log entries from everyone but the daemons; tokens
// are added and revoked without a restart; health stays open and
// reflection can be turned off. Without TLS, tokens still apply (and the
// daemons still refuse to listen beyond loopback unauthenticated).
#include <grpcpp/grpcpp.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "common/sharding_spec.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/socket.h"
#include "tessera/v1/store.grpc.pb.h"
#include "tests/testing/daemon_cluster.h"
#include "tests/testing/iota.h"
#include "tests/testing/raw_call.h"
#include "tests/testing/raw_data_plane.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_pki.h"
#include "wire/auth.h"
#include "wire/chunk_codec.h"
#include "wire/credentials.h"
#include "wire/data_connection.h"

namespace tessera {
namespace {

namespace tt = ::tessera::testing;
using ::testing::HasSubstr;

constexpr char kReadToken[] = "read-token-0123456789abcdef";
constexpr char kWriteToken[] = "write-token-0123456789abcdef";
constexpr char kAdminToken[] = "admin-token-0123456789abcdef";
constexpr char kClusterToken[] = "cluster-token-0123456789abcdef";
constexpr char kUnknownToken[] = "unknown-token-0123456789abcdef";

std::string TokenFileText(const std::vector<std::string>& extra = {}) {
  std::string text =
      absl::StrCat("# test tokens\n", kReadToken, " read dashboards\n",
                   kWriteToken, " write trainer\n", kAdminToken, " admin ops\n",
                   kClusterToken, " cluster daemons\n");
  for (const std::string& line : extra) absl::StrAppend(&text, line, "\n");
  return text;
}

// Writes `text` to `path` (mode 0600) by renaming a new file over it.
void ReplaceFile(const std::string& path, const std::string& text) {
  const std::string next = path + ".next";
  std::ofstream(next) << text;
  ASSERT_EQ(chmod(next.c_str(), 0600), 0);
  ASSERT_EQ(rename(next.c_str(), path.c_str()), 0);
}

std::vector<std::pair<std::string, std::string>> Bearer(
    const std::string& token) {
  return {{"authorization", absl::StrCat("Bearer ", token)}};
}

// The role just below `role`'s token, for a PERMISSION_DENIED call.
std::string TokenBelow(Role role) {
  switch (role) {
    case Role::kWrite:
      return kReadToken;
    case Role::kAdmin:
      return kWriteToken;
    case Role::kCluster:
      return kAdminToken;
    case Role::kRead:
      break;
  }
  return "";
}

// Every test: a CA, a daemon and a client certificate (tt::PkiTest), and a
// token file.
class AuthTest : public tt::PkiTest {
 protected:
  void SetUp() override {
    tt::PkiTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    ASSERT_TRUE(pki_->MakeCert("client", "ca"));
    tokens_ = absl::StrCat(dir_, "/tokens");
    ReplaceFile(tokens_, TokenFileText());
  }
  void TearDown() override {
    SetProcessTls(TlsConfig());
    SetProcessToken("");
    tt::PkiTest::TearDown();
  }

  // `world_size` daemons with tokens, and mutual TLS unless `tls` is false.
  tt::DaemonClusterOptions Daemons(int world_size, bool tls = true) {
    tt::DaemonClusterOptions options;
    options.world_size = world_size;
    options.server_path = TESSERA_SERVER_PATH;
    options.extra_args = {"--log-level", "error", "--auth-token-file", tokens_};
    if (tls) {
      for (const std::string& flag : DaemonTlsFlags(pki_->Path("ca", "pem"))) {
        options.extra_args.push_back(flag);
      }
    }
    return options;
  }

  std::shared_ptr<grpc::Channel> Channel(const std::string& address,
                                         bool tls = true) {
    return grpc::CreateChannel(
        address, ChannelCredentialsFor(tls ? pki_->Client("ca", "client")
                                           : TlsConfig()));
  }

  // A client of the cluster presenting `token`.
  absl::StatusOr<std::shared_ptr<Client>> Connect(
      const tt::DaemonCluster& cluster, const std::string& token,
      bool tls = true, ClientOptions options = {}) {
    SetProcessTls(tls ? pki_->Client("ca", "client") : TlsConfig());
    SetProcessToken(token);
    return Client::Connect(cluster.address(0), options);
  }

  // A write-token client reading over the data plane (not the local path)
  // a [rows, cols] tensor split over 2 daemons that it wrote; checked.
  void WriteAndReadOverTheDataPlane(const tt::DaemonCluster& cluster, bool tls,
                                    const std::vector<int64_t>& sizes,
                                    std::shared_ptr<Client>* writer,
                                    std::optional<ShardedTensorView>* view) {
    ClientOptions data_plane;
    data_plane.use_local_path = false;
    ASSERT_OK_AND_ASSIGN(*writer,
                         Connect(cluster, kWriteToken, tls, data_plane));
    const ShardingSpec rows = *ChunkShardingSpec::Create(
        0, std::vector<std::string>{"rank:0/cpu", "rank:1/cpu"});
    ASSERT_OK_AND_ASSIGN(ShardedTensorView created,
                         (*writer)->Create("t", sizes, rows));
    *view = created;
    ASSERT_OK(created.Write({0, 0}, tt::Iota(sizes[0], sizes[1])));
    ASSERT_OK_AND_ASSIGN(Tensor values, created.Read());
    tt::ExpectIotaBox(values, 0, 0, sizes[1]);
  }

  std::string tokens_;
};

// The refusal matrix: every method of ControlService, ShardService and
// StoreService, on a daemon that is not the entry point and on the store.
TEST_F(AuthTest, EveryMethodRefusesMissingUnknownAndLowerTokens) {
  tt::DaemonClusterOptions options = Daemons(2);
  options.extra_args.push_back("--reflection=false");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<tt::DaemonCluster> cluster,
                       tt::DaemonCluster::Start(options));
  const std::vector<std::pair<std::string, Role>> methods = MethodRoles();
  ASSERT_EQ(methods.size(), 31u);
  for (const auto& [method, role] : methods) {
    SCOPED_TRACE(method);
    const bool store = absl::StartsWith(method, "tessera.v1.StoreService/");
    const std::shared_ptr<grpc::Channel> channel =
        Channel(store ? cluster->store_address() : cluster->address(1));
    const std::string path = absl::StrCat("/", method);
    const std::string name = method.substr(method.find('.', 8) + 1);
    auto call =
        [&](const std::vector<std::pair<std::string, std::string>>& metadata) {
          return tt::RawUnaryCall(channel, path, "", absl::Seconds(10),
                                  metadata);
        };

    grpc::Status status = call({});
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_THAT(status.error_message(),
                HasSubstr(absl::StrCat(name,
                                       ": unauthenticated: this "
                                       "cluster requires a token")));
    status = call(Bearer(kUnknownToken));
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_THAT(status.error_message(), HasSubstr("not one this cluster"));
    EXPECT_THAT(status.error_message(), ::testing::Not(HasSubstr("unknown-")));
    status = call({{"authorization", kAdminToken}});  // not "Bearer ..."
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    if (role != Role::kRead) {
      status = call(Bearer(TokenBelow(role)));
      EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
      EXPECT_THAT(status.error_message(),
                  HasSubstr(absl::StrCat(name,
                                         ": permission denied: it needs "
                                         "the ",
                                         RoleName(role), " role")));
      EXPECT_THAT(status.error_message(), ::testing::Not(HasSubstr("-token-")));
    }
    if (!store) {
      // The method's own role gets past the check to the request itself
      // (empty here: an error of its own, never an auth error).
      const std::string own = role == Role::kRead    ? kReadToken
                              : role == Role::kWrite ? kWriteToken
                                                     : kAdminToken;
      status = call(Bearer(own));
      EXPECT_NE(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
      EXPECT_NE(status.error_code(), grpc::StatusCode::PERMISSION_DENIED)
          << status.error_message();
    }
  }

  // Health stays open to probes; reflection is off.
  grpc::Status health = tt::RawUnaryCall(Channel(cluster->address(0)),
                                         "/grpc.health.v1.Health/Check", "");
  EXPECT_TRUE(health.ok()) << health.error_message();
  const grpc::Status reflection = tt::RawUnaryCall(
      Channel(cluster->address(0)),
      "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", "");
  EXPECT_EQ(reflection.error_code(), grpc::StatusCode::UNIMPLEMENTED)
      << reflection.error_message();
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(cluster->daemon(r).WaitFor(absl::ZeroDuration()))
        << cluster->Log(r);
  }
}

// Each role does what it may, end to end over mutual TLS, and is refused
// the rest in one clear status.
TEST_F(AuthTest, EachRoleWorksEndToEndWithinItsRights) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<tt::DaemonCluster> cluster,
                       tt::DaemonCluster::Start(Daemons(2)));
  const std::vector<std::string> placements = {"rank:0/cpu", "rank:1/cpu"};
  const ShardingSpec rows = *ChunkShardingSpec::Create(0, placements);

  ASSERT_OK_AND_ASSIGN(auto admin, Connect(*cluster, kAdminToken));
  ASSERT_OK_AND_ASSIGN(ShardedTensorView view,
                       admin->Create("weights", {64, 32}, rows));
  ASSERT_OK(view.Write({0, 0}, tt::Iota(64, 32)));
  ASSERT_OK_AND_ASSIGN(Tensor all, view.Read());
  tt::ExpectIotaBox(all, 0, 0, 32);
  ASSERT_OK_AND_ASSIGN(Tensor gathered, admin->Gather("weights"));
  tt::ExpectIotaBox(gathered, 0, 0, 32);
  ASSERT_OK(admin->Save("ckpt", {"weights"}).status());
  ASSERT_OK(admin->Delete("weights"));
  v1::LoadCheckpointRequest load;
  load.set_path("ckpt");
  ASSERT_OK(admin->Load(load).status());

  // write: creates and writes, but neither saves nor loads.
  ASSERT_OK_AND_ASSIGN(auto writer, Connect(*cluster, kWriteToken));
  ASSERT_OK_AND_ASSIGN(ShardedTensorView scratch,
                       writer->Create("scratch", {8, 4}, rows));
  ASSERT_OK(scratch.Write({0, 0}, tt::Iota(8, 4)));
  EXPECT_THAT(writer->Save("ckpt2", {"scratch"}).status(),
              tt::StatusIs(absl::StatusCode::kPermissionDenied,
                           HasSubstr("SaveCheckpoint: permission denied: it "
                                     "needs the admin role; the token of "
                                     "trainer has write")));

  // read: reads every way (shard streams, the local path, regions,
  // gathers), changes nothing.
  ASSERT_OK_AND_ASSIGN(auto reader, Connect(*cluster, kReadToken));
  ASSERT_OK_AND_ASSIGN(ShardedTensorView opened, reader->Open("weights"));
  ASSERT_OK_AND_ASSIGN(Tensor again, opened.Read());
  tt::ExpectIotaBox(again, 0, 0, 32);
  ASSERT_OK_AND_ASSIGN(Tensor box, opened.ReadRegion({30, 3}, {4, 5}));
  tt::ExpectIotaBox(box, 30, 3, 32);
  ASSERT_OK_AND_ASSIGN(Tensor whole, reader->Gather("weights"));
  tt::ExpectIotaBox(whole, 0, 0, 32);
  EXPECT_THAT(opened.Write({0, 0}, tt::Iota(2, 2)),
              tt::StatusIs(absl::StatusCode::kPermissionDenied,
                           HasSubstr("WriteRegion")));
  EXPECT_THAT(reader->Create("nope", {4}, rows).status(),
              tt::StatusIs(absl::StatusCode::kPermissionDenied,
                           HasSubstr("CreateTensor: permission denied")));
  EXPECT_THAT(reader->Delete("weights"),
              tt::StatusIs(absl::StatusCode::kPermissionDenied, ::testing::_));
  // Renewing leases: a pin with read (one this daemon does not hold comes
  // back as gone), an open version only with write.
  auto control = v1::ControlService::NewStub(Channel(cluster->address(0)));
  for (const char* token : {kReadToken, kWriteToken}) {
    SCOPED_TRACE(token);
    grpc::ClientContext pins_context;
    pins_context.AddMetadata("authorization", absl::StrCat("Bearer ", token));
    v1::RenewLeasesRequest pins;
    pins.add_pins("pin.0.nobody");
    v1::RenewLeasesResponse renewed;
    ASSERT_TRUE(control->RenewLeases(&pins_context, pins, &renewed).ok());
    EXPECT_THAT(renewed.gone_pins(), ::testing::ElementsAre("pin.0.nobody"));
    grpc::ClientContext versions_context;
    versions_context.AddMetadata("authorization",
                                 absl::StrCat("Bearer ", token));
    v1::RenewLeasesRequest versions;
    v1::VersionHandle* handle = versions.add_versions();
    handle->set_name("weights");
    handle->set_number(2);
    const grpc::Status status =
        control->RenewLeases(&versions_context, versions, &renewed);
    if (absl::string_view(token) == kReadToken) {
      EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
      EXPECT_THAT(status.error_message(), HasSubstr("BeginVersion"));
    } else {
      EXPECT_TRUE(status.ok()) << status.error_message();
      EXPECT_EQ(renewed.gone_size(), 1);
    }
  }

  // No token at all: the client cannot even connect, and says why.
  EXPECT_THAT(Connect(*cluster, "").status(),
              tt::StatusIs(absl::StatusCode::kUnauthenticated,
                           HasSubstr("TESSERA_TOKEN")));
}

// The operation log cannot be forged: writing the store needs the
// cluster role, which only the daemons hold; an admin may read it.
TEST_F(AuthTest, OnlyDaemonsWriteTheStore) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<tt::DaemonCluster> cluster,
                       tt::DaemonCluster::Start(Daemons(2)));
  auto stub = v1::StoreService::NewStub(Channel(cluster->store_address()));
  for (const char* token : {kReadToken, kWriteToken, kAdminToken}) {
    SCOPED_TRACE(token);
    grpc::ClientContext set_context;
    set_context.AddMetadata("authorization", absl::StrCat("Bearer ", token));
    v1::StoreSetRequest forged;
    forged.set_key("control/op/1");
    forged.set_value("forged");
    v1::StoreSetResponse set_response;
    EXPECT_EQ(stub->Set(&set_context, forged, &set_response).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
    grpc::ClientContext add_context;
    add_context.AddMetadata("authorization", absl::StrCat("Bearer ", token));
    v1::StoreAddRequest add;
    add.set_key("control/seq");
    add.set_delta(1000);
    v1::StoreAddResponse add_response;
    EXPECT_EQ(stub->Add(&add_context, add, &add_response).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  grpc::ClientContext check_context;
  check_context.AddMetadata("authorization",
                            absl::StrCat("Bearer ", kAdminToken));
  v1::StoreCheckRequest check;
  check.add_keys("control/seq");
  v1::StoreCheckResponse checked;
  EXPECT_TRUE(stub->Check(&check_context, check, &checked).ok());

  // The log still works: the cluster creates and deletes as before.
  ASSERT_OK_AND_ASSIGN(auto admin, Connect(*cluster, kAdminToken));
  const ShardingSpec rows = *ChunkShardingSpec::Create(
      0, std::vector<std::string>{"rank:0/cpu", "rank:1/cpu"});
  ASSERT_OK(admin->Create("after", {4, 4}, rows).status());
  ASSERT_OK(admin->Delete("after"));
}

// Tokens are added and revoked by editing the file: no restart.
TEST_F(AuthTest, TokensChangeWithoutRestart) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<tt::DaemonCluster> cluster,
                       tt::DaemonCluster::Start(Daemons(1)));
  const std::string fresh = "fresh-token-0123456789abcdef";
  auto list = [&](const std::string& token) {
    return tt::RawUnaryCall(Channel(cluster->address(0)),
                            "/tessera.v1.ControlService/ListTensors", "",
                            absl::Seconds(10), Bearer(token));
  };
  EXPECT_EQ(list(fresh).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  ReplaceFile(tokens_, TokenFileText({fresh + " read newcomer"}));
  bool accepted = false;
  for (int i = 0; i < 50 && !accepted; ++i) {
    absl::SleepFor(absl::Milliseconds(200));
    accepted = list(fresh).ok();
  }
  EXPECT_TRUE(accepted) << "the daemon did not reload its token file";

  // Revoked: the read token's line is gone.
  std::string without_read = TokenFileText({fresh + " read newcomer"});
  without_read.erase(without_read.find(kReadToken),
                     std::string(kReadToken).size() + 16);
  ReplaceFile(tokens_, without_read);
  bool revoked = false;
  for (int i = 0; i < 50 && !revoked; ++i) {
    absl::SleepFor(absl::Milliseconds(200));
    revoked =
        list(kReadToken).error_code() == grpc::StatusCode::UNAUTHENTICATED;
  }
  EXPECT_TRUE(revoked) << "a revoked token still works";
  EXPECT_TRUE(list(fresh).ok());

  // A file that no longer parses keeps the last good table.
  ReplaceFile(tokens_, "garbage\n");
  absl::SleepFor(absl::Milliseconds(2500));
  EXPECT_TRUE(list(fresh).ok());
  EXPECT_FALSE(cluster->daemon(0).WaitFor(absl::ZeroDuration()));
}

// Tokens without TLS (on loopback): the same checks on gRPC and on the
// data plane, whose connections present their token first.
TEST_F(AuthTest, TokensWithoutTls) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<tt::DaemonCluster> cluster,
                       tt::DaemonCluster::Start(Daemons(2, /*tls=*/false)));
  EXPECT_THAT(Connect(*cluster, "", /*tls=*/false).status(),
              tt::StatusIs(absl::StatusCode::kUnauthenticated, ::testing::_));
  std::shared_ptr<Client> writer;
  std::optional<ShardedTensorView> view;
  WriteAndReadOverTheDataPlane(*cluster, /*tls=*/false, {16, 8}, &writer,
                               &view);
  if (HasFatalFailure()) return;

  // Shard 0 lives on rank 0.
  const std::string data_address = writer->cluster().workers(0).data_address();
  ASSERT_NE(data_address, "");
  const std::string id = view->tensor_id();
  const auto code = [](const absl::StatusOr<v1::BulkFetchReply>& reply) {
    return reply.ok() ? reply->code() : -1;
  };
  EXPECT_EQ(code(tt::RawFetch(data_address, id, kDataPlaneMagic)),
            static_cast<int>(absl::StatusCode::kUnauthenticated));
  absl::StatusOr<v1::BulkFetchReply> unknown =
      tt::RawFetch(data_address, id, kDataPlaneTokenMagic, kUnknownToken);
  EXPECT_EQ(code(unknown),
            static_cast<int>(absl::StatusCode::kUnauthenticated));
  if (unknown.ok()) {
    EXPECT_THAT(unknown->message(),
                HasSubstr("FetchShard: unauthenticated: the token is not"));
  }
  EXPECT_EQ(
      code(tt::RawFetch(data_address, id, kDataPlaneTokenMagic, kReadToken)),
      0);
  // Describe digests (a client's cached Open) need the read role too.
  absl::StatusOr<v1::DescribeDigestReply> stranger_digest =
      tt::RawDescribeDigest(data_address, view->name(), kUnknownToken);
  ASSERT_OK(stranger_digest.status());
  EXPECT_EQ(stranger_digest->code(),
            static_cast<int>(absl::StatusCode::kUnauthenticated));
  EXPECT_EQ(stranger_digest->digest(), 0u);
  absl::StatusOr<v1::DescribeDigestReply> reader_digest =
      tt::RawDescribeDigest(data_address, view->name(), kReadToken);
  ASSERT_OK(reader_digest.status());
  EXPECT_EQ(reader_digest->code(), 0) << reader_digest->message();
  EXPECT_NE(reader_digest->digest(), 0u);

  // Writes over the data plane need the write role, as WriteRegion does.
  absl::StatusOr<v1::BulkWriteReply> read_only =
      tt::RawWrite(data_address, id, 8, kReadToken);
  ASSERT_OK(read_only.status());
  EXPECT_EQ(read_only->code(),
            static_cast<int>(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(read_only->message(), HasSubstr("WriteRegion"));
  absl::StatusOr<v1::BulkWriteReply> unknown_write =
      tt::RawWrite(data_address, id, 8, kUnknownToken);
  ASSERT_OK(unknown_write.status());
  EXPECT_EQ(unknown_write->code(),
            static_cast<int>(absl::StatusCode::kUnauthenticated));
  absl::StatusOr<v1::BulkWriteReply> allowed =
      tt::RawWrite(data_address, id, 8, kWriteToken);
  ASSERT_OK(allowed.status());
  EXPECT_EQ(allowed->code(), 0) << allowed->message();
  EXPECT_FALSE(allowed->fallback()) << allowed->message();
  // A read-token client's write is refused, and nothing changed.
  std::shared_ptr<Client> reader;
  ClientOptions data_plane;
  data_plane.use_local_path = false;
  ASSERT_OK_AND_ASSIGN(reader,
                       Connect(*cluster, kReadToken, false, data_plane));
  ASSERT_OK_AND_ASSIGN(ShardedTensorView seen, reader->Open("t"));
  ASSERT_OK_AND_ASSIGN(Tensor zeros, Tensor::Zeros({2, 8}));
  EXPECT_THAT(seen.Write({0, 0}, zeros),
              tt::StatusIs(absl::StatusCode::kPermissionDenied, ::testing::_));
  ASSERT_OK_AND_ASSIGN(Tensor values, seen.Read());
  tt::ExpectIotaBox(values, 0, 0, 8);
}

// With mutual TLS the data plane is TLS too: the cluster's client reads
// over it; a plaintext client, or one whose certificate another CA signed,
// never gets past the handshake; and the token still applies.
TEST_F(AuthTest, DataPlaneOverMutualTls) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<tt::DaemonCluster> cluster,
                       tt::DaemonCluster::Start(Daemons(2)));
  std::shared_ptr<Client> writer;
  std::optional<ShardedTensorView> view;
  WriteAndReadOverTheDataPlane(*cluster, /*tls=*/true, {512, 256}, &writer,
                               &view);
  if (HasFatalFailure()) return;
  ASSERT_OK_AND_ASSIGN(Tensor box, view->ReadRegion({300, 7}, {20, 30}));
  tt::ExpectIotaBox(box, 300, 7, 256);

  const std::string data_address = writer->cluster().workers(1).data_address();
  ASSERT_NE(data_address, "");
  // Plaintext: the daemon's handshake fails and it closes the connection.
  EXPECT_FALSE(tt::RawFetch(data_address, view->tensor_id(),
                            kDataPlaneTokenMagic, kReadToken)
                   .ok());
  // Another CA's certificate: refused by the handshake.
  ASSERT_TRUE(pki_->MakeCa("other_ca"));
  ASSERT_TRUE(pki_->MakeCert("stranger", "other_ca"));
  TlsConfig stranger = pki_->Client("ca", "stranger");
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<TlsContext> context,
                       TlsContext::ForClient(stranger));
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  ASSERT_OK_AND_ASSIGN(UniqueFd socket, ConnectTcp(data_address, deadline));
  absl::StatusOr<DataConnection> connection = DataConnection::Connect(
      std::move(socket), "127.0.0.1", *context, deadline);
  if (connection.ok()) {
    // TLS 1.3 reports a refused client certificate after the handshake:
    // at the next write or read.
    const absl::Status written = connection->WriteFull(
        kDataPlaneMagic.data(), kDataPlaneMagic.size(), deadline);
    EXPECT_FALSE(written.ok() && connection->ReadFrame(deadline).ok());
  }
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(cluster->daemon(r).WaitFor(absl::ZeroDuration()))
        << cluster->Log(r);
  }
}

}  // namespace
}  // namespace tessera
