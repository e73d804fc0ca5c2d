#include "server/collective/nccl/nccl_backend.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tessera {

struct NcclBackend::Comm {
  Comm(int device, size_t scratch_bytes)
      : device(device), scratch_bytes(scratch_bytes) {}
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;
  // Aborts rather than destroys the communicator: abort never waits for
  // peers, which may be gone.
  ~Comm() {
    cudaSetDevice(device);
    if (comm != nullptr) ncclCommAbort(comm);
    if (stream != nullptr) cudaStreamDestroy(stream);
    if (scratch != nullptr) cudaFree(scratch);
  }

  const int device;
  const size_t scratch_bytes;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  void* scratch = nullptr;
};

namespace {

using collective::TransferPlan;

absl::Status CudaStatus(cudaError_t error, absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(what, ": ", cudaGetErrorString(error)));
}

absl::Status NcclStatus(ncclResult_t result, ncclComm_t comm,
                        absl::string_view what) {
  const std::string message = absl::StrCat(
      what, ": ", ncclGetErrorString(result),
      comm != nullptr ? absl::StrCat(" (", ncclGetLastError(comm), ")") : "");
  switch (result) {
    case ncclSuccess:
      return absl::OkStatus();
    case ncclSystemError:
    case ncclRemoteError:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status TimedOut(absl::string_view what, absl::Duration timeout) {
  return absl::DeadlineExceededError(
      absl::StrCat(what, " timed out after ", absl::FormatDuration(timeout)));
}

// Calls `poll` (a Status once finished or failed, nullopt while pending)
// with a short backoff until `deadline`.
template <typename Poll>
absl::Status PollUntil(absl::Time deadline, absl::string_view what,
                       absl::Duration timeout, Poll poll) {
  absl::Duration backoff = absl::Microseconds(10);
  for (;;) {
    std::optional<absl::Status> done = poll();
    if (done.has_value()) return *done;
    if (absl::Now() >= deadline) return TimedOut(what, timeout);
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Milliseconds(1));
  }
}

// A non-blocking communicator answers ncclInProgress until an operation is
// enqueued (or the communicator initialised); waits for that, bounded.
absl::Status Settle(ncclComm_t comm, ncclResult_t result, absl::Time deadline,
                    absl::Duration timeout, absl::string_view what) {
  if (result != ncclInProgress) return NcclStatus(result, comm, what);
  return PollUntil(deadline, what, timeout,
                   [&]() -> std::optional<absl::Status> {
                     ncclResult_t state = ncclInProgress;
                     ncclResult_t r = ncclCommGetAsyncError(comm, &state);
                     if (r != ncclSuccess) return NcclStatus(r, comm, what);
                     if (state == ncclInProgress) return std::nullopt;
                     return NcclStatus(state, comm, what);
                   });
}

// Waits for the stream's work, watching the communicator for asynchronous
// errors (a peer that died) meanwhile.
absl::Status SyncStream(const NcclBackend::Comm& comm, absl::Time deadline,
                        absl::Duration timeout) {
  return PollUntil(deadline, "waiting for the NCCL stream", timeout,
                   [&]() -> std::optional<absl::Status> {
                     const cudaError_t query = cudaStreamQuery(comm.stream);
                     if (query == cudaSuccess) return absl::OkStatus();
                     if (query != cudaErrorNotReady) {
                       return CudaStatus(query, "cudaStreamQuery");
                     }
                     ncclResult_t state = ncclSuccess;
                     ncclCommGetAsyncError(comm.comm, &state);
                     if (state != ncclSuccess && state != ncclInProgress) {
                       return NcclStatus(state, comm.comm, "NCCL communicator");
                     }
                     return std::nullopt;
                   });
}

size_t PlanBytes(int size) {
  return (2 * static_cast<size_t>(size) + 1) * sizeof(int64_t);
}

// Moves every member's share as the agreed plan says: sends[r] / recvs[r]
// hold the bytes for / from member r. The own share is a device copy; the
// rest is one fused group of sends and receives, so no member waits on
// another in a fixed order. Empty shares are skipped on both ends.
absl::Status Exchange(const NcclBackend::Call& call, const TransferPlan& plan,
                      const std::vector<const void*>& sends,
                      const std::vector<void*>& recvs, absl::Duration timeout) {
  const int self = call.rank;
  if (plan.send_bytes[self] > 0) {
    RETURN_IF_ERROR(CudaStatus(
        cudaMemcpyAsync(recvs[self], sends[self], plan.send_bytes[self],
                        cudaMemcpyDeviceToDevice, call.comm.stream),
        "cudaMemcpyAsync"));
  }
  ncclResult_t first_error = ncclGroupStart();
  for (size_t r = 0; r < sends.size() && first_error == ncclSuccess; ++r) {
    if (static_cast<int>(r) == self) continue;
    if (plan.send_bytes[r] > 0) {
      first_error =
          ncclSend(sends[r], plan.send_bytes[r], ncclUint8, static_cast<int>(r),
                   call.comm.comm, call.comm.stream);
    }
    if (first_error == ncclSuccess && plan.recv_bytes[r] > 0) {
      first_error =
          ncclRecv(recvs[r], plan.recv_bytes[r], ncclUint8, static_cast<int>(r),
                   call.comm.comm, call.comm.stream);
    }
  }
  // The group must be closed even after a failed enqueue.
  const ncclResult_t end = ncclGroupEnd();
  RETURN_IF_ERROR(NcclStatus(first_error, call.comm.comm, "ncclSend/Recv"));
  return Settle(call.comm.comm, end, call.deadline, timeout, "ncclGroupEnd");
}

// All-gathers every member's encoded plan through the scratch buffer.
absl::Status GatherPlans(const NcclBackend::Call& call,
                         const TransferPlan& plan, int size,
                         absl::Duration timeout, std::vector<int64_t>* all) {
  const std::vector<int64_t> mine = plan.Encode();
  auto* device = static_cast<int64_t*>(call.comm.scratch);
  RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(device, mine.data(), mine.size() * sizeof(int64_t),
                      cudaMemcpyHostToDevice, call.comm.stream),
      "cudaMemcpyAsync"));
  RETURN_IF_ERROR(
      Settle(call.comm.comm,
             ncclAllGather(device, device + mine.size(), mine.size(), ncclInt64,
                           call.comm.comm, call.comm.stream),
             call.deadline, timeout, "ncclAllGather"));
  // Wait with the timeout first: a copy to pageable memory would block
  // without one until the all-gather finishes.
  RETURN_IF_ERROR(SyncStream(call.comm, call.deadline, timeout));
  all->resize(mine.size() * size);
  return CudaStatus(
      cudaMemcpy(all->data(), device + mine.size(),
                 all->size() * sizeof(int64_t), cudaMemcpyDeviceToHost),
      "cudaMemcpy");
}

