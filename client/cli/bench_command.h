// `tessera bench`: what the wire between this host and each daemon can do,
// measured as a user would need it on their own fabric: per transport (the
// data plane with each lane count asked, gRPC, and the local path when the
// daemon is on this host), reads and writes of boxes of several sizes of a
// scratch tensor the daemon holds, and for each the two-term fit
//
//   time = per-op + bytes / GB/s
//
// (weighted least squares on the medians, each size weighing as much as
// any other, so the small sizes set the per-op cost and the large ones the
// rate). One table per daemon, or one JSON document with --json:
//
//   rank 1 at 10.0.0.2:29601 (cpu), 64 MiB scratch tensor
//   TRANSPORT   LANES  OP     4 KiB   64 KiB  1 MiB   16 MiB  64 MiB  PER-OP
//   GB/s data_plane  1      read   31 us   64 us   0.41 ms  6.9 ms  27 ms  28
//   us   2.41 data_plane  4      read   ...
//
// The scratch tensor ("tessera_bench.r<rank>.<pid>", held whole by the
// daemon on its device) is created and written first and deleted at the
// end, also after a failure (needs the write role). Deadline: --timeout per
// call (60 s). Exit codes (command.h): 0 when every daemon was measured, 1
// when one could not be, 2 for a usage error.
//
// Not measured: the wire between two daemons (their fetches from each
// other); this measures this host's client against each daemon.
#ifndef TESSERA_CLIENT_CLI_BENCH_COMMAND_H_
#define TESSERA_CLIENT_CLI_BENCH_COMMAND_H_

#include <cstdint>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "client/cli/command.h"
#include "client/cli/connection.h"

namespace tessera::cli {

struct BenchOptions {
  ConnectionFlags connection;
  // Daemons to measure; empty: every one.
  std::vector<int> ranks;
  // Box sizes ("4KiB"...), each rounded up to whole 4 KiB rows.
  std::vector<std::string> sizes = {"4KiB", "64KiB", "1MiB", "16MiB", "64MiB"};
  std::vector<int> lanes = {1, 4};
  // Transfers per size (fewer for large sizes: about 1 GiB per size).
  int reps = 20;
  bool json = false;
};

void AddBenchCommand(CLI::App& app, CommandContext& context);

int RunBench(const BenchOptions& options, const CommandContext& context);

// One (size, seconds) sample set reduced to the fit time = per_op +
// bytes / bytes_per_second, weighting each point by 1 / seconds^2
// (relative error). per_op is clamped at 0; bytes_per_second is 0 when the
// times do not grow with size.
struct TwoTermFit {
  double per_op_seconds = 0;
  double bytes_per_second = 0;
};
TwoTermFit FitTwoTerms(const std::vector<int64_t>& bytes,
                       const std::vector<double>& seconds);

}  // namespace tessera::cli

#endif  // TESSERA_CLIENT_CLI_BENCH_COMMAND_H_
