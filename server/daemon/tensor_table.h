// TensorTable: a daemon's table of named sharded tensors, and the answers
// read from it alone (ListTensors, DescribeTensor).
//
// Every daemon holds the same names with the same tensor ids and infos:
// the operation log (op_log.h) changes the table only from the executor
// thread, in log order, after every daemon agreed (control_ops.h); a
// re-formed generation drops what the daemons do not all hold alike
// (membership.h). The refills of a restarted daemon (replication.h) are the
// only other writers: they complete an entry in place.
//
// An entry is degraded when shards were lost with their owner (its info
// lists lost_shards: reads and ops are refused, FAILED_PRECONDITION naming
// them), and refilling while this daemon fetches back the shards and
// copies it lost (UNAVAILABLE until done). Lookup gives a tensor only when
// it is neither.
//
// Thread-safety: every method may be called from any thread; the table's
// lock is a leaf (no method calls out while holding it, except the
// functions passed to Update and ForEach, which must not call the table).
#ifndef TESSERA_SERVER_DAEMON_TENSOR_TABLE_H_
#define TESSERA_SERVER_DAEMON_TENSOR_TABLE_H_

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "server/daemon/memory_budget.h"
#include "server/daemon/refill.h"
#include "server/daemon/replica_copies.h"
#include "server/daemon/version_set.h"
#include "server/rank/rank.h"
#include "server/sharded/sharded_tensor.h"
#include "tessera/v1/control.pb.h"

namespace tessera::control_internal {

// One named tensor on this daemon.
struct TableEntry {
  // Absent on a daemon that restarted and lost its shards of it (the
  // info then lists them in lost_shards), or while it refills them.
  std::optional<ShardedTensor> tensor;
  v1::TensorInfo info;
  // This daemon's CPU shards of it, in the memory budget.
  MemoryBudget::Reservation held;
  // Its metadata on this daemon (EntryMetadataBytes), in the budget.
  MemoryBudget::Reservation metadata;
  // Its copies of other daemons' shards (null when it holds none).
  std::shared_ptr<ReplicaCopies> replicas;
  // While this daemon, restarted, refills its shards and copies in the
  // background (`tensor` and `replicas` are set when it completes).
  std::shared_ptr<Refill> refill;
  // Why the refill failed ("" unless it did).
  std::string refill_error;
  // A versioned tensor's versions (null for an unversioned one); `tensor`
  // is then its latest published version.
  std::shared_ptr<VersionSet> versions;
};

// What a daemon holds for the entry of a tensor of `shards` shards, as the
// memory budget counts it: every daemon holds every tensor's metadata (the
// C++ boxes and the info it answers with), about 1 KiB a shard and 1 KiB a
// tensor (measured with 4 CPU daemons: one tensor of 1,000,000 shards took
// 1.0-1.2 GB of RSS on each, 200,000 tensors of one shard 410 MB).
inline constexpr int64_t kTensorMetadataBytes = 1024;
inline constexpr int64_t kShardMetadataBytes = 1024;
int64_t EntryMetadataBytes(size_t shards);
// What each version of a versioned tensor holds (its own copy of the
// metadata, its shards' handles), reserved with the version's shards and
// kept with them when they are reused: 512 bytes a shard (measured: 336
// bytes a shard a version, one tensor of 1,000,000 shards over 4
// daemons).
inline constexpr int64_t kVersionShardMetadataBytes = 512;
int64_t VersionMetadataBytes(size_t shards);

// NOT_FOUND for a name the table does not hold.
absl::Status UnknownTensor(absl::string_view name);
// FAILED_PRECONDITION for an op on a degraded tensor, naming its lost
// shards and their owners.
absl::Status DegradedError(const v1::TensorInfo& info);
// UNAVAILABLE for an op on a tensor that daemon `rank` is still refilling
// (or failed to refill).
absl::Status RefillingError(int rank, const std::string& name,
                            const TableEntry& entry);
// The info of `tensor` under `name`: its id, metadata and each shard's
// owner rank (no replicas yet).
absl::StatusOr<v1::TensorInfo> TensorInfoOf(const Rank& rank,
                                            const std::string& name,
                                            const ShardedTensor& tensor);

class TensorTable {
 public:
  // The table of the daemon of rank `rank` (which marks its own refills in
  // the infos it reports).
  explicit TensorTable(int rank) : rank_(rank) {}
  TensorTable(const TensorTable&) = delete;
  TensorTable& operator=(const TensorTable&) = delete;

