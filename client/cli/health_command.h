// `tessera health`: asks every daemon of the cluster for its
// grpc.health.v1 status and prints one line per daemon:
//
//   127.0.0.1:29600  rank 0  SERVING
//   127.0.0.1:29601  rank 1  NOT_SERVING  (draining)
//   127.0.0.1:29602  rank 2  UNAVAILABLE  (connection refused)
//
// The daemons are learned from the one at --address; when that one cannot
// be reached the command fails at once with one error line. Deadline: 5 s
// per call unless --timeout. Exit codes (command.h): 0 when every daemon
// serves; 1 when one does not or the cluster cannot be reached; 2 for a
// usage error.
#ifndef TESSERA_CLIENT_CLI_HEALTH_COMMAND_H_
#define TESSERA_CLIENT_CLI_HEALTH_COMMAND_H_

#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "client/cli/command.h"
#include "client/cli/connection.h"

namespace tessera::cli {

struct HealthOptions {
  ConnectionFlags connection;
};

void AddHealthCommand(CLI::App& app, CommandContext& context);

int RunHealth(const HealthOptions& options, const CommandContext& context);

// "SERVING" for OK; "NOT_SERVING" when the daemon answered but does not
// serve (the status message says NOT_SERVING, as Client::Health words it);
// "UNAVAILABLE" otherwise (no answer).
absl::string_view HealthState(const absl::Status& status);

}  // namespace tessera::cli

#endif  // TESSERA_CLIENT_CLI_HEALTH_COMMAND_H_
