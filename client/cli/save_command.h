// `tessera save PATH [NAME...]`: saves tensors (default: all of them) into
// a checkpoint directory that every daemon writes its own shards into.
//
//   tessera save [--overwrite] step100 [w x ...]
//
// PATH is the daemons' to resolve: relative to their first
// --checkpoint-root, or an absolute path inside one (never through ".." or
// a symbolic link); it must name a place every daemon can write (one host,
// or a shared filesystem). Exit codes (command.h): 0 ok; 1 when a tensor
// does not exist, the checkpoint exists (without --overwrite), the path is
// refused or cannot be written, or the cluster cannot be reached; 2 for a
// usage error.
#ifndef TESSERA_CLIENT_CLI_SAVE_COMMAND_H_
#define TESSERA_CLIENT_CLI_SAVE_COMMAND_H_

#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "client/cli/command.h"
#include "client/cli/connection.h"

namespace tessera::cli {

struct SaveOptions {
  ConnectionFlags connection;
  std::string path;
  std::vector<std::string> names;
  bool overwrite = false;
};

void AddSaveCommand(CLI::App& app, CommandContext& context);

int RunSave(const SaveOptions& options, const CommandContext& context);

// INVALID_ARGUMENT for an empty path. Shared with `tessera load`.
absl::Status CheckCheckpointPath(const std::string& path);

}  // namespace tessera::cli

#endif  // TESSERA_CLIENT_CLI_SAVE_COMMAND_H_
