// The launch's local etcd (client/cli/launch/local_etcd.h): finding the
// executable, and a real member (skipped without Debian's etcd-server).
#include "client/cli/launch/local_etcd.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "wire/credentials.h"

namespace tessera::cli {
namespace {

using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

// The local etcd's executable: PATH first, then the fallbacks; none names
// the package to install.
TEST(LocalEtcdTest, FindEtcdBinaryLooksOnPathThenFallbacks) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string root =
      absl::StrCat(base != nullptr ? base : "/tmp", "/tessera_etcd_XXXXXX");
  ASSERT_NE(mkdtemp(root.data()), nullptr);
  auto make = [&](const std::string& relative, mode_t mode) {
    const std::string path = absl::StrCat(root, "/", relative);
    std::filesystem::create_directories(
        std::filesystem::path(path).parent_path());
    std::ofstream(path) << "#!/bin/sh\n";
    chmod(path.c_str(), mode);
    return path;
  };
  make("plain/etcd", 0644);  // not executable: skipped
  const std::string on_path = make("bin/etcd", 0755);
  const std::string fallback = make("usr/bin/etcd", 0755);
  const std::string path_env =
      absl::StrCat(root, "/none:", root, "/plain:", root, "/bin");
  ASSERT_OK_AND_ASSIGN(std::string found, FindEtcdBinary(path_env, {fallback}));
  EXPECT_EQ(found, on_path);
  ASSERT_OK_AND_ASSIGN(
      found, FindEtcdBinary(absl::StrCat(root, "/plain"), {fallback}));
  EXPECT_EQ(found, fallback);
  EXPECT_THAT(FindEtcdBinary("", {absl::StrCat(root, "/plain/etcd")}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("etcd-server")));
  std::filesystem::remove_all(root);
}

// A real local etcd (skipped without etcd-server): it serves a client with
// the certificate it gives the daemons, refuses one with only its CA (as
// another user of the host would be), keeps its files in a 0700
// directory, and stops on SIGTERM.
TEST(LocalEtcdTest, ServesOnlyClientsWithItsCertificate) {
  const char* path = std::getenv("PATH");
  absl::StatusOr<std::string> binary = FindEtcdBinary(path ? path : "");
  if (!binary.ok()) GTEST_SKIP() << binary.status();
  const char* base = std::getenv("TEST_TMPDIR");
  std::string root =
      absl::StrCat(base != nullptr ? base : "/tmp", "/tessera_etcd_XXXXXX");
  ASSERT_NE(mkdtemp(root.data()), nullptr);
  LocalEtcdOptions options;
  options.etcd = *binary;
  options.dir = absl::StrCat(root, "/etcd");
  options.start_timeout = absl::Seconds(30);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<LocalEtcd> etcd,
                       LocalEtcd::Start(options));
  struct stat info;
  ASSERT_EQ(::stat(options.dir.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0700);

  const std::vector<std::string> flags = etcd->DaemonFlags();
  ASSERT_EQ(flags.size(), 8u);
  EXPECT_EQ(flags[0], "--store");
  EXPECT_EQ(flags[1], absl::StrCat("etcd://", etcd->endpoint(), "/tessera/"));
  EXPECT_EQ(flags[2], "--store-tls-ca");
  TlsConfig tls;
  tls.ca_file = flags[3];
  tls.cert_file = flags[5];
  tls.key_file = flags[7];
  auto check = [&](const TlsConfig& config) {
    auto channel =
        grpc::CreateChannel(etcd->endpoint(), ChannelCredentialsFor(config));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    grpc::health::v1::HealthCheckResponse response;
    return grpc::health::v1::Health::NewStub(channel)->Check(
        &context, grpc::health::v1::HealthCheckRequest(), &response);
  };
  EXPECT_TRUE(check(tls).ok());
  TlsConfig ca_only;
  ca_only.ca_file = tls.ca_file;
  EXPECT_FALSE(check(ca_only).ok());

  const pid_t pid = etcd->pid();
  EXPECT_FALSE(etcd->Exited().has_value());
  EXPECT_TRUE(etcd->Stop(absl::Seconds(10)));
  EXPECT_NE(::kill(pid, 0), 0);
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace tessera::cli
