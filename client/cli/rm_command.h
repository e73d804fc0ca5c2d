// `tessera rm NAME...`: deletes tensors; every daemon frees their shards.
//
//   tessera rm w [x ...] [-f]
//
// Each name is deleted in turn; a failure is reported and the rest are
// still tried. -f ignores names that do not exist. Exit codes (command.h):
// 0 when every name was deleted (or was missing, with -f); 1 when one was
// not, or the cluster cannot be reached; 2 for a usage error.
#ifndef TESSERA_CLIENT_CLI_RM_COMMAND_H_
#define TESSERA_CLIENT_CLI_RM_COMMAND_H_

#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "client/cli/command.h"
#include "client/cli/connection.h"

namespace tessera::cli {

struct RmOptions {
  ConnectionFlags connection;
  std::vector<std::string> names;
  bool force = false;
};

void AddRmCommand(CLI::App& app, CommandContext& context);

int RunRm(const RmOptions& options, const CommandContext& context);

}  // namespace tessera::cli

#endif  // TESSERA_CLIENT_CLI_RM_COMMAND_H_
