// What the subcommands that talk to a cluster share: the daemon address
// and deadline flags, connecting, and transfer options with a progress bar.
//
// The address is, in order of precedence: the subcommand's -a/--address,
// the global `tessera --address HOST:PORT <command>`, $TESSERA_ADDRESS, and
// 127.0.0.1:29600 (the first daemon `tessera launch` starts). Any daemon of
// a cluster will do: the client learns the others from it.
//
// Not thread-safe: one ConnectionFlags per invocation.
#ifndef TESSERA_CLIENT_CLI_CONNECTION_H_
#define TESSERA_CLIENT_CLI_CONNECTION_H_

#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/cli/progress_bar.h"
#include "client/client.h"

namespace tessera::cli {

inline constexpr char kDefaultAddress[] = "127.0.0.1:29600";
inline constexpr char kAddressEnv[] = "TESSERA_ADDRESS";

// The flags of a subcommand that talks to a cluster, unparsed.
struct ConnectionFlags {
  std::string address;          // -a/--address; empty: not given
  double timeout_seconds = 0;   // --timeout; 0: the command's default
  double default_timeout = 60;  // seconds, per command
  bool no_progress = false;     // --no-progress (transfer commands)
  // --request-id: the id the control calls carry (ClientOptions::request_id).
  std::string request_id;
  // The root app's --address; owned by the app, valid while it runs the
  // action.
  const CLI::Option* global_address = nullptr;
};

// Adds -a/--address and --timeout to `command` (and --no-progress when
// `transfers`), and the global --address to `app` unless an earlier
// command did. `flags` must outlive the parse and the action.
void AddConnectionFlags(CLI::App& app, CLI::App* command,
                        ConnectionFlags* flags, bool transfers);

// The address to dial (see the precedence above).
std::string ResolveAddress(const ConnectionFlags& flags);

// The deadline of each call: --timeout, or the command's default.
absl::Duration Timeout(const ConnectionFlags& flags);

// Client::Connect with the resolved address and deadline. The error names
// the address and, when nothing answered, how to choose another.
absl::StatusOr<std::shared_ptr<Client>> ConnectToCluster(
    const ConnectionFlags& flags);

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
