// `tessera save PATH [NAME...]`: saves tensors (default: all of them) into
// a checkpoint directory that every daemon writes its own shards into.
//
//   tessera save [--overwrite] step100 [w x ...]
//   tessera save --version 7 step100 w        # a kept older version of w
//   tessera save --version w=7 --version b=3 step100 w b
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

#include <cstdint>
#include <map>
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
  // --version: "N" (one tensor named) or "NAME=N" per versioned tensor.
  std::vector<std::string> versions;
};

// The versions map of `tessera save --version ...` for the tensors
// `names`: INVALID_ARGUMENT for a malformed entry, a bare N with other
// than one tensor named, or a name given twice or not among `names`.
absl::StatusOr<std::map<std::string, int64_t>> ParseSaveVersions(
    const std::vector<std::string>& versions,
    const std::vector<std::string>& names);

void AddSaveCommand(CLI::App& app, CommandContext& context);

int RunSave(const SaveOptions& options, const CommandContext& context);

// INVALID_ARGUMENT for an empty path. Shared with `tessera load`.
absl::Status CheckCheckpointPath(const std::string& path);

}  // namespace tessera::cli

#endif  // TESSERA_CLIENT_CLI_SAVE_COMMAND_H_
