#include "client/cli/top_command.h"

#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <iterator>
#include <limits>
#include <memory>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/cli/table.h"
#include "client/client.h"
#include "nlohmann/json.hpp"

namespace tessera::cli {
namespace {

constexpr absl::string_view kTopCommand = "top";
constexpr double kTopTimeoutSeconds = 5;
constexpr const char* kTransports[3] = {"grpc", "data_plane", "local_path"};

// One look at every daemon, in rank order.
std::vector<DaemonLook> LookAtEveryDaemon(const Client& client) {
  const std::vector<absl::StatusOr<v1::ClusterInfo>> clusters =
      client.Clusters();
  const std::vector<absl::StatusOr<v1::DaemonStats>> stats = client.Stats();
  const v1::ClusterInfo& cluster = client.cluster();
  std::vector<DaemonLook> looks(stats.size());
  for (size_t r = 0; r < looks.size(); ++r) {
    DaemonLook& look = looks[r];
    look.rank = static_cast<int>(r);
    if (r < static_cast<size_t>(cluster.workers_size())) {
      look.address = cluster.workers(static_cast<int>(r)).address();
    }
    if (!stats[r].ok()) {
      look.error = stats[r].status();
      continue;
    }
    absl::StatusOr<std::vector<MetricSample>> metrics =
        ParsePrometheusText(stats[r]->metrics());
    if (!metrics.ok()) {
      look.error = metrics.status();
      continue;
    }
    look.metrics = *std::move(metrics);
    if (r < clusters.size() && clusters[r].ok()) {
      look.state = clusters[r]->state();
      look.generation = clusters[r]->generation();
    }
  }
  return looks;
}

std::string Rate(double bytes_per_second) {
  return FormatBytes(static_cast<int64_t>(bytes_per_second));
}

std::string Latency(double seconds) {
  if (seconds < 0) return "-";
  if (seconds < 1e-3) return absl::StrFormat("%.0fus", seconds * 1e6);
  if (seconds < 1) return absl::StrFormat("%.1fms", seconds * 1e3);
  return absl::StrFormat("%.2fs", seconds);
}

// `after` less `before`, bucket by bucket.
std::map<double, double> Delta(const std::map<double, double>& after,
                               const std::map<double, double>& before) {
  std::map<double, double> delta = after;
  for (const auto& [bound, count] : before) delta[bound] -= count;
  return delta;
}

}  // namespace

bool IsCallerOutcome(absl::string_view code) {
  static constexpr absl::string_view kCallers[] = {
      "INVALID_ARGUMENT", "NOT_FOUND",         "ALREADY_EXISTS", "OUT_OF_RANGE",
      "UNIMPLEMENTED",    "PERMISSION_DENIED", "UNAUTHENTICATED"};
  return std::find(std::begin(kCallers), std::end(kCallers), code) !=
         std::end(kCallers);
}

DaemonView ViewOf(const DaemonLook& before, const DaemonLook& after,
                  double seconds) {
  DaemonView view;
  view.rank = after.rank;
  view.address = after.address;
  if (!after.error.ok()) {
    view.state = "unreachable";
    view.error = std::string(after.error.message());
    return view;
  }
  view.state = after.state.empty() ? "serving" : after.state;
  view.generation = after.generation;
  const std::vector<MetricSample>& now = after.metrics;
  // A daemon that did not answer the first look counts from zero.
  const std::vector<MetricSample>& then = before.metrics;
  const auto change = [&](absl::string_view name,
                          const std::map<std::string, std::string>& match) {
    const double delta = SumOf(now, name, match) - SumOf(then, name, match);
    return seconds > 0 ? std::max(delta, 0.0) / seconds : 0.0;
  };
  view.tensors = SumOf(now, "tessera_tensors");
  view.shards = SumOf(now, "tessera_shards");
  view.bytes_held = SumOf(now, "tessera_shard_bytes");
  view.budget_bytes = SumOf(now, "tessera_memory_budget_bytes");
  view.budget_used_bytes = SumOf(now, "tessera_memory_budget_used_bytes");
  for (int t = 0; t < 3; ++t) {
    view.read_bytes_per_second[t] =
        change("tessera_transfer_bytes_total",
               {{"transport", kTransports[t]}, {"direction", "read"}});
    view.write_bytes_per_second[t] =
        change("tessera_transfer_bytes_total",
               {{"transport", kTransports[t]}, {"direction", "write"}});
  }
  view.ops_per_second = change("tessera_control_ops_total", {});
  view.ops_total = SumOf(now, "tessera_control_ops_total");
  for (const MetricSample& sample : now) {
    if (sample.name != "tessera_control_ops_total") continue;
    const auto code = sample.labels.find("code");
    const absl::string_view label =
        code == sample.labels.end() ? "" : absl::string_view(code->second);
    if (label == "OK") continue;
    (IsCallerOutcome(label) ? view.op_refusals : view.op_errors) +=
        sample.value;
  }
  view.checksum_failures =
      SumOf(now, "tessera_checksum_failures_total") +
      SumOf(now, "tessera_received_checksum_failures_total");
  view.budget_refusals = SumOf(now, "tessera_memory_budget_refusals_total");
  view.collective_failures = SumOf(now, "tessera_collective_failures_total");
  view.store_failures = SumOf(now, "tessera_store_op_failures_total");
  const std::map<std::string, std::string> reads = {{"direction", "read"}};
  std::map<double, double> fetches =
      BucketsOf(now, "tessera_transfer_seconds", reads);
  const std::map<double, double> recent =
      Delta(fetches, BucketsOf(then, "tessera_transfer_seconds", reads));
  view.latency_of_interval = !recent.empty() && recent.rbegin()->second > 0;
  if (view.latency_of_interval) fetches = recent;
  view.fetch_p50_seconds = HistogramQuantile(fetches, 0.5);
  view.fetch_p99_seconds = HistogramQuantile(fetches, 0.99);
  return view;
}

std::string FormatTopTable(const std::vector<DaemonView>& views) {
  std::vector<std::vector<std::string>> rows = {
      {"RANK", "ADDRESS", "STATE", "GEN", "TENSORS", "SHARDS", "HELD",
       "READ/s grpc", "data", "local", "WRITE/s grpc", "data", "local", "OPS/s",
       "FETCH p50", "p99", "ERRORS"}};
  for (const DaemonView& view : views) {
    if (view.state == "unreachable") {
      rows.push_back({absl::StrCat(view.rank), view.address,
                      absl::StrCat("unreachable (", view.error, ")")});
      continue;
    }
    rows.push_back({absl::StrCat(view.rank), view.address,
                    view.state.substr(0, view.state.find(':')),
                    absl::StrCat(view.generation), absl::StrCat(view.tensors),
                    absl::StrCat(view.shards),
                    FormatBytes(static_cast<int64_t>(view.bytes_held)),
                    Rate(view.read_bytes_per_second[0]),
                    Rate(view.read_bytes_per_second[1]),
                    Rate(view.read_bytes_per_second[2]),
                    Rate(view.write_bytes_per_second[0]),
                    Rate(view.write_bytes_per_second[1]),
                    Rate(view.write_bytes_per_second[2]),
                    absl::StrFormat("%.1f", view.ops_per_second),
                    Latency(view.fetch_p50_seconds),
                    Latency(view.fetch_p99_seconds),
                    absl::StrCat(view.errors())});
  }
  return FormatColumns(rows);
}

std::string FormatTopJson(const std::vector<DaemonView>& views,
                          double interval_seconds) {
  nlohmann::json daemons = nlohmann::json::array();
  const auto per_transport = [](const double(&values)[3]) {
    nlohmann::json out;
    for (int t = 0; t < 3; ++t) out[kTransports[t]] = values[t];
    return out;
  };
  const auto seconds_or_null = [](double seconds) {
    return seconds < 0 ? nlohmann::json(nullptr) : nlohmann::json(seconds);
  };
  for (const DaemonView& view : views) {
    nlohmann::json daemon = {
        {"rank", view.rank}, {"address", view.address}, {"state", view.state}};
    if (view.state == "unreachable") {
      daemon["error"] = view.error;
      daemons.push_back(std::move(daemon));
      continue;
    }
    // Counts as integers; rates and latencies as numbers.
    const auto count = [](double value) { return static_cast<int64_t>(value); };
    daemon["generation"] = view.generation;
    daemon["tensors"] = count(view.tensors);
    daemon["shards"] = count(view.shards);
    daemon["bytes_held"] = count(view.bytes_held);
    daemon["memory_budget_bytes"] = count(view.budget_bytes);
    daemon["memory_budget_used_bytes"] = count(view.budget_used_bytes);
    daemon["read_bytes_per_second"] = per_transport(view.read_bytes_per_second);
    daemon["write_bytes_per_second"] =
        per_transport(view.write_bytes_per_second);
    daemon["ops_per_second"] = view.ops_per_second;
    daemon["ops_total"] = count(view.ops_total);
    daemon["fetch_p50_seconds"] = seconds_or_null(view.fetch_p50_seconds);
    daemon["fetch_p99_seconds"] = seconds_or_null(view.fetch_p99_seconds);
    daemon["fetch_latency_window"] =
        view.latency_of_interval ? "interval" : "lifetime";
    daemon["errors"] = {{"total", count(view.errors())},
                        {"control_ops", count(view.op_errors)},
                        {"checksum", count(view.checksum_failures)},
                        {"memory_budget_refusals", count(view.budget_refusals)},
                        {"collectives", count(view.collective_failures)},
                        {"store", count(view.store_failures)}};
    daemon["refused"] = {{"control_ops", count(view.op_refusals)}};
    daemons.push_back(std::move(daemon));
  }
  return nlohmann::json{{"interval_seconds", interval_seconds},
                        {"daemons", std::move(daemons)}}
             .dump(2, ' ', false, nlohmann::json::error_handler_t::replace) +
         "\n";
}

int RunTop(const TopOptions& options, const CommandContext& context) {
  absl::StatusOr<std::shared_ptr<Client>> client =
      ConnectToCluster(options.connection);
  // A bad credential flag is a usage error, an unreachable cluster a
  // failure: as every command.
  if (!client.ok())
    return context.ReportUserError(kTopCommand, client.status());
  const absl::Duration interval = absl::Seconds(options.interval_seconds);
  const int frames = options.once ? 1 : options.iterations;
  const bool clear_screen =
      &context.out() == &std::cout && ::isatty(STDOUT_FILENO);
  std::vector<DaemonLook> before = LookAtEveryDaemon(**client);
  absl::Time looked = absl::Now();
  bool all_answered = true;
  for (int frame = 0; frames == 0 || frame < frames; ++frame) {
    absl::SleepFor(interval);
    std::vector<DaemonLook> after = LookAtEveryDaemon(**client);
    const absl::Time now = absl::Now();
    const double seconds = absl::ToDoubleSeconds(now - looked);
    std::vector<DaemonView> views;
    all_answered = true;
    for (size_t r = 0; r < after.size(); ++r) {
      views.push_back(ViewOf(r < before.size() ? before[r] : DaemonLook(),
                             after[r], seconds));
      all_answered = all_answered && after[r].error.ok();
    }
    if (options.json) {
      context.out() << FormatTopJson(views, seconds);
    } else {
      // Home and clear on a terminal; into a pipe or file, the frames
      // follow each other, a blank line apart, without escape codes.
      if (!options.once && clear_screen) {
        context.out() << "\x1b[H\x1b[2J";
      } else if (frame > 0) {
        context.out() << "\n";
      }
      context.out() << "tessera top: " << views.size() << " daemons at "
                    << absl::FormatTime("%H:%M:%S", now, absl::LocalTimeZone())
                    << ", rates over " << absl::StrFormat("%.1f", seconds)
                    << "s" << (options.once ? "" : " (Ctrl-C to stop)") << "\n"
                    << FormatTopTable(views);
    }
    context.out().flush();
    if (!context.out().good()) return kExitFailure;
    before = std::move(after);
    looked = now;
  }
  return all_answered ? kExitOk : kExitFailure;
}

void AddTopCommand(CLI::App& app, CommandContext& context) {
  CLI::App* top = app.add_subcommand(
      std::string(kTopCommand),
      "Watch every daemon: state, tensors, bytes held, read and write "
      "throughput per transport, operations per second, fetch latency, "
      "errors in the daemons (from their metrics)");
  auto options = std::make_shared<TopOptions>();
  options->connection.default_timeout = kTopTimeoutSeconds;
  AddConnectionFlags(app, top, &options->connection, /*transfers=*/false);
  top->add_option("--interval", options->interval_seconds,
                  "Seconds between looks (default 2)")
      ->type_name("SECONDS")
      ->check(Seconds(0.1, 3600.0));
  top->add_option("--iterations", options->iterations,
                  "Stop after this many frames (default: until interrupted)")
      ->type_name("N")
      ->check(Whole(0, std::numeric_limits<int>::max()));
  top->add_flag("--once", options->once,
                "One frame after one interval, without clearing the screen");
  top->add_flag("--json", options->json,
                "Print each frame as a JSON document (with --once: for "
                "scripts)");
  top->footer(
      "Examples:\n"
      "  tessera top\n"
      "  tessera top --once --json --interval 1 | jq '.daemons[].state'\n\n"
      "ERRORS: what went wrong in a daemon since it started: control "
      "operations\nthat failed in the cluster (not those refused for the "
      "caller's request, such\nas NOT_FOUND or ALREADY_EXISTS: --json counts "
      "them as \"refused\"), checksum\nfailures, memory-budget refusals, "
      "failed collectives and store calls.\n\n"
      "Exit status: 0 when every daemon answered the last look, 1 when one "
      "did not or the cluster cannot be reached, 2 for a usage error.");
  RunWhenParsed(top, context, kTopCommand, options, RunTop);
}

}  // namespace tessera::cli
