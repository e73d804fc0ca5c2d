// A reader of Prometheus' text exposition format (version 0.0.4), the
// format of a daemon's metrics (GetStats, --metrics-port), for `tessera
// top`.
//
// Thread-safety: values; no shared state.
#ifndef TESSERA_CLIENT_CLI_PROMETHEUS_TEXT_H_
#define TESSERA_CLIENT_CLI_PROMETHEUS_TEXT_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tessera::cli {

struct MetricSample {
  std::string name;  // With its suffix: "tessera_transfer_seconds_bucket".
  std::map<std::string, std::string> labels;
  double value = 0;
};

// Every sample of `text`; comments and blank lines are skipped.
// INVALID_ARGUMENT naming the line for one that is not a sample.
absl::StatusOr<std::vector<MetricSample>> ParsePrometheusText(
    absl::string_view text);

// The sum of the samples named `name` whose labels include every one of
// `match`; 0 when none does.
double SumOf(const std::vector<MetricSample>& samples, absl::string_view name,
             const std::map<std::string, std::string>& match = {});

// The `q` quantile (0 < q < 1) of the histogram whose cumulative bucket
// counts are `buckets` (upper bound -> count, +Inf included), interpolated
// within its bucket as Prometheus' histogram_quantile does; -1 when it
// holds no observations.
double HistogramQuantile(const std::map<double, double>& buckets, double q);

// The buckets of histogram `name` (without "_bucket") over the samples
// matching `match`, summed across the other labels.
std::map<double, double> BucketsOf(
    const std::vector<MetricSample>& samples, absl::string_view name,
    const std::map<std::string, std::string>& match = {});

}  // namespace tessera::cli

#endif  // TESSERA_CLIENT_CLI_PROMETHEUS_TEXT_H_
