// VersionSet: the versions of one versioned tensor on one daemon
// (docs/versions.md): its published versions still kept, the versions
// begun and not yet published (open), and the pins that keep old versions
// readable.
//
// Every version is a ShardedTensor of its own, registered under its own id
// (version 1, the tensor as created, under the tensor's id; version n
// under VersionId(tensor id, n)), holding this daemon's shards of it and
// their share of the memory budget. Publishing a version copies nothing:
// it tells the registry that the tensor's id now reads that version
// (ShardRegistry::PublishVersion), then frees the published versions
// beyond the `kept` newest that no pin holds. Freeing a version drops its
// registration; a fetch already serving it keeps its bytes alive until it
// ends. A replicated tensor's versions each hold this daemon's copies of
// other daemons' shards too (ReplicaCopies, registered under
// ReplicaTensorId(version id)), published and freed with the version: the
// registry maps ReplicaTensorId(tensor id) to the latest published copies
// as it maps the tensor's id.
//
// Reuse: the memory of a freed version (trimmed, aborted or expired) is
// kept as the set's one spare, reserved in the budget as before, and the
// next Open takes it (TakeSpare) instead of allocating: a writer that
// publishes every step fills the same pages each time, which stay mapped
// and warm on both ends, instead of faulting in fresh ones. A spare is
// reused only when nothing else holds its memory (no fetch or lease of the
// freed version is still running, nothing lent it past a lease:
// Storage::reusable); it holds this daemon's CPU shards of a version
// without copies of others' shards. The budget takes a spare back when a
// reservation would not fit otherwise (MemoryBudget::Reclaimable); a
// newer spare replaces an older one; the set's end frees it.
//
// Numbers: the control ops (control_ops.h) change a set only from the
// executor thread, after every daemon agreed, so every daemon numbers the
// versions alike: version 1 at create, then next() for each Open. Leases
// (open versions and pins) expire on each daemon by its own clock
// (Expire): an expired open version can no longer be published (a publish
// naming it fails on every daemon, since one of them refuses it), and an
// expired pin stops keeping its version.
//
// Thread-safety: every method may be called from any thread (one lock).
// Ownership: shared by the tensor's table entry (tensor_table.h) and the
// op running on it; destroying the set forgets the tensor's versions in
// the registry and frees every version it holds.
#ifndef TESSERA_SERVER_DAEMON_VERSION_SET_H_
#define TESSERA_SERVER_DAEMON_VERSION_SET_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/daemon/memory_budget.h"
#include "server/daemon/replica_copies.h"
#include "server/rank/rank.h"
#include "server/sharded/sharded_tensor.h"
#include "tessera/v1/control.pb.h"

