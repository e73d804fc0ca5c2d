#include "client/cli/ls_command.h"

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cli/table.h"
#include "nlohmann/json.hpp"
#include "wire/replicas.h"

namespace tessera::cli {
namespace {

constexpr absl::string_view kLsCommand = "ls";

// "ok", or "degraded: shards [2] lost" (their owner restarted).
std::string StateOf(const ShardedTensorView& view) {
  if (!view.degraded()) return "ok";
  return absl::StrCat("degraded: shards [",
                      absl::StrJoin(view.info().lost_shards(), ", "), "] lost");
}

}  // namespace

std::string FormatTensorTable(absl::Span<const ShardedTensorView> views) {
  if (views.empty()) return "no tensors\n";
  std::vector<std::vector<std::string>> rows = {
      {"NAME", "DTYPE", "SIZES", "SHARDS", "TENSOR ID", "STATE"}};
  for (const ShardedTensorView& view : views) {
    rows.push_back({view.name(), std::string(DTypeName(view.dtype())),
                    FormatDims(view.sizes()),
                    absl::StrCat(view.metadata().shards_metadata.size()),
                    view.tensor_id(), StateOf(view)});
  }
  return FormatColumns(rows);
}

std::string TensorsToJson(absl::Span<const ShardedTensorView> views) {
  nlohmann::ordered_json json = nlohmann::ordered_json::array();
  for (const ShardedTensorView& view : views) {
    json.push_back({{"name", view.name()},
                    {"dtype", std::string(DTypeName(view.dtype()))},
                    {"sizes", view.sizes()},
                    {"shards", view.metadata().shards_metadata.size()},
                    {"tensor_id", view.tensor_id()},
                    {"state", StateOf(view)},
                    {"lost_shards", view.info().lost_shards()},
                    {"copies", CopiesOf(view.info())}});
  }
  return json.dump();
}

int RunLs(const LsOptions& options, const CommandContext& context) {
  absl::StatusOr<std::shared_ptr<Client>> client =
      ConnectToCluster(options.connection);
  if (!client.ok()) return context.ReportUserError(kLsCommand, client.status());
  absl::StatusOr<std::vector<ShardedTensorView>> views = (*client)->List();
  if (!views.ok()) return context.ReportUserError(kLsCommand, views.status());
  if (options.json) {
    context.out() << TensorsToJson(*views) << "\n";
  } else {
    context.out() << FormatTensorTable(*views);
  }
  context.out().flush();
  return context.out().good() ? kExitOk : kExitFailure;
}

void AddLsCommand(CLI::App& app, CommandContext& context) {
  CLI::App* ls = app.add_subcommand(
      std::string(kLsCommand),
      "List the cluster's tensors: name, dtype, sizes, shards, tensor id");
  auto options = std::make_shared<LsOptions>();
  AddConnectionFlags(app, ls, &options->connection, /*transfers=*/false);
  ls->add_flag("--json", options->json,
               "Print a JSON array instead of a table");
  ls->footer(
      "Examples:\n"
      "  tessera ls\n"
      "  tessera --address 10.0.0.1:29600 ls --json\n\n"
      "Exit status: 0 on success, 1 when the cluster cannot be reached, 2 "
      "for a usage error.");
  RunWhenParsed(ls, context, kLsCommand, options, RunLs);
}

}  // namespace tessera::cli
