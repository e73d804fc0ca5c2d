// A one-line progress bar for long transfers, redrawn in place ('\r') on a
// terminal:
//
//   fetch w  [=============>          ]  58%  37.1 MiB / 64.0 MiB  212.4 MiB/s
//
// Fed by TransferOptions::progress (client/client.h). Transfers smaller
// than a threshold draw nothing, so quick commands stay quiet.
//
// Thread-safety: Update may be called from any thread (the client calls it
// from transfer threads, one call at a time); Finish from the thread that
// started the transfer once it returned.
#ifndef TESSERA_CLIENT_CLI_PROGRESS_BAR_H_
#define TESSERA_CLIENT_CLI_PROGRESS_BAR_H_

#include <cstdint>
#include <ostream>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/client.h"

namespace tessera::cli {

// The bar's text for `done` of `total` bytes after `elapsed` (no '\r', no
// newline). The rate is left out until some time has passed.
std::string FormatProgressLine(absl::string_view label, int64_t done,
                               int64_t total, absl::Duration elapsed);

class ProgressBar {
 public:
  // Transfers of fewer bytes than this draw nothing.
  static constexpr int64_t kDefaultMinBytes = int64_t{4} << 20;

  // Draws on `out` (not owned; must outlive the bar) when `enabled`.
  ProgressBar(std::ostream& out, std::string label, bool enabled,
              int64_t min_bytes = kDefaultMinBytes);
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  bool enabled() const { return enabled_; }

  // Redraws at most ten times a second, and always when done == total.
  void Update(int64_t done, int64_t total) ABSL_LOCKS_EXCLUDED(mu_);

  // A ProgressFn calling Update; the bar must outlive every call.
  ProgressFn Callback();

  // Ends the bar's line, if one was drawn (also after a failed transfer).
  void Finish() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  std::ostream& out_;
  const std::string label_;
  const bool enabled_;
  const int64_t min_bytes_;
  const absl::Time start_;

  absl::Mutex mu_;
  bool drawn_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time last_draw_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  size_t last_width_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tessera::cli

#endif  // TESSERA_CLIENT_CLI_PROGRESS_BAR_H_
