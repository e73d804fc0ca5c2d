#include "client/cli/load_command.h"

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cli/ls_command.h"
#include "client/cli/save_command.h"
#include "client/client.h"
#include "common/proto_convert.h"
#include "common/sharding_spec_text.h"

namespace tessera::cli {
namespace {

constexpr absl::string_view kLoadCommand = "load";

}  // namespace

int RunLoad(const LoadOptions& options, const CommandContext& context) {
  v1::LoadCheckpointRequest request;
  if (absl::Status path = CheckCheckpointPath(options.path); !path.ok()) {
    return context.ReportUserError(kLoadCommand, path);
  }
  const std::string* path = &options.path;
  request.set_path(*path);
  std::vector<std::string> names;
  if (!options.names.empty()) {
    absl::StatusOr<std::vector<std::string>> parsed =
        ParseNameList(options.names, "--names");
    if (!parsed.ok())
      return context.ReportUserError(kLoadCommand, parsed.status());
    names = *std::move(parsed);
  }
  if (!options.as_names.empty()) {
    absl::StatusOr<std::vector<std::string>> as_names =
        ParseNameList(options.as_names, "--as");
    if (!as_names.ok()) {
      return context.ReportUserError(kLoadCommand, as_names.status());
    }
    if (as_names->size() != names.size()) {
      return context.ReportUserError(
          kLoadCommand, absl::InvalidArgumentError(absl::StrCat(
                            "--as gives ", as_names->size(),
                            " names but --names ", names.size(),
                            "; rename the entries listed by --names one to "
                            "one")));
    }
    for (const std::string& name : *as_names) request.add_as_names(name);
  }
  for (const std::string& name : names) request.add_names(name);
  request.set_replace(options.replace);
  request.set_versions(options.versions);
  if (!options.spec.empty()) {
    absl::StatusOr<ShardingSpec> spec = ParseShardingSpec(options.spec);
    if (!spec.ok()) return context.ReportUserError(kLoadCommand, spec.status());
    *request.mutable_spec() = ToProto(*spec);
  }

  absl::StatusOr<std::shared_ptr<Client>> client =
      ConnectToCluster(options.connection);
  if (!client.ok())
    return context.ReportUserError(kLoadCommand, client.status());
  absl::StatusOr<std::vector<ShardedTensorView>> views =
      (*client)->Load(request);
  if (!views.ok()) return context.ReportUserError(kLoadCommand, views.status());
  if (options.json) {
    context.out() << TensorsToJson(*views) << "\n";
  } else {
    context.out() << "loaded " << views->size()
                  << (views->size() == 1 ? " tensor" : " tensors") << " from "
                  << *path << "\n"
                  << (views->empty() ? "" : FormatTensorTable(*views));
  }
  context.out().flush();
  return context.out().good() ? kExitOk : kExitFailure;
}

void AddLoadCommand(CLI::App& app, CommandContext& context) {
  CLI::App* load = app.add_subcommand(
      std::string(kLoadCommand),
      "Load tensors from a checkpoint, in their saved layout or resharded");
  auto options = std::make_shared<LoadOptions>();
  load->add_option("path", options->path,
                   "The checkpoint directory: relative to the daemons' "
                   "--checkpoint-root, or an absolute path inside one")
      ->required()
      ->type_name("PATH");
  load->add_option("--names", options->names,
                   "Entries to load, comma-separated (default: all)")
      ->type_name("A,B,...");
  load->add_option("--as", options->as_names,
                   "New names for the entries of --names, in the same order")
      ->type_name("X,Y,...");
  load->add_flag("--replace", options->replace,
                 "Replace existing tensors of the same names");
  load->add_option("--spec", options->spec,
                   "Reshard every loaded tensor to this spec (text form, as "
                   "for 'tessera plan')")
      ->type_name("SPEC");
  load->add_option("--versions", options->versions,
                   "Load versioned tensors keeping this many published "
                   "versions (2 to 64; docs/versions.md): the checkpoint's "
                   "values are their version 1; 1 loads them in place "
                   "(default: each as it was saved)")
      ->check(Whole(1, 64))
      ->type_name("K");
  load->add_flag("--json", options->json,
                 "Print the loaded tensors as JSON (as 'tessera ls --json')");
  AddConnectionFlags(app, load, &options->connection, /*transfers=*/false);
  load->footer(
      "Examples:\n"
      "  tessera load /shared/ckpt\n"
      "  tessera load /tmp/ckpt --names w --as w2\n"
      "  tessera load /tmp/ckpt --replace \\\n"
      "      --spec 'chunk:dim=1:rank:0/cpu,rank:1/cpu'\n\n"
      "Exit status: 0 on success, 1 when the checkpoint or an entry does not "
      "exist, a name is taken or the cluster cannot be reached, 2 for a "
      "usage error or a bad spec.");
  RunWhenParsed(load, context, kLoadCommand, options, RunLoad);
}

}  // namespace tessera::cli
