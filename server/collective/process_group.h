// ProcessGroup: the collectives Tessera uses, over a fixed set of ranks.
//
// One narrow interface with one backend per device type: GlooBackend
// (gloo/gloo_backend.h) moves CPU tensors over TCP, NcclBackend
// (nccl/nccl_backend.h) moves CUDA tensors. Backends register by name ("gloo",
// "nccl") and are created collectively: every member calls CreateProcessGroup
// with the same name and ranks, and they rendezvous through a Store.
//
// Ranks: a group has `size()` members numbered 0..size-1 (group ranks);
// `global_ranks()[g]` is the global rank of group rank g. `rank()` is this
// process's group rank.
//
// Tensors: every collective takes contiguous tensors of one dtype on the
// backend's device type; per-rank tensors may have different sizes (an
// all-gather of uneven shards). Inputs are read, outputs are written in
// place (they are views; the caller allocates them).
//
// Thread-safety: collectives on one group must be issued in the same order
// on every member (as in c10d); calls from several threads are serialised,
// which gives no order, so issue them from one thread. Shutdown may be
// called from any thread; it waits for a collective in flight (bounded by
// the timeout). Different groups are independent.
//
// Failure: bad arguments are INVALID_ARGUMENT on the calling member before
// anything is sent. Arguments that disagree between members (sizes, dtypes,
// roots) are INVALID_ARGUMENT on every member: members exchange a small
// plan before any data moves, and the group stays usable. A peer that dies
// or stalls makes the collective fail with UNAVAILABLE or DEADLINE_EXCEEDED
// within the group's timeout — never a hang or an abort. After a transport
// failure the group is unusable (FAILED_PRECONDITION) and must be recreated
// (under a new name, or after every member has shut the old one down).
#ifndef TESSERA_SERVER_COLLECTIVE_PROCESS_GROUP_H_
#define TESSERA_SERVER_COLLECTIVE_PROCESS_GROUP_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/device.h"
#include "common/dtype.h"
#include "common/tensor/tensor.h"
#include "server/store/store.h"

namespace tessera {

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;

  // "gloo" or "nccl".
  virtual absl::string_view backend() const = 0;
  // The device type whose tensors this group moves.
  virtual Device::Type device_type() const = 0;
  // The device whose tensors this group moves: "cpu", or "cuda:N" for a
  // group bound to one GPU. Defaults to the device type without an index
  // (any device of that type).
  virtual Device device() const;

  // This process's group rank; -1 on a handle held by a non-member (see
  // Rank::NewGroup), whose collectives are all FAILED_PRECONDITION.
  int rank() const { return rank_; }
  bool is_member() const { return rank_ >= 0; }
  int size() const { return static_cast<int>(global_ranks_.size()); }
  const std::vector<int>& global_ranks() const { return global_ranks_; }
  // Group rank of a global rank; nullopt when it is not a member.
  std::optional<int> GroupRank(int global_rank) const;
  // A name unique among the groups of one world ("0" for the default
  // group); tensor ids and store keys are scoped by it.
  const std::string& name() const { return name_; }

