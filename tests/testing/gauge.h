// A gauge's value in a daemon's metrics text (v1::DaemonStats.metrics,
// Prometheus' text format), for tests that watch one.
#ifndef TESSERA_TESTS_TESTING_GAUGE_H_
#define TESSERA_TESTS_TESTING_GAUGE_H_

#include <cstdint>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace tessera::testing {

// The value of the first sample of gauge `name` (a line "name value" or
// "name{labels} value"); -1 when there is none or it does not parse.
inline int64_t GaugeValue(absl::string_view metrics, absl::string_view name) {
  for (absl::string_view line : absl::StrSplit(metrics, '\n')) {
    if (!absl::StartsWith(line, name) || line.size() == name.size()) continue;
    const char next = line[name.size()];
    if (next != ' ' && next != '{') continue;
    double value = 0;
    if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &value)) {
      return static_cast<int64_t>(value);
    }
  }
  return -1;
}

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TESTING_GAUGE_H_
