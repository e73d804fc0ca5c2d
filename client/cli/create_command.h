// `tessera create NAME`: creates a named sharded tensor on the cluster and
// prints its shard table (as `tessera describe`).
//
//   tessera create w --size 10,20
//       --spec 'chunk:dim=0:rank:0/cpu,rank:1/cpu,rank:2/cpu,rank:3/cpu'
//       [--dtype float32] [--init empty|zeros|ones|full|rand|randn]
//       [--fill V] [--seed N] [--copies C] [--json]
//
// The size, spec (text form of common/sharding_spec_text.h, as `tessera
// plan`), dtype and init are checked before any daemon is contacted, with
// the reference's wording for a spec that does not fit the size. --fill
// implies --init full. Exit codes (command.h): 0 ok; 1 when the name is
// taken or the cluster cannot be reached; 2 for a usage error or a bad
// size, spec, dtype or init.
#ifndef TESSERA_CLIENT_CLI_CREATE_COMMAND_H_
#define TESSERA_CLIENT_CLI_CREATE_COMMAND_H_

#include <cstdint>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/cli/command.h"
#include "client/cli/connection.h"
#include "client/client.h"

namespace tessera::cli {

struct CreateCommandOptions {
  ConnectionFlags connection;
  std::string name;
  std::string size;
  std::string spec;
  std::string dtype = "float32";
  std::string init;  // empty: "full" with --fill, else "empty"
  double fill = 0;
  bool fill_given = false;
  uint64_t seed = 0;
  int copies = 1;
  int versions = 0;  // 0 or 1: unversioned
  bool json = false;
};

void AddCreateCommand(CLI::App& app, CommandContext& context);

int RunCreate(const CreateCommandOptions& options,
              const CommandContext& context);

// "empty", "zeros", "ones", "full", "rand", "randn"; INVALID_ARGUMENT
// listing them otherwise.
absl::StatusOr<TensorInit> ParseTensorInit(absl::string_view text);

}  // namespace tessera::cli

#endif  // TESSERA_CLIENT_CLI_CREATE_COMMAND_H_
