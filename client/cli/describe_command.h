// `tessera describe NAME`: one tensor's shard table: each shard's index,
// offsets, sizes, placement, owning rank and that daemon's address.
//
//   tessera describe w [--json] [-a HOST:PORT] [--timeout S]
//
// --json prints {"name", "tensor_id", "dtype", "sizes", "shards": [{"index",
// "offsets", "sizes", "placement", "rank", "address"}]}. Exit codes
// (command.h): 0 ok; 1 when the tensor does not exist or the cluster cannot
// be reached; 2 for a usage error.
#ifndef TESSERA_CLIENT_CLI_DESCRIBE_COMMAND_H_
#define TESSERA_CLIENT_CLI_DESCRIBE_COMMAND_H_

#include <cstdint>
#include <set>
#include <string>

#include "CLI/CLI.hpp"
#include "client/cli/command.h"
#include "client/cli/connection.h"
#include "client/client.h"
#include "tessera/v1/control.pb.h"

namespace tessera::cli {

struct DescribeOptions {
  ConnectionFlags connection;
  std::string name;
  bool json = false;
};

void AddDescribeCommand(CLI::App& app, CommandContext& context);

int RunDescribe(const DescribeOptions& options, const CommandContext& context);

// Per shard, the ranks holding it (owner or replica) that are refilling
// their copy after a restart (v1::ShardReplicas.refilling), merged from
// every daemon's description; empty: as `view` says.
using Refilling = std::vector<std::set<int>>;

// "Versions: latest 5, kept 3, 4, 5 (keeps 3), pinned 3, open 6; 4.0 MiB
// per version, 16.0 MiB held by 4 versions\n": a versioned tensor's
// versions (docs/versions.md) and the memory they hold in the cluster (a
// version's bytes, times its copies, for each kept and open one), as
// describe and `tessera versions` print them.
std::string FormatVersions(const v1::TensorInfo& info);
// The bytes one version of `info` holds in the cluster: the tensor's,
// times its copies (INT64_MAX when that overflows).
int64_t BytesPerVersion(const v1::TensorInfo& info);

// A title line ("Tensor w: float32 [10, 20], 4 shards, 800 B, id ...") and
// one aligned row per shard: its owner, the owner's state ("ok", "lost",
// "refilling") and its replicas with theirs. Addresses come from `cluster`
// ("?" for a rank it does not list). Shared with `tessera create`.
std::string FormatShardTable(const ShardedTensorView& view,
                             const v1::ClusterInfo& cluster,
                             const Refilling& refilling = {});

// The --json form, on one line.
std::string ShardTableToJson(const ShardedTensorView& view,
                             const v1::ClusterInfo& cluster,
                             const Refilling& refilling = {});

// Prints FormatShardTable, or with `json` ShardTableToJson, to
// context.out(); the exit code (kExitFailure when stdout fails).
int PrintShardTable(const ShardedTensorView& view,
                    const v1::ClusterInfo& cluster, bool json,
                    const CommandContext& context,
                    const Refilling& refilling = {});

}  // namespace tessera::cli

#endif  // TESSERA_CLIENT_CLI_DESCRIBE_COMMAND_H_
