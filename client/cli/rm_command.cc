#include "client/cli/rm_command.h"

#include <memory>
#include <set>
#include <string>

#include "client/client.h"

namespace tessera::cli {
namespace {

constexpr absl::string_view kRmCommand = "rm";

}  // namespace

int RunRm(const RmOptions& options, const CommandContext& context) {
  absl::StatusOr<std::shared_ptr<Client>> client =
      ConnectToCluster(options.connection);
  if (!client.ok()) return context.ReportUserError(kRmCommand, client.status());
  int exit_code = kExitOk;
  // Several distinct names: one logged call for all of them (all or none).
  // Refused as NOT_FOUND, nothing was deleted: each is deleted on its own
  // below, so that the others still go and the missing ones are named.
  const std::set<std::string> distinct(options.names.begin(),
                                       options.names.end());
  if (distinct.size() > 1 && distinct.size() == options.names.size() &&
      distinct.size() <= Client::kMaxDeleteTensors) {
    const absl::Status together = (*client)->DeleteMany(options.names);
    if (together.ok()) {
      for (const std::string& name : options.names) {
        context.out() << "deleted " << name << "\n";
      }
      context.out().flush();
      return context.out().good() ? kExitOk : kExitFailure;
    }
    if (!absl::IsNotFound(together)) {
      context.PrintError(kRmCommand, together.message());
      return kExitFailure;
    }
  }
  for (const std::string& name : options.names) {
    const absl::Status status = (*client)->Delete(name);
    if (status.ok()) {
      context.out() << "deleted " << name << "\n";
    } else if (!(options.force && absl::IsNotFound(status))) {
      context.PrintError(kRmCommand, status.message());
      exit_code = kExitFailure;
    }
  }
  context.out().flush();
  if (!context.out().good()) return kExitFailure;
  return exit_code;
}

void AddRmCommand(CLI::App& app, CommandContext& context) {
  CLI::App* rm =
      app.add_subcommand(std::string(kRmCommand),
                         "Delete tensors (every daemon frees their shards)");
  auto options = std::make_shared<RmOptions>();
  rm->add_option("names", options->names, "The tensors' names")
      ->required()
      ->type_name("NAME...");
  rm->add_flag("-f,--force", options->force, "Ignore names that do not exist");
  AddConnectionFlags(app, rm, &options->connection, /*transfers=*/false);
  rm->footer(
      "Examples:\n"
      "  tessera rm w\n"
      "  tessera rm -f a b c\n\n"
      "Exit status: 0 when every tensor was deleted, 1 when one was not (or "
      "the cluster cannot be reached), 2 for a usage error.");
  RunWhenParsed(rm, context, kRmCommand, options, RunRm);
}

}  // namespace tessera::cli
