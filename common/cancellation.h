// Cancellation: a caller's request that work in progress stop, which also
// wakes the work where it waits. C++17 has no std::stop_source /
// std::stop_callback; this is that pair, for transfers:
//
//   auto cancel = std::make_shared<Cancellation>();
//   options.cancel = cancel;             // the transfer checks cancelled()
//   ...                                  // between its chunks, and while it
//   cancel->Cancel();                    // waits on a socket or an RPC it
//                                        // holds a Registration whose
//                                        // callback interrupts that wait
//
// A transfer blocked on a stalled peer therefore ends at once on Cancel,
// not at its deadline.
//
// Thread-safety: every method may be called from any thread. Callbacks run
// on the thread that calls Cancel (or, when already cancelled, on the one
// that registers), under the cancellation's lock: they must be short and
// must not register or cancel. A Registration's destructor waits for its
// callback when it is running, so what the callback touches (a socket, an
// RPC context) may be destroyed right after the Registration.
#ifndef TESSERA_COMMON_CANCELLATION_H_
#define TESSERA_COMMON_CANCELLATION_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace tessera {

class Cancellation {
 public:
  // Keeps a callback registered while it lives (movable; empty when
  // default-made or moved from).
  class Registration {
   public:
    Registration() = default;
    Registration(Registration&& other) noexcept;
    Registration& operator=(Registration&& other) noexcept;
    Registration(const Registration&) = delete;
    Registration& operator=(const Registration&) = delete;
    ~Registration() { Reset(); }
    // Unregisters now (waits for the callback when it is running).
    void Reset();

   private:
    friend class Cancellation;
    Registration(Cancellation* owner, int64_t id) : owner_(owner), id_(id) {}
    Cancellation* owner_ = nullptr;
    int64_t id_ = 0;
  };

  Cancellation() = default;
  Cancellation(const Cancellation&) = delete;
  Cancellation& operator=(const Cancellation&) = delete;
  // Every Registration must have been destroyed first.
  ~Cancellation() = default;

  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }
  // Marks it cancelled and runs every registered callback once. Later
  // calls do nothing.
  void Cancel();
  // Runs `on_cancel` when Cancel is called while the registration lives;
  // at once (on this thread) when it already was.
  Registration OnCancel(std::function<void()> on_cancel);

 private:
  std::atomic<bool> cancelled_{false};
  absl::Mutex mu_;
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<int64_t, std::function<void()>> callbacks_ ABSL_GUARDED_BY(mu_);
};

// For optional cancellations (null: never cancelled).
inline bool Cancelled(const std::shared_ptr<Cancellation>& cancel) {
  return cancel != nullptr && cancel->cancelled();
}
inline Cancellation::Registration OnCancel(
    const std::shared_ptr<Cancellation>& cancel,
    std::function<void()> on_cancel) {
  if (cancel == nullptr) return {};
  return cancel->OnCancel(std::move(on_cancel));
}

}  // namespace tessera

#endif  // TESSERA_COMMON_CANCELLATION_H_
