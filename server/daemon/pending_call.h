// A client's call waiting for its logged operation (PendingCall), what the
// operation produced for the reply (OpResult), and the slot a Gather
// stream waits on (ResultSlot).
//
// A PendingCall is completed exactly once, by whichever comes first: the
// executor (the op's agreed outcome, op_log.h), the submit thread (its
// deadline passed, the store failed), the gRPC reactor (the client
// cancelled), membership (a daemon went silent while it waited,
// membership.h) or Shutdown. Later completions do nothing, so the caller
// always gets one answer and never waits past its deadline.
//
// Thread-safety: every method may be called from any thread. Ownership:
// shared by the log's pending set, the submit queue and the reactor.
#ifndef TESSERA_SERVER_DAEMON_PENDING_CALL_H_
#define TESSERA_SERVER_DAEMON_PENDING_CALL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/tensor/tensor.h"
#include "server/daemon/memory_budget.h"
#include "tessera/v1/control.pb.h"

namespace tessera::control_internal {

// What an op produced, for its coordinator's reply.
struct OpResult {
  v1::TensorInfo info;                // CreateTensor, Reshard, Gather
  std::vector<std::string> names;     // SaveCheckpoint
  std::vector<v1::TensorInfo> infos;  // LoadCheckpoint
  v1::VersionGroup group;  // BeginVersion, PublishVersion, PinVersions
  Tensor gathered;         // Gather, on the coordinator
  // Its share of the memory budget, held until the stream is done with it.
  std::shared_ptr<MemoryBudget::Reservation> gathered_reservation;
};

using Completion = std::function<void(const absl::Status&, OpResult)>;

class PendingCall {
 public:
  PendingCall(uint64_t id, std::string method, std::string request_id,
              absl::Time deadline, Completion completion)
      : id_(id),
        method_(std::move(method)),
        request_id_(std::move(request_id)),
        deadline_(deadline),
        created_(absl::Now()),
        completion_(std::move(completion)) {}

  // Runs the completion unless it ran already.
  void Complete(const absl::Status& status, OpResult result = {}) {
    Completion completion;
    {
      absl::MutexLock lock(&mu_);
      completion = std::exchange(completion_, nullptr);
    }
    if (completion != nullptr) completion(status, std::move(result));
  }
  bool done() const {
    absl::MutexLock lock(&mu_);
    return completion_ == nullptr;
  }

  // Unique within this daemon's incarnation: with the coordinator's rank
  // and incarnation it names the call in the log (ControlOp.request_id).
  uint64_t id() const { return id_; }
  const std::string& method() const { return method_; }
  // The client's id of the call (wire/request_id.h); "" when none.
  const std::string& request_id() const { return request_id_; }
  absl::Time deadline() const { return deadline_; }
  // When the call arrived (its op's wait in the log counts from here).
  absl::Time created() const { return created_; }

 private:
  const uint64_t id_;
  const std::string method_;
  const std::string request_id_;
  const absl::Time deadline_;
  const absl::Time created_;
  mutable absl::Mutex mu_;
  Completion completion_ ABSL_GUARDED_BY(mu_);
};

// The outcome of a Gather for the stream that sends it: set once by the
// call's completion, waited for by the stream's own thread.
class ResultSlot {
 public:
  void Set(const absl::Status& status, OpResult result) {
    absl::MutexLock lock(&mu_);
    status_ = status;
    result_ = std::move(result);
    set_ = true;
  }
  // The result, or DEADLINE_EXCEEDED when none was set by `deadline`.
  absl::StatusOr<OpResult> Wait(absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    if (!mu_.AwaitWithDeadline(absl::Condition(&set_), deadline)) {
      return absl::DeadlineExceededError(
          "Gather did not complete within its deadline (a gather changes "
          "nothing: retry it)");
    }
    if (!status_.ok()) return status_;
    return std::move(result_);
  }

 private:
  absl::Mutex mu_;
  bool set_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  OpResult result_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::control_internal

#endif  // TESSERA_SERVER_DAEMON_PENDING_CALL_H_
