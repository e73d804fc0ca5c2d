// How fast fresh host memory fills, by kind: the cost every fetched copy,
// gather output and staging buffer pays once (issue: "Allocation"). For
// each size, `reps` times: allocate, fill (memset), free; JSON lines
//   {"bench":"alloc_fill", "kind":K, "mib":N, "gbps":...}
// with K one of
//   "private"   Storage with HostSharing::kPrivate (huge pages when large;
//               from 2 MiB up, a buffer freed earlier is reused from the
//               process's host buffer cache unless --host-cache-bytes 0)
//   "shared"    a memory file (what the local path lends), sharing on
//   "reused"    one buffer filled again and again: the ceiling (memset)
// GB/s counts the bytes over allocate + fill + free. Every line also
// carries "host_cache_bytes" (TESSERA_HOST_CACHE_BYTES for this run).
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/time/clock.h"
#include "common/tensor/storage.h"
#include "tests/bench/bench_util.h"

namespace tessera {
namespace {

absl::Status Measure(const std::string& kind, int64_t mib, int reps,
                     const std::string& cache_bytes) {
  const size_t bytes = static_cast<size_t>(mib) << 20;
  std::vector<double> seconds;
  std::shared_ptr<Storage> reused;
  if (kind == "reused") {
    absl::StatusOr<std::shared_ptr<Storage>> storage =
        Storage::Allocate(bytes, Device::Cpu(), false, HostSharing::kPrivate);
    if (!storage.ok()) return storage.status();
    reused = *std::move(storage);
    std::memset(reused->data(), 1, bytes);
  }
  for (int rep = -1; rep < reps; ++rep) {  // rep -1 warms up.
    const absl::Time start = absl::Now();
    if (reused != nullptr) {
      std::memset(reused->data(), rep & 0xff, bytes);
    } else {
      absl::StatusOr<std::shared_ptr<Storage>> storage = Storage::Allocate(
          bytes, Device::Cpu(), false,
          kind == "shared" ? HostSharing::kIfEnabled : HostSharing::kPrivate);
      if (!storage.ok()) return storage.status();
      if (kind == "shared" && (*storage)->shared_memory_fd() < 0) {
        return absl::FailedPreconditionError("no memory file could be had");
      }
      std::memset((*storage)->data(), rep & 0xff, bytes);
    }
    if (rep >= 0) seconds.push_back(bench::Seconds(absl::Now() - start));
  }
  const double gbps =
      bench::Gbps(static_cast<double>(bytes), bench::Median(seconds));
  bench::PrintJsonLine(bench::JsonLine{{"bench", "alloc_fill"},
                                       {"kind", kind},
                                       {"mib", mib},
                                       {"reps", reps},
                                       {"host_cache_bytes", cache_bytes},
                                       {"gbps", gbps}});
  return absl::OkStatus();
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  CLI::App app{"Fill speed of fresh host memory by kind (JSON lines)"};
  std::vector<int64_t> mibs = {1, 16, 64, 256};
  int reps = 9;
  app.add_option("--mib", mibs, "sizes in MiB")->check(CLI::Range(1, 65536));
  app.add_option("--reps", reps, "allocations per size and kind")
      ->check(CLI::Range(1, 10000));
  bool quick = false;
  app.add_flag("--quick", quick, "small run for ctest");
  std::string cache_bytes;
  app.add_option("--host-cache-bytes", cache_bytes,
                 "TESSERA_HOST_CACHE_BYTES for this run (0: every private "
                 "allocation is fresh)");
  CLI11_PARSE(app, argc, argv);
  // Read once, at the first allocation: set before any.
  if (!cache_bytes.empty()) {
    setenv("TESSERA_HOST_CACHE_BYTES", cache_bytes.c_str(), 1);
  }
  const char* effective = std::getenv("TESSERA_HOST_CACHE_BYTES");
  cache_bytes = effective != nullptr ? effective : "default";
  if (quick) {
    mibs = {1, 4};
    reps = 2;
  }
  tessera::SetHostMemorySharing();
  for (const int64_t mib : mibs) {
    for (const char* kind : {"private", "shared", "reused"}) {
      if (absl::Status status = tessera::Measure(kind, mib, reps, cache_bytes);
          !status.ok()) {
        std::cerr << "alloc_bench: " << status << "\n";
        return 1;
      }
    }
  }
  return 0;
}