  virtual absl::Status Barrier() = 0;
  // Root's `tensor` is copied into every member's `tensor` (same sizes).
  virtual absl::Status Broadcast(const Tensor& tensor, int root) = 0;
  // outputs[r] receives member r's `input`; outputs has size() entries whose
  // sizes match each member's input (they may differ per rank).
  virtual absl::Status AllGather(const Tensor& input,
                                 absl::Span<const Tensor> outputs) = 0;
  // As AllGather, but only `root` receives; other members pass no outputs.
  virtual absl::Status Gather(const Tensor& input,
                              absl::Span<const Tensor> outputs, int root) = 0;
  // AllGather and Gather for callers whose every member computes every
  // size from the same agreed data (a ShardedTensor's metadata): the
  // exchange of transfer plans that otherwise checks the members against
  // each other first is skipped, one round trip less; each member's own
  // arguments are still checked. Only for such sizes: members that
  // disagreed would corrupt the transport. Backends without the shortcut
  // run the checked collective.
  virtual absl::Status AllGatherAgreed(const Tensor& input,
                                       absl::Span<const Tensor> outputs) {
    return AllGather(input, outputs);
  }
  virtual absl::Status GatherAgreed(const Tensor& input,
                                    absl::Span<const Tensor> outputs,
                                    int root) {
    return Gather(input, outputs, root);
  }
  // Member r's `output` receives root's inputs[r]; only root passes inputs.
  virtual absl::Status Scatter(absl::Span<const Tensor> inputs,
                               const Tensor& output, int root) = 0;
  // outputs[r] receives member r's inputs[rank()]; both have size() entries
  // and the sizes must agree pairwise (they may differ per pair).
  virtual absl::Status AllToAll(absl::Span<const Tensor> inputs,
                                absl::Span<const Tensor> outputs) = 0;

  // OK while the transport works; after a transport failure or Shutdown,
  // the FAILED_PRECONDITION later collectives return. Waits for a
  // collective in flight on another thread.
  virtual absl::Status Usable() const { return absl::OkStatus(); }

  // Tears the transport down; later collectives are FAILED_PRECONDITION.
  // Idempotent; the destructor calls it.
  virtual void Shutdown() = 0;

 protected:
  ProcessGroup(int rank, std::vector<int> global_ranks, std::string name)
      : rank_(rank),
        global_ranks_(std::move(global_ranks)),
        name_(std::move(name)) {}

 private:
  int rank_;
  std::vector<int> global_ranks_;
  std::string name_;
};

// What a backend needs to join a group.
struct ProcessGroupOptions {
  // Scoped to this group (a PrefixStore); members rendezvous through it.
  std::shared_ptr<Store> store;
  // This process's group rank, and the global rank of every member.
  int rank = 0;
  std::vector<int> global_ranks;
  std::string name = "0";
  // Bounds every collective and the rendezvous.
  absl::Duration timeout = absl::Seconds(300);
  // Gloo: the local interface/host to bind ("127.0.0.1" on loopback,
  // empty for the host name's address). NCCL: ignored.
  std::string hostname = "127.0.0.1";
  // NCCL: the CUDA device this process uses. Gloo: ignored.
  int device_index = 0;
};

using ProcessGroupFactory =
    std::function<absl::StatusOr<std::shared_ptr<ProcessGroup>>(
        const ProcessGroupOptions&)>;

// Registers a backend under `name`; false when the name is taken. Gloo
// (gloo/) and, when built with it, NCCL (nccl/) register themselves while
// the program starts; a new backend does the same from its own file and is
// linked whole into tessera_process_group (server/collective/CMakeLists.txt).
bool RegisterProcessGroupBackend(const std::string& name,
                                 ProcessGroupFactory factory);
// The registered backend names, sorted.
std::vector<std::string> ProcessGroupBackends();
// INVALID_ARGUMENT ("Backend foo not supported!") unless `backend` is
// registered.
absl::Status CheckProcessGroupBackend(absl::string_view backend);
// Creates (collectively) a group with the named backend. INVALID_ARGUMENT
// for an unknown backend ("Backend foo not supported!") or bad options.
absl::StatusOr<std::shared_ptr<ProcessGroup>> CreateProcessGroup(
    absl::string_view backend, const ProcessGroupOptions& options);

// Exchanges one byte string per member (of any lengths) and returns them in
// group-rank order: PyTorch's all_gather_object for serialized payloads.
// One all-gather when every payload is at most 1016 bytes, two otherwise
// (neither agrees on plans first: their sizes follow from the protocol).
// Works on any backend (CUDA backends stage through the device).
absl::StatusOr<std::vector<std::string>> AllGatherBytes(
    ProcessGroup& group, absl::string_view bytes);

