// The throwaway credentials of `tessera launch --secure`: a fresh CA, a
// certificate for the daemons (server and client use: they dial each
// other with it), one for clients, and tokens, made with the `openssl`
// command in a private directory that the launcher removes when it stops.
//
//   ca.pem                 the CA (its key, ca.key, signs the two below)
//   daemon.pem, daemon.key subjectAltName 127.0.0.1, localhost and the
//                          launch's --host when it is a specific address
//   client.pem, client.key a client certificate for mutual TLS
//   tokens                 the daemons' --auth-token-file: an admin token
//                          for clients and the cluster token (mode 0600)
//   client.token           the admin token alone (TESSERA_TOKEN_FILE)
//   env                    `export` lines of the client's variables
//
// Every key and token file is mode 0600 in a 0700 directory. The
// certificates are valid for `valid_days`; nothing here is reused between
// launches, and gRPC's test certificates are never used.
//
// MakeCertificates is the step underneath, shared with the launch's local
// etcd (local_etcd.h), which gets a CA of its own.
//
// Thread-compatible. Runs `openssl` (from PATH) as a child process.
#ifndef TESSERA_CLIENT_CLI_LAUNCH_SECURE_SETUP_H_
#define TESSERA_CLIENT_CLI_LAUNCH_SECURE_SETUP_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace tessera::cli {

struct SecureSetup {
  std::string dir;
  std::string ca, daemon_cert, daemon_key, client_cert, client_key;
  std::string token_file, client_token_file, env_file;

  // --tls-cert, --tls-key, --tls-ca, --auth-token-file for a daemon.
  std::vector<std::string> DaemonFlags() const;
  // TESSERA_TLS_CA, TESSERA_TLS_CERT, TESSERA_TLS_KEY, TESSERA_TOKEN_FILE.
  std::vector<std::pair<std::string, std::string>> ClientEnvironment() const;
};

// One certificate that MakeCertificates signs: <name>.pem, <name>.key.
struct CertificateRequest {
  std::string name;
  std::string usage;  // extendedKeyUsage, e.g. "serverAuth,clientAuth"
  // subjectAltName entries ("IP:127.0.0.1", "DNS:localhost"); none: no SAN.
  std::vector<std::string> alt_names;
};

// A fresh CA in `dir` (an existing private directory): ca.pem, its key
// ca.key, subject CN=`ca_name`; then each of `leaves`, signed by it. Every
// key is mode 0600; openssl's output goes to dir/openssl.log. Errors as
// MakeSecureSetup's.
absl::Status MakeCertificates(const std::string& dir,
                              const std::string& ca_name,
                              const std::vector<CertificateRequest>& leaves,
                              int valid_days);

// Makes the files in `dir` (an existing private directory). `host` is the
// launch's --host. INTERNAL naming the step and openssl's last output
// lines when a step fails; FAILED_PRECONDITION when `openssl` cannot be
// run.
absl::StatusOr<SecureSetup> MakeSecureSetup(const std::string& dir,
                                            const std::string& host,
                                            int valid_days = 7);

}  // namespace tessera::cli

#endif  // TESSERA_CLIENT_CLI_LAUNCH_SECURE_SETUP_H_
