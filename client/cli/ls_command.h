// `tessera ls`: the cluster's tensors, one row each (name, dtype, sizes,
// number of shards, tensor id), sorted by name.
//
//   tessera ls [--json] [-a HOST:PORT] [--timeout S]
//
// --json prints an array of {"name", "dtype", "sizes", "shards",
// "tensor_id"} instead. Exit codes (command.h): 0 ok; 1 when the cluster
// cannot be reached; 2 for a usage error.
#ifndef TESSERA_CLIENT_CLI_LS_COMMAND_H_
#define TESSERA_CLIENT_CLI_LS_COMMAND_H_

#include <string>

#include "CLI/CLI.hpp"
#include "absl/types/span.h"
#include "client/cli/command.h"
#include "client/cli/connection.h"
#include "client/client.h"

namespace tessera::cli {

struct LsOptions {
  ConnectionFlags connection;
  bool json = false;
};

void AddLsCommand(CLI::App& app, CommandContext& context);

int RunLs(const LsOptions& options, const CommandContext& context);

// One aligned row per tensor under a header row, or "no tensors\n".
// Shared with `tessera load`.
std::string FormatTensorTable(absl::Span<const ShardedTensorView> views);

// The --json form: an array, on one line.
std::string TensorsToJson(absl::Span<const ShardedTensorView> views);

}  // namespace tessera::cli

#endif  // TESSERA_CLIENT_CLI_LS_COMMAND_H_