// Joins the communicator; `comm` owns whatever was created, even on error.
absl::Status InitComm(const ProcessGroupOptions& options, int size,
                      absl::Time deadline, NcclBackend::Comm& comm) {
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(comm.device), "cudaSetDevice"));
  ncclUniqueId id;
  const std::string key = absl::StrCat("nccl/", options.name, "/unique_id");
  if (options.rank == 0) {
    RETURN_IF_ERROR(
        NcclStatus(ncclGetUniqueId(&id), nullptr, "ncclGetUniqueId"));
    RETURN_IF_ERROR(options.store->Set(
        key, absl::string_view(id.internal, sizeof(id.internal))));
  } else {
    ASSIGN_OR_RETURN(std::string value,
                     options.store->Get(key, deadline - absl::Now()));
    if (value.size() != sizeof(id.internal)) {
      return absl::InternalError(absl::StrCat(
          "store key ", key, " holds ", value.size(), " bytes, not an id"));
    }
    std::memcpy(id.internal, value.data(), value.size());
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // So that a missing member cannot hang us.
  const ncclResult_t init =
      ncclCommInitRankConfig(&comm.comm, size, id, options.rank, &config);
  RETURN_IF_ERROR(Settle(comm.comm, init, deadline, options.timeout,
                         "ncclCommInitRankConfig"));
  // A blocking stream: it waits for work on the legacy default stream, where
  // Tensor copies run, so inputs are complete before NCCL reads them.
  RETURN_IF_ERROR(
      CudaStatus(cudaStreamCreate(&comm.stream), "cudaStreamCreate"));
  return CudaStatus(cudaMalloc(&comm.scratch, comm.scratch_bytes),
                    "cudaMalloc");
}

}  // namespace

