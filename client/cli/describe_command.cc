#include "client/cli/describe_command.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cli/table.h"
#include "common/proto_convert.h"
#include "nlohmann/json.hpp"
#include "wire/replicas.h"

namespace tessera::cli {
namespace {

constexpr absl::string_view kDescribeCommand = "describe";

std::string AddressOf(const v1::ClusterInfo& cluster, int rank) {
  for (const v1::WorkerAddress& worker : cluster.workers()) {
    if (worker.rank() == rank) return worker.address();
  }
  return "?";
}

std::string PlacementOf(const ShardMetadata& shard) {
  return shard.placement().has_value() ? shard.placement()->ToString() : "-";
}

// Whether shard i's bytes were lost (its owner restarted).
bool ShardLost(const ShardedTensorView& view, size_t i) {
  const auto& lost = view.info().lost_shards();
  return std::find(lost.begin(), lost.end(), static_cast<int>(i)) != lost.end();
}

// The ranks holding a copy of shard i besides its owner.
std::vector<int> ReplicasOf(const ShardedTensorView& view, size_t i) {
  std::vector<int> holders = HoldersOf(view.info(), static_cast<int>(i));
  if (!holders.empty()) holders.erase(holders.begin());
  return holders;
}

// `refilling`, or the view's own marks when it is empty.
Refilling RefillingOr(const ShardedTensorView& view,
                      const Refilling& refilling) {
  if (!refilling.empty()) return refilling;
  Refilling marks(view.metadata().shards_metadata.size());
  for (int i = 0;
       i < view.info().replicas_size() && i < static_cast<int>(marks.size());
       ++i) {
    const auto& ranks = view.info().replicas(i).refilling();
    marks[i].insert(ranks.begin(), ranks.end());
  }
  return marks;
}

// "ok", "lost" or "refilling" for holder `rank` of shard i.
std::string HolderState(const ShardedTensorView& view, const Refilling& marks,
                        size_t i, int rank) {
  if (ShardLost(view, i)) return "lost";
  return i < marks.size() && marks[i].count(rank) > 0 ? "refilling" : "ok";
}

}  // namespace

int64_t BytesPerVersion(const v1::TensorInfo& info) {
  absl::StatusOr<ShardedTensorMetadata> metadata = FromProto(info.metadata());
  if (!metadata.ok()) return 0;
  const std::optional<int64_t> numel = CheckedProduct(metadata->size);
  const int64_t element =
      static_cast<int64_t>(ElementSize(metadata->tensor_properties.dtype));
  const int64_t copies = CopiesOf(info);
  if (element <= 0 || copies <= 0) return 0;
  if (!numel.has_value() ||
      *numel > std::numeric_limits<int64_t>::max() / element / copies) {
    return std::numeric_limits<int64_t>::max();
  }
  return *numel * element * copies;
}

int64_t VersionsHeld(const v1::TensorInfo& info) {
  return info.kept_versions_size() + info.open_versions_size();
}

std::string FormatVersions(const v1::TensorInfo& info) {
  const auto list = [](const auto& numbers) {
    return numbers.empty() ? std::string("none") : absl::StrJoin(numbers, ", ");
  };
  const int64_t per_version = BytesPerVersion(info);
  const int64_t held = VersionsHeld(info);
  return absl::StrCat(
      "Versions: latest ", info.version(), ", kept ",
      list(info.kept_versions()), " (keeps ", info.versions_kept(),
      "), pinned ", list(info.pinned_versions()), ", open ",
      list(info.open_versions()), "; ", FormatBytes(per_version),
      " per version", CopiesOf(info) > 1 ? " (all copies)" : "", ", ",
      FormatBytes(held > 0 && per_version >
                                  std::numeric_limits<int64_t>::max() / held
                      ? std::numeric_limits<int64_t>::max()
                      : per_version * held),
      " held by ", held, held == 1 ? " version" : " versions", "\n");
}

std::string FormatShardTable(const ShardedTensorView& view,
                             const v1::ClusterInfo& cluster,
                             const Refilling& refilling) {
  const Refilling marks = RefillingOr(view, refilling);
  const ShardedTensorMetadata& metadata = view.metadata();
  const size_t count = metadata.shards_metadata.size();
  std::string text = absl::StrCat(
      "Tensor ", view.name(), ": ", DescribeArray(view.dtype(), view.sizes()),
      " in ", count, count == 1 ? " shard" : " shards", ", id ",
      view.tensor_id(),
      CopiesOf(view.info()) > 1
          ? absl::StrCat(", ", CopiesOf(view.info()), " copies of each")
          : "",
      "\n", view.versioned() ? FormatVersions(view.info()) : "");
  std::vector<std::vector<std::string>> rows = {{"SHARD", "OFFSETS", "SIZES",
                                                 "PLACEMENT", "RANK", "ADDRESS",
                                                 "STATE", "REPLICAS"}};
  for (size_t i = 0; i < count; ++i) {
    const ShardMetadata& shard = metadata.shards_metadata[i];
    const int rank = view.owner_rank(i);
    rows.push_back({absl::StrCat(i), FormatDims(shard.shard_offsets()),
                    FormatDims(shard.shard_sizes()), PlacementOf(shard),
                    absl::StrCat(rank), AddressOf(cluster, rank),
                    HolderState(view, marks, i, rank)});
    std::vector<std::string> replicas;
    for (const int holder : ReplicasOf(view, i)) {
      replicas.push_back(absl::StrCat("rank ", holder, " (",
                                      AddressOf(cluster, holder), ") ",
                                      HolderState(view, marks, i, holder)));
    }
    rows.back().push_back(replicas.empty() ? "-"
                                           : absl::StrJoin(replicas, ", "));
  }
  absl::StrAppend(&text, FormatColumns(rows));
  return text;
}

std::string ShardTableToJson(const ShardedTensorView& view,
                             const v1::ClusterInfo& cluster,
                             const Refilling& refilling) {
  const Refilling marks = RefillingOr(view, refilling);
  nlohmann::ordered_json shards = nlohmann::ordered_json::array();
  const ShardedTensorMetadata& metadata = view.metadata();
  for (size_t i = 0; i < metadata.shards_metadata.size(); ++i) {
    const ShardMetadata& shard = metadata.shards_metadata[i];
    const int rank = view.owner_rank(i);
    nlohmann::ordered_json replicas = nlohmann::ordered_json::array();
    for (const int holder : ReplicasOf(view, i)) {
      replicas.push_back({{"rank", holder},
                          {"address", AddressOf(cluster, holder)},
                          {"state", HolderState(view, marks, i, holder)}});
    }
    nlohmann::ordered_json placement = nullptr;
    if (shard.placement().has_value()) {
      placement = shard.placement()->ToString();
    }
    shards.push_back({{"index", i},
                      {"offsets", shard.shard_offsets()},
                      {"sizes", shard.shard_sizes()},
                      {"placement", placement},
                      {"rank", rank},
                      {"address", AddressOf(cluster, rank)},
                      {"state", HolderState(view, marks, i, rank)},
                      {"replicas", replicas}});
  }
  nlohmann::ordered_json json = {
      {"name", view.name()},
      {"tensor_id", view.tensor_id()},
      {"dtype", std::string(DTypeName(view.dtype()))},
      {"sizes", view.sizes()},
      {"shards", shards}};
  if (view.versioned()) {
    const v1::TensorInfo& info = view.info();
    json["versions"] = {{"latest", info.version()},
                        {"keeps", info.versions_kept()},
                        {"kept", info.kept_versions()},
                        {"pinned", info.pinned_versions()},
                        {"open", info.open_versions()},
                        {"bytes_per_version", BytesPerVersion(info)}};
  }
  return json.dump();
}

int PrintShardTable(const ShardedTensorView& view,
                    const v1::ClusterInfo& cluster, bool json,
                    const CommandContext& context, const Refilling& refilling) {
  if (json) {
    context.out() << ShardTableToJson(view, cluster, refilling) << "\n";
  } else {
    context.out() << FormatShardTable(view, cluster, refilling);
  }
  context.out().flush();
  return context.out().good() ? kExitOk : kExitFailure;
}

int RunDescribe(const DescribeOptions& options, const CommandContext& context) {
  absl::StatusOr<std::shared_ptr<Client>> client =
      ConnectToCluster(options.connection);
  if (!client.ok())
    return context.ReportUserError(kDescribeCommand, client.status());
  absl::StatusOr<ShardedTensorView> view = (*client)->Open(options.name);
  if (!view.ok())
    return context.ReportUserError(kDescribeCommand, view.status());
  // Each daemon reports its own refills: with replicas, every daemon is
  // asked (one that does not answer reports nothing).
  Refilling refilling;
  if (view->info().replicas_size() > 0) {
    refilling.resize(view->metadata().shards_metadata.size());
    for (const v1::WorkerAddress& worker : (*client)->cluster().workers()) {
      ConnectionFlags there = options.connection;
      there.address = worker.address();
      absl::StatusOr<std::shared_ptr<Client>> other = ConnectToCluster(there);
      if (!other.ok()) continue;
      absl::StatusOr<ShardedTensorView> seen = (*other)->Open(options.name);
      if (!seen.ok() || seen->tensor_id() != view->tensor_id()) continue;
      for (int i = 0; i < seen->info().replicas_size() &&
                      i < static_cast<int>(refilling.size());
           ++i) {
        const auto& ranks = seen->info().replicas(i).refilling();
        refilling[i].insert(ranks.begin(), ranks.end());
      }
    }
  }
  return PrintShardTable(*view, (*client)->cluster(), options.json, context,
                         refilling);
}

void AddDescribeCommand(CLI::App& app, CommandContext& context) {
  CLI::App* describe = app.add_subcommand(
      std::string(kDescribeCommand),
      "Show a tensor's shards: offsets, sizes, placement, owner and its "
      "address");
  auto options = std::make_shared<DescribeOptions>();
  describe->add_option("name", options->name, "The tensor's name")
      ->required()
      ->type_name("NAME");
  AddConnectionFlags(app, describe, &options->connection, /*transfers=*/false);
  describe->add_flag("--json", options->json,
                     "Print a JSON object instead of a table");
  describe->footer(
      "Examples:\n"
      "  tessera describe w\n"
      "  tessera describe w --json\n\n"
      "Exit status: 0 on success, 1 when the tensor does not exist or the "
      "cluster cannot be reached, 2 for a usage error.");
  RunWhenParsed(describe, context, kDescribeCommand, options, RunDescribe);
}

}  // namespace tessera::cli
