// StallWatchdog: gives up on a transfer that moves no byte for a while.
// A read of a tensor with replicas may come from any holder of a shard;
// when the first one asked is stalled (SIGSTOPped, swapping, cut off
// behind a silent network), waiting for the read's whole deadline before
// asking the next is what makes a stalled owner expensive. The client
// (FetchFromHolders, client/cluster.h) watches each try but the last:
// every chunk that arrives counts as progress, and a try that shows none
// for its patience is cancelled (through its Cancellation, which
// interrupts whatever it waits on: a socket, an RPC) so the next holder is
// asked.
//
//   auto attempt = std::make_shared<Cancellation>();
//   std::unique_ptr<StallWatchdog::Watch> watch =
//       StallWatchdog::Process().Start(attempt, absl::Seconds(2));
//   options.cancel = attempt;
//   options.on_chunk = [&](int64_t) { watch->Progress(); };
//   ... the transfer ...
//   if (watch->fired()) ...   // it was cancelled for moving nothing
//
// One thread per process checks every watch each kTick (started on first
// use, alive until the process exits), so a stall is noticed within
// patience + kTick.
//
// Thread-safety: every method may be called from any thread; Progress is
// lock-free. A Watch's destructor unregisters it and returns only once no
// Cancel of it is running, so its Cancellation may be destroyed after it.
#ifndef TESSERA_CLIENT_STALL_WATCHDOG_H_
#define TESSERA_CLIENT_STALL_WATCHDOG_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <set>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/shard_client.h"
#include "common/cancellation.h"

namespace tessera {

class StallWatchdog {
 public:
  // How often the watches are checked.
  static constexpr absl::Duration kTick = absl::Milliseconds(50);

  class Watch {
   public:
    ~Watch();
    Watch(const Watch&) = delete;
    Watch& operator=(const Watch&) = delete;
    // Bytes moved: the patience counts again from now.
    void Progress();
    // Whether the watchdog cancelled the transfer.
    bool fired() const { return fired_.load(std::memory_order_acquire); }

   private:
    friend class StallWatchdog;
    Watch(StallWatchdog* owner, std::shared_ptr<Cancellation> cancel,
          absl::Duration patience);
    StallWatchdog* const owner_;
    const std::shared_ptr<Cancellation> cancel_;
    const absl::Duration patience_;
    std::atomic<int64_t> last_progress_ns_;
    std::atomic<bool> fired_{false};
  };

  // The process's watchdog.
  static StallWatchdog& Process();

  // Cancels `cancel` (not null) once `patience` (> 0) passes without a
  // Progress() of the returned watch, counted from now.
  std::unique_ptr<Watch> Start(std::shared_ptr<Cancellation> cancel,
                               absl::Duration patience);

 private:
  StallWatchdog() = default;
  // The thread's body: checks the watches each kTick while there are any.
  void Run();

  absl::Mutex mu_;
  std::set<Watch*> watches_ ABSL_GUARDED_BY(mu_);
  bool running_ ABSL_GUARDED_BY(mu_) = false;
};

// How long a read gives a holder of a replicated shard that moves nothing
// before it asks the next one: the client's default
// (ClientOptions::holder_patience) and the daemons' (ReadBoxInto).
inline constexpr absl::Duration kDefaultHolderPatience = absl::Seconds(2);

// Runs `fetch` with `options` whose cancellation and on_chunk are watched:
// cancelled when no chunk arrives for `patience`, and still by the
// caller's options.cancel. A patience of zero or less: `fetch(options)`,
// unwatched (the last holder a read can ask). When the watch gave up on it (and
// the caller did not cancel), DEADLINE_EXCEEDED "moved no byte for 2s (stalled,
// or cut off)" instead of what the interrupted fetch returned; else the fetch's
// status.
absl::Status FetchWatched(
    const FetchOptions& options, absl::Duration patience,
    absl::FunctionRef<absl::Status(const FetchOptions&)> fetch);

}  // namespace tessera

#endif  // TESSERA_CLIENT_STALL_WATCHDOG_H_
