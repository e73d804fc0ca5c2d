// Read plans (docs/weight_sync.md): destinations filled from boxes of
// named tensors, planned once from the metadata and run every step.
//
//   std::vector<ReadItem> items;
//   items.push_back(ReadItem::Box("w", {0, 512}, {768, 256}, w_half));
//   items.push_back({{{"q", {0, 0}, {768, 384}, {0, 0}},       // fused:
//                     {"k", {0, 0}, {768, 384}, {768, 0}},     // one out
//                     {"v", {0, 0}, {768, 384}, {1536, 0}}},   // from 3
//                    qkv});
//   auto plan = client->PlanReads(std::move(items)).value();
//   int64_t version = plan->Run().value();   // every step
//
// PlanReads opens the tensors (one control call, whatever their number),
// then cuts every source box into the pieces that the tensors' shards hold
// (PlanPieces, which needs the metadata only). Run fetches every piece
// from its shard's holder straight into its place in `out` (a piece whose
// tensor has another dtype than `out`, or whose `out` is on a GPU, through
// a host staging buffer, converted as torch converts: round to nearest
// even; but a piece of a same-host CUDA shard into a dense run of a CUDA
// `out` is copied device to device over the local path), pieces of
// different daemons at once: it makes no control call when nothing
// changed.
//
// Versions: Run() reads, for every versioned tensor, one published version,
// and for the plan's tensors together one point of the operation log (as
// Client::Pin gives): when their versions are numbered alike (a group
// begun and published together, as tessera.torch.publish_state_dict
// does), pieces that came from a version older than the newest seen (a
// publish was being applied) are read again as at least the newest
// (wire/version_id.h: AtLeastId); otherwise (or when not every tensor has
// that version published) the run pins the tensors (one logged call),
// reads again the pieces that are not of the pinned versions, and unpins.
// Every run asks for at least the newest version this client read or
// watched (of any of the tensors, when numbered alike), so that a reader
// woken by a publish reads each piece once, not first from the daemons
// still applying it. Run(version) reads that version of every versioned tensor
// of the plan (NOT_FOUND once it is no longer kept). Unversioned tensors are
// read as they are.
//
// Staleness: pieces are fetched by the tensor's id, which a reshard, a
// delete or a re-create changes, so a run never reads through a stale
// placement: a piece refused as NOT_FOUND or FAILED_PRECONDITION (or, after
// every holder was tried, UNAVAILABLE: a daemon restarted elsewhere) makes
// the run plan again from fresh metadata and start over, a few times at
// most, within the deadline.
//
// Failure: errors name the tensor, the piece's box and the holder; a
// failed run leaves the destinations partly written. Every run has
// TransferOptions::timeout as its one deadline, its re-plans included (a
// stalled daemon's pieces are read from a replica when the tensor has
// copies; a re-plan's control calls have ClientOptions::timeout).
//
// Thread-safety: a ReadPlan may be shared; runs are serialized (one at a
// time, in call order). The `out` tensors must stay valid, and not be
// written by others, while a run uses them.
#ifndef TESSERA_CLIENT_READ_PLAN_H_
#define TESSERA_CLIENT_READ_PLAN_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "client/client.h"
#include "common/dtype.h"
#include "common/shard_metadata.h"
#include "common/tensor/tensor.h"
#include "tessera/v1/control.pb.h"

namespace tessera {

// A box of a named tensor and where it goes in its item's `out`.
struct ReadSource {
  std::string name;
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
  // Where the box starts in `out`; empty: at out's origin.
  std::vector<int64_t> out_offsets;
};

// One destination and the boxes that fill it. Sources may not overlap in
// `out` (INVALID_ARGUMENT); parts of `out` no source covers are left as
// they are. The dense outs of two items may not overlap in part either
// (INVALID_ARGUMENT), but may be the same memory exactly (tied parameters:
// it then holds whichever item's piece lands last, so read them from
// tensors that hold the same values).
struct ReadItem {
  std::vector<ReadSource> sources;
  // A CPU or CUDA tensor of the sources' rank, any strides. Its dtype may
  // differ from the tensors': floating types convert to one another
  // (float32, float64, float16, bfloat16); others must match
  // (INVALID_ARGUMENT). A CUDA out's pieces land in host staging and are
  // copied to the device after they arrive (in a build without CUDA the
  // run fails with that copy's error), except those of a same-host CUDA
  // shard of its dtype into a dense run of it: the local path copies
  // them in from the owner's GPU memory (CUDA IPC).
  Tensor out;

