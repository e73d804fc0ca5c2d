// `tessera save PATH [NAME...]`: saves tensors (default: all of them) into
// a checkpoint directory that every daemon writes its own shards into.
//
//   tessera save /shared/ckpt [w x ...]
//
// A relative PATH is made absolute against the current directory, since
// the daemons run elsewhere; it must name a place every daemon can write
// (one host, or a shared filesystem). Exit codes (command.h): 0 ok; 1 when
// a tensor does not exist, the directory cannot be written or the cluster
// cannot be reached; 2 for a usage error.
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
};

void AddSaveCommand(CLI::App& app, CommandContext& context);

int RunSave(const SaveOptions& options, const CommandContext& context);

// `path` made absolute against the current directory (unchanged when it
// already is). Shared with `tessera load`.
absl::StatusOr<std::string> AbsoluteCheckpointPath(const std::string& path);

}  // namespace tessera::cli

#endif  // TESSERA_CLIENT_CLI_SAVE_COMMAND_H_
