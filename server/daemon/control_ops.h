// ControlOps: the bodies of the logged control operations (CreateTensor,
// DeleteTensor, Reshard, Gather, SaveCheckpoint, LoadCheckpoint), run by
// every daemon's executor at the same log entry (op_log.h).
//
// Every op has the same shape: deterministic checks first (name, sizes,
// spec, placements, deadline: they pass or fail alike on every daemon),
// then what depends on this daemon (the memory budget, allocation, files),
// then an agreement on every daemon's outcome (agreement.h), and only then
// a change to the table. An op that may have created tensors on some
// daemons only re-aligns the tensor ids. The agreed status is the
// caller's answer; Outcome::agreed tells the log whether every daemon
// has read the op.
//
// Reshard serves any layout to any other (shard counts, ranks without
// shards, several shards per rank, chunk or explicit boxes), unlike the
// SPMD ShardedTensor::Reshard it leaves to the PyTorch API: each daemon
// reserves and allocates its new shards and its copies of others' new
// shards (as many copies as before), fills every one from the old
// layout's holders (ReadBoxInto, region_io.h: a local copy where it holds
// the box), and only once every daemon agreed that its boxes are filled
// does the name move to the new layout under a new tensor id; the old one
// is freed after every daemon confirmed the commit (OpOutcome::retired).
// Before any daemon copies, every daemon fences writes to its part of an
// unversioned tensor's old layout (ShardRegistry::Fence: new ones are
// refused, those in flight waited for) and they agree that all did, so
// that no write answered OK is lost; the fence is lifted if the reshard
// fails.
// A versioned tensor's new layout is its latest published version, in a
// new VersionSet with that number and the pins of it; the old set (its
// older versions) is retired with the old layout; refused while a version
// is open (docs/versions.md, "Resharding"). A refused reshard changes
// nothing.
//
// Errors (as the client sees them): INVALID_ARGUMENT for a bad name, size,
// spec, placement, init kind or copies count; ALREADY_EXISTS for a taken
// name; NOT_FOUND for an unknown tensor or checkpoint entry;
// FAILED_PRECONDITION for a degraded tensor or a checkpoint path outside
// the roots; RESOURCE_EXHAUSTED beyond the memory budget;
// DEADLINE_EXCEEDED when the call's deadline passed before the op ran;
// another daemon's own error as "on rank N: ...".
//
// Thread-safety: Run is called by the executor thread only. Ownership: the
// control core owns it; the table, replication and membership it points
// at outlive it.
#ifndef TESSERA_SERVER_DAEMON_CONTROL_OPS_H_
#define TESSERA_SERVER_DAEMON_CONTROL_OPS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "server/collective/process_group.h"
#include "server/daemon/control_options.h"
#include "server/daemon/in_doubt.h"
#include "server/daemon/membership.h"
#include "server/daemon/memory_budget.h"
#include "server/daemon/pending_call.h"
#include "server/daemon/replication.h"
#include "server/daemon/tensor_table.h"
#include "server/daemon/version_set.h"
#include "server/daemon/version_watch.h"
#include "server/rank/rank.h"
#include "server/sharded/sharded_tensor.h"
#include "tessera/v1/control.pb.h"
#include "tessera/v1/control_internal.pb.h"

namespace tessera::control_internal {

// What an op did on this daemon: the agreed status, the reply, and
// whether the last agreement went through (every daemon has read the op,
// so its log entry may go).
struct OpOutcome {
  absl::Status status;
  OpResult result;
  bool agreed = false;
  // What the op replaced (a reshard's old layout: its shards, copies and
  // their budget), kept until every daemon confirmed the commit
  // (OpLog::Execute's barrier): a read that resolved the old layout on a
  // daemon that had not committed yet still finds its shards on every
  // daemon, and a read that fails after that finds the new id in its
  // daemon's table (region_io.h).
  std::shared_ptr<const void> retired;
  // Set when the op is in doubt here (in_doubt.h): the agreement's
  // exchange broke after this daemon's part succeeded, so some daemons
  // may have committed; what this daemon does once the op is decided.
  std::optional<LateCommit> late;
};

// "a,b": the names of version handles, for logs.
std::string VersionHandleNames(
    const google::protobuf::RepeatedPtrField<v1::VersionHandle>& handles);
// The method name of `op` ("CreateTensor", ...), for messages.
const char* OpName(const v1::ControlOp& op);
// The tensor `op` is about (names joined by "," for checkpoints; "" for
// none), for logs.
std::string OpTensor(const v1::ControlOp& op);

class ControlOps {
 public:
  ControlOps(std::shared_ptr<Rank> rank, std::shared_ptr<ProcessGroup> group,
             const ControlOptions& options,
             std::shared_ptr<MemoryBudget> budget, TensorTable* table,
             Replication* replication, const Membership* membership,
             VersionWatch* watch);
  ControlOps(const ControlOps&) = delete;
  ControlOps& operator=(const ControlOps&) = delete;

  // Runs `op` (collective). An op with no request does nothing.
  OpOutcome Run(const v1::ControlOp& op);