NcclBackend::NcclBackend(const ProcessGroupOptions& options,
                         std::unique_ptr<Comm> comm)
    : ProcessGroup(options.rank, options.global_ranks, options.name),
      device_index_(options.device_index),
      timeout_(options.timeout),
      comm_(std::move(comm)) {}

NcclBackend::~NcclBackend() { Shutdown(); }

absl::StatusOr<std::shared_ptr<NcclBackend>> NcclBackend::Create(
    const ProcessGroupOptions& options) {
  if (!CudaAvailable()) {
    return absl::FailedPreconditionError(
        "the nccl backend needs a CUDA device, and none is visible");
  }
  if (options.device_index < 0 || options.device_index >= CudaDeviceCount()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device_index ", options.device_index, " is not among the ",
        CudaDeviceCount(), " visible CUDA devices"));
  }
  const int size = static_cast<int>(options.global_ranks.size());
  const absl::Time deadline = absl::Now() + options.timeout;
  // Scratch: this member's plan and everyone's; the barrier reuses it.
  auto comm = std::make_unique<Comm>(options.device_index,
                                     PlanBytes(size) * (size + 1));
  absl::Status status = InitComm(options, size, deadline, *comm);
  std::shared_ptr<NcclBackend> group;
  if (status.ok()) {
    group.reset(new NcclBackend(options, std::move(comm)));
    // Everyone has read the id once all pass the barrier.
    status = group->Barrier();
  }
  if (options.rank == 0) {
    options.store->Delete(absl::StrCat("nccl/", options.name, "/unique_id"))
        .IgnoreError();
  }
  if (!status.ok()) {
    return Annotate(
        status, absl::StrCat("joining nccl group ", options.name, " as rank ",
                             options.rank, " of ", size));
  }
  return group;
}

absl::Status NcclBackend::Run(
    absl::string_view op, const TransferPlan* plan,
    absl::FunctionRef<absl::Status(const Call&)> body) {
  const std::string where = absl::StrCat(op, " on nccl group ", name());
  absl::MutexLock lock(&mu_);
  if (!broken_.ok()) return Annotate(broken_, where);
  const Call call{*comm_, rank(), absl::Now() + timeout_};
  std::vector<int64_t> plans;
  absl::Status status =
      CudaStatus(cudaSetDevice(device_index_), "cudaSetDevice");
  if (status.ok() && plan != nullptr) {
    status = GatherPlans(call, *plan, size(), timeout_, &plans);
  }
  if (status.ok()) {
    absl::StatusOr<int64_t> total =
        plan == nullptr ? int64_t{1}
                        : collective::CheckPlansAgree(plan->op, size(), plans);
    if (!total.ok() || *total == 0) return total.status();
    status = body(call);
    if (status.ok()) status = SyncStream(*comm_, call.deadline, timeout_);
  }
  if (status.ok()) return status;
  comm_.reset();  // Aborts the communicator, so peers fail rather than hang.
  broken_ = absl::FailedPreconditionError(absl::StrCat(
      "the group is broken by an earlier failure (", status.message(), ")"));
  return Annotate(status, where);
}

absl::Status NcclBackend::Barrier() {
  return Run("Barrier", nullptr, [&](const Call& call) {
    float* word = static_cast<float*>(call.comm.scratch);
    return Settle(call.comm.comm,
                  ncclAllReduce(word, word, 1, ncclFloat32, ncclSum,
                                call.comm.comm, call.comm.stream),
                  call.deadline, timeout_, "ncclAllReduce");
  });
}

