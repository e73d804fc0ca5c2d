// `tessera top`: every daemon of the cluster at a glance, refreshed like
// top(1), from the daemons' metrics (ControlService.GetStats, so it works
// whether or not their --metrics-port is on):
//
//   RANK  ADDRESS          STATE    GEN  TENSORS  HELD     READ/s grpc  data
//   local  WRITE/s ...  OPS/s  FETCH p50  p99  ERRORS 0     127.0.0.1:29600
//   serving  1    3        48 MiB   0 B          ...
//
// Rates are over the interval between two looks (--interval); fetch
// latencies are the p50 and p99 of the fetches the daemon served in that
// interval (of its whole life when it served none meanwhile). ERRORS
// counts what went wrong in the daemon since it started: control
// operations that failed for a reason of the cluster's (any code but OK
// and the caller's own mistakes, IsCallerOutcome), checksum failures (of
// bytes written to it or fetched by it), memory-budget refusals, failed
// collectives and store calls. An operation refused for the caller's
// request (deleting a tensor that does not exist, creating one twice, a
// bad argument) is an answer, not an error: --json counts those apart, as
// "refused". A daemon that does not answer shows "unreachable" and its
// error.
//
//   tessera top [--interval 2] [--iterations N]
//   tessera top --once [--json]     one frame after one interval, for scripts
//
// Exit codes (command.h): 0 when every daemon answered, 1 when one did not
// or the cluster cannot be reached, 2 for a usage error.
#ifndef TESSERA_CLIENT_CLI_TOP_COMMAND_H_
#define TESSERA_CLIENT_CLI_TOP_COMMAND_H_

#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/cli/command.h"
#include "client/cli/connection.h"
#include "client/cli/prometheus_text.h"

namespace tessera::cli {

struct TopOptions {
  ConnectionFlags connection;
  double interval_seconds = 2;
  int iterations = 0;  // 0: until interrupted (1 with --once)
  bool once = false;
  bool json = false;
};

void AddTopCommand(CLI::App& app, CommandContext& context);

int RunTop(const TopOptions& options, const CommandContext& context);

// One look at one daemon.
struct DaemonLook {
  int rank = 0;
  std::string address;
  absl::Status error;  // Not OK: it did not answer (the rest is empty).
  std::string state;   // ClusterInfo.state
  int64_t generation = 0;
  std::vector<MetricSample> metrics;
};

// What `tessera top` shows of one daemon, from two looks `seconds` apart.
struct DaemonView {
  int rank = 0;
  std::string address;
  std::string state;  // "unreachable" when it did not answer.
  std::string error;
  int64_t generation = 0;
  double tensors = 0, shards = 0, bytes_held = 0;
  double budget_bytes = 0, budget_used_bytes = 0;
  // Per transport: grpc, data_plane, local_path.
  double read_bytes_per_second[3] = {0, 0, 0};
  double write_bytes_per_second[3] = {0, 0, 0};
  double ops_per_second = 0;
  double ops_total = 0;
  double fetch_p50_seconds = -1, fetch_p99_seconds = -1;  // -1: no fetch
  // Whether they are of the interval's fetches (else of the daemon's life).
  bool latency_of_interval = false;
  // Control operations that failed for the cluster's reasons, and those
  // refused for the caller's (not errors: IsCallerOutcome).
  double op_errors = 0, op_refusals = 0;
  double checksum_failures = 0, budget_refusals = 0, collective_failures = 0,
         store_failures = 0;
  double errors() const {
    return op_errors + checksum_failures + budget_refusals +
           collective_failures + store_failures;
  }
};

// Whether an operation that ended with `code` (its metric label,
// "NOT_FOUND") was refused for the caller's request rather than failed in
// the cluster: INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, OUT_OF_RANGE,
// UNIMPLEMENTED, PERMISSION_DENIED and UNAUTHENTICATED. Every other code
// but OK (INTERNAL, UNAVAILABLE, DEADLINE_EXCEEDED, DATA_LOSS, ABORTED,
// FAILED_PRECONDITION such as a degraded tensor, RESOURCE_EXHAUSTED...) is
// a daemon error.
bool IsCallerOutcome(absl::string_view code);

DaemonView ViewOf(const DaemonLook& before, const DaemonLook& after,
                  double seconds);
// The table, and the JSON document of --json.
std::string FormatTopTable(const std::vector<DaemonView>& views);
std::string FormatTopJson(const std::vector<DaemonView>& views,
                          double interval_seconds);

}  // namespace tessera::cli

#endif  // TESSERA_CLIENT_CLI_TOP_COMMAND_H_