 private:
  int rank() const { return rank_->rank(); }
  // CreateTensor's work on this daemon before the daemons agree: the
  // deterministic checks (*checked says they passed, so that a failure
  // after them is this daemon's alone and the tensor ids must be
  // resynchronized) and its shards, reserved in the budget.
  absl::StatusOr<TableEntry> PrepareCreate(
      const v1::ControlOp& op, const v1::CreateTensorRequest& request,
      bool* checked);
  OpOutcome RunCreate(const v1::ControlOp& op);
  // CreateTensors: every tensor of the request, or none.
  OpOutcome RunCreateMany(const v1::ControlOp& op);
  OpOutcome RunDelete(const v1::ControlOp& op);
  OpOutcome RunReshard(const v1::ControlOp& op);
  OpOutcome RunGather(const v1::ControlOp& op);
  OpOutcome RunSave(const v1::ControlOp& op);
  OpOutcome RunLoad(const v1::ControlOp& op);
  // The version ops (docs/versions.md).
  OpOutcome RunBeginVersion(const v1::ControlOp& op);
  OpOutcome RunPublishVersion(const v1::ControlOp& op);
  OpOutcome RunAbortVersion(const v1::ControlOp& op);
  OpOutcome RunPinVersions(const v1::ControlOp& op);
  OpOutcome RunUnpinVersions(const v1::ControlOp& op);
  // The versions of tensor `name`, for op `what`: NOT_FOUND, degraded or
  // refilling as Lookup says; FAILED_PRECONDITION for an unversioned one.
  absl::StatusOr<std::shared_ptr<VersionSet>> VersionsOf(
      const std::string& name, absl::string_view what) const;
  // BeginVersion's copy of tensor `name`'s latest version into the new
  // one `to`: this daemon's shards, and its `copies` of others' shards
  // (null: none) from the latest copies of `tensor_id`. INTERNAL when the
  // two do not match.
  absl::Status CopyLatest(const std::string& name, const ShardedTensor& latest,
                          const ShardedTensor& to, const std::string& tensor_id,
                          const RegisteredTensor* copies) const;
  // CreateTensor's tensor (this daemon's shards), filled by its init kind.
  absl::StatusOr<ShardedTensor> NewTensor(
      const v1::CreateTensorRequest& request, DType dtype,
      const ShardingSpec& spec, absl::Span<const int64_t> sizes);
  // A request's spec, its placements checked against the cluster: each
  // names a daemon (by rank or worker name) and a device that daemon can
  // hold (CPU anywhere; CUDA on a CUDA daemon; never meta, which would
  // drop the data). INVALID_ARGUMENT naming `what` and the placement.
  // Deterministic: every daemon decides alike.
  absl::StatusOr<ShardingSpec> SpecOf(bool has_spec,
                                      const v1::ShardingSpec& proto,
                                      absl::string_view what) const;
  absl::Status CheckPlacement(const std::optional<RemoteDevice>& placement,
                              absl::Span<const std::string> devices) const;
  // The info of a layout about to be made: name, metadata and each shard's
  // owner rank (no id, no replicas). INVALID_ARGUMENT for a placement the
  // group cannot resolve.
  absl::StatusOr<v1::TensorInfo> LayoutInfo(
      const std::string& name, const ShardedTensorMetadata& metadata) const;
  // The bytes of `metadata`'s shards this daemon holds in host memory;
  // with `version` (a version of a versioned tensor), also the version's
  // own copy of the metadata (VersionMetadataBytes), reserved with them.
  absl::StatusOr<int64_t> LocalHostBytes(const ShardedTensorMetadata& metadata,
                                         bool version) const;
  // Reserves the metadata of `metadata` on this daemon
  // (EntryMetadataBytes) for `what` ("CreateTensor \"x\""): the
  // budget's RESOURCE_EXHAUSTED when it does not fit.
  absl::StatusOr<MemoryBudget::Reservation> ReserveMetadata(
      const ShardedTensorMetadata& metadata, absl::string_view what) const;
  absl::Status Agree(const absl::Status& local, bool* agreed);
  // Agrees on `local`, then runs `commit` (the op's effects here, which
  // cannot fail) once every daemon succeeded. When the exchange broke
  // after this daemon's part succeeded, the outcome is in doubt and keeps
  // `commit` and `give_up` for the next generation to decide
  // (OpOutcome::late); on any other failure `give_up` runs now.
  OpOutcome AgreeThenCommit(const absl::Status& local,
                            std::function<OpResult()> commit,
                            std::function<void()> give_up = nullptr);
  void ResyncTensorIds();

  const std::shared_ptr<Rank> rank_;
  const std::shared_ptr<ProcessGroup> group_;
  const ControlOptions options_;
  const std::shared_ptr<MemoryBudget> budget_;
  TensorTable* const table_;
  Replication* const replication_;
  const Membership* const membership_;
  VersionWatch* const watch_;
};

}  // namespace tessera::control_internal

#endif  // TESSERA_SERVER_DAEMON_CONTROL_OPS_H_