// Agreement on an outcome (collective): exchanges each member's `local`
// status. AllGatherStatuses returns every member's, in group-rank order,
// each error's message prefixed "on rank <global rank>: " (code kept).
// AllGatherStatus returns the same answer on every member: OK when every
// member is OK, otherwise the lowest failing member's annotated status; so
// members that went through the same steps agree on whether to commit them.
// An error of the exchange itself (a dead peer: UNAVAILABLE,
// DEADLINE_EXCEEDED) is returned as is, and then members may disagree.
absl::StatusOr<std::vector<absl::Status>> AllGatherStatuses(
    ProcessGroup& group, const absl::Status& local);
absl::Status AllGatherStatus(ProcessGroup& group, const absl::Status& local);

// Exchanges one payload or error per member (collective), so that a local
// mistake fails every member together instead of leaving the others waiting
// in the next collective. Returns every member's payload in group-rank
// order. When any member has an error, every member returns one: its own
// `local` error first, otherwise the lowest failing member's, with its
// message prefixed "on rank <global rank>: " (code kept). DATA_LOSS for a
// record that is neither; errors of the exchange itself as AllGatherBytes.
absl::StatusOr<std::vector<std::string>> AllGatherOutcomes(
    ProcessGroup& group, const absl::StatusOr<std::string>& local);

// Helpers for backends: argument checks and cross-member agreement, so
// that every backend rejects the same calls with the same messages.
namespace collective {

// What one member sends to and expects from every member (itself
// included) in one collective, in bytes; kNone where nothing moves.
// Members exchange plans before moving data, so that sizes, dtypes or roots
// that differ between members are INVALID_ARGUMENT on every member instead
// of a transport hang or a transport assertion (Gloo aborts the process
// when more bytes arrive than a receive expects).
struct TransferPlan {
  static constexpr int64_t kNone = -1;

  // The collective's name, for messages ("AllGather").
  absl::string_view op;
  DType dtype = DType::kUInt8;
  std::vector<int64_t> send_bytes;  // size() entries.
  std::vector<int64_t> recv_bytes;  // size() entries.

  // [dtype, send_bytes..., recv_bytes...]: 2 * size() + 1 entries, the same
  // length on every member, so plans travel in an equal-size all-gather.
  std::vector<int64_t> Encode() const;
};

// Each checks one member's arguments (INVALID_ARGUMENT: undefined or
// non-contiguous tensors, mixed dtypes, tensors off the group's device, a
// wrong number of tensors, a root out of range, per-rank sizes that disagree
// locally) and returns that member's plan. Nothing is sent.
absl::StatusOr<TransferPlan> PlanBroadcast(const ProcessGroup& group,
                                           const Tensor& tensor, int root);
absl::StatusOr<TransferPlan> PlanAllGather(const ProcessGroup& group,
                                           const Tensor& input,
                                           absl::Span<const Tensor> outputs);
absl::StatusOr<TransferPlan> PlanGather(const ProcessGroup& group,
                                        const Tensor& input,
                                        absl::Span<const Tensor> outputs,
                                        int root);
absl::StatusOr<TransferPlan> PlanScatter(const ProcessGroup& group,
                                         absl::Span<const Tensor> inputs,
                                         const Tensor& output, int root);
absl::StatusOr<TransferPlan> PlanAllToAll(const ProcessGroup& group,
                                          absl::Span<const Tensor> inputs,
                                          absl::Span<const Tensor> outputs);

// Checks every member's encoded plan (concatenated in group-rank order)
// against the others. Returns the total bytes the collective moves (0: no
// member has anything to do) or INVALID_ARGUMENT naming the first
// disagreement; every member computes the same answer from the same plans.
absl::StatusOr<int64_t> CheckPlansAgree(absl::string_view op, int size,
                                        absl::Span<const int64_t> plans);

}  // namespace collective
}  // namespace tessera

#endif  // TESSERA_SERVER_COLLECTIVE_PROCESS_GROUP_H_
