// NcclBackend: the ProcessGroup for CUDA tensors, over NCCL. Built only
// when Tessera is configured with NCCL (TESSERA_WITH_NCCL).
//
// Group rank 0 creates the NCCL unique id and publishes it in the group's
// Store ("nccl/<name>/unique_id"); every member joins the communicator on
// options.device_index with a non-blocking init, so a member that never
// arrives is DEADLINE_EXCEEDED instead of a hang. Collectives run on one
// dedicated stream per group; each call waits for its own work, polling the
// stream and the communicator until options.timeout, then aborts the
// communicator. Uneven all-gathers, gathers, scatters and all-to-alls are
// grouped ncclSend/ncclRecv; tensors move as bytes, so every dtype works.
// As with Gloo, members first all-gather a small plan so that arguments that
// disagree between members are INVALID_ARGUMENT on all of them.
//
// Failure: no CUDA device is FAILED_PRECONDITION at Create; NCCL and CUDA
// errors become absl::Status with NCCL's message (UNAVAILABLE for system or
// remote errors, DEADLINE_EXCEEDED for timeouts, INTERNAL otherwise), and
// any of them breaks the group (later calls FAILED_PRECONDITION).
//
// Thread-safety: as ProcessGroup; an internal mutex serialises collectives
// and Shutdown. Calls may come from any thread: each sets the CUDA device.
#ifndef TESSERA_SERVER_COLLECTIVE_NCCL_NCCL_BACKEND_H_
#define TESSERA_SERVER_COLLECTIVE_NCCL_NCCL_BACKEND_H_

#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/collective/process_group.h"

namespace tessera {

class NcclBackend : public ProcessGroup {
 public:
  // Joins the group described by `options` (already validated by
  // CreateProcessGroup); blocks until every member has joined or
  // options.timeout has passed.
  static absl::StatusOr<std::shared_ptr<NcclBackend>> Create(
      const ProcessGroupOptions& options);
  ~NcclBackend() override;

  absl::string_view backend() const override { return "nccl"; }
  Device::Type device_type() const override { return Device::Type::kCuda; }
  Device device() const override { return Device::Cuda(device_index_); }

  absl::Status Barrier() override;
  absl::Status Broadcast(const Tensor& tensor, int root) override;
  absl::Status AllGather(const Tensor& input,
                         absl::Span<const Tensor> outputs) override;
  absl::Status Gather(const Tensor& input, absl::Span<const Tensor> outputs,
                      int root) override;
  absl::Status Scatter(absl::Span<const Tensor> inputs, const Tensor& output,
                       int root) override;
  absl::Status AllToAll(absl::Span<const Tensor> inputs,
                        absl::Span<const Tensor> outputs) override;
  absl::Status Usable() const override;
  void Shutdown() override;

  // The communicator, its stream and a small device scratch buffer
  // (defined in the .cc, which alone includes NCCL and CUDA headers).
  struct Comm;
  // One collective's view of the transport.
  struct Call {
    Comm& comm;
    int rank;
    absl::Time deadline;
  };

 private:
  NcclBackend(const ProcessGroupOptions& options, std::unique_ptr<Comm> comm);

  // Runs one collective under the lock: agrees on `plan` with the other
  // members (unless null), then, when any member moves bytes, enqueues
  // `body` and waits for the stream; errors break the group.
  absl::Status Run(absl::string_view op, const collective::TransferPlan* plan,
                   absl::FunctionRef<absl::Status(const Call&)> body);
  const int device_index_;
  const absl::Duration timeout_;
  mutable absl::Mutex mu_;
  // Null once shut down or aborted.
  std::unique_ptr<Comm> comm_ ABSL_GUARDED_BY(mu_);
  // Why the group is unusable; OK while it works.
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_SERVER_COLLECTIVE_NCCL_NCCL_BACKEND_H_
