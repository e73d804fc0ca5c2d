// tessera-server's configuration: flags, the torchrun and Slurm
// environment, defaults and validation, with a fake environment.
#include "server/daemon/daemon_options.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tessera::daemon {
namespace {

using ::tessera::testing::IsOkAndHolds;
using ::tessera::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;
using ::testing::StartsWith;

class DaemonOptionsTest : public ::testing::Test {
 protected:
  DaemonEnvironment Env() {
    DaemonEnvironment env;
    env.getenv = [this](const std::string& name) -> std::optional<std::string> {
      auto it = vars_.find(name);
      if (it == vars_.end()) return std::nullopt;
      return it->second;
    };
    env.cuda_devices = cuda_devices_;
    env.nccl = nccl_;
    env.local_address =
        [this](const std::string& master) -> absl::StatusOr<std::string> {
      asked_for_.push_back(master);
      return local_address_;
    };
    return env;
  }
  absl::StatusOr<DaemonOptions> Resolve(const DaemonFlags& flags) {
    return ResolveDaemonOptions(flags, Env());
  }
  static DaemonFlags RankOf(int rank, int world_size) {
    DaemonFlags flags;
    flags.rank = std::to_string(rank);
    flags.world_size = std::to_string(world_size);
    return flags;
  }

  // A file of this test's scratch directory holding `text`.
  std::string ScratchFile(const std::string& name, const std::string& text,
                          mode_t mode = 0644) {
    if (dir_.empty()) {
      char dir[] = "/tmp/tessera-options-XXXXXX";
      EXPECT_NE(mkdtemp(dir), nullptr);
      dir_ = dir;
    }
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    EXPECT_EQ(chmod(path.c_str(), mode), 0);
    return path;
  }
  // A scratch file that passes the PEM checks (nothing parses it further).
  std::string PemFile(const std::string& name, const std::string& kind) {
    return ScratchFile(
        name, "-----BEGIN " + kind + "-----\nx\n-----END " + kind + "-----\n");
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  std::string dir_;
  std::map<std::string, std::string> vars_;
  int cuda_devices_ = 0;
  bool nccl_ = false;
  absl::StatusOr<std::string> local_address_ = std::string("10.0.0.7");
  std::vector<std::string> asked_for_;
};

TEST_F(DaemonOptionsTest, DefaultsWithRankAndWorldSizeFlags) {
  ASSERT_OK_AND_ASSIGN(DaemonOptions o, Resolve(RankOf(1, 4)));
  EXPECT_EQ(o.rank, 1);
  EXPECT_EQ(o.world_size, 4);
  EXPECT_EQ(o.local_rank, 0);
  EXPECT_EQ(o.master_addr, "127.0.0.1");
  EXPECT_EQ(o.master_port, 29500);
  EXPECT_EQ(o.store_address(), "127.0.0.1:29500");
  // Nobody is authenticated: loopback only.
  EXPECT_EQ(o.host, "127.0.0.1");
  EXPECT_FALSE(o.authenticates());
  EXPECT_TRUE(o.reflection);
  EXPECT_EQ(o.port, 29600);
  // A loopback master: everything is on this host.
  EXPECT_EQ(o.advertise_host, "127.0.0.1");
  EXPECT_THAT(asked_for_, IsEmpty());
  EXPECT_EQ(o.device, Device::Cpu());
  EXPECT_EQ(o.backend, "gloo");
  EXPECT_EQ(o.timeout, absl::Seconds(60));
  EXPECT_EQ(o.store_timeout, absl::Seconds(60));
  EXPECT_EQ(o.shutdown_grace, absl::Seconds(10));
  EXPECT_EQ(o.lease, absl::Seconds(5));
  EXPECT_EQ(o.address_file, "");
  EXPECT_EQ(o.log_level, "info");
}

TEST_F(DaemonOptionsTest, TorchrunEnvironment) {
  vars_ = {{"RANK", "3"},           {"WORLD_SIZE", "8"},
           {"LOCAL_RANK", "1"},     {"MASTER_ADDR", "10.0.0.1"},
           {"MASTER_PORT", "1234"}, {"SLURM_PROCID", "6"}};
  DaemonFlags insecure;
  insecure.insecure = true;  // A cluster beyond this host, unauthenticated.
  ASSERT_OK_AND_ASSIGN(DaemonOptions o, Resolve(insecure));
  EXPECT_EQ(o.host, "0.0.0.0");
  EXPECT_EQ(o.rank, 3);  // RANK wins over SLURM_PROCID.
  EXPECT_EQ(o.world_size, 8);
  EXPECT_EQ(o.local_rank, 1);
  EXPECT_EQ(o.store_address(), "10.0.0.1:1234");
  EXPECT_EQ(o.port, 29601);  // 29600 + local rank.
  // A remote master: this host's address towards it.
  EXPECT_EQ(o.advertise_host, "10.0.0.7");
  EXPECT_THAT(asked_for_, ::testing::ElementsAre("10.0.0.1"));
}

TEST_F(DaemonOptionsTest, SlurmEnvironment) {
  vars_ = {
      {"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "2"}};
  ASSERT_OK_AND_ASSIGN(DaemonOptions o, Resolve({}));
  EXPECT_EQ(o.rank, 5);
  EXPECT_EQ(o.world_size, 8);
  EXPECT_EQ(o.local_rank, 2);
  EXPECT_EQ(o.port, 29602);
}

TEST_F(DaemonOptionsTest, EmptyVariablesCountAsUnset) {
  vars_ = {{"RANK", ""},
           {"SLURM_PROCID", "2"},
           {"WORLD_SIZE", "4"},
           {"MASTER_ADDR", ""},
           {"MASTER_PORT", ""}};
  ASSERT_OK_AND_ASSIGN(DaemonOptions o, Resolve({}));
  EXPECT_EQ(o.rank, 2);
  EXPECT_EQ(o.store_address(), "127.0.0.1:29500");
}

TEST_F(DaemonOptionsTest, FlagsOverrideEnvironment) {
  vars_ = {{"RANK", "3"},
           {"WORLD_SIZE", "8"},
           {"LOCAL_RANK", "3"},
           {"MASTER_ADDR", "10.0.0.1"},
           {"MASTER_PORT", "1234"}};
  DaemonFlags flags = RankOf(0, 2);
  flags.local_rank = "1";
  flags.master_addr = "127.0.0.1";
  flags.master_port = "4321";
  flags.port = "0";
  flags.host = "127.0.0.1";
  flags.timeout = "1m30s";
  flags.store_timeout = "2";
  flags.shutdown_grace = "250ms";
  flags.address_file = "/tmp/a";
  flags.log_level = "debug";
  ASSERT_OK_AND_ASSIGN(DaemonOptions o, Resolve(flags));
  EXPECT_EQ(o.rank, 0);
  EXPECT_EQ(o.world_size, 2);
  EXPECT_EQ(o.local_rank, 1);
  EXPECT_EQ(o.store_address(), "127.0.0.1:4321");
  EXPECT_EQ(o.port, 0);  // Any free port.
  EXPECT_EQ(o.advertise_host, "127.0.0.1");
  EXPECT_EQ(o.timeout, absl::Seconds(90));
  EXPECT_EQ(o.store_timeout, absl::Seconds(2));
  EXPECT_EQ(o.shutdown_grace, absl::Milliseconds(250));
  EXPECT_EQ(o.address_file, "/tmp/a");
  EXPECT_EQ(o.log_level, "debug");
}

TEST_F(DaemonOptionsTest, AdvertiseHost) {
  DaemonFlags flags = RankOf(0, 1);
  flags.master_addr = "node0";
  flags.insecure = true;
  flags.host = "10.1.2.3";  // A specific listen address is what peers dial.
  ASSERT_OK_AND_ASSIGN(DaemonOptions o, Resolve(flags));
  EXPECT_EQ(o.advertise_host, "10.1.2.3");
  flags.advertise_host = "node1.example";
  ASSERT_OK_AND_ASSIGN(o, Resolve(flags));
  EXPECT_EQ(o.advertise_host, "node1.example");
  flags.host = "0.0.0.0";
  flags.advertise_host = "";  // Empty (an unset shell variable): default.
  ASSERT_OK_AND_ASSIGN(o, Resolve(flags));
  EXPECT_EQ(o.advertise_host, "10.0.0.7");
  EXPECT_THAT(asked_for_, ::testing::ElementsAre("node0"));

  local_address_ = absl::UnavailableError("no route");
  EXPECT_THAT(Resolve(flags),
              StatusIs(absl::StatusCode::kUnavailable, "no route"));
}

// Unauthenticated daemons stay on this host unless --insecure says
// otherwise; authenticated ones (mutual TLS or tokens) listen everywhere.
TEST_F(DaemonOptionsTest, SafeDefaultsWithoutAuthentication) {
  DaemonFlags flags = RankOf(0, 2);
  for (const char* host : {"0.0.0.0", "10.1.2.3", "::", "node0"}) {
    SCOPED_TRACE(host);
    flags.host = host;
    EXPECT_THAT(Resolve(flags),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("without authentication"),
                               HasSubstr("--insecure"))));
  }
  flags.host.reset();
  flags.master_addr = "10.0.0.1";
  EXPECT_THAT(Resolve(flags),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("the master 10.0.0.1 is not on loopback")));
  // Server-only TLS encrypts but does not say who the caller is.
  const std::string pem = PemFile("cert.pem", "CERTIFICATE");
  const std::string key = PemFile("key.pem", "PRIVATE KEY");
  flags.tls_cert = pem;
  flags.tls_key = key;
  EXPECT_THAT(Resolve(flags),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  flags.insecure = true;
  ASSERT_OK_AND_ASSIGN(DaemonOptions o, Resolve(flags));
  EXPECT_EQ(o.host, "0.0.0.0");
  flags.insecure = false;
  flags.tls_ca = pem;  // mutual TLS
  ASSERT_OK_AND_ASSIGN(o, Resolve(flags));
  EXPECT_EQ(o.host, "0.0.0.0");
  EXPECT_TRUE(o.authenticates());
  flags.tls_cert.reset();
  flags.tls_key.reset();
  flags.tls_ca.reset();
  flags.auth_token_file =
      ScratchFile("tokens", "0123456789abcdef0123 cluster daemons\n", 0600);
  ASSERT_OK_AND_ASSIGN(o, Resolve(flags));
  EXPECT_EQ(o.host, "0.0.0.0");
  EXPECT_TRUE(o.authenticates());
}

TEST_F(DaemonOptionsTest, EtcdStore) {
  DaemonFlags flags = RankOf(0, 2);
  ASSERT_OK_AND_ASSIGN(DaemonOptions o, Resolve(flags));
  EXPECT_EQ(o.store_url, "");
  vars_["TESSERA_STORE"] = "etcd://127.0.0.1:2379,localhost:2380/job";
  ASSERT_OK_AND_ASSIGN(o, Resolve(flags));
  EXPECT_EQ(o.store_url, "etcd://127.0.0.1:2379,localhost:2380/job");
  flags.store = "http://127.0.0.1:2379";
  EXPECT_THAT(Resolve(flags),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("--store"), HasSubstr("etcd://"))));
  flags.store = "etcd://127.0.0.1:0";
  EXPECT_THAT(Resolve(flags), StatusIs(absl::StatusCode::kInvalidArgument,
                                       HasSubstr("1..65535")));
  // etcd beyond loopback is reached without credentials: only with
  // --insecure, even when the daemons authenticate their callers.
  flags.store = "etcd://127.0.0.1:2379,10.0.0.9:2379";
  flags.auth_token_file =
      ScratchFile("tokens", "0123456789abcdef0123 cluster daemons\n", 0600);
  EXPECT_THAT(Resolve(flags),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("etcd member 10.0.0.9:2379"),
                             HasSubstr("--insecure"))));
  flags.insecure = true;
  ASSERT_OK_AND_ASSIGN(o, Resolve(flags));
  EXPECT_EQ(o.store_url, "etcd://127.0.0.1:2379,10.0.0.9:2379");
  // Or with mutual TLS to etcd.
  flags.insecure = false;
  const std::string pem = PemFile("etcd-ca.pem", "CERTIFICATE");
  const std::string key = PemFile("etcd-client.key", "PRIVATE KEY");
  flags.store_tls_ca = pem;
  EXPECT_THAT(Resolve(flags), StatusIs(absl::StatusCode::kInvalidArgument,
                                       HasSubstr("without mutual TLS")));
  flags.store_tls_cert = pem;
  EXPECT_THAT(Resolve(flags), StatusIs(absl::StatusCode::kInvalidArgument,
                                       HasSubstr("--store-tls-key")));
  vars_["TESSERA_STORE_TLS_KEY"] = key;
  ASSERT_OK_AND_ASSIGN(o, Resolve(flags));
  EXPECT_EQ(o.store_tls.key_file, key);
  EXPECT_EQ(o.store_tls.ca_file, pem);
  // TLS settings without an etcd store are a mistake, said so.
  flags.store.reset();
  vars_.erase("TESSERA_STORE");
  EXPECT_THAT(Resolve(flags), StatusIs(absl::StatusCode::kInvalidArgument,
                                       HasSubstr("pass --store etcd://")));
}

