#include "client/cli/versions_command.h"

#include <limits>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cli/describe_command.h"
#include "client/client.h"
#include "client/version_watcher.h"
#include "nlohmann/json.hpp"

namespace tessera::cli {
namespace {

constexpr absl::string_view kVersionsCommand = "versions";
constexpr absl::string_view kWatchCommand = "watch";

absl::Status Unversioned(const std::string& name) {
  return absl::FailedPreconditionError(
      absl::StrCat("tensor '", name,
                   "' has no versions (create it with --versions K, K >= 2)"));
}

}  // namespace

int RunVersions(const VersionsOptions& options, const CommandContext& context) {
  absl::StatusOr<ShardedTensorView> view =
      OpenTensor(options.connection, options.name);
  if (!view.ok()) {
    return context.ReportUserError(kVersionsCommand, view.status());
  }
  if (!view->versioned()) {
    context.PrintError(kVersionsCommand, Unversioned(options.name).message());
    return kExitUsage;
  }
  const v1::TensorInfo& info = view->info();
  if (options.json) {
    nlohmann::ordered_json json = {
        {"name", options.name},
        {"latest", info.version()},
        {"keeps", info.versions_kept()},
        {"kept", std::vector<int64_t>(info.kept_versions().begin(),
                                      info.kept_versions().end())},
        {"pinned", std::vector<int64_t>(info.pinned_versions().begin(),
                                        info.pinned_versions().end())},
        {"open", std::vector<int64_t>(info.open_versions().begin(),
                                      info.open_versions().end())}};
    context.out() << json.dump(2) << "\n";
  } else {
    context.out() << options.name << ": " << FormatVersions(info);
  }
  context.out().flush();
  return context.out().good() ? kExitOk : kExitFailure;
}

int RunWatch(const WatchOptions& options, const CommandContext& context) {
  absl::StatusOr<std::shared_ptr<Client>> client =
      ConnectToCluster(options.connection);
  if (!client.ok()) {
    return context.ReportUserError(kWatchCommand, client.status());
  }
  absl::StatusOr<std::unique_ptr<VersionWatcher>> watcher =
      (*client)->Watch(options.name, options.after);
  if (!watcher.ok()) {
    if (absl::IsFailedPrecondition(watcher.status())) {
      context.PrintError(kWatchCommand, Unversioned(options.name).message());
      return kExitUsage;
    }
    return context.ReportUserError(kWatchCommand, watcher.status());
  }
  const absl::Duration limit = options.timeout > 0
                                   ? absl::Seconds(options.timeout)
                                   : absl::InfiniteDuration();
  absl::Time last = absl::Now();
  int64_t printed = 0;
  while (options.count == 0 || printed < options.count) {
    const absl::Duration left = limit - (absl::Now() - last);
    if (left <= absl::ZeroDuration()) break;
    absl::StatusOr<int64_t> next =
        (*watcher)->Next(std::min(left, absl::Seconds(1)));
    if (absl::IsDeadlineExceeded(next.status())) continue;
    if (!next.ok()) {
      context.PrintError(kWatchCommand, next.status().message());
      return kExitFailure;
    }
    context.out() << *next << std::endl;
    if (!context.out().good()) return kExitFailure;
    last = absl::Now();
    ++printed;
  }
  return kExitOk;
}

void AddVersionsCommand(CLI::App& app, CommandContext& context) {
  CLI::App* versions = app.add_subcommand(
      std::string(kVersionsCommand),
      "Show a versioned tensor's versions: latest, kept, pinned, open");
  auto options = std::make_shared<VersionsOptions>();
  versions->add_option("name", options->name, "The tensor's name")
      ->required()
      ->type_name("NAME");
  versions->add_flag("--json", options->json, "Print JSON");
  AddConnectionFlags(app, versions, &options->connection,
                     /*transfers=*/false);
  versions->footer(
      "Examples:\n"
      "  tessera versions w\n"
      "  tessera versions w --json\n\n"
      "Exit status: 0 on success, 1 when the tensor does not exist or the "
      "cluster cannot be reached, 2 for a usage error or an unversioned "
      "tensor.");
  RunWhenParsed(versions, context, kVersionsCommand, options, RunVersions);
}

void AddWatchCommand(CLI::App& app, CommandContext& context) {
  CLI::App* watch = app.add_subcommand(
      std::string(kWatchCommand),
      "Print each version of a versioned tensor as it is published");
  auto options = std::make_shared<WatchOptions>();
  watch->add_option("name", options->name, "The tensor's name")
      ->required()
      ->type_name("NAME");
  watch->add_option("--count", options->count, "Stop after N versions")
      ->check(Whole(1, std::numeric_limits<int64_t>::max()))
      ->type_name("N");
  watch
      ->add_option("--after", options->after,
                   "Report the versions after N, those still kept first "
                   "(default: those published from now on)")
      ->check(Whole(1, std::numeric_limits<int64_t>::max()))
      ->type_name("N");
  watch
      ->add_option("--idle-timeout", options->timeout,
                   "Stop after this many seconds without a new version")
      ->check(Seconds(0, kMaxTimeoutSeconds))
      ->type_name("SECONDS");
  AddConnectionFlags(app, watch, &options->connection, /*transfers=*/false);
  watch->footer(
      "Examples:\n"
      "  tessera watch w\n"
      "  tessera watch w --count 3 --idle-timeout 60\n"
      "  tessera watch w --after 41   # 42 and on, even if already out\n\n"
      "Exit status: 0 on success (also when --idle-timeout ends it), 1 when "
      "the "
      "tensor does not exist or is deleted, or the cluster cannot be "
      "reached, 2 for a usage error or an unversioned tensor.");
  RunWhenParsed(watch, context, kWatchCommand, options, RunWatch);
}

}  // namespace tessera::cli