namespace tessera::control_internal {

// The most published versions a tensor may keep.
inline constexpr int kMaxKeptVersions = 64;

class VersionSet : public MemoryBudget::Reclaimable,
                   public std::enable_shared_from_this<VersionSet> {
 public:
  // The versions of tensor `name`, registered as `tensor_id`, keeping the
  // `kept` newest published ones (at least 1).
  VersionSet(std::shared_ptr<Rank> rank, std::string name,
             std::string tensor_id, int kept);
  ~VersionSet() override;
  VersionSet(const VersionSet&) = delete;
  VersionSet& operator=(const VersionSet&) = delete;

  const std::string& tensor_id() const { return tensor_id_; }
  // The latest published version's number.
  int64_t latest() const;
  // The number the next Open takes.
  int64_t next() const;
  // The latest published version's tensor.
  ShardedTensor Latest() const;
  // Version `number`'s tensor, published and kept: NOT_FOUND naming the
  // kept ones otherwise (`name` is the tensor's, for the message).
  absl::StatusOr<ShardedTensor> Published(const std::string& name,
                                          int64_t number) const;

  // Version 1: the tensor as created (registered under tensor_id()).
  void AddFirst(ShardedTensor tensor, MemoryBudget::Reservation held);
  // Published version `number`, kept (a restarted daemon's refill of the
  // versions the others hold: `tensor` is registered under tensor_id() for
  // 1, VersionId otherwise); the latest when it is the highest so far.
  // Numbers from then on start at `next` or above.
  void AddPublished(int64_t number, ShardedTensor tensor,
                    std::shared_ptr<ReplicaCopies> copies,
                    MemoryBudget::Reservation held, int64_t next);
  // Hands published version `number` this daemon's copies of others'
  // shards (registered under ReplicaTensorId of its id): version 1's,
  // replicated after create. Dropped when that version is not kept.
  void SetCopies(int64_t number, std::shared_ptr<ReplicaCopies> copies);
  // Opens version next() with `tensor` (registered under its version id)
  // and this daemon's `copies` of others' shards of it (null when it holds
  // none), until `lease_end`; returns its number. A positive `renewal`:
  // its writer renews the lease (Renew), each renewal ending it `renewal`
  // later.
  int64_t Open(ShardedTensor tensor, std::shared_ptr<ReplicaCopies> copies,
               MemoryBudget::Reservation held, absl::Time lease_end,
               absl::Duration renewal = absl::ZeroDuration());
  // OK when version `number` is open: FAILED_PRECONDITION otherwise,
  // saying whether it was published, dropped or never begun.
  absl::Status CheckOpen(const std::string& name, int64_t number) const;
  // CheckOpen, and on success keeps `number` from expiring until Publish
  // or Unclaim: a publish op claims what it checked before the daemons
  // agree, so that no daemon drops a version the others publish.
  absl::Status Claim(const std::string& name, int64_t number);
  void Unclaim(int64_t number);
  // Publishes open version `number` (claimed): the latest from now on,
  // read-only; frees what it pushes beyond the kept versions.
  void Publish(int64_t number);
  // Drops open version `number`, if open.
  void Abort(int64_t number);
  // Keeps published version `number` readable until `until` or Unpin;
  // with a positive `renewal`, RenewPin moves `until` to `renewal` from
  // the renewal.
  void Pin(const std::string& pin, int64_t number, absl::Time until,
           absl::Duration renewal = absl::ZeroDuration());
  // Renews open version `number`'s lease, when it was opened with a
  // renewal: it ends no sooner than `now` + that renewal (a renewal never
  // shortens a lease). False when `number` is not open.
  bool Renew(int64_t number, absl::Time now);
  // The same for `pin`; false when this set holds no such pin.
  bool RenewPin(const std::string& pin, absl::Time now);
  // Moves the ends of the renewed leases `stalled` later: this daemon did
  // not run for that long (VersionLeases), so their holders could not
  // renew them here.
  void Postpone(absl::Duration stalled);
  // Releases `pin`; false when this set holds no such pin.
  bool Unpin(const std::string& pin);
  // The pins held, by id: the version each keeps and until when.
  struct PinState {
    std::string id;
    int64_t number = 0;
    absl::Time until;
    // Positive: renewed by its holder (RenewPin).
    absl::Duration renewal = absl::ZeroDuration();
  };
  std::vector<PinState> Pins() const;
  // Drops the pins and open versions whose lease ended by `now`, and
  // frees the published versions that only they kept. With `renewed`
  // false, leases their holders renew are left to the lease thread
  // (VersionLeases), which first accounts for a stall of this daemon.
  void Expire(absl::Time now, bool renewed = true);

  // A freed version's shards and their reservation, for Open to reuse
  // (see Reuse above).
  struct Spare {
    std::vector<Shard> shards;
    MemoryBudget::Reservation held;
  };
  // The spare, when one is kept and its memory is this set's alone;
  // nullopt otherwise (a spare some other holder still uses is dropped).
  // The shards keep the bytes of the version they held.
  std::optional<Spare> TakeSpare();
  // Frees the spare; returns its bytes (MemoryBudget::Reclaimable).
  int64_t Reclaim() override;
  // The spare's reserved bytes; 0 without one (MemoryBudget::Reclaimable).
  int64_t KeptBytes() const override;
  // The open versions, as "name@number" (a group id Client.join takes),
  // their reserved bytes and lease ends (MemoryBudget::Reclaimable).
  std::vector<Leased> LeasedNow() const override;

  // Writes the version fields of `info` (versions_kept, version,
  // kept_versions, pinned_versions, open_versions, next_version).
  void Describe(v1::TensorInfo* info) const;

 private:
  struct Version {
    ShardedTensor tensor;
    // This daemon's copies of other daemons' shards of it, or null.
    std::shared_ptr<ReplicaCopies> copies;
    MemoryBudget::Reservation held;
    absl::Time lease_end = absl::InfiniteFuture();
    // Positive: renewed by its writer (Renew), each renewal this long.
    absl::Duration renewal = absl::ZeroDuration();
    // Claimed by a publish in progress: not expired.
    bool claimed = false;
  };
  struct PinEntry {
    int64_t number = 0;
    absl::Time until;
    absl::Duration renewal = absl::ZeroDuration();
  };

  // What a change frees, destroyed once the lock is released: versions,
  // and a spare replaced by a newer one.
  struct Freed {
    std::vector<Version> versions;
    std::optional<Spare> spare;
  };
  // Removes the published versions beyond the kept newest that no pin
  // holds (never the latest), handing them to `freed`.
  void TrimLocked(Freed* freed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes the spare, if any, and returns it.
  std::optional<Spare> PopSpare() ABSL_LOCKS_EXCLUDED(mu_);
  // Keeps the shards of the last of `freed`'s versions that may be reused
  // as the spare (the one before goes to `freed`).
  void KeepSpareLocked(Freed* freed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string KeptListLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tells the registry that published version `number` (registered under
  // `id`) and its copies, if any, are readable.
  void RegisterPublishedLocked(int64_t number, const std::string& id,
                               const Version& version)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckOpenLocked(const std::string& name, int64_t number) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Asks the budget of `held` to ask this set from now on, once.
  void AddToBudgetLocked(const MemoryBudget::Reservation& held)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<Rank> rank_;
  const std::string name_;
  const std::string tensor_id_;
  const int kept_;
  mutable absl::Mutex mu_;
  std::map<int64_t, Version> published_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, Version> open_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, PinEntry> pins_ ABSL_GUARDED_BY(mu_);
  int64_t latest_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_ ABSL_GUARDED_BY(mu_) = 1;
  std::optional<Spare> spare_ ABSL_GUARDED_BY(mu_);
  // Whether the budget of a spare or an open version knows this set
  // (AddReclaimable).
  bool reclaimable_added_ ABSL_GUARDED_BY(mu_) = false;
  // Versions were added (AddPublished) since the last trim.
  bool untrimmed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tessera::control_internal

#endif  // TESSERA_SERVER_DAEMON_VERSION_SET_H_
