// TLS on every gRPC surface (wire/credentials.h) with 2 real
// `tessera-server` processes started with --tls-cert/--tls-key/--tls-ca
// (mutual TLS), certificates made for the test by the `openssl` command: a
// client with the cluster's CA and a certificate it signed creates, writes,
// reads, gathers, saves and loads; a plaintext client, a client without a
// certificate and a client trusting another CA are refused on the
// daemons' port and on the store's, and the daemons keep serving.
#include <grpcpp/grpcpp.h>
#include <stdlib.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "common/sharding_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tessera/v1/control.grpc.pb.h"
#include "tessera/v1/store.grpc.pb.h"
#include "tests/testing/daemon_cluster.h"
#include "tests/testing/iota.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_pki.h"
#include "wire/credentials.h"

namespace tessera {
namespace {

namespace tt = ::tessera::testing;
using tt::Shell;
using tt::TestPki;

// One call of `method` on a fresh channel to `address` with
// `credentials`, within 5 s.
template <typename Service, typename Request, typename Response>
grpc::Status Call(const std::string& address,
                  std::shared_ptr<grpc::ChannelCredentials> credentials,
                  grpc::Status (Service::Stub::*method)(grpc::ClientContext*,
                                                        const Request&,
                                                        Response*),
                  const Request& request) {
  auto stub =
      Service::NewStub(grpc::CreateChannel(address, std::move(credentials)));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(5));
  Response response;
  return ((*stub).*method)(&context, request, &response);
}

grpc::Status GetCluster(const std::string& address,
                        std::shared_ptr<grpc::ChannelCredentials> credentials) {
  return Call<v1::ControlService>(address, std::move(credentials),
                                  &v1::ControlService::Stub::GetCluster,
                                  v1::GetClusterRequest());
}

// A forged operation-log entry, as an attacker would write it.
grpc::Status StoreSet(const std::string& address,
                      std::shared_ptr<grpc::ChannelCredentials> credentials) {
  v1::StoreSetRequest request;
  request.set_key("control/op/1");
  request.set_value("forged");
  return Call<v1::StoreService>(address, std::move(credentials),
                                &v1::StoreService::Stub::Set, request);
}

class TlsTest : public tt::PkiTest {
 protected:
  // Daemons serving with the "daemon" certificate, trusting `ca_file`.
  tt::DaemonClusterOptions Daemons(int world_size, const std::string& ca_file) {
    tt::DaemonClusterOptions options;
    options.world_size = world_size;
    options.server_path = TESSERA_SERVER_PATH;
    options.extra_args = {"--log-level", "error"};
    for (const std::string& flag : DaemonTlsFlags(ca_file)) {
      options.extra_args.push_back(flag);
    }
    return options;
  }
};

TEST_F(TlsTest, MutualTlsOnEveryGrpcSurface) {
  TestPki& pki = *pki_;
  ASSERT_TRUE(pki.MakeCert("client", "ca"));
  ASSERT_TRUE(pki.MakeCa("other_ca"));
  ASSERT_TRUE(pki.MakeCert("stranger", "other_ca"));
  ASSERT_TRUE(pki.MakeCert("expired", "ca", /*days=*/-1));
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<tt::DaemonCluster> cluster,
      tt::DaemonCluster::Start(Daemons(2, pki.Path("ca", "pem"))));

