// ShardRegistry: the tensors whose shards this rank serves, by tensor id.
//
// A registered tensor is immutable metadata plus the local shards (their
// Tensors share storage with the ShardedTensor that registered them, so a
// fetch reads the live bytes). Entries are held by shared_ptr: a fetch in
// flight keeps its tensor alive even if it is unregistered meanwhile, and
// a tensor unregistered before a fetch starts is NOT_FOUND.
//
// Retiring: remote shards hold no reference on their owner (that would cost
// messages per handle), so a tensor whose last local handle is dropped may
// still be fetched by a peer that has not yet reached the same point of the
// program. Such a tensor is retired rather than unregistered: it leaves
// the live set (size(), TensorIds()) at once but is still served until the
// next synchronisation of all ranks releases it (Rank::Barrier passes the
// RetirementMark taken before the barrier to ReleaseRetired afterwards).
//
// Versions (docs/versions.md): a versioned tensor's published versions are
// each registered under an id of their own (the first under the tensor's
// id, version n > 1 under "<tensor id>@<n>", VersionId), and the registry
// maps the tensor's id to its latest published version: Resolve(tensor id)
// finds that version, Resolve(VersionId(id, n)) a kept one. Published
// versions are read-only (Resolved::writable), and so is the tensor id of
// a versioned tensor; a version begun but not yet published is an
// ordinary registration under its version id, writable.
//
// Thread-safety: all methods are safe to call concurrently.
#ifndef TESSERA_SERVER_SERVE_SHARD_REGISTRY_H_
#define TESSERA_SERVER_SERVE_SHARD_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/shard_metadata.h"
#include "common/sharded_tensor_metadata.h"
#include "common/tensor/tensor.h"
#include "wire/version_id.h"

namespace tessera {

// One shard this rank serves: where it sits in the metadata, and its bytes.
// Its box is metadata->shards_metadata[index] (kept once per tensor, not
// once per shard: at a million shards each copy costs over 100 MB per
// rank).
struct LocalShard {
  // Index of the shard in metadata->shards_metadata.
  int64_t index = 0;
  Tensor tensor;
};

struct RegisteredTensor {
  // Never null once registered. Shared, immutable: a ShardedTensor and its
  // registry entry hold the same copy.
  std::shared_ptr<const ShardedTensorMetadata> metadata;
  // Registered in increasing index order (Register sorts a copy when they
  // are not), so that a lookup stays O(log n) for ranks holding hundreds of
  // thousands of shards.
  std::vector<LocalShard> local_shards;

  // The local shard with global index `index`, or null.
  const LocalShard* FindShard(int64_t index) const;
};

class ShardRegistry {
 public:
  // What Resolve finds for an id.
  struct Resolved {
    // Null when the id names nothing registered.
    std::shared_ptr<const RegisteredTensor> tensor;
    // The published version it is (0: unversioned, or not yet published).
    int64_t version = 0;
    // False for a published version and for a versioned tensor's own id.
    bool writable = true;
    // An AtLeastId whose version this daemon had not published by the
    // deadline: `tensor` is the latest it has, older.
    bool behind = false;
  };
  // How long Resolve waits at most for a version an AtLeastId asks for.
  static constexpr absl::Duration kAtLeastWait = absl::Seconds(1);

  // ALREADY_EXISTS when `tensor_id` is registered; INVALID_ARGUMENT when a
  // local shard's index is out of range or repeated, or its tensor does not
  // match its metadata's sizes.
  absl::Status Register(std::string tensor_id,
                        std::shared_ptr<const RegisteredTensor> tensor);
  // True when the id was registered (live or retired).
  bool Unregister(absl::string_view tensor_id);
  // Moves a live tensor to the retired set; true when it was live.
  bool Retire(absl::string_view tensor_id);
  // A position in the sequence of retirements: ReleaseRetired(mark) frees
  // exactly the tensors retired before the mark was taken.
  uint64_t RetirementMark() const;
  // Unregisters the tensors retired before `mark`; returns how many.
  size_t ReleaseRetired(uint64_t mark);
  // Live or retired; null when unknown.
  std::shared_ptr<const RegisteredTensor> Find(
      absl::string_view tensor_id) const;
  // What a fetch or a write of `id` reaches: a versioned tensor's id
  // resolves to its latest published version, VersionId(id, n) to version
  // n while it is kept, any other id as Find does. AtLeastId(id, n): the
  // latest once it is n or newer, waiting for that publish until
  // `deadline` (at most kAtLeastWait; InfinitePast: not at all), else the
  // older latest, `behind`.
  Resolved Resolve(absl::string_view id,
                   absl::Time deadline = absl::InfinitePast()) const;
  // Version `number` of versioned tensor `tensor_id`, registered under
  // `registration_id`, is published: read-only from now on, and the latest
  // unless a higher number was published before.
  void PublishVersion(const std::string& tensor_id, int64_t number,
                      const std::string& registration_id);
  // Version `number` of `tensor_id` is no longer kept (its registration is
  // dropped by its owner).
  void ForgetVersion(const std::string& tensor_id, int64_t number);
  // `tensor_id` is no longer a versioned tensor (it was deleted).
  void DropVersions(const std::string& tensor_id);

