#include "client/cli/progress_bar.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli/table.h"

namespace tessera::cli {
namespace {

constexpr int kBarWidth = 24;
constexpr absl::Duration kRedrawInterval = absl::Milliseconds(100);
// A rate over less time than this is noise.
constexpr absl::Duration kMinRateTime = absl::Milliseconds(200);

}  // namespace

std::string FormatProgressLine(absl::string_view label, int64_t done,
                               int64_t total, absl::Duration elapsed) {
  const double fraction =
      total > 0
          ? std::clamp(static_cast<double>(done) / static_cast<double>(total),
                       0.0, 1.0)
          : 1.0;
  const int filled = static_cast<int>(fraction * kBarWidth);
  std::string bar(static_cast<size_t>(filled), '=');
  if (filled < kBarWidth) {
    bar.push_back('>');
    bar.append(static_cast<size_t>(kBarWidth - filled - 1), ' ');
  }
  std::string line = absl::StrFormat("%s  [%s] %3d%%  %s / %s", label, bar,
                                     static_cast<int>(fraction * 100),
                                     FormatBytes(done), FormatBytes(total));
  if (elapsed >= kMinRateTime) {
    const double rate =
        static_cast<double>(done) / absl::ToDoubleSeconds(elapsed);
    absl::StrAppend(&line, "  ", FormatBytes(static_cast<int64_t>(rate)), "/s");
  }
  return line;
}

ProgressBar::ProgressBar(std::ostream& out, std::string label, bool enabled,
                         int64_t min_bytes)
    : out_(out),
      label_(std::move(label)),
      enabled_(enabled),
      min_bytes_(min_bytes),
      start_(absl::Now()) {}

void ProgressBar::Update(int64_t done, int64_t total) {
  if (!enabled_ || total < min_bytes_) return;
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  if (finished_) return;
  if (done < total && now - last_draw_ < kRedrawInterval) return;
  last_draw_ = now;
  std::string line = FormatProgressLine(label_, done, total, now - start_);
  // Blank out what a longer previous line left.
  const size_t width = line.size();
  if (width < last_width_) line.append(last_width_ - width, ' ');
  last_width_ = width;
  out_ << '\r' << line << std::flush;
  drawn_ = true;
}

ProgressFn ProgressBar::Callback() {
  return [this](int64_t done, int64_t total) { Update(done, total); };
}

void ProgressBar::Finish() {
  absl::MutexLock lock(&mu_);
  if (finished_) return;
  finished_ = true;
  if (drawn_) out_ << '\n' << std::flush;
}

}  // namespace tessera::cli
