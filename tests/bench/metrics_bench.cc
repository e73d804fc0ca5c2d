// The cost of counting a transfer (server/metrics/metrics.h), which every
// shard server pays once per fetch or write it serves, whether or not an
// endpoint serves the metrics: nanoseconds per CountTransfer, on one thread
// and on several counting the same series at once (the worst contention:
// every transfer of one transport and direction); and the same for
// CountRpc, which every gRPC call pays.
//
//   build/tests/bench/metrics_bench [--calls N] [--threads T]
//
//   {"bench":"metrics","op":"count_transfer","threads":1,"ns_per_call":...}
//   {"bench":"metrics","op":"count_rpc","threads":1,"ns_per_call":...}
//
// One call per transfer: a 4 KiB fetch pays it once (the goal: 1 µs at
// most), a 64 MiB read too.
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/time/clock.h"
#include "server/metrics/metrics.h"
#include "tests/bench/bench_util.h"

namespace tessera {
namespace {

// Nanoseconds per call with `threads` threads making `calls` calls each.
// `count` is "transfer" (what every fetch and write pays) or "rpc" (what
// every gRPC call pays: its series found by method and code).
double NsPerCall(const std::string& count, int threads, int64_t calls) {
  const absl::Time start = absl::Now();
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([calls, rpc = count == "rpc"] {
      for (int64_t i = 0; i < calls; ++i) {
        if (rpc) {
          CountRpc("tessera.v1.ShardService/FetchShard", absl::StatusCode::kOk,
                   absl::Microseconds(60));
        } else {
          CountTransfer(MetricsTransport::kDataPlane, MetricsDirection::kRead,
                        4096, absl::Microseconds(15));
        }
      }
    });
  }
  for (std::thread& worker : workers) worker.join();
  return absl::ToDoubleNanoseconds(absl::Now() - start) /
         static_cast<double>(calls);
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  CLI::App app("Cost of counting one transfer in the process's metrics");
  int64_t calls = 10'000'000;
  int threads = 4;
  app.add_option("--calls", calls, "Calls per thread")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  app.add_option("--threads", threads, "Threads of the contended run")
      ->check(CLI::Range(1, 256));
  CLI11_PARSE(app, argc, argv);
  for (const std::string count : {"transfer", "rpc"}) {
    tessera::NsPerCall(count, 1, 1000);  // Registers the series.
    for (int t : {1, threads}) {
      tessera::bench::JsonLine line;
      line["bench"] = "metrics";
      line["op"] = "count_" + count;
      line["threads"] = t;
      line["calls_per_thread"] = calls;
      line["ns_per_call"] = tessera::NsPerCall(count, t, calls);
      tessera::bench::PrintJsonLine(line);
    }
  }
  return 0;
}
