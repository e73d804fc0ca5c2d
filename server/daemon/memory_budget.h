// A daemon's budget of host memory: every tensor shard it holds on the CPU,
// every staging buffer of a region read or write and every gathered tensor
// is reserved here before it is allocated, so that a request too big for
// what is left is refused (RESOURCE_EXHAUSTED, naming the request, the
// bytes asked and left) instead of being admitted and getting the daemon
// OOM-killed once its pages are touched. The store's values count through
// a fixed share set aside on the rank that serves it.
//
// Every daemon also holds every tensor's metadata (its shards' boxes and
// owners): an estimate of it is reserved with the tensor
// (tensor_table.h, EntryMetadataBytes), so that a create of millions of
// shards, which needs no shard memory, is refused like one of many bytes.
//
// The limit (tessera-server --memory-limit) defaults to DefaultMemoryLimit:
// the memory limit of the daemon's own cgroup, v1 or v2, the most
// restrictive of it and its ancestors (cgroup_memory.h), when the daemon
// runs under one (a systemd unit, a Kubernetes pod, a Slurm task: one
// daemon each), else the host's physical memory divided among the daemons
// of the host; less a reserve for the daemon's own code, threads and gRPC
// buffers (a tenth, at least 256 MiB, at most half).
//
// Memory a daemon keeps only to reuse it (a versioned tensor's spare
// version, version_set.h) stays reserved, and is given back on demand: a
// reservation that does not fit first asks every live Reclaimable to let
// go of its memory, then tries once more. A refusal then names the open
// versions that hold memory until their lease ends, and how to free one
// that a writer which died left behind.
//
// Thread-safety: every method may be called from any thread. A Reservation
// is movable, owned by one holder, and gives its bytes back when destroyed
// (it keeps its budget alive).
#ifndef TESSERA_SERVER_DAEMON_MEMORY_BUDGET_H_
#define TESSERA_SERVER_DAEMON_MEMORY_BUDGET_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tessera {

class MemoryBudget : public std::enable_shared_from_this<MemoryBudget> {
 public:
  class Reservation {
   public:
    Reservation() = default;
    Reservation(Reservation&& other) noexcept
        : budget_(std::move(other.budget_)), bytes_(other.bytes_) {
      other.bytes_ = 0;
    }
    Reservation& operator=(Reservation&& other) noexcept {
      if (this != &other) {
        Release();
        budget_ = std::move(other.budget_);
        bytes_ = other.bytes_;
        other.bytes_ = 0;
      }
      return *this;
    }
    ~Reservation() { Release(); }

    int64_t bytes() const { return bytes_; }
    // The budget the bytes are reserved in; null once released.
    const std::shared_ptr<MemoryBudget>& budget() const { return budget_; }
    // Gives the bytes back now.
    void Release();

   private:
    friend class MemoryBudget;
    Reservation(std::shared_ptr<MemoryBudget> budget, int64_t bytes)
        : budget_(std::move(budget)), bytes_(bytes) {}

    std::shared_ptr<MemoryBudget> budget_;
    int64_t bytes_ = 0;
  };

  // `limit` bytes; `name` says where it comes from in messages ("--memory-
  // limit", "the cgroup limit"...).
  static std::shared_ptr<MemoryBudget> Create(int64_t limit,
                                              std::string source);

  int64_t limit() const { return limit_; }
  int64_t used() const { return used_.load(std::memory_order_relaxed); }
  const std::string& source() const { return source_; }

  // Reserves `bytes` (>= 0) for `what`, or RESOURCE_EXHAUSTED saying what
  // asked for how much and how much is left of the limit (after every
  // Reclaimable gave back what it could).
  absl::StatusOr<Reservation> Reserve(int64_t bytes, absl::string_view what);
  // Reserves `bytes` (>= 0; a negative count reserves none) whether or not
  // they fit: memory this daemon must hold whatever is left (the cluster's
  // metadata on a daemon that rejoins it). used() may then pass limit(),
  // and Reserves are refused until enough is given back.
  Reservation Charge(int64_t bytes);

  // Something holding reserved memory it can drop on demand. Reclaim runs
  // on the thread of the Reserve that did not fit, with no lock of the
  // budget held, and returns the bytes it gave back.
  class Reclaimable {
   public:
    virtual ~Reclaimable() = default;
    virtual int64_t Reclaim() = 0;
    // The reserved bytes Reclaim would give back now.
    virtual int64_t KeptBytes() const = 0;
    // What it also holds reserved, not for reuse, until a lease ends
    // (versions a writer opened and has not published, version_set.h): a
    // refusal names them, as a writer that died holds its version until
    // then. Asked as Reclaim is; none by default.
    struct Leased {
      std::string label;  // How a client names it ("w@5": join's id)
      int64_t bytes = 0;
      absl::Time lease_end;
    };
    virtual std::vector<Leased> LeasedNow() const { return {}; }
  };
  // Asks `reclaimable` from now on, for as long as it lives (held weakly).
  void AddReclaimable(std::weak_ptr<Reclaimable> reclaimable);
  // The bytes of used() that every live Reclaimable keeps only for reuse
  // (the tessera_memory_kept_for_reuse_bytes gauge). Asks each outside
  // the budget's lock, as Reserve does.
  int64_t kept_for_reuse() const;

 private:
  MemoryBudget(int64_t limit, std::string source)
      : limit_(limit), source_(std::move(source)) {}
  // Reserve without reclaiming: false when `bytes` do not fit.
  bool TryReserve(int64_t bytes);
  // For a refusal: "; versions opened and not yet published hold ..." naming
  // the largest that every live Reclaimable leases, or "" when none does.
  std::string LeasedNote() const;
  // The Reclaimables still alive, held strongly, for asking each outside
  // reclaimables_mu_ (giving memory back releases reservations).
  std::vector<std::shared_ptr<Reclaimable>> LiveReclaimables() const;

  const int64_t limit_;
  const std::string source_;
  std::atomic<int64_t> used_{0};
  mutable absl::Mutex reclaimables_mu_;
  std::vector<std::weak_ptr<Reclaimable>> reclaimables_
      ABSL_GUARDED_BY(reclaimables_mu_);
};

// The host's physical memory in bytes.
int64_t PhysicalMemoryBytes();
// The default limit described above, for a daemon among
// `local_world_size` on its host (0: unknown, taken as 1); `source` is set
// to where it came from.
int64_t DefaultMemoryLimit(int local_world_size, std::string* source);

}  // namespace tessera

#endif  // TESSERA_SERVER_DAEMON_MEMORY_BUDGET_H_