absl::Status NcclBackend::Broadcast(const Tensor& tensor, int root) {
  ASSIGN_OR_RETURN(TransferPlan plan,
                   collective::PlanBroadcast(*this, tensor, root));
  return Run("Broadcast", &plan, [&](const Call& call) {
    return Settle(
        call.comm.comm,
        ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), tensor.nbytes(),
                      ncclUint8, root, call.comm.comm, call.comm.stream),
        call.deadline, timeout_, "ncclBroadcast");
  });
}

absl::Status NcclBackend::AllGather(const Tensor& input,
                                    absl::Span<const Tensor> outputs) {
  ASSIGN_OR_RETURN(TransferPlan plan,
                   collective::PlanAllGather(*this, input, outputs));
  return Run("AllGather", &plan, [&](const Call& call) {
    std::vector<const void*> sends(size(), input.data_ptr());
    std::vector<void*> recvs;
    for (const Tensor& t : outputs) recvs.push_back(t.data_ptr());
    return Exchange(call, plan, sends, recvs, timeout_);
  });
}

absl::Status NcclBackend::Gather(const Tensor& input,
                                 absl::Span<const Tensor> outputs, int root) {
  ASSIGN_OR_RETURN(TransferPlan plan,
                   collective::PlanGather(*this, input, outputs, root));
  return Run("Gather", &plan, [&](const Call& call) {
    std::vector<const void*> sends(size(), nullptr);
    sends[root] = input.data_ptr();
    std::vector<void*> recvs(size(), nullptr);
    for (size_t r = 0; r < outputs.size(); ++r) {
      recvs[r] = outputs[r].data_ptr();
    }
    return Exchange(call, plan, sends, recvs, timeout_);
  });
}

absl::Status NcclBackend::Scatter(absl::Span<const Tensor> inputs,
                                  const Tensor& output, int root) {
  ASSIGN_OR_RETURN(TransferPlan plan,
                   collective::PlanScatter(*this, inputs, output, root));
  return Run("Scatter", &plan, [&](const Call& call) {
    std::vector<const void*> sends(size(), nullptr);
    for (size_t r = 0; r < inputs.size(); ++r) sends[r] = inputs[r].data_ptr();
    std::vector<void*> recvs(size(), nullptr);
    recvs[root] = output.data_ptr();
    return Exchange(call, plan, sends, recvs, timeout_);
  });
}

absl::Status NcclBackend::AllToAll(absl::Span<const Tensor> inputs,
                                   absl::Span<const Tensor> outputs) {
  ASSIGN_OR_RETURN(TransferPlan plan,
                   collective::PlanAllToAll(*this, inputs, outputs));
  return Run("AllToAll", &plan, [&](const Call& call) {
    std::vector<const void*> sends;
    for (const Tensor& t : inputs) sends.push_back(t.data_ptr());
    std::vector<void*> recvs;
    for (const Tensor& t : outputs) recvs.push_back(t.data_ptr());
    return Exchange(call, plan, sends, recvs, timeout_);
  });
}

absl::Status NcclBackend::Usable() const {
  absl::MutexLock lock(&mu_);
  return broken_;
}

void NcclBackend::Shutdown() {
  absl::MutexLock lock(&mu_);
  if (comm_ == nullptr) return;
  comm_.reset();
  broken_ = absl::FailedPreconditionError("the group is shut down");
}

namespace {

// Registered while the program starts: tessera_process_group links this
// library whole (CMake's WHOLE_ARCHIVE), so the linker keeps this
// initialiser although nothing refers to it.
[[maybe_unused]] const bool kNcclBackendRegistered =
    RegisterProcessGroupBackend(
        "nccl",
        [](const ProcessGroupOptions& options)
            -> absl::StatusOr<std::shared_ptr<ProcessGroup>> {
          ASSIGN_OR_RETURN(std::shared_ptr<NcclBackend> group,
                           NcclBackend::Create(options));
          return std::shared_ptr<ProcessGroup>(std::move(group));
        });

}  // namespace

}  // namespace tessera
