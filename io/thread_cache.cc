#include "io/thread_cache.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace tessera {

// What a cached thread runs next; owned by its thread.
struct CachedThread {
  absl::AnyInvocable<void() &&> work;
  std::shared_ptr<ThreadJob> job;
  bool has_work = false;  // guarded by the cache's mutex while idle
  std::condition_variable wake;
};

class ThreadCacheAccess {
 public:
  static void Finish(ThreadJob& job) { job.Finish(); }
};

namespace {

class Cache {
 public:
  std::shared_ptr<ThreadJob> Start(absl::AnyInvocable<void() &&> work) {
    auto job = std::make_shared<ThreadJob>();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!idle_.empty()) {
        CachedThread* thread = idle_.back();
        idle_.pop_back();
        thread->work = std::move(work);
        thread->job = job;
        thread->has_work = true;
        thread->wake.notify_one();
        return job;
      }
    }
    auto* thread = new CachedThread;
    thread->work = std::move(work);
    thread->job = job;
    std::thread([this, thread] { Loop(thread); }).detach();
    return job;
  }

  size_t idle() {
    std::lock_guard<std::mutex> lock(mu_);
    return idle_.size();
  }

 private:
  void Loop(CachedThread* thread) {
    for (;;) {
      std::move(thread->work)();
      thread->work = nullptr;  // its captures go before the job finishes
      std::shared_ptr<ThreadJob> job = std::move(thread->job);
      ThreadCacheAccess::Finish(*job);
      job.reset();
      std::unique_lock<std::mutex> lock(mu_);
      if (idle_.size() >= kMaxIdleThreads) break;
      idle_.push_back(thread);
      thread->wake.wait_for(lock, absl::ToChronoSeconds(kIdleKeep),
                            [thread] { return thread->has_work; });
      if (!thread->has_work) {
        idle_.erase(std::find(idle_.begin(), idle_.end(), thread));
        break;
      }
      thread->has_work = false;
    }
    delete thread;
  }

  std::mutex mu_;
  std::vector<CachedThread*> idle_;  // guarded by mu_
};

std::atomic<Cache*> process_cache{nullptr};

// In a forked child the parent's threads are gone: a new cache, the old
// one left as it was (its mutex may be held by a thread that is not here).
void ForgetInChild() { process_cache.store(nullptr); }

Cache& ProcessCache() {
  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(nullptr, nullptr, ForgetInChild); });
  Cache* cache = process_cache.load();
  if (cache != nullptr) return *cache;
  auto* fresh = new Cache;  // never destroyed: its threads may outlive main
  if (!process_cache.compare_exchange_strong(cache, fresh)) {
    delete fresh;
    return *cache;
  }
  return *fresh;
}

}  // namespace

void ThreadJob::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  finished_.wait(lock, [this] { return done_; });
}

bool ThreadJob::WaitFor(absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return finished_.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                            [this] { return done_; });
}

void ThreadJob::Finish() {
  std::lock_guard<std::mutex> lock(mu_);
  done_ = true;
  finished_.notify_all();
}

std::shared_ptr<ThreadJob> StartThread(absl::AnyInvocable<void() &&> work) {
  return ProcessCache().Start(std::move(work));
}

size_t IdleCachedThreads() { return ProcessCache().idle(); }

}  // namespace tessera