  // Refused: plaintext, TLS without a client certificate, another CA's
  // certificate (trusting either CA), on the daemons' and the store's port.
  const std::vector<std::pair<std::string, TlsConfig>> refused = {
      {"plaintext", TlsConfig()},
      {"no client certificate", pki.Client("ca", "")},
      {"another CA's certificate", pki.Client("ca", "stranger")},
      {"an expired certificate", pki.Client("ca", "expired")},
      {"trusting another CA", pki.Client("other_ca", "stranger")},
  };
  for (const auto& [what, config] : refused) {
    SCOPED_TRACE(what);
    for (const std::string& address :
         {cluster->address(0), cluster->address(1)}) {
      const grpc::Status status =
          GetCluster(address, ChannelCredentialsFor(config));
      EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE)
          << status.error_message();
    }
    EXPECT_EQ(StoreSet(cluster->store_address(), ChannelCredentialsFor(config))
                  .error_code(),
              grpc::StatusCode::UNAVAILABLE);
  }

  // The cluster's own client: everything works, over TLS.
  const TlsConfig good = pki.Client("ca", "client");
  ASSERT_OK(ValidateTlsConfig(good, /*server=*/false));
  EXPECT_TRUE(
      GetCluster(cluster->address(1), ChannelCredentialsFor(good)).ok());
  SetProcessTls(good);
  ASSERT_OK_AND_ASSIGN(auto client, Client::Connect(cluster->address(0)));
  const std::vector<std::string> placements = {"rank:0/cpu", "rank:1/cpu"};
  ShardingSpec rows = *ChunkShardingSpec::Create(0, placements);
  ASSERT_OK_AND_ASSIGN(ShardedTensorView view,
                       client->Create("secret", {8, 4}, rows));
  ASSERT_OK(view.Write({0, 0}, tt::Iota(8, 4)));
  ASSERT_OK_AND_ASSIGN(Tensor values, view.Read());
  tt::ExpectIotaBox(values, 0, 0, 4);
  ASSERT_OK_AND_ASSIGN(Tensor box, view.ReadRegion({3, 1}, {4, 2}));
  tt::ExpectIotaBox(box, 3, 1, 4);
  ASSERT_OK_AND_ASSIGN(Tensor gathered, client->Gather("secret"));
  tt::ExpectIotaBox(gathered, 0, 0, 4);
  ASSERT_OK(client->Save("ckpt", {"secret"}).status());
  ASSERT_OK(client->Delete("secret"));
  v1::LoadCheckpointRequest load_all;
  load_all.set_path("ckpt");
  ASSERT_OK(client->Load(load_all).status());
  ASSERT_OK_AND_ASSIGN(ShardedTensorView reloaded, client->Open("secret"));
  ASSERT_OK_AND_ASSIGN(Tensor again, reloaded.Read());
  tt::ExpectIotaBox(again, 0, 0, 4);
  for (const absl::Status& health : client->Health()) EXPECT_OK(health);
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(cluster->daemon(r).WaitFor(absl::ZeroDuration()))
        << cluster->Log(r);
  }
  SetProcessTls(TlsConfig());
}

// Certificates are reloaded from their files without a restart: a daemon
// that trusts one CA starts trusting a second once its --tls-ca file holds
// both.
TEST_F(TlsTest, RotatedFilesTakeEffectWithoutRestart) {
  TestPki& pki = *pki_;
  ASSERT_TRUE(pki.MakeCa("new_ca"));
  ASSERT_TRUE(pki.MakeCert("new_client", "new_ca"));
  const std::string trusted = pki.Path("trusted", "pem");
  ASSERT_TRUE(Shell(absl::StrCat("cp ", pki.Path("ca", "pem"), " ", trusted)));
  tt::DaemonClusterOptions options = Daemons(1, trusted);
  options.extra_args.push_back("--tls-refresh");
  options.extra_args.push_back("1");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<tt::DaemonCluster> cluster,
                       tt::DaemonCluster::Start(options));
  // The new client verifies the daemon with the old CA, and presents a
  // certificate of the new one.
  const TlsConfig client = pki.Client("ca", "new_client");
  EXPECT_EQ(GetCluster(cluster->address(0), ChannelCredentialsFor(client))
                .error_code(),
            grpc::StatusCode::UNAVAILABLE);
  // Rotate: the daemon's CA file now holds both (written aside, renamed).
  ASSERT_TRUE(Shell(absl::StrCat("cat ", pki.Path("ca", "pem"), " ",
                                 pki.Path("new_ca", "pem"), " > ", trusted,
                                 ".next && mv ", trusted, ".next ", trusted)));
  bool accepted = false;
  for (int i = 0; i < 50 && !accepted; ++i) {
    absl::SleepFor(absl::Milliseconds(200));
    accepted =
        GetCluster(cluster->address(0), ChannelCredentialsFor(client)).ok();
  }
  EXPECT_TRUE(accepted) << "the daemon did not reload its CA file";
  EXPECT_FALSE(cluster->daemon(0).WaitFor(absl::ZeroDuration()));
}

TEST(TlsConfigTest, BadTlsFlagsAreUsageErrors) {
  TlsConfig config;
  config.cert_file = "/nonexistent/cert.pem";
  EXPECT_THAT(ValidateTlsConfig(config, /*server=*/true),
              tt::StatusIs(absl::StatusCode::kInvalidArgument,
                           ::testing::HasSubstr("give both or neither")));
  config.key_file = "/nonexistent/key.pem";
  EXPECT_THAT(ValidateTlsConfig(config, /*server=*/true),
              tt::StatusIs(absl::StatusCode::kInvalidArgument,
                           ::testing::HasSubstr("--tls-cert")));
  TlsConfig ca_only;
  ca_only.ca_file = "/etc/hostname";
  EXPECT_THAT(ValidateTlsConfig(ca_only, /*server=*/true),
              tt::StatusIs(absl::StatusCode::kInvalidArgument,
                           ::testing::HasSubstr("needs --tls-cert")));
  EXPECT_THAT(ValidateTlsConfig(ca_only, /*server=*/false),
              tt::StatusIs(absl::StatusCode::kInvalidArgument,
                           ::testing::HasSubstr("holds no PEM certificate")));
}

}  // namespace
}  // namespace tessera
