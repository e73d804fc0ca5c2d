// ReformableGroup: a ProcessGroup that survives the failure of its
// transport by forming it again, in a new generation, with the same members.
//
// A backend group (Gloo, NCCL) is unusable for good after a transport
// failure: a member that died, or stalled past the timeout. A
// ReformableGroup holds one backend group per *generation* (1, 2, ...),
// each rendezvousing under a store prefix of its own, and forwards every
// collective to the current one. When that breaks, Reform() forms the next
// generation as soon as every member takes part again (the stalled one
// resumed, the dead one restarted with the same rank): nobody restarts.
// Holders of the group (tensors, the control service) keep the same object
// and see the new transport without noticing.
//
// Agreement, through the group's store:
//   "generation"              the generation members should form. A member
//                             that needs a new one moves it from its own g
//                             to g + 1 by CompareSet, so members that break
//                             together ask for the same one, and a member
//                             that lags behind finds the newer one;
//   "gen/<g>/arrived/<rank>"  member <rank> is ready to form g.
// Once every member arrived, each runs the backend's rendezvous under
// "gen/<g>/" (bounded by the timeout); a member whose rendezvous fails asks
// for g + 1 and everyone follows. A member starting while the store
// already names a generation (a restarted member) asks for the next one, so
// the running members form it with the newcomer (they notice through
// WantedGeneration(), see Reform).
//
// Fencing: a member left in an older generation (a zombie: stalled, or an
// old process of a restarted rank) cannot take part in collectives of the
// current one; its calls on the old transport fail, because the others
// shut theirs down before they form the next.
//
// Thread-safety: as ProcessGroup: collectives and Reform() from one thread
// (the one that issues collectives). generation(), Usable(), State() and
// Shutdown() from any thread.
// Failure: never aborts; see Reform().
#ifndef TESSERA_SERVER_COLLECTIVE_REFORMABLE_GROUP_H_
#define TESSERA_SERVER_COLLECTIVE_REFORMABLE_GROUP_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/collective/process_group.h"

namespace tessera {

// How Reform() waits.
struct ReformOptions {
  // Gives up with DEADLINE_EXCEEDED (naming the members still missing).
  absl::Time deadline = absl::InfiniteFuture();
  // Polled between waits; Reform() returns CANCELLED once it says true.
  std::function<bool()> cancelled;
  // How often the store is looked at while members are missing.
  absl::Duration poll_interval = absl::Milliseconds(100);
};

// Where a group stands, for health reports.
struct GroupState {
  // The generation in use (0 before the first formed).
  int64_t generation = 0;
  // OK while that generation's transport works, else what broke it.
  absl::Status usable;
  // While Reform() runs: the generation being formed and the global ranks
  // it still waits for, as last counted (empty before the first count);
  // forming == 0 otherwise. all_arrived: every member arrived for
  // `forming` (missing alone cannot tell: it is empty until counted).
  int64_t forming = 0;
  std::vector<int> missing;
  bool all_arrived = false;
};

class ReformableGroup final : public ProcessGroup {
 public:
  // Forms the first generation (collective, bounded by options.timeout):
  // generation 1 for a new group, or the one after the store's current
  // generation when the others formed one before (a member that restarted).
  // Errors as the backend's rendezvous; INVALID_ARGUMENT for an unknown
  // backend.
  static absl::StatusOr<std::shared_ptr<ReformableGroup>> Create(
      const std::string& backend, const ProcessGroupOptions& options);
  ~ReformableGroup() override;

  absl::string_view backend() const override { return backend_; }
  Device::Type device_type() const override { return device_.type(); }
  Device device() const override { return device_; }

  absl::Status Barrier() override;
  absl::Status Broadcast(const Tensor& tensor, int root) override;
  absl::Status AllGather(const Tensor& input,
                         absl::Span<const Tensor> outputs) override;
  absl::Status Gather(const Tensor& input, absl::Span<const Tensor> outputs,
                      int root) override;
  absl::Status AllGatherAgreed(const Tensor& input,
                               absl::Span<const Tensor> outputs) override;
  absl::Status GatherAgreed(const Tensor& input,
                            absl::Span<const Tensor> outputs,
                            int root) override;
  absl::Status Scatter(absl::Span<const Tensor> inputs, const Tensor& output,
                       int root) override;
  absl::Status AllToAll(absl::Span<const Tensor> inputs,
                        absl::Span<const Tensor> outputs) override;
  absl::Status Usable() const override;
  // Shuts the current generation down; Reform() fails afterwards.
  void Shutdown() override;

  int64_t generation() const;
  GroupState State() const;

  // The generation the store asks members to form: more than generation()
  // when another member broke or restarted. UNAVAILABLE when the store
  // cannot be read.
  absl::StatusOr<int64_t> WantedGeneration() const;
  // Whether this member should call Reform(): its transport broke, or the
  // store asks for a newer generation. Store errors count as no.
  bool NeedsReform() const;

  // Forms the next generation with every member (collective; every member
  // calls it, each once it finds NeedsReform()): shuts the current
  // transport down, asks for the next generation, waits for every member
  // to arrive and rendezvous. Blocks while a member is missing (a dead
  // member that is never restarted keeps the others here until
  // options.deadline). OK once a new generation works; DEADLINE_EXCEEDED
  // naming the missing members; CANCELLED; FAILED_PRECONDITION after
  // Shutdown(). Store errors are retried until the deadline.
  absl::Status Reform(const ReformOptions& options = {});

 private:
  ReformableGroup(const std::string& backend,
                  const ProcessGroupOptions& options);
  // FAILED_PRECONDITION: the group is shut down.
  absl::Status ShutDownError() const;
  // The current transport, or FAILED_PRECONDITION naming why there is none.
  absl::StatusOr<std::shared_ptr<ProcessGroup>> Current() const;
  // Runs `call` on the current transport and notes whether it broke it.
  // Runs `call` on the current generation's group, counted in the metrics
  // as `collective` (server/metrics/metrics.h).
  absl::Status Forward(const char* collective,
                       absl::FunctionRef<absl::Status(ProcessGroup&)> call);
  // Waits for every member to arrive at `target` (or for the store to name
  // a newer generation, which becomes the target) and forms it.
  absl::Status FormFrom(int64_t current, const ReformOptions& options);

  const std::string backend_;
  const ProcessGroupOptions options_;
  // The first generation's; set before the group is handed out.
  Device device_ = Device::Cpu();
  // This process's claim on its rank (MemberKey), random per process.
  const std::string incarnation_;

  mutable absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<ProcessGroup> current_ ABSL_GUARDED_BY(mu_);
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  int64_t forming_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<int> missing_ ABSL_GUARDED_BY(mu_);
  bool all_arrived_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_COLLECTIVE_REFORMABLE_GROUP_H_
