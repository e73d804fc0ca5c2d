// StaleCopies: the copies on this daemon that missed a write, and the fence
// that keeps a daemon which may not know it yet from serving them
// (docs/control_log.md, "Replicas").
//
// A write to a tensor with copies goes to every holder of each piece. When
// one holder took a piece and another did not (stalled past the patience,
// cut off, refused), the writer does not fail: it marks the holder's copy
// stale in the store with Mark (a line "<token> <tensor id>" under the key
// stale/<rank>, changed by compare-and-set), and only returns once the
// fence has passed since. The holder learns its marks on a thread of its
// own that reads its key every `period`; it stops serving a marked tensor
// at once (CheckServe: UNAVAILABLE, so readers take another holder) and
// has it refilled (the `on_stale` callback), after which Refilled clears
// the marks it covered.
//
// The fence: a daemon serves copies of a tensor with copies (`replicated`)
// only while its last look at its marks started less than `fence` ago.
// A look that started after a mark was written sees it; one that started
// before is trusted for less than `fence`, and the writer waits `fence`
// after marking: so once a write returned, no holder that missed it serves
// the old bytes, even one that was stopped (SIGSTOP) when the write began
// and resumes just after (its looks are older than the fence; reads wait
// for a fresh one). A daemon that cannot reach the store stops serving
// copies of tensors with copies after the fence: reads of them wait for
// the store, up to their deadline (other tensors are not affected).
//
// Failure: Mark fails (the store's error, or RESOURCE_EXHAUSTED past
// `max_marks` outstanding marks of one holder) without a fence wait; the
// writer then fails the write naming the holders. CheckServe is UNAVAILABLE
// naming the rank and why (stale, or no look within the fence).
//
// Thread-safety: every method may be called from any thread. `on_stale`
// runs on the looking thread, outside the lock, and must not block (start
// the refill and return). Ownership: the Core owns it; it shares the store.
#ifndef TESSERA_SERVER_DAEMON_STALE_COPIES_H_
#define TESSERA_SERVER_DAEMON_STALE_COPIES_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "server/store/store.h"

namespace tessera::control_internal {

struct StaleCopiesOptions {
  // How long a look at the marks is trusted; what a writer waits after
  // marking.
  absl::Duration fence = absl::Seconds(2);
  // How often the marks are looked at (well under the fence).
  absl::Duration period = absl::Milliseconds(200);
  // Outstanding marks of one holder at most (a bound on the key's size).
  int max_marks = 4096;
  // The longest a read waits for a look (CheckServe), whatever its
  // deadline.
  absl::Duration max_wait = absl::Minutes(5);
};

class StaleCopies {
 public:
  StaleCopies(std::shared_ptr<Store> store, int rank,
              StaleCopiesOptions options = {});
  // Calls Stop().
  ~StaleCopies();
  StaleCopies(const StaleCopies&) = delete;
  StaleCopies& operator=(const StaleCopies&) = delete;

  // Starts looking at this daemon's marks. `on_stale(tensor_id)` is called
  // once per tensor newly marked (again after Refilled when it was marked
  // again meanwhile). `replicated(tensor_id)` says whether the fence
  // applies to a tensor id (an unversioned tensor with copies).
  void Start(std::function<void(const std::string& tensor_id)> on_stale,
             std::function<bool(absl::string_view tensor_id)> replicated);
  // Joins the looking thread. Idempotent.
  void Stop();

  // Marks the copies of `tensor_id` on each of `holders` stale, then waits
  // out the fence (bounded by `deadline`: DEADLINE_EXCEEDED when the
  // deadline comes first, the marks made).
  absl::Status Mark(absl::Span<const int> holders, const std::string& tensor_id,
                    absl::Time deadline);

  // Whether this daemon may serve its registration `id` (a tensor id, or
  // its copies' "<id>/replicas") now. A read: UNAVAILABLE while it is
  // marked stale; for a tensor with copies, waits (up to `deadline`, at
  // most max_wait) for a look at the marks that started within the fence:
  // while the store is unreachable, reads of copies wait for it (a stalled
  // store delays them; a reader's holder patience moves it on to the next
  // holder, which waits for the rest of its deadline).
  // A write over the data plane or the local path: FAILED_PRECONDITION
  // while it is marked stale (a stream routes it into the refill).
  absl::Status CheckServe(absl::string_view id, bool write,
                          absl::Time deadline);

  // The refill of `tensor_id` ended: on success the marks it covered (those
  // seen when it started) are cleared and the tensor is served again,
  // unless it was marked again meanwhile (then on_stale runs once more);
  // on failure it stays stale and is tried again after a fence.
  void Refilled(const std::string& tensor_id, bool ok);

  // Whether `tensor_id` is marked stale here (for tests and describe).
  bool Stale(absl::string_view tensor_id) const;

 private:
  // One look: reads the marks, starts what is newly marked.
  void Look();
  void Loop();
  // Removes `tokens` from this daemon's key.
  absl::Status Clear(const std::vector<std::string>& tokens);

  const std::shared_ptr<Store> store_;
  const int rank_;
  const StaleCopiesOptions options_;

  mutable absl::Mutex mu_;
  absl::CondVar changed_;
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  bool look_now_ ABSL_GUARDED_BY(mu_) = false;
  // When the last successful look started.
  absl::Time fresh_from_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // Tensors marked stale here: the tokens seen, and those its refill in
  // progress covers (empty: none running).
  struct State {
    absl::flat_hash_set<std::string> seen;
    std::vector<std::string> covered;
    bool refilling = false;
    absl::Time retry_at = absl::InfinitePast();
  };
  absl::flat_hash_map<std::string, State> stale_ ABSL_GUARDED_BY(mu_);
  std::function<void(const std::string&)> on_stale_;
  std::function<bool(absl::string_view)> replicated_;
  std::thread looker_;
};

}  // namespace tessera::control_internal

#endif  // TESSERA_SERVER_DAEMON_STALE_COPIES_H_
