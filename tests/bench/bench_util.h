// Helpers shared by the benchmarks in tests/bench: sample statistics and
// the JSON-lines output (one JSON object per line on stdout, flushed at
// once so that a bench killed midway keeps its finished lines).
//
// Thread-compatible; JSON lines are written whole.
#ifndef TESSERA_TESTS_BENCH_BENCH_UTIL_H_
#define TESSERA_TESTS_BENCH_BENCH_UTIL_H_

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "nlohmann/json.hpp"

namespace tessera::bench {

// The q-quantile (0 <= q <= 1) of `samples` by nearest rank; 0 when empty.
inline double Percentile(std::vector<double> samples, double q) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  size_t index = static_cast<size_t>(q * (samples.size() - 1) + 0.5);
  return samples[index];
}

inline double Median(std::vector<double> samples) {
  return Percentile(std::move(samples), 0.5);
}

inline double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

// Bytes per second in GB/s (10^9); 0 for a zero or negative time.
inline double Gbps(double bytes, double seconds) {
  return seconds > 0 ? bytes / seconds / 1e9 : 0;
}

// A JSON object whose keys keep their insertion order.
using JsonLine = nlohmann::ordered_json;

// Prints `line` as one line on stdout and flushes.
inline void PrintJsonLine(const JsonLine& line) {
  const std::string text = line.dump();
  std::printf("%s\n", text.c_str());
  std::fflush(stdout);
}

}  // namespace tessera::bench

#endif  // TESSERA_TESTS_BENCH_BENCH_UTIL_H_
