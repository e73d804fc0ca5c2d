// Transport security of every gRPC surface (ControlService, ShardService,
// StoreService, health, reflection): TLS, and mutual TLS when a CA is
// given, with certificates reloaded from their files when they change
// (gRPC's FileWatcherCertificateProvider: rotate by writing the new files,
// or by swapping a directory or symlink, see its header).
//
//   server: cert + key             TLS; clients need only the CA
//           cert + key + ca        mutual TLS: a client certificate signed
//                                  by the CA is required and verified
//   client: ca                     verifies the server (and its name: the
//                                  certificate's SANs must hold the host
//                                  dialled, e.g. IP:127.0.0.1 or the DNS
//                                  name)
//           ca + cert + key        also presents its own certificate
//   none                           plaintext (insecure)
//
// Daemons take --tls-cert, --tls-key, --tls-ca (and present the same
// certificate when they dial each other and the store); clients (library,
// CLI) take TESSERA_TLS_CA, TESSERA_TLS_CERT and TESSERA_TLS_KEY from the
// environment unless the process set a configuration (SetProcessTls: the
// CLI's --tls-ca, --tls-cert, --tls-key, Python's tessera.connect).
//
// Who may call what is wire/auth.h (tokens and roles); the raw data plane
// is not served with TLS on, and the local path checks the peer's uid:
// docs/security.md.
//
// Thread-safety: every function may be called from any thread;
// SetProcessTls should run before the first channel is made.
#ifndef TESSERA_WIRE_CREDENTIALS_H_
#define TESSERA_WIRE_CREDENTIALS_H_

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tessera {

struct TlsConfig {
  std::string cert_file;  // PEM certificate chain of this side
  std::string key_file;   // its PEM private key
  std::string ca_file;    // PEM root certificates to verify the peer with
  // How often the files are checked for changes.
  int refresh_seconds = 60;

  bool enabled() const {
    return !cert_file.empty() || !key_file.empty() || !ca_file.empty();
  }
};

// INVALID_ARGUMENT naming the flag or variable (`cert_name` etc.) unless
// the combination is one of the table above and every file named can be
// read and holds PEM data of the right kind.
absl::Status ValidateTlsConfig(const TlsConfig& config, bool server,
                               const std::string& cert_name = "--tls-cert",
                               const std::string& key_name = "--tls-key",
                               const std::string& ca_name = "--tls-ca");

// TESSERA_TLS_CA, TESSERA_TLS_CERT, TESSERA_TLS_KEY.
TlsConfig TlsConfigFromEnvironment();

// The configuration channels of this process use: the one set by
// SetProcessTls, else TlsConfigFromEnvironment() (read once).
void SetProcessTls(TlsConfig config);
TlsConfig ProcessTls();

// Credentials for `config` (assumed valid): TLS when enabled, else
// insecure.
std::shared_ptr<grpc::ServerCredentials> ServerCredentialsFor(
    const TlsConfig& config);
std::shared_ptr<grpc::ChannelCredentials> ChannelCredentialsFor(
    const TlsConfig& config);
// ChannelCredentialsFor(ProcessTls()): what every Tessera channel uses.
std::shared_ptr<grpc::ChannelCredentials> ProcessChannelCredentials();

}  // namespace tessera

#endif  // TESSERA_WIRE_CREDENTIALS_H_
