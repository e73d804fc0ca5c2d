#include "wire/credentials.h"

#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "io/file.h"
#include "wire/openssl_init.h"

namespace tessera {
namespace {

absl::Mutex tls_process_mu(absl::kConstInit);
// Never destroyed: channels may be made during static destruction.
std::optional<TlsConfig>& ProcessConfig() {
  static auto* config = new std::optional<TlsConfig>();
  return *config;
}

// OK when `path` can be read and holds a PEM block whose label contains
// `label` ("CERTIFICATE", "PRIVATE KEY").
absl::Status CheckPem(const std::string& path, const std::string& name,
                      absl::string_view label) {
  absl::StatusOr<std::string> contents = ReadFileToString(path);
  if (!contents.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": ", contents.status().message()));
  }
  const size_t begin = contents->find("-----BEGIN ");
  if (begin == std::string::npos ||
      contents->find(std::string(label), begin) == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": ", path, " holds no PEM ", absl::AsciiStrToLower(label)));
  }
  return absl::OkStatus();
}

std::string Getenv(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

std::shared_ptr<grpc::experimental::CertificateProviderInterface> Provider(
    const TlsConfig& config) {
  InitOpenssl();  // before gRPC first uses it
  return std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      config.key_file, config.cert_file, config.ca_file,
      static_cast<unsigned int>(std::max(config.refresh_seconds, 1)));
}

}  // namespace

absl::Status ValidateTlsConfig(const TlsConfig& config, bool server,
                               const std::string& cert_name,
                               const std::string& key_name,
                               const std::string& ca_name) {
  if (!config.enabled()) return absl::OkStatus();
  if (config.cert_file.empty() != config.key_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        cert_name, " and ", key_name, " go together: give both or neither"));
  }
  if (server && config.cert_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a TLS server needs ", cert_name, " and ", key_name, " (",
                     ca_name, " alone configures clients)"));
  }
  if (!server && config.ca_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a TLS client needs ", ca_name, " to verify the server with"));
  }
  if (!config.cert_file.empty()) {
    if (absl::Status s = CheckPem(config.cert_file, cert_name, "CERTIFICATE");
        !s.ok()) {
      return s;
    }
    if (absl::Status s = CheckPem(config.key_file, key_name, "PRIVATE KEY");
        !s.ok()) {
      return s;
    }
  }
  if (!config.ca_file.empty()) {
    return CheckPem(config.ca_file, ca_name, "CERTIFICATE");
  }
  return absl::OkStatus();
}

TlsConfig TlsConfigFromEnvironment() {
  TlsConfig config;
  config.ca_file = Getenv("TESSERA_TLS_CA");
  config.cert_file = Getenv("TESSERA_TLS_CERT");
  config.key_file = Getenv("TESSERA_TLS_KEY");
  return config;
}

void SetProcessTls(TlsConfig config) {
  absl::MutexLock lock(&tls_process_mu);
  ProcessConfig() = std::move(config);
}

TlsConfig ProcessTls() {
  absl::MutexLock lock(&tls_process_mu);
  if (!ProcessConfig().has_value()) {
    ProcessConfig() = TlsConfigFromEnvironment();
  }
  return *ProcessConfig();
}

std::shared_ptr<grpc::ServerCredentials> ServerCredentialsFor(
    const TlsConfig& config) {
  if (!config.enabled()) return grpc::InsecureServerCredentials();
  grpc::experimental::TlsServerCredentialsOptions options(Provider(config));
  options.watch_identity_key_cert_pairs();
  if (!config.ca_file.empty()) {
    options.watch_root_certs();
    options.set_cert_request_type(
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  return grpc::experimental::TlsServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentialsFor(
    const TlsConfig& config) {
  if (!config.enabled()) return grpc::InsecureChannelCredentials();
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(Provider(config));
  options.watch_root_certs();
  if (!config.cert_file.empty()) options.watch_identity_key_cert_pairs();
  options.set_verify_server_certs(true);
  return grpc::experimental::TlsCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> ProcessChannelCredentials() {
  return ChannelCredentialsFor(ProcessTls());
}

}  // namespace tessera