  // The box [offsets, offsets + out.sizes()) of `name` into all of `out`.
  static ReadItem Box(std::string name, std::vector<int64_t> offsets,
                      Tensor out);
};

// ---- The planner (metadata only).

// A tensor as the planner sees it.
struct PlannedTensor {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> sizes;
  std::vector<ShardMetadata> shards;
};

// A source as the planner sees it: its tensor by index.
struct PlanSource {
  uint32_t tensor = 0;
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
  std::vector<int64_t> out_offsets;
};

// A destination as the planner sees it.
struct PlanTarget {
  std::vector<PlanSource> sources;
  std::vector<int64_t> out_sizes;
  DType out_dtype = DType::kFloat32;
};

using PlanDims = absl::InlinedVector<int64_t, 4>;

// One shard's part of one source: what one fetch moves.
struct PlanPiece {
  uint32_t target = 0;
  uint32_t tensor = 0;
  uint32_t shard = 0;
  PlanDims offsets_in_shard;
  PlanDims out_offsets;
  PlanDims sizes;
  int64_t bytes = 0;  // In the tensor's dtype.
};

// Cuts every source of `targets` into the parts the shards of its tensor
// hold. INVALID_ARGUMENT for a box outside its tensor or its `out`, ranks
// that differ, sources that overlap in `out`, or dtypes that do not
// convert; OUT_OF_RANGE as ValidateRegion. O(sources x shards of their
// tensor); uses nothing but the metadata.
absl::StatusOr<std::vector<PlanPiece>> PlanPieces(
    absl::Span<const PlannedTensor> tensors,
    absl::Span<const PlanTarget> targets);

// Whether `from` converts to `to` in a plan: equal, or both floating.
bool PlanCastAllowed(DType from, DType to);

// ---- Plans.

// How a run went.
struct ReadPlanRun {
  // The version read: the one every versioned tensor of the plan was read
  // at, or when they differ (tensors published apart) the highest; 0 when
  // none is versioned.
  int64_t version = 0;
  // The version read of each tensor (by name; 0 for an unversioned one).
  std::vector<std::pair<std::string, int64_t>> versions;
  // Whether the run planned again (a reshard, re-create or restart).
  bool replanned = false;
  // Whether it pinned the tensors to read one point of the log.
  bool pinned = false;
  // Bytes fetched, pieces read twice included.
  int64_t bytes = 0;
};

class ReadPlan {
 public:
  // Reads every item (see the file comment). `version` > 0: that version
  // of every versioned tensor.
  absl::StatusOr<ReadPlanRun> Run(const TransferOptions& options = {},
                                  int64_t version = 0);

  // Bytes one run moves when no piece is read twice (in the tensors'
  // dtypes), and the number of pieces.
  int64_t bytes() const;
  size_t pieces() const;
  // The plan's tensors, in the order first named.
  std::vector<std::string> names() const;
  // Their sizes, parallel to names(), as the plan was last made (a caller
  // that means whole tensors checks its outs against them).
  std::vector<std::vector<int64_t>> shapes() const;
  // Per daemon (rank order, ranks with no piece left out): (rank, pieces,
  // bytes) of one run, as planned (replicas are read only when the owner
  // fails).
  std::vector<std::tuple<int, size_t, int64_t>> sources() const;
  // How many times the plan was made (1 + re-plans).
  int plans() const;

  // The control calls a plan makes (Client::PlanReads provides them).
  struct Control {
    // Every named tensor's view (NOT_FOUND naming one that is missing).
    std::function<absl::StatusOr<std::vector<ShardedTensorView>>(
        const std::vector<std::string>&)>
        open;
    // Pins the latest of each (one point of the log) for a short lease.
    std::function<absl::StatusOr<v1::VersionGroup>(
        const std::vector<std::string>&)>
        pin;
    std::function<absl::Status(const v1::VersionGroup&)> unpin;
  };

  // Plans `items`; Client::PlanReads is the way in.
  static absl::StatusOr<std::shared_ptr<ReadPlan>> Make(
      std::shared_ptr<internal_client::Cluster> cluster, Control control,
      std::vector<ReadItem> items);

 private:
  ReadPlan() = default;
  // Opens the tensors and cuts the pieces again.
  absl::Status Plan() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One attempt of Run on the current plan. Sets *final when its error is
  // one no new plan changes (a version asked for that is not published).
  absl::StatusOr<ReadPlanRun> RunOnce(const TransferOptions& options,
                                      int64_t version, absl::Time deadline,
                                      bool* final)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fetches pieces `which` of tensor ids `ids` (by tensor), into
  // versions[piece] the version each was.
  absl::Status Fetch(const std::vector<size_t>& which,
                     const std::vector<std::string>& ids,
                     const TransferOptions& options, absl::Time deadline,
                     std::vector<int64_t>* versions, int64_t* bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::shared_ptr<internal_client::Cluster> cluster_;
  Control control_;
  std::vector<ReadItem> items_;
  std::vector<std::string> names_;

  mutable absl::Mutex mu_;
  bool stale_ ABSL_GUARDED_BY(mu_) = true;
  int plans_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<ShardedTensorView> views_ ABSL_GUARDED_BY(mu_);
  std::vector<PlanPiece> pieces_ ABSL_GUARDED_BY(mu_);
  // Pieces in fetch order: owners interleaved, so that every daemon's
  // pieces start at once.
  std::vector<size_t> order_ ABSL_GUARDED_BY(mu_);
  // Each piece's place in `out` (a view). A piece of another dtype lands
  // in a staging buffer of the tensor's dtype first, converted into it.
  std::vector<Tensor> out_views_ ABSL_GUARDED_BY(mu_);
  // Whether each piece may be asked for in a pipelined batch (Fetch): a
  // piece of a small host shard.
  std::vector<bool> pipelined_ ABSL_GUARDED_BY(mu_);
  // By piece: it lands in its out, a CUDA one, over the local path.
  std::vector<bool> in_place_ ABSL_GUARDED_BY(mu_);
  // Whether the versioned tensors are numbered alike (same latest, same
  // next number when planned).
  bool aligned_ ABSL_GUARDED_BY(mu_) = true;
};

}  // namespace tessera

#endif  // TESSERA_CLIENT_READ_PLAN_H_