TEST_F(DaemonOptionsTest, AuthAndReflectionFlags) {
  DaemonFlags flags = RankOf(0, 1);
  flags.auth_token_file =
      ScratchFile("tokens", "0123456789abcdef0123 admin ops\n", 0600);
  EXPECT_THAT(Resolve(flags),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("no token with the cluster role")));
  flags.auth_token_file =
      ScratchFile("open", "0123456789abcdef0123 cluster\n", 0644);
  EXPECT_THAT(Resolve(flags), StatusIs(absl::StatusCode::kInvalidArgument,
                                       HasSubstr("every user may read it")));
  flags.auth_token_file = "";
  EXPECT_THAT(Resolve(flags),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  flags.auth_token_file.reset();
  flags.reflection = "false";
  ASSERT_OK_AND_ASSIGN(DaemonOptions o, Resolve(flags));
  EXPECT_FALSE(o.reflection);
  flags.reflection = "maybe";
  EXPECT_THAT(Resolve(flags),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--reflection must be true or false")));
  flags.reflection.reset();
  flags.local_users = {"root", "65534"};
  ASSERT_OK_AND_ASSIGN(o, Resolve(flags));
  EXPECT_THAT(o.local_users, ::testing::ElementsAre(0u, 65534u));
  flags.local_users = {"no-such-user-here"};
  EXPECT_THAT(Resolve(flags), StatusIs(absl::StatusCode::kInvalidArgument,
                                       HasSubstr("--local-users: no user")));
}

TEST_F(DaemonOptionsTest, MissingRankOrWorldSize) {
  DaemonFlags flags;
  flags.rank = "0";
  EXPECT_THAT(Resolve(flags),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "no world size: pass --world-size or set WORLD_SIZE "
                       "(or SLURM_NTASKS)"));
  flags = {};
  flags.world_size = "2";
  EXPECT_THAT(Resolve(flags),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "no rank: pass --rank or set RANK (or SLURM_PROCID)"));
}

