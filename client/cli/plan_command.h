// `tessera plan`: shows how a sharding spec splits a tensor (offsets, sizes,
// placement and bytes of every shard) without contacting any server.
//
//   tessera plan --size 10,20
//       --spec 'chunk:dim=0:rank:0/cpu,rank:1/cpu,rank:2/cpu,rank:3/cpu'
//   tessera plan --size 10,10 --spec-file spec.json --json
//
// The spec grammars (text for --spec, JSON for --spec-file) are those of
// common/sharding_spec_text.h. Output on stdout: a table, or with --json
// the ShardsToJson array only (which --spec-file accepts back). Exit codes
// (command.h): 0 ok; 2 for a usage error or a bad size, spec or dtype; 1
// when the spec file cannot be read.
#ifndef TESSERA_CLIENT_CLI_PLAN_COMMAND_H_
#define TESSERA_CLIENT_CLI_PLAN_COMMAND_H_

#include <string>

#include "CLI/CLI.hpp"
#include "client/cli/command.h"
#include "common/sharded_tensor_metadata.h"
#include "common/sharding_spec.h"

namespace tessera::cli {

// The flags of `tessera plan`, unparsed.
struct PlanOptions {
  std::string size;       // "10,20"
  std::string spec;       // text form; exclusive with spec_file
  std::string spec_file;  // path of a JSON spec
  std::string dtype = "float32";
  bool json = false;
};

// Registers the `plan` subcommand.
void AddPlanCommand(CLI::App& app, CommandContext& context);

// Runs `tessera plan` with parsed flags; returns the exit code.
// The shards `spec` cuts a tensor of `sizes` and `dtype` into (plan's
// table, create's check before any daemon is contacted).
absl::StatusOr<ShardedTensorMetadata> PlanTensor(
    const ShardingSpec& spec, absl::Span<const int64_t> sizes, DType dtype);

int RunPlan(const PlanOptions& options, const CommandContext& context);

// The human-readable table: a title line, one aligned row per shard, and a
// summary of totals and per-rank balance. Each line ends in '\n'.
std::string FormatPlanTable(const ShardedTensorMetadata& metadata,
                            const ShardingSpec& spec);

}  // namespace tessera::cli

#endif  // TESSERA_CLIENT_CLI_PLAN_COMMAND_H_
