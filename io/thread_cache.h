// Threads started once and used again: StartThread runs a function on an
// idle thread of the process's cache, or on a new one when none is idle,
// and a thread whose function returned waits (up to kIdleKeep) for the
// next instead of exiting.
//
// Why: a transfer run on a thread of its own (the Python client's
// interruptible calls, RunInParallel's workers, one thread per holder of a
// replicated write) created and joined that thread each time: 2,000 small
// writes from Python started 2,007 threads, each a clone3, a stack mapped
// and given back, on the critical path of the write.
//
// The thread that became idle last is taken first, so that a steady load
// keeps a few threads busy and lets the others expire.
//
// Every StartThread gets a thread at once (never queued behind other work), so
// work may start and wait for more work without deadlock, as with
// std::thread.
//
// Fork: a child forked while threads were cached has none of them; the
// child's first StartThread begins a new cache (the parent's idle threads are
// forgotten there, not signalled). The cache waits with the C library's
// mutexes, not absl::Mutex: absl's slow path measures the CPU's frequency
// once, under a spin lock, for milliseconds, and a child forked meanwhile
// hung at its first contended absl::Mutex.
//
// Thread-safety: StartThread, ThreadJob::Wait and ThreadJob::WaitFor may
// be called from any thread. A job is waited for by anyone holding it; its
// function's captures are destroyed before Wait returns, so the function may
// refer to the waiter's stack.
#ifndef TESSERA_IO_THREAD_CACHE_H_
#define TESSERA_IO_THREAD_CACHE_H_

#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>

#include "absl/functional/any_invocable.h"
#include "absl/time/time.h"

namespace tessera {

// How long an idle thread waits for work before it exits.
inline constexpr absl::Duration kIdleKeep = absl::Seconds(10);
// The most idle threads kept; more exit as soon as their work returned.
inline constexpr size_t kMaxIdleThreads = 64;

// One function started by StartThread.
class ThreadJob {
 public:
  // Blocks until the function returned and its captures were destroyed.
  void Wait();
  // Wait for at most `timeout`; whether it finished.
  bool WaitFor(absl::Duration timeout);

 private:
  friend class ThreadCacheAccess;
  void Finish();

  std::mutex mu_;
  std::condition_variable finished_;
  bool done_ = false;  // guarded by mu_
};

// Runs `work` on a cached thread (or a new one) and returns its job. Never
// fails: like std::thread, a process that cannot create a thread aborts.
std::shared_ptr<ThreadJob> StartThread(absl::AnyInvocable<void() &&> work);

// Threads the process's cache holds idle now (for tests and metrics).
size_t IdleCachedThreads();

}  // namespace tessera

#endif  // TESSERA_IO_THREAD_CACHE_H_
