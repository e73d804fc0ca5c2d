#include "client/cli/health_command.h"

#include <memory>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/cli/table.h"
#include "client/client.h"

namespace tessera::cli {
namespace {

constexpr absl::string_view kHealthCommand = "health";
constexpr double kHealthTimeoutSeconds = 5;

}  // namespace

absl::string_view HealthState(const absl::Status& status) {
  if (status.ok()) return "SERVING";
  if (absl::StrContains(status.message(), "NOT_SERVING")) return "NOT_SERVING";
  return "UNAVAILABLE";
}

int RunHealth(const HealthOptions& options, const CommandContext& context) {
  absl::StatusOr<std::shared_ptr<Client>> client =
      ConnectToCluster(options.connection);
  // A bad credential flag is a usage error, an unreachable cluster a
  // failure: as every command.
  if (!client.ok())
    return context.ReportUserError(kHealthCommand, client.status());
  const v1::ClusterInfo& cluster = (*client)->cluster();
  const std::vector<absl::Status> health = (*client)->Health();
  const std::vector<absl::StatusOr<v1::ClusterInfo>> clusters =
      (*client)->Clusters();
  std::vector<std::vector<std::string>> rows;
  bool all_serving = true;
  for (size_t i = 0; i < health.size(); ++i) {
    std::string address = "?";
    std::string rank = absl::StrCat("rank ", i);
    if (i < static_cast<size_t>(cluster.workers_size())) {
      const v1::WorkerAddress& worker = cluster.workers(static_cast<int>(i));
      address = worker.address();
      rank = absl::StrCat("rank ", worker.rank());
    }
    std::vector<std::string> row = {address, rank,
                                    std::string(HealthState(health[i]))};
    // Where its control plane stands: "generation 2" and its state when
    // not plainly serving.
    if (i < clusters.size() && clusters[i].ok()) {
      row.push_back(absl::StrCat("generation ", clusters[i]->generation()));
      if (clusters[i]->state() != "serving" && !clusters[i]->state().empty()) {
        all_serving = false;
        row.push_back(absl::StrCat("(", clusters[i]->state(), ")"));
      }
    }
    if (!health[i].ok()) {
      all_serving = false;
      // Client::Health names the daemon first ("daemon worker1 (rank 1) at
      // HOST:PORT: "); this line already does.
      absl::string_view detail = health[i].message();
      const std::string prefix = absl::StrCat(address, ": ");
      const size_t at = detail.find(prefix);
      if (at != absl::string_view::npos) {
        detail.remove_prefix(at + prefix.size());
      }
      if (detail != HealthState(health[i])) {
        row.push_back(absl::StrCat("(", detail, ")"));
      }
    }
    rows.push_back(std::move(row));
  }
  context.out() << FormatColumns(rows);
  context.out().flush();
  if (!context.out().good()) return kExitFailure;
  return all_serving ? kExitOk : kExitFailure;
}

void AddHealthCommand(CLI::App& app, CommandContext& context) {
  CLI::App* health = app.add_subcommand(
      std::string(kHealthCommand),
      "Check every daemon of the cluster (grpc.health.v1): SERVING, "
      "NOT_SERVING or UNAVAILABLE, and the generation of its process group");
  auto options = std::make_shared<HealthOptions>();
  options->connection.default_timeout = kHealthTimeoutSeconds;
  AddConnectionFlags(app, health, &options->connection, /*transfers=*/false);
  health->footer(
      "Examples:\n"
      "  tessera health\n"
      "  tessera health --address 10.0.0.1:29600 --timeout 2\n\n"
      "Exit status: 0 when every daemon serves, 1 when one does not (or is "
      "re-forming its process group after a failure, or waits for a silent "
      "daemon) or the cluster cannot "
      "be reached, 2 for a usage error.");
  RunWhenParsed(health, context, kHealthCommand, options, RunHealth);
}

}  // namespace tessera::cli