  // Whether the table holds `name` (degraded or not).
  bool Holds(const std::string& name) const;
  // The tensor named `name`: NOT_FOUND when the table holds none,
  // FAILED_PRECONDITION when it is degraded, UNAVAILABLE while refilling.
  absl::StatusOr<ShardedTensor> Lookup(const std::string& name) const;
  // The info of `name` as stored (NOT_FOUND when absent).
  absl::StatusOr<v1::TensorInfo> Info(const std::string& name) const;
  // The info of `name` as clients see it: with this daemon's refill in
  // progress marked (ShardReplicas.refilling). NOT_FOUND when absent.
  absl::StatusOr<v1::TensorInfo> Describe(const std::string& name) const;
  // Every tensor's info as Describe gives it, sorted by name; with `names`,
  // only those of them that exist (each once); with `after`, only those
  // whose names sort after it. page_bytes > 0: the reply ends with the
  // first tensor that brings its tensors' serialized size to page_bytes or
  // more, with `more` set when tensors are left (ListTensorsRequest).
  v1::ListTensorsResponse List(const std::vector<std::string>& names = {},
                               const std::string& after = "",
                               int64_t page_bytes = 0) const;
  size_t size() const;
  // The name of the tensor with id `tensor_id`; nullopt when none.
  std::optional<std::string> NameOf(absl::string_view tensor_id) const;
  // Whether `tensor_id` is an unversioned tensor with copies on several
  // daemons (the copies a writer may mark stale: stale_copies.h).
  bool Replicated(absl::string_view tensor_id) const;

  // Adds or replaces `name`; a replaced entry is freed outside the lock.
  void Put(const std::string& name, TableEntry entry);
  // Removes `name`, handing its entry back (to be freed by the caller,
  // outside the lock); nullopt when absent.
  std::optional<TableEntry> Remove(const std::string& name);
  // Runs `change` on the entry of `name` under the lock; NOT_FOUND when
  // absent.
  absl::Status Update(const std::string& name,
                      const std::function<void(TableEntry&)>& change);
  // Runs `visit` on every entry in name order under the lock, stopping at
  // the first error, which it returns.
  absl::Status ForEach(
      const std::function<absl::Status(const std::string&, const TableEntry&)>&
          visit) const;
  // The versions of every versioned tensor (docs/versions.md), to work on
  // outside the table's lock.
  std::vector<std::shared_ptr<VersionSet>> VersionSets() const;
  // Removes the entries `keep` says no to; their names, in order.
  std::vector<std::string> RemoveUnless(
      const std::function<bool(const std::string&, const TableEntry&)>& keep);

  // A refill that completed: `name` gets `tensor` and `copies` (an
  // unversioned tensor) or `versions` (a versioned one: `tensor` is its
  // latest) unless it was deleted or replaced meanwhile (its refill is no
  // longer `refill`), in which case they are dropped.
  void CompleteRefill(const std::string& name,
                      const std::shared_ptr<Refill>& refill,
                      ShardedTensor tensor,
                      std::shared_ptr<ReplicaCopies> copies,
                      std::shared_ptr<VersionSet> versions);
  // A refill that failed: `name` remembers why (RefillingError), unless it
  // was replaced meanwhile.
  void FailRefill(const std::string& name,
                  const std::shared_ptr<Refill>& refill, std::string error);

 private:
  v1::TensorInfo InfoWithState(const TableEntry& entry) const;
  // Keeps by_id_ in step with the entry of `name` (absent: removed).
  void IndexLocked(const std::string& name, const TableEntry* was,
                   const TableEntry* now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int rank_;
  mutable absl::Mutex mu_;
  std::map<std::string, TableEntry> entries_ ABSL_GUARDED_BY(mu_);
  // Tensor id -> name.
  absl::flat_hash_map<std::string, std::string> by_id_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::control_internal

#endif  // TESSERA_SERVER_DAEMON_TENSOR_TABLE_H_
