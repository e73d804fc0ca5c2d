// GlooBackend: the ProcessGroup for CPU tensors, over Gloo's TCP transport.
//
// Members rendezvous through the group's Store (each publishes its pair
// addresses under "gloo/<name>/..." and connects a full mesh), then move
// bytes directly between each other; nothing bulky touches the store. Every
// collective treats tensors as bytes, so all 12 dtypes work. Before moving
// data, members all-gather a small plan (collective::TransferPlan) so that
// arguments that disagree between members fail on all of them alike.
//
// Gloo reports failures by throwing; this class catches every exception at
// its boundary and returns absl::Status: a rendezvous key that never appears
// or a peer that stalls is DEADLINE_EXCEEDED, a lost connection UNAVAILABLE,
// a Gloo assertion INTERNAL. After any of these the group is broken and
// later calls are FAILED_PRECONDITION. The rendezvous keys are deleted once
// every member has connected (or the rendezvous failed), so a name can be
// reused for a new group after the old one is gone.
//
// Thread-safety: as ProcessGroup; an internal mutex serialises collectives
// and Shutdown. The Gloo device runs one I/O thread per group.
#ifndef TESSERA_SERVER_COLLECTIVE_GLOO_GLOO_BACKEND_H_
#define TESSERA_SERVER_COLLECTIVE_GLOO_GLOO_BACKEND_H_

#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/collective/process_group.h"

namespace gloo {
class Context;
}  // namespace gloo

namespace tessera {

class GlooBackend : public ProcessGroup {
 public:
  // Joins the group described by `options` (already validated by
  // CreateProcessGroup); blocks until every member has joined or
  // options.timeout has passed.
  static absl::StatusOr<std::shared_ptr<GlooBackend>> Create(
      const ProcessGroupOptions& options);
  ~GlooBackend() override;

  absl::string_view backend() const override { return "gloo"; }
  Device::Type device_type() const override { return Device::Type::kCpu; }

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
  void Shutdown() override;

  // One collective's view of the transport: a tag no other collective of
  // this group uses, and the deadline that bounds every wait.
  struct Call {
    std::shared_ptr<gloo::Context> context;
    uint32_t tag;
    absl::Time deadline;
  };

 private:
  GlooBackend(const ProcessGroupOptions& options,
              std::shared_ptr<gloo::Context> context);

  // Runs one collective under the lock: agrees on `plan` with the other
  // members (unless null), then runs `body` when any member moves bytes,
  // turning Gloo's exceptions into a Status and marking the group broken.
  absl::Status Run(absl::string_view op, const collective::TransferPlan* plan,
                   absl::FunctionRef<void(const Call&)> body);
  uint32_t NextTag() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The collectives, with or without agreeing on their plans first.
  absl::Status AllGatherImpl(const Tensor& input,
                             absl::Span<const Tensor> outputs, bool agree);
  absl::Status GatherImpl(const Tensor& input, absl::Span<const Tensor> outputs,
                          int root, bool agree);

  const absl::Duration timeout_;
  mutable absl::Mutex mu_;
  // Null once shut down.
  std::shared_ptr<gloo::Context> context_ ABSL_GUARDED_BY(mu_);
  // Why the group is unusable; OK while it works.
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  // Every member issues collectives in the same order, so counting them
  // gives matching tags without any exchange. Tag 0 is the rendezvous
  // barrier's.
  uint32_t next_tag_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_COLLECTIVE_GLOO_GLOO_BACKEND_H_
