#include "client/cli/save_command.h"

#include <algorithm>
#include <memory>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/client.h"

namespace tessera::cli {
namespace {

constexpr absl::string_view kSaveCommand = "save";

}  // namespace

absl::StatusOr<std::map<std::string, int64_t>> ParseSaveVersions(
    const std::vector<std::string>& versions,
    const std::vector<std::string>& names) {
  std::map<std::string, int64_t> parsed;
  for (const std::string& entry : versions) {
    std::string name;
    absl::string_view number = entry;
    if (const size_t eq = entry.rfind('='); eq != std::string::npos) {
      name = entry.substr(0, eq);
      number = absl::string_view(entry).substr(eq + 1);
    } else if (names.size() == 1) {
      name = names[0];
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "--version ", entry, ": with ", names.size(),
          " tensors named, say whose version it is: --version NAME=N"));
    }
    int64_t value = 0;
    if (!absl::SimpleAtoi(number, &value) || value < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--version ", entry,
                       ": a version is a number from 1 (tessera "
                       "versions NAME lists the kept ones)"));
    }
    if (std::find(names.begin(), names.end(), name) == names.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--version ", entry, ": \"", name,
                       "\" is not among the tensors named to save"));
    }
    if (!parsed.emplace(name, value).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("--version: \"", name, "\" is given twice"));
    }
  }
  return parsed;
}

absl::Status CheckCheckpointPath(const std::string& path) {
  if (path.empty()) {
    return absl::InvalidArgumentError("the checkpoint path is empty");
  }
  return absl::OkStatus();
}

int RunSave(const SaveOptions& options, const CommandContext& context) {
  if (absl::Status path = CheckCheckpointPath(options.path); !path.ok()) {
    return context.ReportUserError(kSaveCommand, path);
  }
  const std::string* path = &options.path;
  absl::StatusOr<std::map<std::string, int64_t>> versions =
      ParseSaveVersions(options.versions, options.names);
  if (!versions.ok()) {
    return context.ReportUserError(kSaveCommand, versions.status());
  }
  absl::StatusOr<std::shared_ptr<Client>> client =
      ConnectToCluster(options.connection);
  if (!client.ok())
    return context.ReportUserError(kSaveCommand, client.status());
  absl::StatusOr<std::vector<std::string>> saved =
      (*client)->Save(*path, options.names, options.overwrite, *versions);
  if (!saved.ok()) return context.ReportUserError(kSaveCommand, saved.status());
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
      std::string(kSaveCommand),
      "Save tensors (default: all) to a checkpoint directory every daemon "
      "can write");
  auto options = std::make_shared<SaveOptions>();
  save->add_option("path", options->path,
                   "The checkpoint directory: relative to the daemons' "
                   "--checkpoint-root, or an absolute path inside one")
      ->required()
      ->type_name("PATH");
  save->add_flag("--overwrite", options->overwrite,
                 "Replace a checkpoint already at PATH");
  save->add_option("--version", options->versions,
                   "Save a kept older version of a versioned tensor: N when "
                   "one tensor is named, NAME=N for each of several "
                   "(default: the latest; tessera versions NAME lists them)")
      ->type_name("[NAME=]N")
      ->allow_extra_args(false);  // One per --version, not the PATH too.
  save->add_option("names", options->names,
                   "Tensors to save (default: every tensor)")
      ->type_name("NAME...");
  AddConnectionFlags(app, save, &options->connection, /*transfers=*/false);
  save->footer(
      "Examples:\n"
      "  tessera save step100\n"
      "  tessera save --overwrite /shared/ckpt/latest w b\n"
      "  tessera save --version 7 step100 w\n\n"
      "Exit status: 0 on success, 1 when a tensor does not exist, the "
      "checkpoint exists (without --overwrite), the path is refused or "
      "cannot be written, or the cluster cannot be reached, 2 for a usage "
      "error.");
  RunWhenParsed(save, context, kSaveCommand, options, RunSave);
}

}  // namespace tessera::cli
