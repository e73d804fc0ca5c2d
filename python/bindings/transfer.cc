// Transfers from Python (support.h): the GIL released while bytes move,
// Ctrl-C and progress callbacks honoured every 50 ms, the transfer
// cancelled (and waited for) when a signal handler raises.
#include <algorithm>
#include <utility>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "io/thread_cache.h"
#include "python/bindings/support.h"

namespace tessera::python {
namespace {

// Transfers at least this large, or watched by a progress bar, run on
// another thread (Interruptible); smaller reads run on the caller's
// thread first (kInlineSlice).
constexpr int64_t kThreadedBytes = int64_t{1} << 20;
// How long a small read runs on the caller's thread before it is started
// again interruptibly (a read is idempotent): the most a Ctrl-C waits for.
constexpr absl::Duration kInlineSlice = absl::Milliseconds(200);

// Runs `work` (which must not touch Python) on a cached thread
// (io/thread_cache.h) while this thread, the GIL released, waits for it in
// slices of 50 ms; between
// them it runs Python's signal handlers (Ctrl-C raises KeyboardInterrupt
// there) and calls `progress(done, total)` when given. When a handler
// raises, `cancel` is cancelled, which interrupts the work even where it
// waits on a stalled daemon; it is waited for and the Python exception
// propagates.
absl::Status Interruptible(const std::function<absl::Status()>& work,
                           const std::shared_ptr<Cancellation>& cancel,
                           const std::shared_ptr<std::atomic<int64_t>>& done,
                           int64_t total, const py::object& progress) {
  absl::Status result;
  const std::shared_ptr<ThreadJob> job = StartThread([&] { result = work(); });
  const auto join = [&] {
    py::gil_scoped_release release;
    job->Wait();
  };
  try {
    while (true) {
      bool ready;
      {
        py::gil_scoped_release release;
        ready = job->WaitFor(absl::Milliseconds(50));
      }
      if (!progress.is_none()) progress(done->load(), total);
      if (ready) break;
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    }
  } catch (...) {
    cancel->Cancel();
    join();
    throw;
  }
  return result;
}

}  // namespace

TransferOptions Transfer(double timeout_seconds) {
  TransferOptions options;
  if (timeout_seconds > 0) options.timeout = absl::Seconds(timeout_seconds);
  return options;
}

PyTransfer::PyTransfer(double timeout_seconds, int64_t bytes,
                       py::object progress)
    : bytes_(bytes),
      progress_(std::move(progress)),
      options_(Transfer(timeout_seconds)) {
  options_.cancel = cancel_;
  if (threaded()) {
    // Counting costs a lock per chunk: only watched transfers count.
    options_.progress = [done = done_](int64_t moved, int64_t) {
      done->store(moved);
    };
  }
}

absl::Status PyTransfer::Run(
    const std::function<absl::Status(const TransferOptions&)>& work,
    bool idempotent) {
  if (!threaded() && idempotent) {
    const absl::Time deadline = absl::Now() + options_.timeout;
    TransferOptions first = options_;
    first.timeout = std::min(options_.timeout, kInlineSlice);
    const absl::Status status = WithoutGil([&] { return work(first); });
    if (!absl::IsDeadlineExceeded(status) ||
        first.timeout == options_.timeout) {
      return status;
    }
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    options_.timeout = std::max(deadline - absl::Now(), absl::ZeroDuration());
  }
  return Interruptible([&] { return work(options_); }, cancel_, done_, bytes_,
                       progress_);
}

bool PyTransfer::threaded() const {
  return bytes_ >= kThreadedBytes || !progress_.is_none();
}

}  // namespace tessera::python