TEST_F(DaemonOptionsTest, RankOutsideWorld) {
  EXPECT_THAT(Resolve(RankOf(4, 4)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "rank 4 (--rank) is outside [0, 4)"));
  vars_ = {{"RANK", "-1"}, {"WORLD_SIZE", "4"}};
  EXPECT_THAT(Resolve({}), StatusIs(absl::StatusCode::kInvalidArgument,
                                    "RANK must be in [0, 1048576], got -1"));
  vars_ = {{"SLURM_PROCID", "2"}, {"WORLD_SIZE", "2"}};
  EXPECT_THAT(Resolve({}), StatusIs(absl::StatusCode::kInvalidArgument,
                                    HasSubstr("(SLURM_PROCID)")));
  EXPECT_THAT(Resolve(RankOf(0, 0)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--world-size must be in [1, 1048576], got 0"));
}

// The metrics endpoint is off unless asked for, on loopback unless told
// otherwise, and beyond loopback only with --insecure (it authenticates
// nobody, whatever protects the gRPC surfaces).
TEST_F(DaemonOptionsTest, MetricsEndpoint) {
  DaemonFlags flags = RankOf(0, 1);
  ASSERT_OK_AND_ASSIGN(DaemonOptions off, Resolve(flags));
  EXPECT_EQ(off.metrics_port, -1);
  flags.metrics_port = "0";
  ASSERT_OK_AND_ASSIGN(DaemonOptions any, Resolve(flags));
  EXPECT_EQ(any.metrics_port, 0);
  EXPECT_EQ(any.metrics_host, "127.0.0.1");
  flags.metrics_port = "65536";
  EXPECT_THAT(Resolve(flags),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--metrics-port must be in [0, 65535], got 65536"));
  flags.metrics_port = "9464";
  for (const auto& [host, error] :
       std::vector<std::pair<std::string, std::string>>{
           {"", "--metrics-host must not be empty"},
           {"0.0.0.0", "--metrics-host 0.0.0.0 listens beyond this host"}}) {
    flags.metrics_host = host;
    EXPECT_THAT(Resolve(flags),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(error)));
  }
  // A daemon that authenticates its data surfaces may open it (it shows
  // counts only), without --insecure.
  flags.auth_token_file =
      ScratchFile("tokens", "0123456789abcdef0123 cluster daemons\n", 0600);
  ASSERT_OK_AND_ASSIGN(DaemonOptions tokens, Resolve(flags));
  EXPECT_EQ(tokens.metrics_host, "0.0.0.0");
  flags.auth_token_file.reset();
  flags.insecure = true;
  ASSERT_OK_AND_ASSIGN(DaemonOptions beyond, Resolve(flags));
  EXPECT_EQ(beyond.metrics_host, "0.0.0.0");
  EXPECT_EQ(beyond.metrics_port, 9464);
  flags.metrics_address_file = "/run/m";
  ASSERT_OK_AND_ASSIGN(DaemonOptions written, Resolve(flags));
  EXPECT_EQ(written.metrics_address_file, "/run/m");
  flags.metrics_port.reset();
  EXPECT_THAT(Resolve(flags),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--metrics-address-file needs --metrics-port"));
}

// --data-port: a free one unless named; never --port's own.
TEST_F(DaemonOptionsTest, DataPort) {
  DaemonFlags flags = RankOf(0, 1);
  ASSERT_OK_AND_ASSIGN(DaemonOptions any, Resolve(flags));
  EXPECT_EQ(any.data_port, 0);
  flags.data_port = "29700";
  ASSERT_OK_AND_ASSIGN(DaemonOptions named, Resolve(flags));
  EXPECT_EQ(named.data_port, 29700);
  flags.data_port = "65536";
  EXPECT_THAT(Resolve(flags),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--data-port must be in [0, 65535], got 65536"));
  flags.data_port = "29600";  // --port's default for local rank 0
  EXPECT_THAT(Resolve(flags),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("the data plane needs a port of its own")));
  flags.port = "0";
  flags.data_port = "0";
  EXPECT_OK(Resolve(flags).status());
}

TEST_F(DaemonOptionsTest, LogFormat) {
  DaemonFlags flags = RankOf(0, 1);
  ASSERT_OK_AND_ASSIGN(DaemonOptions text, Resolve(flags));
  EXPECT_EQ(text.log_format, "text");
  flags.log_format = "json";
  ASSERT_OK_AND_ASSIGN(DaemonOptions json, Resolve(flags));
  EXPECT_EQ(json.log_format, "json");
  flags.log_format = "JSON";
  EXPECT_THAT(Resolve(flags),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--log-format must be text or json; got 'JSON'"));
}

TEST_F(DaemonOptionsTest, BadNumbersNameTheirSource) {
  DaemonFlags flags = RankOf(0, 1);
  flags.rank = "one";
  EXPECT_THAT(Resolve(flags), StatusIs(absl::StatusCode::kInvalidArgument,
                                       "--rank must be an integer, got 'one'"));
  vars_ = {{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"LOCAL_RANK", "x"}};
  EXPECT_THAT(Resolve({}), StatusIs(absl::StatusCode::kInvalidArgument,
                                    "LOCAL_RANK must be an integer, got 'x'"));
}

TEST_F(DaemonOptionsTest, Ports) {
  DaemonFlags flags = RankOf(0, 1);
  flags.port = "65536";
  EXPECT_THAT(Resolve(flags),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--port must be in [0, 65535], got 65536"));
  flags.port = "http";
  EXPECT_THAT(Resolve(flags),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--port must be an integer, got 'http'"));
  flags.port = std::nullopt;
  flags.master_port = "0";  // Peers could not find it.
  EXPECT_THAT(Resolve(flags),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--master-port must be in [1, 65535], got 0"));
  flags.master_port = std::nullopt;
  vars_ = {{"MASTER_PORT", "29500x"}};
  EXPECT_THAT(Resolve(flags),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "MASTER_PORT must be an integer, got '29500x'"));
}

TEST_F(DaemonOptionsTest, DeviceAuto) {
  DaemonFlags flags = RankOf(1, 2);
  flags.local_rank = "1";
  ASSERT_OK_AND_ASSIGN(DaemonOptions o, Resolve(flags));
  EXPECT_EQ(o.device, Device::Cpu());  // No GPU.
  cuda_devices_ = 2;
  ASSERT_OK_AND_ASSIGN(o, Resolve(flags));
  EXPECT_EQ(o.device, Device::Cpu());  // GPUs but no NCCL in this build.
  nccl_ = true;
  ASSERT_OK_AND_ASSIGN(o, Resolve(flags));
  EXPECT_EQ(o.device, Device::Cuda(1));
  EXPECT_EQ(o.backend, "nccl");
  flags.local_rank = "2";  // More daemons than GPUs on this host.
  ASSERT_OK_AND_ASSIGN(o, Resolve(flags));
  EXPECT_EQ(o.device, Device::Cpu());
  EXPECT_EQ(o.backend, "gloo");
}

TEST_F(DaemonOptionsTest, DeviceExplicit) {
  cuda_devices_ = 2;
  nccl_ = true;
  DaemonFlags flags = RankOf(0, 1);
  flags.local_rank = "1";
  flags.device = "cuda";  // This host's local rank.
  ASSERT_OK_AND_ASSIGN(DaemonOptions o, Resolve(flags));
  EXPECT_EQ(o.device, Device::Cuda(1));
  flags.device = "cuda:0";
  ASSERT_OK_AND_ASSIGN(o, Resolve(flags));
  EXPECT_EQ(o.device, Device::Cuda(0));
  EXPECT_EQ(o.backend, "nccl");
  flags.device = "cpu";
  ASSERT_OK_AND_ASSIGN(o, Resolve(flags));
  EXPECT_EQ(o.device, Device::Cpu());
  EXPECT_EQ(o.backend, "gloo");

  flags.device = "cuda:2";
  EXPECT_THAT(Resolve(flags),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--device cuda:2: no CUDA device 2 (2 visible)"));
  for (const char* bad : {"gpu", "meta", "cuda:-1", ""}) {
    flags.device = bad;
    EXPECT_THAT(Resolve(flags),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         StartsWith("--device must be auto, cpu, cuda or "
                                    "cuda:N")))
        << bad;
  }
  cuda_devices_ = 0;
  flags.device = "cuda";
  EXPECT_THAT(Resolve(flags), StatusIs(absl::StatusCode::kInvalidArgument,
                                       HasSubstr("(0 visible)")));
  nccl_ = false;
  EXPECT_THAT(Resolve(flags), StatusIs(absl::StatusCode::kInvalidArgument,
                                       HasSubstr("no NCCL backend")));
}

// Four daemons on a one-GPU host (tests/integration/daemon_cuda_test.cc):
// NCCL cannot put two ranks on one GPU, so they all share cuda:0 over Gloo.
TEST_F(DaemonOptionsTest, LocalRanksSharingGpusUseGloo) {
  cuda_devices_ = 1;
  nccl_ = true;
  for (int local = 0; local < 4; ++local) {
    DaemonFlags flags = RankOf(local, 4);
    flags.local_rank = std::to_string(local);
    flags.local_world_size = "4";
    flags.device = "cuda";
    ASSERT_OK_AND_ASSIGN(DaemonOptions o, Resolve(flags));
    EXPECT_EQ(o.local_world_size, 4);
    EXPECT_EQ(o.device, Device::Cuda(0)) << local;
    EXPECT_EQ(o.backend, "gloo") << local;
    // auto keeps every rank of the host on the CPU rather than give some a
    // GPU and the backend the others cannot join.
    flags.device = "auto";
    ASSERT_OK_AND_ASSIGN(o, Resolve(flags));
    EXPECT_EQ(o.device, Device::Cpu()) << local;
    EXPECT_EQ(o.backend, "gloo") << local;
  }

  // Two GPUs, four ranks: spread round-robin, still Gloo; from torchrun's
  // environment too.
  cuda_devices_ = 2;
  DaemonFlags flags = RankOf(3, 4);
  flags.device = "cuda";
  vars_ = {{"LOCAL_RANK", "3"}, {"LOCAL_WORLD_SIZE", "4"}};
  ASSERT_OK_AND_ASSIGN(DaemonOptions o, Resolve(flags));
  EXPECT_EQ(o.device, Device::Cuda(1));
  EXPECT_EQ(o.backend, "gloo");
  // As many GPUs as local ranks: each its own, over NCCL.
  cuda_devices_ = 4;
  ASSERT_OK_AND_ASSIGN(o, Resolve(flags));
  EXPECT_EQ(o.device, Device::Cuda(3));
  EXPECT_EQ(o.backend, "nccl");
  flags.device = "auto";
  ASSERT_OK_AND_ASSIGN(o, Resolve(flags));
  EXPECT_EQ(o.device, Device::Cuda(3));
  EXPECT_EQ(o.backend, "nccl");

  // Sharing without knowing the local world size: the ranks could not
  // agree on a backend, so this one refuses to start.
  cuda_devices_ = 1;
  vars_ = {{"LOCAL_RANK", "3"}};
  flags.device = "cuda";
  EXPECT_THAT(Resolve(flags),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("local rank 3 shares a GPU (1 visible)")));
  flags.device = "cuda:0";
  EXPECT_THAT(Resolve(flags), StatusIs(absl::StatusCode::kInvalidArgument,
                                       HasSubstr("--local-world-size")));

  flags.local_world_size = "3";
  EXPECT_THAT(Resolve(flags),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "local rank 3 is outside [0, 3) (--local-world-size)"));
  flags.local_world_size = "0";
  EXPECT_THAT(Resolve(flags),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--local-world-size must be in [1, ")));
}

TEST_F(DaemonOptionsTest, DurationsAndLogLevels) {
  DaemonFlags flags = RankOf(0, 1);
  for (const char* bad : {"0s", "-1s", "soon", "inf", ""}) {
    flags.timeout = bad;
    EXPECT_THAT(Resolve(flags),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         StartsWith("--timeout must be a positive duration")))
        << bad;
  }
  flags.timeout = std::nullopt;
  for (const char* bad : {"0s", "-2s", "never"}) {
    flags.lease = bad;
    EXPECT_THAT(Resolve(flags),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         StartsWith("--lease must be a positive duration")))
        << bad;
  }
  flags.lease = "750ms";
  flags.store_timeout = "1.5";
  ASSERT_OK_AND_ASSIGN(DaemonOptions o, Resolve(flags));
  EXPECT_EQ(o.store_timeout, absl::Milliseconds(1500));
  EXPECT_EQ(o.lease, absl::Milliseconds(750));
  for (const char* level : {"trace", "debug", "info", "warn", "error"}) {
    flags.log_level = level;
    EXPECT_OK(Resolve(flags).status()) << level;
  }
  flags.log_level = "verbose";
  EXPECT_THAT(Resolve(flags),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--log-level must be one of trace, debug, info, warn, "
                       "error; got 'verbose'"));
}

TEST(DaemonOptionsHelpersTest, IsLoopbackHost) {
  for (const char* host :
       {"localhost", "127.0.0.1", "127.1.2.3", "::1", "[::1]"}) {
    EXPECT_TRUE(IsLoopbackHost(host)) << host;
  }
  for (const char* host : {"10.0.0.1", "0.0.0.0", "node0", "128.0.0.1", ""}) {
    EXPECT_FALSE(IsLoopbackHost(host)) << host;
  }
}

TEST(DaemonOptionsHelpersTest, DurationText) {
  EXPECT_EQ(DurationText(absl::Seconds(60)), "60s");
  EXPECT_EQ(DurationText(absl::Seconds(2)), "2s");
  EXPECT_EQ(DurationText(absl::Milliseconds(1500)), "1.5s");
  EXPECT_EQ(DurationText(absl::Milliseconds(250)), "250ms");
}

TEST(DaemonOptionsHelpersTest, LocalAddressForLoopbackIsLoopback) {
  ASSERT_OK_AND_ASSIGN(std::string address, LocalAddressFor("127.0.0.1"));
  EXPECT_EQ(address, "127.0.0.1");
}

// ---- the command line -------------------------------------------------------

struct CommandLineResult {
  ParsedCommandLine parsed;
  std::string out;
  std::string err;
};

CommandLineResult Parse(std::vector<std::string> args,
                        const DaemonEnvironment& env) {
  std::vector<const char*> argv = {"tessera-server"};
  for (const std::string& arg : args) argv.push_back(arg.c_str());
  std::ostringstream out, err;
  CommandLineResult result;
  result.parsed = ParseDaemonCommandLine(static_cast<int>(argv.size()),
                                         argv.data(), env, out, err);
  result.out = out.str();
  result.err = err.str();
  return result;
}

std::vector<std::string> Lines(const std::string& text) {
  return absl::StrSplit(text, '\n', absl::SkipEmpty());
}

TEST_F(DaemonOptionsTest, CommandLineParses) {
  vars_ = {{"WORLD_SIZE", "4"}};
  CommandLineResult r = Parse(
      {"--rank", "2", "--port=0", "--device", "cpu", "--store-timeout", "2s"},
      Env());
  ASSERT_TRUE(r.parsed.options.has_value()) << r.err;
  EXPECT_EQ(r.parsed.options->rank, 2);
  EXPECT_EQ(r.parsed.options->world_size, 4);
  EXPECT_EQ(r.parsed.options->port, 0);
  EXPECT_EQ(r.parsed.options->store_timeout, absl::Seconds(2));
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "");
}

TEST_F(DaemonOptionsTest, CommandLineErrorsAreOneLineAndExitTwo) {
  const std::vector<std::vector<std::string>> bad = {
      {"--rank", "0", "--world-size", "1", "--bogus"},
      {"--rank", "0", "--world-size", "1", "stray"},
      {"--rank"},
      {"--world-size", "2"},
      {"--rank", "2", "--world-size", "2"},
      {"--rank", "0", "--world-size", "1", "--port", "99999"},
      {"--rank", "0", "--world-size", "1", "--device", "tpu"},
  };
  for (const auto& args : bad) {
    CommandLineResult r = Parse(args, Env());
    EXPECT_FALSE(r.parsed.options.has_value());
    EXPECT_EQ(r.parsed.exit_code, kExitUsage);
    EXPECT_THAT(Lines(r.err), SizeIs(1)) << r.err;
    EXPECT_THAT(r.err, StartsWith("tessera-server: error: "));
    EXPECT_EQ(r.out, "");
  }
}

TEST_F(DaemonOptionsTest, CommandLineHelp) {
  CommandLineResult r = Parse({"--help"}, Env());
  EXPECT_FALSE(r.parsed.options.has_value());
  EXPECT_EQ(r.parsed.exit_code, kExitOk);
  for (const char* flag : {"--rank",
                           "--world-size",
                           "--local-rank",
                           "--local-world-size",
                           "--master-addr",
                           "--master-port",
                           "--host",
                           "--port",
                           "--advertise-host",
                           "--device",
                           "--timeout",
                           "--store-timeout",
                           "--shutdown-grace",
                           "--address-file",
                           "--log-level",
                           "--insecure",
                           "--auth-token-file",
                           "--reflection",
                           "--local-users",
                           "SLURM_PROCID"}) {
    EXPECT_THAT(r.out, HasSubstr(flag));
  }
}

// --help is the settings table: every setting once, with its variables
// and default.
TEST_F(DaemonOptionsTest, CommandLineHelpListsEverySettingOnce) {
  const DaemonEnvironment env = Env();
  const DaemonSettingTable settings = DaemonSettings(env);
  const std::string help = Parse({"--help"}, env).out;
  for (const DaemonSettingTable::Setting& setting : settings.settings()) {
    int listed = 0;
    for (const std::string& line : Lines(help)) {
      const absl::string_view option = absl::StripLeadingAsciiWhitespace(line);
      listed += absl::StartsWith(option, setting.flag() + " ") ||
                option == setting.flag();
    }
    EXPECT_EQ(listed, 1) << setting.flag() << "\n" << help;
  }
  EXPECT_THAT(help, HasSubstr("global rank [env RANK, SLURM_PROCID]"));
  EXPECT_THAT(help, HasSubstr("[env LOCAL_RANK, SLURM_LOCALID; default 0]"));
  EXPECT_THAT(help, HasSubstr("[env MASTER_PORT; default 29500]"));
  EXPECT_THAT(help, HasSubstr("[default 60s]"));
}

// Variables read for a setting are named by their errors, as flags are.
TEST_F(DaemonOptionsTest, SettingsFromVariablesNameThem) {
  vars_ = {{"WORLD_SIZE", "2"}, {"RANK", "0"}, {"TESSERA_STORE", "http://x"}};
  EXPECT_THAT(Resolve({}), StatusIs(absl::StatusCode::kInvalidArgument,
                                    StartsWith("TESSERA_STORE: ")));
  vars_ = {{"WORLD_SIZE", "2"}, {"RANK", "0"}, {"LOCAL_WORLD_SIZE", "four"}};
  EXPECT_THAT(Resolve({}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "LOCAL_WORLD_SIZE must be an integer, got 'four'"));
  vars_ = {{"WORLD_SIZE", "2"},
           {"RANK", "0"},
           {"SLURM_NTASKS_PER_NODE", "1"},
           {"LOCAL_RANK", "1"}};
  EXPECT_THAT(Resolve({}), StatusIs(absl::StatusCode::kInvalidArgument,
                                    "local rank 1 is outside [0, 1) "
                                    "(SLURM_NTASKS_PER_NODE)"));
}

TEST_F(DaemonOptionsTest, CommandLineUnfindableAddressExitsOne) {
  local_address_ = absl::UnavailableError("cannot find this host's address");
  CommandLineResult r = Parse({"--rank", "0", "--world-size", "1",
                               "--master-addr", "node0", "--insecure"},
                              Env());
  EXPECT_EQ(r.parsed.exit_code, kExitFailure);
  EXPECT_EQ(r.err, "tessera-server: error: cannot find this host's address\n");
}

TEST(DaemonOptionsHelpersTest, ParseByteSize) {
  EXPECT_THAT(ParseByteSize("--memory-limit", "1000"), IsOkAndHolds(1000));
  EXPECT_THAT(ParseByteSize("--memory-limit", "512MiB"),
              IsOkAndHolds(int64_t{512} << 20));
  EXPECT_THAT(ParseByteSize("--memory-limit", "8Gi"),
              IsOkAndHolds(int64_t{8} << 30));
  EXPECT_THAT(ParseByteSize("--memory-limit", "1.5G"),
              IsOkAndHolds(int64_t{1500000000}));
  EXPECT_THAT(ParseByteSize("--memory-limit", "2KB"), IsOkAndHolds(2000));
  EXPECT_THAT(ParseByteSize("--memory-limit", "64B"), IsOkAndHolds(64));
  for (const char* bad : {"", "GiB", "-1GiB", "1XB", "1e30", "nan", "1 2"}) {
    EXPECT_THAT(ParseByteSize("--memory-limit", bad),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("--memory-limit")))
        << bad;
  }
}

TEST_F(DaemonOptionsTest, MemoryLimitAndCheckpointRoots) {
  DaemonFlags flags;
  flags.rank = "0";
  flags.world_size = "1";
  flags.memory_limit = "2GiB";
  flags.checkpoint_roots = {"/a", "/b"};
  ASSERT_OK_AND_ASSIGN(DaemonOptions options,
                       ResolveDaemonOptions(flags, Env()));
  EXPECT_EQ(options.memory_limit, int64_t{2} << 30);
  EXPECT_THAT(options.checkpoint_roots, ::testing::ElementsAre("/a", "/b"));
  flags.memory_limit = "0";
  EXPECT_THAT(ResolveDaemonOptions(flags, Env()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--memory-limit must be positive")));
  flags.memory_limit = std::nullopt;
  flags.checkpoint_roots = {""};
  EXPECT_THAT(ResolveDaemonOptions(flags, Env()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--checkpoint-root")));
}

}  // namespace
}  // namespace tessera::daemon