  // Whether a registration may be served now, as its owner decides (the
  // daemon's stale copies, server/daemon/stale_copies.h): OK, or why not
  // (a read: UNAVAILABLE, so the reader asks another holder; a write over
  // the data plane or the local path: FAILED_PRECONDITION, so it goes over
  // a stream). `deadline` bounds a wait. Called outside the registry's
  // lock, on serving threads; it must not call the registry.
  using ServeGate = std::function<absl::Status(absl::string_view id, bool write,
                                               absl::Time deadline)>;
  // Replaces the gate; an empty one lets everything through (the default).
  void SetServeGate(ServeGate gate);
  // The gate's verdict on `id` (OK without a gate).
  absl::Status CheckServe(absl::string_view id, bool write,
                          absl::Time deadline) const;

  // Writes into a registration hold a WritePass while they change its
  // bytes (the data plane's and WriteRegion's, and the local path's for as
  // long as it lends the memory writable). Fence(id) refuses new passes
  // and waits until every pass held is returned, so that whatever reads
  // the bytes after it (a reshard copying the old layout) holds every
  // write that was answered OK, and no later write lands where it would
  // be lost. A fence lasts until Lift, or until `id` is unregistered.
  class WritePass {
   public:
    WritePass() = default;  // Holds nothing.
    WritePass(WritePass&& other) noexcept;
    WritePass& operator=(WritePass&& other) noexcept;
    WritePass(const WritePass&) = delete;
    WritePass& operator=(const WritePass&) = delete;
    ~WritePass();

   private:
    friend class ShardRegistry;
    WritePass(const ShardRegistry* registry, std::string id)
        : registry_(registry), id_(std::move(id)) {}
    void Release();
    const ShardRegistry* registry_ = nullptr;
    std::string id_;
  };
  // A pass for a write into `id`; ABORTED while `id` is fenced, saying
  // why (the write was not applied: write it again once the fence ends).
  // Not UNAVAILABLE: a writer takes that for a holder that is down, and
  // would let the write succeed on the other holders without this one.
  absl::StatusOr<WritePass> EnterWrite(absl::string_view id) const;
  // Fences `id` (`why`: what the refusals say) and waits for the passes
  // held to be returned: DEADLINE_EXCEEDED by `deadline` (the fence stays
  // up: Lift it).
  absl::Status Fence(const std::string& id, const std::string& why,
                     absl::Time deadline);
  void Lift(const std::string& id);

  // Live tensors only.
  size_t size() const;
  size_t retired_size() const;
  // Live ids, sorted.
  std::vector<std::string> TensorIds() const;

  // What the registry holds, live and retired (for metrics).
  struct Holdings {
    int64_t tensors = 0;
    int64_t shards = 0;
    int64_t cpu_bytes = 0;
    int64_t cuda_bytes = 0;
  };
  // O(shards held), under the registry's lock.
  Holdings Held() const;

 private:
  // Resolve of any id but an AtLeastId, under the lock.
  Resolved ResolveLocked(absl::string_view id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The registration of `id`, live or retired (Find, under the lock).
  std::shared_ptr<const RegisteredTensor> FindLocked(absl::string_view id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // A versioned tensor's published versions: number -> registration id.
  struct VersionIndex {
    int64_t latest = 0;
    std::map<int64_t, std::string> registrations;
  };

  struct Retired {
    uint64_t sequence;
    std::shared_ptr<const RegisteredTensor> tensor;
  };

  // Writes in flight and fences, by id (an entry only while either is).
  struct WriteState {
    int writers = 0;
    bool fenced = false;
    std::string why;
  };
  // Drops the write state of ids no longer registered (no writer can
  // reach them).
  void ForgetWrites(const std::vector<std::string>& ids);

  mutable absl::Mutex writes_mu_;
  mutable absl::flat_hash_map<std::string, WriteState> writes_
      ABSL_GUARDED_BY(writes_mu_);

  mutable absl::Mutex gate_mu_;
  std::shared_ptr<const ServeGate> gate_ ABSL_GUARDED_BY(gate_mu_);

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<const RegisteredTensor>>
      tensors_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Retired> retired_ ABSL_GUARDED_BY(mu_);
  uint64_t retirements_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, VersionIndex> versions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_SERVER_SERVE_SHARD_REGISTRY_H_
