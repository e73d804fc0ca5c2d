// `tessera load PATH`: loads tensors from a checkpoint written by `tessera
// save` (or SaveStateDict), keeping their saved layout or resharding them.
//
//   tessera load /shared/ckpt [--names a,b] [--as x,y] [--replace]
//       [--spec 'chunk:dim=1:rank:0/cpu,rank:1/cpu'] [--versions K] [--json]
//
// --names picks entries (default: all), --as renames them (same count as
// --names), --replace overwrites tensors of the same name, --spec reshards
// every loaded tensor while loading, --versions K loads versioned tensors
// (docs/versions.md) whose version 1 is the checkpoint's values. PATH is
// resolved by the daemons, as for `tessera save`. Prints the loaded tensors as
// `tessera ls` does. Exit codes (command.h): 0 ok; 1 when the checkpoint or an
// entry does not exist, a name is taken or the cluster cannot be reached; 2 for
// a usage error or a bad spec.
#ifndef TESSERA_CLIENT_CLI_LOAD_COMMAND_H_
#define TESSERA_CLIENT_CLI_LOAD_COMMAND_H_

#include <string>

#include "CLI/CLI.hpp"
#include "client/cli/command.h"
#include "client/cli/connection.h"

namespace tessera::cli {

struct LoadOptions {
  ConnectionFlags connection;
  std::string path;
  std::string names;     // comma-separated; empty: all
  std::string as_names;  // comma-separated; empty: saved names
  bool replace = false;
  std::string spec;  // empty: keep the saved layout
  int versions = 1;  // --versions: 2 to 64 loads versioned tensors
  bool json = false;
};

void AddLoadCommand(CLI::App& app, CommandContext& context);

int RunLoad(const LoadOptions& options, const CommandContext& context);

}  // namespace tessera::cli

#endif  // TESSERA_CLIENT_CLI_LOAD_COMMAND_H_
