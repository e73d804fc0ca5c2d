#include "client/stall_watchdog.h"

#include <functional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace tessera {
namespace {

int64_t NowNs() { return absl::GetCurrentTimeNanos(); }

}  // namespace

StallWatchdog::Watch::Watch(StallWatchdog* owner,
                            std::shared_ptr<Cancellation> cancel,
                            absl::Duration patience)
    : owner_(owner),
      cancel_(std::move(cancel)),
      patience_(patience),
      last_progress_ns_(NowNs()) {}

StallWatchdog::Watch::~Watch() {
  absl::MutexLock lock(&owner_->mu_);
  owner_->watches_.erase(this);
}

void StallWatchdog::Watch::Progress() {
  last_progress_ns_.store(NowNs(), std::memory_order_relaxed);
}

StallWatchdog& StallWatchdog::Process() {
  // Never destroyed: its thread may outlive main's return.
  static StallWatchdog* const watchdog = new StallWatchdog();
  return *watchdog;
}

std::unique_ptr<StallWatchdog::Watch> StallWatchdog::Start(
    std::shared_ptr<Cancellation> cancel, absl::Duration patience) {
  std::unique_ptr<Watch> watch(new Watch(this, std::move(cancel), patience));
  absl::MutexLock lock(&mu_);
  watches_.insert(watch.get());
  if (!running_) {
    running_ = true;
    std::thread([this] { Run(); }).detach();
  }
  return watch;
}

void StallWatchdog::Run() {
  mu_.Lock();
  for (;;) {
    // Idle (no watches): sleep until one is started.
    mu_.Await(absl::Condition(
        +[](std::set<Watch*>* watches) { return !watches->empty(); },
        &watches_));
    mu_.Unlock();
    absl::SleepFor(kTick);
    mu_.Lock();
    const int64_t now = NowNs();
    for (Watch* watch : watches_) {
      if (watch->fired()) continue;
      const int64_t quiet =
          now - watch->last_progress_ns_.load(std::memory_order_relaxed);
      if (quiet < absl::ToInt64Nanoseconds(watch->patience_)) continue;
      watch->fired_.store(true, std::memory_order_release);
      // Under mu_, so that the Watch (and its Cancellation) outlive it.
      watch->cancel_->Cancel();
    }
  }
}

absl::Status FetchWatched(
    const FetchOptions& options, absl::Duration patience,
    absl::FunctionRef<absl::Status(const FetchOptions&)> fetch) {
  if (patience <= absl::ZeroDuration()) return fetch(options);
  FetchOptions watched = options;
  // Declared in this order so that the watch and the link to the caller's
  // cancellation end before this try's cancellation does.
  const auto cancel = std::make_shared<Cancellation>();
  const Cancellation::Registration follow =
      OnCancel(options.cancel, [cancel] { cancel->Cancel(); });
  const std::unique_ptr<StallWatchdog::Watch> watch =
      StallWatchdog::Process().Start(cancel, patience);
  watched.cancel = cancel;
  StallWatchdog::Watch* const watching = watch.get();
  const std::function<void(int64_t)>& caller_on_chunk = options.on_chunk;
  watched.on_chunk = [watching, &caller_on_chunk](int64_t bytes) {
    watching->Progress();
    if (caller_on_chunk) caller_on_chunk(bytes);
  };
  absl::Status status = fetch(watched);
  if (!status.ok() && watch->fired() && !Cancelled(options.cancel)) {
    return absl::DeadlineExceededError(
        absl::StrCat("moved no byte for ", absl::FormatDuration(patience),
                     " (stalled, or cut off)"));
  }
  return status;
}

}  // namespace tessera
