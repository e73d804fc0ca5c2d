// What the subcommands that talk to a cluster share: the daemon address
// and deadline flags, connecting, and transfer options with a progress bar.
//
// The address is, in order of precedence: the subcommand's -a/--address,
// the global `tessera --address HOST:PORT <command>`, $TESSERA_ADDRESS, and
// 127.0.0.1:29600 (the first daemon `tessera launch` starts). Any daemon of
// a cluster will do: the client learns the others from it.
//
// Credentials: --tls-ca, --tls-cert, --tls-key and --token-file, given
// after the command or before it (`tessera --tls-ca F ls`; after wins),
// each winning over its variable ($TESSERA_TLS_CA, $TESSERA_TLS_CERT,
// $TESSERA_TLS_KEY; --token-file over both $TESSERA_TOKEN and
// $TESSERA_TOKEN_FILE). Without a token from either, the per-user token
// goes to daemons on loopback (wire/auth.h ProcessTokenFor). They become
// the process's (wire/credentials.h SetProcessTls, wire/auth.h
// SetProcessToken) when the command connects.
//
// Not thread-safe: one ConnectionFlags per invocation.
#ifndef TESSERA_CLIENT_CLI_CONNECTION_H_
#define TESSERA_CLIENT_CLI_CONNECTION_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/cli/progress_bar.h"
#include "client/client.h"
#include "wire/credentials.h"

namespace tessera::cli {

inline constexpr char kDefaultAddress[] = "127.0.0.1:29600";
inline constexpr char kAddressEnv[] = "TESSERA_ADDRESS";
// What the credential flags default to (wire/credentials.h).
inline constexpr char kTlsCaEnv[] = "TESSERA_TLS_CA";
inline constexpr char kTlsCertEnv[] = "TESSERA_TLS_CERT";
inline constexpr char kTlsKeyEnv[] = "TESSERA_TLS_KEY";

// The flags of a subcommand that talks to a cluster, unparsed.
struct ConnectionFlags {
  std::string address;          // -a/--address; empty: not given
  double timeout_seconds = 0;   // --timeout; 0: the command's default
  double default_timeout = 60;  // seconds, per command
  bool no_progress = false;     // --no-progress (transfer commands)
  // --request-id: the id the control calls carry (ClientOptions::request_id).
  std::string request_id;
  // --tls-ca, --tls-cert, --tls-key, --token-file; empty: not given.
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  std::string token_file;
  // The root app's --address and credential flags (given before the
  // command); owned by the app, valid while it runs the action.
  const CLI::Option* global_address = nullptr;
  const CLI::Option* global_tls_ca = nullptr;
  const CLI::Option* global_tls_cert = nullptr;
  const CLI::Option* global_tls_key = nullptr;
  const CLI::Option* global_token_file = nullptr;
};

// Adds -a/--address, --timeout, --request-id and the credential flags to
// `command` (and --no-progress when `transfers`), and the global --address
// and credential flags to `app` unless an earlier command did. `flags` must
// outlive the parse and the action.
void AddConnectionFlags(CLI::App& app, CLI::App* command,
                        ConnectionFlags* flags, bool transfers);

// The address to dial (see the precedence above).
std::string ResolveAddress(const ConnectionFlags& flags);

// The deadline of each call: --timeout, or the command's default.
absl::Duration Timeout(const ConnectionFlags& flags);

// What the command presents to the daemons.
struct ClientCredentials {
  TlsConfig tls;  // each file from its flag, else its variable
  // --token-file's token; nullopt: the process's own choice (wire/auth.h).
  std::optional<std::string> token;
};

// The credentials of the flags and the environment (see the precedence
// above). INVALID_ARGUMENT naming the flag or variable at fault: a TLS
// combination wire/credentials.h does not allow, a file that cannot be
// read or holds no PEM data, a --token-file that cannot be read or holds
// no token.
absl::StatusOr<ClientCredentials> ResolveCredentials(
    const ConnectionFlags& flags);

// Client::Connect with the resolved address, deadline and credentials.
// INVALID_ARGUMENT as ResolveCredentials (and for an unreadable
// $TESSERA_TOKEN_FILE) before anything is dialled; otherwise the error
// names the address and, when nothing answered or the token was refused,
// what to change. `options` gives the rest (transports, lanes); its timeout
// and request id are the flags'.
absl::StatusOr<std::shared_ptr<Client>> ConnectToCluster(
    const ConnectionFlags& flags, ClientOptions options = {});

// ConnectToCluster, then Client::Open(name): the view of one tensor (it
// keeps the connection alive).
absl::StatusOr<ShardedTensorView> OpenTensor(const ConnectionFlags& flags,
                                             const std::string& name);

// TransferOptions with the deadline and, when stderr is a terminal and
// --no-progress is not set, `bar`'s callback. `bar` must outlive the
// transfer.
TransferOptions MakeTransferOptions(const ConnectionFlags& flags,
                                    ProgressBar* bar);

// Whether progress bars should be drawn on `err`: it is std::cerr and
// stderr is a terminal.
bool ProgressWanted(const ConnectionFlags& flags, const std::ostream& err);

// Splits a comma-separated list of names ("a,b"); empty pieces are
// INVALID_ARGUMENT naming `flag`.
absl::StatusOr<std::vector<std::string>> ParseNameList(absl::string_view text,
                                                       absl::string_view flag);

}  // namespace tessera::cli

#endif  // TESSERA_CLIENT_CLI_CONNECTION_H_
