#include "client/cli/save_command.h"

#include <filesystem>
#include <memory>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/client.h"

namespace tessera::cli {
namespace {

constexpr absl::string_view kCommand = "save";

}  // namespace

absl::StatusOr<std::string> AbsoluteCheckpointPath(const std::string& path) {
  if (path.empty()) {
    return absl::InvalidArgumentError("the checkpoint path is empty");
  }
  std::error_code error;
  const std::filesystem::path absolute = std::filesystem::absolute(path, error);
  if (error) {
    return absl::InternalError(
        absl::StrCat("cannot resolve '", path, "': ", error.message()));
  }
  return absolute.lexically_normal().string();
}

int RunSave(const SaveOptions& options, const CommandContext& context) {
  absl::StatusOr<std::string> path = AbsoluteCheckpointPath(options.path);
  if (!path.ok()) return context.ReportUserError(kCommand, path.status());
  absl::StatusOr<std::shared_ptr<Client>> client =
      ConnectToCluster(options.connection);
  if (!client.ok()) return context.ReportUserError(kCommand, client.status());
  absl::StatusOr<std::vector<std::string>> saved =
      (*client)->Save(*path, options.names);
  if (!saved.ok()) return context.ReportUserError(kCommand, saved.status());
  if (saved->empty()) {
    context.out() << "saved no tensors (there are none) to " << *path << "\n";
  } else {
    context.out() << "saved " << absl::StrJoin(*saved, ", ") << " to " << *path
                  << "\n";
  }
  context.out().flush();
  return context.out().good() ? kExitOk : kExitFailure;
}

void AddSaveCommand(CLI::App& app, CommandContext& context) {
  CLI::App* save = app.add_subcommand(
      std::string(kCommand),
      "Save tensors (default: all) to a checkpoint directory every daemon "
      "can write");
  auto options = std::make_shared<SaveOptions>();
  save->add_option("path", options->path,
                   "The checkpoint directory (relative paths are resolved "
                   "here, the daemons must see the same filesystem)")
      ->required()
      ->type_name("PATH");
  save->add_option("names", options->names,
                   "Tensors to save (default: every tensor)")
      ->type_name("NAME...");
  AddConnectionFlags(app, save, &options->connection, /*transfers=*/false);
  save->footer(
      "Examples:\n"
      "  tessera save /shared/ckpt/step100\n"
      "  tessera save /tmp/ckpt w b\n\n"
      "Exit status: 0 on success, 1 when a tensor does not exist, the "
      "directory cannot be written or the cluster cannot be reached, 2 for a "
      "usage error.");
  RunWhenParsed(save, context, kCommand, options, RunSave);
}

}  // namespace tessera::cli
