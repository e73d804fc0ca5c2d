#include "client/cli/prometheus_text.h"

#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace tessera::cli {
namespace {

bool ParseValue(absl::string_view text, double* value) {
  if (text == "+Inf" || text == "Inf") {
    *value = std::numeric_limits<double>::infinity();
    return true;
  }
  if (text == "-Inf") {
    *value = -std::numeric_limits<double>::infinity();
    return true;
  }
  if (text == "NaN") {
    *value = std::numeric_limits<double>::quiet_NaN();
    return true;
  }
  return absl::SimpleAtod(text, value);
}

// Reads `{a="1",b="x\"y"}` from the front of `rest` into `labels`.
bool ParseLabels(absl::string_view* rest,
                 std::map<std::string, std::string>* labels) {
  rest->remove_prefix(1);  // '{'
  while (true) {
    *rest = absl::StripLeadingAsciiWhitespace(*rest);
    if (absl::ConsumePrefix(rest, "}")) return true;
    const size_t eq = rest->find('=');
    if (eq == absl::string_view::npos) return false;
    std::string name(absl::StripAsciiWhitespace(rest->substr(0, eq)));
    rest->remove_prefix(eq + 1);
    if (!absl::ConsumePrefix(rest, "\"")) return false;
    std::string value;
    while (true) {
      if (rest->empty()) return false;
      const char c = rest->front();
      rest->remove_prefix(1);
      if (c == '"') break;
      if (c == '\\' && !rest->empty()) {
        const char escaped = rest->front();
        rest->remove_prefix(1);
        value.push_back(escaped == 'n' ? '\n' : escaped);
      } else {
        value.push_back(c);
      }
    }
    (*labels)[std::move(name)] = std::move(value);
    *rest = absl::StripLeadingAsciiWhitespace(*rest);
    absl::ConsumePrefix(rest, ",");
  }
}

bool Matches(const MetricSample& sample,
             const std::map<std::string, std::string>& match) {
  for (const auto& [name, value] : match) {
    auto found = sample.labels.find(name);
    if (found == sample.labels.end() || found->second != value) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::vector<MetricSample>> ParsePrometheusText(
    absl::string_view text) {
  std::vector<MetricSample> samples;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line.front() == '#') continue;
    MetricSample sample;
    absl::string_view rest = line;
    const size_t name_end = rest.find_first_of("{ \t");
    if (name_end == 0 || name_end == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("metrics line ", number, " is not a sample: ", line));
    }
    sample.name = std::string(rest.substr(0, name_end));
    rest.remove_prefix(name_end);
    if (!rest.empty() && rest.front() == '{' &&
        !ParseLabels(&rest, &sample.labels)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "metrics line ", number, " has malformed labels: ", line));
    }
    std::vector<absl::string_view> fields =
        absl::StrSplit(rest, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (fields.empty() || fields.size() > 2 ||
        !ParseValue(fields[0], &sample.value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("metrics line ", number, " has no value: ", line));
    }
    samples.push_back(std::move(sample));
  }
  return samples;
}

double SumOf(const std::vector<MetricSample>& samples, absl::string_view name,
             const std::map<std::string, std::string>& match) {
  double sum = 0;
  for (const MetricSample& sample : samples) {
    if (sample.name == name && Matches(sample, match)) sum += sample.value;
  }
  return sum;
}

std::map<double, double> BucketsOf(
    const std::vector<MetricSample>& samples, absl::string_view name,
    const std::map<std::string, std::string>& match) {
  const std::string bucket = absl::StrCat(name, "_bucket");
  std::map<double, double> buckets;
  for (const MetricSample& sample : samples) {
    if (sample.name != bucket || !Matches(sample, match)) continue;
    auto le = sample.labels.find("le");
    double bound = 0;
    if (le == sample.labels.end() || !ParseValue(le->second, &bound)) continue;
    buckets[bound] += sample.value;
  }
  return buckets;
}

double HistogramQuantile(const std::map<double, double>& buckets, double q) {
  if (buckets.empty()) return -1;
  const double total = buckets.rbegin()->second;
  if (total <= 0) return -1;
  const double rank = q * total;
  double lower = 0;
  double below = 0;
  for (const auto& [bound, count] : buckets) {
    if (count >= rank) {
      // The top bucket has no upper bound: its lower one is the answer.
      if (std::isinf(bound)) return lower;
      const double in_bucket = count - below;
      if (in_bucket <= 0) return bound;
      return lower + (bound - lower) * (rank - below) / in_bucket;
    }
    lower = bound;
    below = count;
  }
  return lower;
}

}  // namespace tessera::cli
