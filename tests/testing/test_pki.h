// A throwaway PKI for tests of TLS: CAs and certificates they sign, made
// by the `openssl` command in a directory the test owns (never gRPC's test
// certificates), and a fixture around one. Tests skip when `openssl
// version` fails.
#ifndef TESSERA_TESTS_TESTING_TEST_PKI_H_
#define TESSERA_TESTS_TESTING_TEST_PKI_H_

#include <stdlib.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "wire/credentials.h"

namespace tessera::testing {

// Runs a shell command quietly; false when it fails.
inline bool Shell(const std::string& command) {
  return std::system((command + " >/dev/null 2>&1").c_str()) == 0;
}

// A CA and certificates it signs, in `dir`: <name>.pem and <name>.key.
class TestPki {
 public:
  explicit TestPki(std::string dir) : dir_(std::move(dir)) {}

  bool MakeCa(const std::string& name) {
    return Shell(absl::StrCat(
        "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
        "-nodes -days 1 -subj /CN=",
        name, " -keyout ", Path(name, "key"), " -out ", Path(name, "pem")));
  }
  // A certificate for 127.0.0.1, localhost and the names in `more_dns`,
  // signed by `ca`, valid for `days` (negative: it expired that many days
  // ago).
  bool MakeCert(const std::string& name, const std::string& ca, int days = 1,
                const std::vector<std::string>& more_dns = {}) {
    const std::string ext = absl::StrCat(dir_, "/", name, ".ext");
    std::string names = "IP:127.0.0.1,DNS:localhost";
    for (const std::string& dns : more_dns)
      absl::StrAppend(&names, ",DNS:", dns);
    std::ofstream(ext) << "subjectAltName=" << names << "\n";
    return Shell(absl::StrCat(
               "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
               "-nodes -subj /CN=",
               name, " -keyout ", Path(name, "key"), " -out ",
               Path(name, "csr"))) &&
           Shell(absl::StrCat(
               "openssl x509 -req -days ", days, " -in ", Path(name, "csr"),
               " -CA ", Path(ca, "pem"), " -CAkey ", Path(ca, "key"),
               " -CAcreateserial -extfile ", ext, " -out ", Path(name, "pem")));
  }
  std::string Path(const std::string& name, const std::string& kind) const {
    return absl::StrCat(dir_, "/", name, ".", kind);
  }
  // A daemon's: its certificate `cert`, and `ca` to check clients with.
  TlsConfig Server(const std::string& ca, const std::string& cert) const {
    return Client(ca, cert);
  }
  TlsConfig Client(const std::string& ca, const std::string& cert) const {
    TlsConfig config;
    config.ca_file = Path(ca, "pem");
    if (!cert.empty()) {
      config.cert_file = Path(cert, "pem");
      config.key_file = Path(cert, "key");
    }
    return config;
  }

 private:
  std::string dir_;
};

// A fixture whose every test gets a fresh directory with a CA ("ca") and
// a daemon certificate it signed ("daemon"), removed afterwards; skipped
// without the openssl command.
class PkiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!Shell("openssl version")) {
      GTEST_SKIP() << "the openssl command is missing";
    }
    char dir_template[] = "/tmp/tessera-pki-XXXXXX";
    ASSERT_NE(mkdtemp(dir_template), nullptr);
    dir_ = dir_template;
    pki_ = std::make_unique<TestPki>(dir_);
    ASSERT_TRUE(pki_->MakeCa("ca"));
    ASSERT_TRUE(pki_->MakeCert("daemon", "ca"));
  }
  void TearDown() override {
    if (!dir_.empty()) Shell(absl::StrCat("rm -rf ", dir_));
  }

  // --tls-cert, --tls-key and --tls-ca of a daemon serving the "daemon"
  // certificate and trusting `ca_file`.
  std::vector<std::string> DaemonTlsFlags(const std::string& ca_file) const {
    return {"--tls-cert", pki_->Path("daemon", "pem"),
            "--tls-key",  pki_->Path("daemon", "key"),
            "--tls-ca",   ca_file};
  }

  std::string dir_;
  std::unique_ptr<TestPki> pki_;
};

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TESTING_TEST_PKI_H_
