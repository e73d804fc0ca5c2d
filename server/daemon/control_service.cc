#include "server/daemon/control_service.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/proto_convert.h"
#include "common/status_macros.h"
#include "server/checkpoint/checkpoint.h"
#include "server/collective/process_group.h"
#include "server/daemon/region_io.h"
#include "server/serve/shard_service.h"
#include "server/sharded/sharded_tensor.h"
#include "server/store/prefix_store.h"
#include "spdlog/spdlog.h"
#include "tessera/v1/control_internal.pb.h"
#include "wire/grpc_status.h"

#ifndef TESSERA_VERSION
#define TESSERA_VERSION "0.1.0"
#endif

namespace tessera {
namespace control_internal {
namespace {

constexpr char kShuttingDown[] = "daemon is shutting down";
constexpr char kStarting[] = "daemon is starting";
// Store keys, under the "control" prefix.
constexpr char kSeqKey[] = "seq";
constexpr char kSkip[] = "skip";
constexpr char kOpPrefix[] = "op:";
constexpr size_t kMaxNameLength = 128;

std::string OpKey(int64_t n) { return absl::StrCat("op/", n); }

const char* OpName(const v1::ControlOp& op) {
  switch (op.request_case()) {
    case v1::ControlOp::kCreateTensor:
      return "CreateTensor";
    case v1::ControlOp::kDeleteTensor:
      return "DeleteTensor";
    case v1::ControlOp::kReshard:
      return "Reshard";
    case v1::ControlOp::kGather:
      return "Gather";
    case v1::ControlOp::kSaveCheckpoint:
      return "SaveCheckpoint";
    case v1::ControlOp::kLoadCheckpoint:
      return "LoadCheckpoint";
    case v1::ControlOp::REQUEST_NOT_SET:
      break;
  }
  return "unknown operation";
}

absl::Status ValidateName(absl::string_view name) {
  bool ok = !name.empty() && name.size() <= kMaxNameLength;
  for (char c : name) {
    ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_' ||
                c == '.' || c == '-');
  }
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "invalid tensor name \"", absl::CHexEscape(name.substr(0, 200)),
      "\": a name is 1 to 128 characters of [A-Za-z0-9_.-]"));
}

absl::Status UnknownTensor(absl::string_view name) {
  return absl::NotFoundError(absl::StrCat("no tensor named \"", name, "\""));
}

absl::Status NameTaken(absl::string_view name) {
  return absl::AlreadyExistsError(
      absl::StrCat("a tensor named \"", name, "\" already exists"));
}

absl::Time DeadlineOf(const v1::ControlOp& op) {
  return op.deadline_unix_nanos() == 0
             ? absl::InfiniteFuture()
             : absl::FromUnixNanos(op.deadline_unix_nanos());
}

// Whether the op may still run: its call gives up at the deadline, so
// running it later would only hold up the ops behind it.
absl::Status CheckDeadline(const v1::ControlOp& op) {
  if (absl::Now() < DeadlineOf(op)) return absl::OkStatus();
  return absl::DeadlineExceededError(absl::StrCat(
      OpName(op), ": the call's deadline passed before the operation ran"));
}

// Tensor sizes a request may name: non-negative, with an element and a byte
// count that fit in int64. Checked before the spec, so that absurd sizes
// never reach an allocation.
absl::Status ValidateSizes(absl::Span<const int64_t> sizes, DType dtype) {
  for (int64_t size : sizes) {
    if (size < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("negative size in [", absl::StrJoin(sizes, ", "), "]"));
    }
  }
  const std::optional<int64_t> numel = CheckedProduct(sizes);
  int64_t nbytes = 0;
  if (!numel.has_value() ||
      __builtin_mul_overflow(*numel, static_cast<int64_t>(ElementSize(dtype)),
                             &nbytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a tensor of sizes [", absl::StrJoin(sizes, ", "),
                     "] has more bytes than int64 counts"));
  }
  return absl::OkStatus();
}

absl::StatusOr<DType> DTypeOf(v1::DType dtype) {
  if (dtype == v1::DTYPE_UNSPECIFIED) return DType::kFloat32;
  return FromProto(dtype);
}

absl::StatusOr<ShardingSpec> SpecOf(bool has_spec, const v1::ShardingSpec& spec,
                                    absl::string_view what) {
  if (!has_spec) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": spec is required"));
  }
  return FromProto(spec);
}

// Rank r draws its local shards from its own stream, so that shards on
// different ranks differ while the same seed (and layout) always gives the
// same values.
uint64_t SeedFor(uint64_t seed, int rank) {
  return seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(rank);
}

int64_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return std::numeric_limits<int64_t>::max();
  return static_cast<int64_t>(pages) * page_size;
}

// Bytes of `numel` elements of `dtype`; ValidateSizes has ruled out
// overflow for any part of a validated tensor.
int64_t BytesOf(int64_t numel, DType dtype) {
  return numel * static_cast<int64_t>(ElementSize(dtype));
}

template <typename Message>
absl::StatusOr<Message> ParseRaw(const grpc::ByteBuffer& serialized,
                                 absl::string_view method) {
  grpc::ByteBuffer buffer(serialized);
  Message message;
  if (!grpc::SerializationTraits<Message>::Deserialize(&buffer, &message)
           .ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(method, ": malformed request"));
  }
  return message;
}

}  // namespace

// What an op produced, for its coordinator's reply.
struct OpResult {
  v1::TensorInfo info;                // CreateTensor, Reshard, Gather
  std::vector<std::string> names;     // SaveCheckpoint
  std::vector<v1::TensorInfo> infos;  // LoadCheckpoint
  Tensor gathered;                    // Gather, on the coordinator
};

using Completion = std::function<void(const absl::Status&, OpResult)>;

// A call waiting for its op. Completed once, by whichever comes first: the
// executor (the op's outcome), the submit thread (deadline, store failure),
// the reactor (cancellation) or Shutdown.
class PendingCall {
 public:
  PendingCall(uint64_t id, std::string method, absl::Time deadline,
              Completion completion)
      : id_(id),
        method_(std::move(method)),
        deadline_(deadline),
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

  uint64_t id() const { return id_; }
  const std::string& method() const { return method_; }
  absl::Time deadline() const { return deadline_; }

 private:
  const uint64_t id_;
  const std::string method_;
  const absl::Time deadline_;
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
  absl::StatusOr<OpResult> Wait(absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    if (!mu_.AwaitWithDeadline(absl::Condition(&set_), deadline)) {
      return absl::DeadlineExceededError(
          "Gather did not complete within its deadline (the operation may "
          "still complete)");
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

// The state of one ControlServiceImpl; see control_service.h for the
// protocol.
class Core : public std::enable_shared_from_this<Core> {
 public:
  Core(std::shared_ptr<Rank> rank, ControlOptions options)
      : rank_(std::move(rank)),
        options_(std::move(options)),
        store_(std::make_shared<PrefixStore>("control", rank_->store())),
        incarnation_(std::random_device()() ^
                     (uint64_t{std::random_device()()} << 32) ^
                     static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()))) {}
  ~Core() { Shutdown(); }

  absl::Status Start();
  void Shutdown();

  // OK while running; UNAVAILABLE before Start() and from Shutdown() on.
  absl::Status Accepting() const {
    absl::MutexLock lock(&mu_);
    return AcceptingLocked();
  }

  // A call for an op of `method` that gives up at `deadline` (the
  // client's, capped by op_timeout); not yet queued. Attach it to its
  // reactor, then Submit it.
  std::shared_ptr<PendingCall> NewCall(std::string method,
                                       absl::Time client_deadline,
                                       Completion completion) {
    const absl::Time deadline = CapDeadline(client_deadline);
    absl::MutexLock lock(&mu_);
    return std::make_shared<PendingCall>(next_request_id_++, std::move(method),
                                         deadline, std::move(completion));
  }
  // The deadline of a call: the client's, capped by op_timeout.
  absl::Time CapDeadline(absl::Time client_deadline) const {
    return std::min(client_deadline, absl::Now() + options_.op_timeout);
  }
  // Queues `op` for the log on behalf of `call`; completes the call at once
  // with UNAVAILABLE when the service is not running.
  void Submit(v1::ControlOp op, const std::shared_ptr<PendingCall>& call);
  // Completes `call` and forgets it (a call completes once; later attempts
  // do nothing).
  void Finish(const std::shared_ptr<PendingCall>& call,
              const absl::Status& status, OpResult result = {});

  absl::StatusOr<v1::TensorInfo> Describe(const std::string& name) const;
  v1::ListTensorsResponse List() const;
  absl::StatusOr<v1::ClusterInfo> Cluster() const;
  RegionEnv Env();
  // How ReadRegion and Gather streams are cut.
  ShardServiceOptions Chunks() const {
    ShardServiceOptions chunks;
    chunks.default_chunk_bytes = options_.default_chunk_bytes;
    chunks.max_chunk_bytes = options_.max_chunk_bytes;
    return chunks;
  }
  int rank() const { return rank_->rank(); }
  // RESOURCE_EXHAUSTED when `bytes` of host memory for `what` exceed
  // ControlOptions::max_host_bytes.
  absl::Status CheckHostBytes(int64_t bytes, absl::string_view what) const {
    const int64_t limit = options_.max_host_bytes > 0 ? options_.max_host_bytes
                                                      : PhysicalMemoryBytes();
    if (bytes <= limit) return absl::OkStatus();
    return absl::ResourceExhaustedError(
        absl::StrCat(what, " needs ", bytes, " bytes of host memory; rank ",
                     rank_->rank(), " allows ", limit));
  }
  int64_t applied_ops() const { return applied_.load(); }

 private:
  enum class State { kNew, kRunning, kStopping, kStopped };
  struct Entry {
    ShardedTensor tensor;
    v1::TensorInfo info;
  };
  struct Queued {
    v1::ControlOp op;
    std::shared_ptr<PendingCall> call;
  };
  // What an op did on this daemon: the agreed status, the reply, and
  // whether the last agreement went through (every daemon has read the op,
  // so its key may go).
  struct Outcome {
    absl::Status status;
    OpResult result;
    bool agreed = false;
  };
  using DeadlineKey = std::pair<absl::Time, uint64_t>;

  absl::Status AcceptingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    switch (state_) {
      case State::kNew:
        return absl::UnavailableError(kStarting);
      case State::kRunning:
        return absl::OkStatus();
      case State::kStopping:
      case State::kStopped:
        break;
    }
    return absl::UnavailableError(kShuttingDown);
  }
  bool running() const {
    absl::MutexLock lock(&mu_);
    return state_ == State::kRunning;
  }
  // Sleeps up to `d`; false when the service stops meanwhile.
  bool Pause(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    if (state_ == State::kRunning) wake_.WaitWithTimeout(&mu_, d);
    return state_ == State::kRunning;
  }

  // ---- Submit thread.
  void SubmitLoop();
  // Claims a log number and writes `op` there; retries when rank 0 marked
  // the number skipped first.
  absl::Status Append(const v1::ControlOp& op, absl::Time deadline);

  // ---- Executor thread.
  void ExecutorLoop();
  // The entry at log number `n`: the op or the skip marker; nullopt when
  // the service stops first.
  std::optional<std::string> AwaitEntry(int64_t n);
  void Execute(absl::string_view entry, int64_t n);
  Outcome RunCreate(const v1::ControlOp& op);
  // CreateTensor's tensor (this daemon's shards), filled by its init kind.
  absl::StatusOr<ShardedTensor> NewTensor(
      const v1::CreateTensorRequest& request, DType dtype,
      const ShardingSpec& spec, absl::Span<const int64_t> sizes);
  Outcome RunDelete(const v1::ControlOp& op);
  Outcome RunReshard(const v1::ControlOp& op);
  Outcome RunGather(const v1::ControlOp& op);
  Outcome RunSave(const v1::ControlOp& op);
  Outcome RunLoad(const v1::ControlOp& op);
  // The agreed outcome of every daemon's `local` status: this daemon's own
  // error first (deterministic errors read the same everywhere), else the
  // lowest failing rank's. `agreed` tells whether the exchange went through.
  absl::Status Agree(const absl::Status& local, bool* agreed);
  // After an op that may have created tensors on some daemons only (an
  // allocation or I/O error on one), brings every daemon's tensor-id
  // counter to the highest one, so later tensors get the same id
  // everywhere. Collective.
  void ResyncTensorIds();
  absl::StatusOr<v1::TensorInfo> InfoOf(const std::string& name,
                                        const ShardedTensor& tensor) const;
  std::optional<ShardedTensor> Lookup(const std::string& name) const;

  const std::shared_ptr<Rank> rank_;
  const ControlOptions options_;
  const std::shared_ptr<Store> store_;
  const uint64_t incarnation_;
  std::shared_ptr<ProcessGroup> group_;  // Set by Start().
  std::atomic<int64_t> applied_{0};

  absl::Mutex shutdown_mu_;  // Serialises Start() and Shutdown().
  mutable absl::Mutex mu_;
  absl::CondVar wake_;  // State changes, queued ops, new deadlines.
  State state_ ABSL_GUARDED_BY(mu_) = State::kNew;
  int64_t first_entry_ ABSL_GUARDED_BY(mu_) = 1;
  std::vector<std::string> devices_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Entry> table_ ABSL_GUARDED_BY(mu_);
  uint64_t next_request_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, std::shared_ptr<PendingCall>> pending_
      ABSL_GUARDED_BY(mu_);
  std::set<DeadlineKey> deadlines_ ABSL_GUARDED_BY(mu_);
  std::deque<Queued> queue_ ABSL_GUARDED_BY(mu_);
  std::thread submitter_;
  std::thread executor_;
};

absl::Status Core::Start() {
  absl::MutexLock serial(&shutdown_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (state_ != State::kNew) {
      return absl::FailedPreconditionError(
          state_ == State::kRunning ? "the control service is already started"
                                    : "the control service is shut down");
    }
  }
  if (!rank_->rpc_initialized()) {
    return absl::FailedPreconditionError(
        "the control service starts after Rank::InitRpc");
  }
  group_ = rank_->default_group();
  // Rank 0 reads where the log stands before it joins the exchange, and the
  // others accept calls only after it: every op claimed from now on lies
  // after the agreed start, and every daemon runs all of them.
  std::string mine = absl::StrCat(options_.device, "\n");
  absl::Status read = absl::OkStatus();
  if (rank_->rank() == 0) {
    absl::StatusOr<int64_t> seq = store_->Add(kSeqKey, 0);
    read = seq.status();
    if (seq.ok()) absl::StrAppend(&mine, *seq);
  }
  ASSIGN_OR_RETURN(std::vector<std::string> gathered,
                   AllGatherBytes(*group_, mine));
  RETURN_IF_ERROR(read);
  std::vector<std::string> devices;
  int64_t seq = -1;
  for (size_t r = 0; r < gathered.size(); ++r) {
    std::vector<std::string> parts = absl::StrSplit(gathered[r], '\n');
    devices.push_back(parts.front());
    if (r == 0 && (parts.size() != 2 || !absl::SimpleAtoi(parts[1], &seq))) {
      return absl::UnavailableError(
          "rank 0 could not read the operation log's position");
    }
  }
  absl::MutexLock lock(&mu_);
  if (state_ != State::kNew) return absl::FailedPreconditionError("stopped");
  devices_ = std::move(devices);
  first_entry_ = seq + 1;
  state_ = State::kRunning;
  submitter_ = std::thread([this] { SubmitLoop(); });
  executor_ = std::thread([this] { ExecutorLoop(); });
  return absl::OkStatus();
}

void Core::Shutdown() {
  absl::MutexLock serial(&shutdown_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (state_ == State::kStopped) return;
    state_ = State::kStopping;
    wake_.SignalAll();
  }
  if (submitter_.joinable()) submitter_.join();
  if (executor_.joinable()) executor_.join();
  absl::flat_hash_map<uint64_t, std::shared_ptr<PendingCall>> pending;
  {
    absl::MutexLock lock(&mu_);
    pending.swap(pending_);
    deadlines_.clear();
    queue_.clear();
    state_ = State::kStopped;
  }
  for (auto& [id, call] : pending) {
    call->Complete(absl::UnavailableError(kShuttingDown));
  }
}

void Core::Submit(v1::ControlOp op, const std::shared_ptr<PendingCall>& call) {
  op.set_coordinator(rank_->rank());
  op.set_incarnation(incarnation_);
  op.set_request_id(call->id());
  if (call->deadline() != absl::InfiniteFuture()) {
    op.set_deadline_unix_nanos(absl::ToUnixNanos(call->deadline()));
  }
  absl::Status accepting;
  {
    absl::MutexLock lock(&mu_);
    accepting = AcceptingLocked();
    if (accepting.ok()) {
      pending_.emplace(call->id(), call);
      deadlines_.emplace(call->deadline(), call->id());
      queue_.push_back(Queued{std::move(op), call});
      wake_.SignalAll();
    }
  }
  if (!accepting.ok()) call->Complete(accepting);
}

void Core::Finish(const std::shared_ptr<PendingCall>& call,
                  const absl::Status& status, OpResult result) {
  {
    absl::MutexLock lock(&mu_);
    pending_.erase(call->id());
    deadlines_.erase(DeadlineKey(call->deadline(), call->id()));
  }
  call->Complete(status, std::move(result));
}

void Core::SubmitLoop() {
  mu_.Lock();
  while (state_ == State::kRunning) {
    // Calls past their deadline end now; their ops may still run.
    if (!deadlines_.empty() && deadlines_.begin()->first <= absl::Now()) {
      auto it = pending_.find(deadlines_.begin()->second);
      deadlines_.erase(deadlines_.begin());
      if (it == pending_.end()) continue;
      std::shared_ptr<PendingCall> call = std::move(it->second);
      pending_.erase(it);
      mu_.Unlock();
      call->Complete(absl::DeadlineExceededError(absl::StrCat(
          call->method(),
          " did not complete within its deadline (the operation may still "
          "complete)")));
      mu_.Lock();
      continue;
    }
    if (queue_.empty()) {
      if (deadlines_.empty()) {
        wake_.Wait(&mu_);
      } else {
        wake_.WaitWithDeadline(&mu_, deadlines_.begin()->first);
      }
      continue;
    }
    Queued queued = std::move(queue_.front());
    queue_.pop_front();
    mu_.Unlock();
    // A call that ended already (deadline, cancellation) needs no op.
    if (!queued.call->done()) {
      absl::Status appended = Append(queued.op, queued.call->deadline());
      if (!appended.ok()) Finish(queued.call, appended);
    }
    mu_.Lock();
  }
  mu_.Unlock();
}

absl::Status Core::Append(const v1::ControlOp& op, absl::Time deadline) {
  const std::string value = absl::StrCat(kOpPrefix, op.SerializeAsString());
  while (true) {
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          OpName(op), ": the deadline passed before the operation was logged"));
    }
    absl::StatusOr<int64_t> n = store_->Add(kSeqKey, 1);
    if (!n.ok()) {
      return absl::UnavailableError(absl::StrCat(
          OpName(op),
          ": cannot reach the operation log: ", n.status().message()));
    }
    absl::StatusOr<std::string> held = store_->CompareSet(OpKey(*n), "", value);
    if (!held.ok()) {
      return absl::UnavailableError(absl::StrCat(
          OpName(op),
          ": cannot write the operation log: ", held.status().message()));
    }
    if (*held == value) return absl::OkStatus();
    // Rank 0 gave up on this number before we wrote it: claim another.
    spdlog::warn("control: log entry {} was skipped before {} wrote it", *n,
                 OpName(op));
  }
}

void Core::ExecutorLoop() {
  int64_t n;
  {
    absl::MutexLock lock(&mu_);
    n = first_entry_;
  }
  while (true) {
    std::optional<std::string> entry = AwaitEntry(n);
    if (!entry.has_value()) return;
    Execute(*entry, n);
    applied_.fetch_add(1);
    ++n;
  }
}

std::optional<std::string> Core::AwaitEntry(int64_t n) {
  const std::string key = OpKey(n);
  std::optional<absl::Time> claimed_since;
  while (running()) {
    absl::Status waited = store_->Wait({key}, options_.poll_interval);
    if (waited.ok()) {
      absl::StatusOr<std::string> value =
          store_->Get(key, options_.poll_interval);
      if (value.ok()) return *std::move(value);
      waited = value.status();
    }
    if (!absl::IsDeadlineExceeded(waited)) {
      spdlog::warn("control: waiting for log entry {}: {}", n,
                   waited.ToString());
      if (!Pause(options_.poll_interval)) break;
      continue;
    }
    if (rank_->rank() != 0) continue;
    // Rank 0 watches for numbers claimed and never written.
    absl::StatusOr<int64_t> seq = store_->Add(kSeqKey, 0);
    if (!seq.ok() || *seq < n) continue;
    const absl::Time now = absl::Now();
    if (!claimed_since.has_value()) claimed_since = now;
    if (now - *claimed_since < options_.claim_timeout) continue;
    absl::StatusOr<std::string> held = store_->CompareSet(key, "", kSkip);
    if (held.ok()) {
      if (*held == kSkip) {
        spdlog::warn(
            "control: log entry {} was claimed but never written; "
            "skipping it",
            n);
      }
      return *std::move(held);
    }
  }
  return std::nullopt;
}

void Core::Execute(absl::string_view entry, int64_t n) {
  if (entry == kSkip) return;
  v1::ControlOp op;
  if (!absl::ConsumePrefix(&entry, kOpPrefix) ||
      !op.ParseFromArray(entry.data(), static_cast<int>(entry.size()))) {
    // Every daemon reads the same bytes, so every daemon skips it.
    spdlog::error("control: log entry {} is malformed; skipping it", n);
    return;
  }
  Outcome outcome;
  switch (op.request_case()) {
    case v1::ControlOp::kCreateTensor:
      outcome = RunCreate(op);
      break;
    case v1::ControlOp::kDeleteTensor:
      outcome = RunDelete(op);
      break;
    case v1::ControlOp::kReshard:
      outcome = RunReshard(op);
      break;
    case v1::ControlOp::kGather:
      outcome = RunGather(op);
      break;
    case v1::ControlOp::kSaveCheckpoint:
      outcome = RunSave(op);
      break;
    case v1::ControlOp::kLoadCheckpoint:
      outcome = RunLoad(op);
      break;
    case v1::ControlOp::REQUEST_NOT_SET:
      spdlog::error("control: log entry {} holds no request; skipping it", n);
      return;
  }
  // The call returns once every daemon shows the change (control.proto:
  // after a call returns, every daemon lists and describes the same
  // tensors), so the daemons confirm their commits to each other first.
  // Every daemon decides alike, from the agreed status.
  const bool changes_table =
      op.request_case() != v1::ControlOp::kGather &&
      op.request_case() != v1::ControlOp::kSaveCheckpoint;
  if (outcome.status.ok() && changes_table) {
    absl::Status confirmed = group_->Barrier();
    if (!confirmed.ok()) {
      outcome.status = absl::Status(
          confirmed.code(),
          absl::StrCat(OpName(op),
                       " was applied, but not every daemon confirmed it: ",
                       confirmed.message()));
    }
  }
  spdlog::debug("control: op {} {} from rank {}: {}", n, OpName(op),
                op.coordinator(), outcome.status.ToString());
  if (op.coordinator() == rank_->rank() && op.incarnation() == incarnation_) {
    std::shared_ptr<PendingCall> call;
    {
      absl::MutexLock lock(&mu_);
      auto it = pending_.find(op.request_id());
      if (it != pending_.end()) call = it->second;
    }
    if (call != nullptr) {
      Finish(call, outcome.status, std::move(outcome.result));
    }
  }
  // Every daemon has read the op once the last agreement went through.
  // Otherwise the key stays: a daemon that has not read it yet must find
  // it rather than an empty number that rank 0 would mark skipped.
  if (rank_->rank() == 0 && outcome.agreed) {
    absl::StatusOr<bool> deleted = store_->Delete(OpKey(n));
    if (!deleted.ok()) {
      spdlog::warn("control: deleting log entry {}: {}", n,
                   deleted.status().ToString());
    }
  }
}

absl::Status Core::Agree(const absl::Status& local, bool* agreed) {
  absl::StatusOr<std::vector<absl::Status>> all =
      AllGatherStatuses(*group_, local);
  *agreed = all.ok();
  if (!all.ok()) return local.ok() ? all.status() : local;
  if (!local.ok()) return local;
  for (const absl::Status& status : *all) {
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

void Core::ResyncTensorIds() {
  // Taking an id is the only way to read the counter; one id is wasted.
  const std::string id = rank_->NextTensorId(*group_);
  int64_t mine = 0;
  absl::SimpleAtoi(id.substr(id.rfind('/') + 1), &mine);
  absl::StatusOr<std::vector<std::string>> all =
      AllGatherBytes(*group_, absl::StrCat(mine));
  if (!all.ok()) {
    spdlog::error("control: re-aligning tensor ids: {}",
                  all.status().ToString());
    return;
  }
  int64_t top = mine;
  for (const std::string& theirs : *all) {
    int64_t value = 0;
    if (absl::SimpleAtoi(theirs, &value)) top = std::max(top, value);
  }
  for (int64_t i = mine; i < top; ++i) rank_->NextTensorId(*group_);
}

absl::StatusOr<v1::TensorInfo> Core::InfoOf(const std::string& name,
                                            const ShardedTensor& tensor) const {
  v1::TensorInfo info;
  info.set_name(name);
  info.set_tensor_id(tensor.tensor_id());
  *info.mutable_metadata() = ToProto(tensor.metadata());
  for (const ShardMetadata& shard : tensor.metadata().shards_metadata) {
    ASSIGN_OR_RETURN(auto placement, ParseAndValidateRemoteDevice(
                                         tensor.process_group()->global_ranks(),
                                         shard.placement(), rank_.get()));
    info.add_shard_ranks(placement.first);
  }
  return info;
}

std::optional<ShardedTensor> Core::Lookup(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  auto it = table_.find(name);
  if (it == table_.end()) return std::nullopt;
  return it->second.tensor;
}

Core::Outcome Core::RunCreate(const v1::ControlOp& op) {
  const v1::CreateTensorRequest& request = op.create_tensor();
  const std::vector<int64_t> sizes(request.sizes().begin(),
                                   request.sizes().end());
  // Deterministic checks: they pass or fail alike on every daemon.
  struct Plan {
    DType dtype;
    ShardingSpec spec;
    int64_t host_bytes;  // Of this daemon's CPU shards.
  };
  auto plan = [&]() -> absl::StatusOr<Plan> {
    RETURN_IF_ERROR(ValidateName(request.name()));
    if (Lookup(request.name()).has_value()) return NameTaken(request.name());
    ASSIGN_OR_RETURN(DType dtype, DTypeOf(request.dtype()));
    RETURN_IF_ERROR(ValidateSizes(sizes, dtype));
    ASSIGN_OR_RETURN(ShardingSpec spec, SpecOf(request.has_spec(),
                                               request.spec(), "CreateTensor"));
    if (!v1::InitKind_IsValid(request.init())) {
      return absl::InvalidArgumentError(
          absl::StrCat("CreateTensor: unknown init kind ", request.init()));
    }
    TensorProperties properties;
    properties.dtype = dtype;
    ASSIGN_OR_RETURN(ShardedTensorMetadata metadata,
                     BuildMetadata(spec, sizes, properties));
    int64_t host_bytes = 0;
    for (const ShardMetadata& shard : metadata.shards_metadata) {
      ASSIGN_OR_RETURN(auto placement, ParseAndValidateRemoteDevice(
                                           group_->global_ranks(),
                                           shard.placement(), rank_.get()));
      if (placement.first == rank_->rank() && placement.second.is_cpu()) {
        host_bytes += BytesOf(shard.numel(), dtype);
      }
    }
    return Plan{dtype, std::move(spec), host_bytes};
  }();
  std::optional<Entry> made;
  absl::Status local = plan.status();
  if (plan.ok()) {
    local = [&]() -> absl::Status {
      RETURN_IF_ERROR(CheckDeadline(op));
      RETURN_IF_ERROR(CheckHostBytes(
          plan->host_bytes, absl::StrCat("tensor \"", request.name(), "\"")));
      ASSIGN_OR_RETURN(ShardedTensor tensor,
                       NewTensor(request, plan->dtype, plan->spec, sizes));
      ASSIGN_OR_RETURN(v1::TensorInfo info, InfoOf(request.name(), tensor));
      made.emplace(Entry{std::move(tensor), std::move(info)});
      return absl::OkStatus();
    }();
  }
  Outcome outcome;
  outcome.status = Agree(local, &outcome.agreed);
  if (outcome.status.ok()) {
    outcome.result.info = made->info;
    absl::MutexLock lock(&mu_);
    table_.emplace(request.name(), *std::move(made));
  } else if (plan.ok()) {
    ResyncTensorIds();
  }
  return outcome;
}

absl::StatusOr<ShardedTensor> Core::NewTensor(
    const v1::CreateTensorRequest& request, DType dtype,
    const ShardingSpec& spec, absl::Span<const int64_t> sizes) {
  ShardedTensorOptions options =
      ShardedTensorOptions().WithDType(dtype).WithRank(rank_);
  switch (request.init()) {
    case v1::INIT_KIND_ZEROS:
      return ShardedTensor::Zeros(spec, sizes, options);
    case v1::INIT_KIND_ONES:
      return ShardedTensor::Ones(spec, sizes, options);
    case v1::INIT_KIND_FULL:
      return ShardedTensor::Full(spec, sizes, request.fill_value(), options);
    case v1::INIT_KIND_RAND: {
      Generator generator(SeedFor(request.seed(), rank_->rank()));
      return ShardedTensor::Rand(spec, sizes, options, &generator);
    }
    case v1::INIT_KIND_RANDN: {
      Generator generator(SeedFor(request.seed(), rank_->rank()));
      return ShardedTensor::Randn(spec, sizes, options, &generator);
    }
    default:
      return ShardedTensor::Empty(spec, sizes, options);
  }
}

Core::Outcome Core::RunDelete(const v1::ControlOp& op) {
  const std::string& name = op.delete_tensor().name();
  absl::Status local =
      Lookup(name).has_value() ? CheckDeadline(op) : UnknownTensor(name);
  Outcome outcome;
  outcome.status = Agree(local, &outcome.agreed);
  if (outcome.status.ok()) {
    std::optional<Entry> gone;  // Freed outside the lock.
    absl::MutexLock lock(&mu_);
    auto it = table_.find(name);
    gone.emplace(std::move(it->second));
    table_.erase(it);
  }
  return outcome;
}

Core::Outcome Core::RunReshard(const v1::ControlOp& op) {
  const v1::ReshardRequest& request = op.reshard();
  Outcome outcome;
  std::optional<ShardedTensor> tensor = Lookup(request.name());
  absl::StatusOr<ShardingSpec> spec =
      SpecOf(request.has_spec(), request.spec(), "Reshard");
  absl::Status ready = !tensor.has_value() ? UnknownTensor(request.name())
                       : !spec.ok()        ? spec.status()
                                           : CheckDeadline(op);
  outcome.status = Agree(ready, &outcome.agreed);
  if (!outcome.status.ok()) return outcome;

  absl::Status resharded = tensor->Reshard(*spec).status();
  // The tensor may have changed locally even when another daemon failed,
  // so its info is refreshed either way.
  absl::StatusOr<v1::TensorInfo> info = InfoOf(request.name(), *tensor);
  outcome.status =
      Agree(resharded.ok() ? info.status() : resharded, &outcome.agreed);
  if (info.ok()) {
    absl::MutexLock lock(&mu_);
    table_.at(request.name()).info = *info;
  }
  if (outcome.status.ok()) {
    outcome.result.info = *std::move(info);
  } else {
    ResyncTensorIds();
  }
  return outcome;
}

Core::Outcome Core::RunGather(const v1::ControlOp& op) {
  const v1::GatherRequest& request = op.gather();
  const bool destination = op.coordinator() == rank_->rank();
  Outcome outcome;
  std::optional<ShardedTensor> tensor = Lookup(request.name());
  Tensor out;
  absl::Status ready = [&]() -> absl::Status {
    if (!tensor.has_value()) return UnknownTensor(request.name());
    if (request.chunk_bytes() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("Gather: negative chunk_bytes ", request.chunk_bytes()));
    }
    RETURN_IF_ERROR(CheckDeadline(op));
    if (destination) {
      RETURN_IF_ERROR(CheckHostBytes(
          BytesOf(CheckedProduct(tensor->size()).value_or(0), tensor->dtype()),
          absl::StrCat("gathering \"", request.name(), "\"")));
      ASSIGN_OR_RETURN(
          out, Tensor::Empty(tensor->size(),
                             TensorOptions().WithDType(tensor->dtype())));
    }
    return absl::OkStatus();
  }();
  outcome.status = Agree(ready, &outcome.agreed);
  if (!outcome.status.ok()) return outcome;

  outcome.status =
      Agree(tensor->Gather(op.coordinator(), out), &outcome.agreed);
  if (outcome.status.ok() && destination) {
    absl::MutexLock lock(&mu_);
    outcome.result.info = table_.at(request.name()).info;
    outcome.result.gathered = std::move(out);
  }
  return outcome;
}

Core::Outcome Core::RunSave(const v1::ControlOp& op) {
  const v1::SaveCheckpointRequest& request = op.save_checkpoint();
  Outcome outcome;
  StateDict dict;
  absl::Status ready = [&]() -> absl::Status {
    if (request.path().empty()) {
      return absl::InvalidArgumentError("SaveCheckpoint: path is required");
    }
    absl::MutexLock lock(&mu_);
    if (request.names().empty()) {
      for (const auto& [name, entry] : table_) {
        dict.emplace_back(name, entry.tensor);
      }
    }
    std::set<std::string> seen;
    for (const std::string& name : request.names()) {
      auto it = table_.find(name);
      if (it == table_.end()) return UnknownTensor(name);
      if (!seen.insert(name).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("SaveCheckpoint: \"", name, "\" is named twice"));
      }
      dict.emplace_back(name, it->second.tensor);
    }
    return absl::OkStatus();
  }();
  if (ready.ok()) ready = CheckDeadline(op);
  outcome.status = Agree(ready, &outcome.agreed);
  if (!outcome.status.ok()) return outcome;

  SaveOptions options;
  options.rank = rank_;
  outcome.status =
      Agree(SaveStateDict(dict, request.path(), options), &outcome.agreed);
  if (outcome.status.ok()) {
    for (const auto& [name, value] : dict) outcome.result.names.push_back(name);
  }
  return outcome;
}

Core::Outcome Core::RunLoad(const v1::ControlOp& op) {
  const v1::LoadCheckpointRequest& request = op.load_checkpoint();
  // Deterministic checks first.
  std::optional<ShardingSpec> spec;
  absl::Status valid = [&]() -> absl::Status {
    if (request.path().empty()) {
      return absl::InvalidArgumentError("LoadCheckpoint: path is required");
    }
    if (!request.as_names().empty() &&
        request.as_names_size() != request.names_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("LoadCheckpoint: ", request.as_names_size(),
                       " as_names for ", request.names_size(), " names"));
    }
    if (request.has_spec()) {
      ASSIGN_OR_RETURN(spec, FromProto(request.spec()));
    }
    return absl::OkStatus();
  }();
  // Then what depends on the files and the daemon: the entries, the names
  // they get, and the load itself.
  std::vector<std::pair<std::string, std::string>> wanted;  // entry, name
  std::vector<std::pair<std::string, ShardedTensor>> loaded;
  std::vector<v1::TensorInfo> infos;
  absl::Status local = valid;
  if (valid.ok()) {
    local = [&]() -> absl::Status {
      ASSIGN_OR_RETURN(v1::CheckpointManifest manifest,
                       ReadCheckpointManifest(request.path()));
      std::map<std::string, const v1::CheckpointEntry*> entries;
      for (const v1::CheckpointEntry& entry : manifest.entries()) {
        entries.emplace(entry.name(), &entry);
      }
      if (request.names().empty()) {
        for (const v1::CheckpointEntry& entry : manifest.entries()) {
          wanted.emplace_back(entry.name(), entry.name());
        }
      }
      for (int i = 0; i < request.names_size(); ++i) {
        wanted.emplace_back(request.names(i), request.as_names().empty()
                                                  ? request.names(i)
                                                  : request.as_names(i));
      }
      std::set<std::string> targets;
      for (const auto& [entry_name, name] : wanted) {
        auto it = entries.find(entry_name);
        if (it == entries.end()) {
          return absl::NotFoundError(absl::StrCat("checkpoint ", request.path(),
                                                  " has no entry \"",
                                                  entry_name, "\""));
        }
        if (!it->second->has_sharded()) {
          return absl::FailedPreconditionError(absl::StrCat(
              "checkpoint entry \"", entry_name,
              "\" is a dense tensor; the cluster holds sharded tensors only"));
        }
        RETURN_IF_ERROR(ValidateName(name));
        if (!targets.insert(name).second) {
          return absl::InvalidArgumentError(absl::StrCat(
              "LoadCheckpoint: two entries would be named \"", name, "\""));
        }
        if (!request.replace() && Lookup(name).has_value()) {
          return NameTaken(name);
        }
      }
      RETURN_IF_ERROR(CheckDeadline(op));
      LoadOptions options;
      options.rank = rank_;
      if (spec.has_value()) {
        for (const auto& [entry_name, name] : wanted) {
          options.reshard.emplace(entry_name, LoadTarget::Spec(*spec));
        }
      }
      ASSIGN_OR_RETURN(StateDict dict, LoadStateDict(request.path(), options));
      std::map<std::string, const ShardedTensor*> by_entry;
      for (const auto& [entry_name, value] : dict) {
        if (const auto* tensor = std::get_if<ShardedTensor>(&value)) {
          by_entry.emplace(entry_name, tensor);
        }
      }
      for (const auto& [entry_name, name] : wanted) {
        auto it = by_entry.find(entry_name);
        if (it == by_entry.end()) {
          return absl::DataLossError(
              absl::StrCat("checkpoint ", request.path(), ": entry \"",
                           entry_name, "\" did not load as a sharded tensor"));
        }
        loaded.emplace_back(name, *it->second);
        ASSIGN_OR_RETURN(infos.emplace_back(), InfoOf(name, *it->second));
      }
      return absl::OkStatus();
    }();
  }
  Outcome outcome;
  outcome.status = Agree(local, &outcome.agreed);
  if (outcome.status.ok()) {
    std::vector<Entry> replaced;  // Freed outside the lock.
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < loaded.size(); ++i) {
      auto it = table_.find(loaded[i].first);
      if (it != table_.end()) {
        replaced.push_back(std::move(it->second));
        table_.erase(it);
      }
      table_.emplace(loaded[i].first, Entry{loaded[i].second, infos[i]});
    }
    outcome.result.infos = std::move(infos);
  } else if (valid.ok()) {
    ResyncTensorIds();
  }
  return outcome;
}

absl::StatusOr<v1::TensorInfo> Core::Describe(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(AcceptingLocked());
  auto it = table_.find(name);
  if (it == table_.end()) return UnknownTensor(name);
  return it->second.info;
}

v1::ListTensorsResponse Core::List() const {
  v1::ListTensorsResponse response;
  absl::MutexLock lock(&mu_);
  for (const auto& [name, entry] : table_) {
    *response.add_tensors() = entry.info;
  }
  return response;
}

absl::StatusOr<v1::ClusterInfo> Core::Cluster() const {
  std::vector<std::string> devices;
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(AcceptingLocked());
    devices = devices_;
  }
  v1::ClusterInfo info;
  info.set_world_size(rank_->world_size());
  info.set_rank(rank_->rank());
  info.set_version(TESSERA_VERSION);
  for (int r = 0; r < rank_->world_size(); ++r) {
    ASSIGN_OR_RETURN(WorkerInfo worker, rank_->Worker(r));
    v1::WorkerAddress* address = info.add_workers();
    address->set_rank(r);
    address->set_name(worker.name);
    address->set_address(worker.address);
    address->set_data_address(worker.data_plane_address);
    address->set_local_address(worker.local_address);
    if (r < static_cast<int>(devices.size())) address->set_device(devices[r]);
  }
  return info;
}

RegionEnv Core::Env() {
  RegionEnv env;
  env.rank = rank_;
  env.max_call_time = options_.op_timeout;
  env.resolve = [weak = weak_from_this()](
                    const std::string& name) -> absl::StatusOr<v1::TensorInfo> {
    std::shared_ptr<Core> core = weak.lock();
    if (core == nullptr) return absl::UnavailableError(kShuttingDown);
    return core->Describe(name);
  };
  return env;
}

namespace {

// The reactor of a call that waits for its op; needed (over the default
// reactor) to hear of cancellation.
class OpReactor final : public grpc::ServerUnaryReactor {
 public:
  void Attach(std::weak_ptr<Core> core, std::weak_ptr<PendingCall> call) {
    core_ = std::move(core);
    call_ = std::move(call);
  }
  void OnCancel() override {
    std::shared_ptr<PendingCall> call = call_.lock();
    if (call == nullptr) return;
    absl::Status cancelled =
        absl::CancelledError(absl::StrCat(call->method(),
                                          " was cancelled by the client (the "
                                          "operation may still complete)"));
    if (std::shared_ptr<Core> core = core_.lock()) {
      core->Finish(call, cancelled);
    } else {
      call->Complete(cancelled);
    }
  }
  void OnDone() override { delete this; }

 private:
  // Set before the handler returns, read only by OnCancel(), which gRPC
  // runs after it.
  std::weak_ptr<Core> core_;
  std::weak_ptr<PendingCall> call_;
};

grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* context,
                               const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

// Logs `op` and answers the call with `reply(result)` once every daemon has
// run it.
grpc::ServerUnaryReactor* RunLogged(const std::shared_ptr<Core>& core,
                                    grpc::CallbackServerContext* context,
                                    std::string method, v1::ControlOp op,
                                    std::function<void(OpResult&)> reply) {
  auto* reactor = new OpReactor();
  std::shared_ptr<PendingCall> call =
      core->NewCall(std::move(method), absl::FromChrono(context->deadline()),
                    [reactor, reply = std::move(reply)](
                        const absl::Status& status, OpResult result) {
                      if (status.ok()) reply(result);
                      reactor->Finish(ToGrpcStatus(status));
                    });
  reactor->Attach(core, call);
  core->Submit(std::move(op), call);
  return reactor;
}

}  // namespace
}  // namespace control_internal

using control_internal::Core;
using control_internal::OpResult;

ControlServiceImpl::ControlServiceImpl(std::shared_ptr<Rank> rank,
                                       ControlOptions options)
    : core_(std::make_shared<Core>(std::move(rank), std::move(options))) {}

ControlServiceImpl::~ControlServiceImpl() { Shutdown(); }

absl::Status ControlServiceImpl::Start() { return core_->Start(); }

void ControlServiceImpl::Shutdown() { core_->Shutdown(); }

int64_t ControlServiceImpl::applied_ops() const { return core_->applied_ops(); }

grpc::ServerUnaryReactor* ControlServiceImpl::GetCluster(
    grpc::CallbackServerContext* context, const v1::GetClusterRequest* request,
    v1::ClusterInfo* response) {
  absl::StatusOr<v1::ClusterInfo> info = core_->Cluster();
  if (info.ok()) *response = *std::move(info);
  return control_internal::Done(context, info.status());
}

grpc::ServerUnaryReactor* ControlServiceImpl::ListTensors(
    grpc::CallbackServerContext* context, const v1::ListTensorsRequest* request,
    v1::ListTensorsResponse* response) {
  absl::Status accepting = core_->Accepting();
  if (accepting.ok()) *response = core_->List();
  return control_internal::Done(context, accepting);
}

grpc::ServerUnaryReactor* ControlServiceImpl::DescribeTensor(
    grpc::CallbackServerContext* context,
    const v1::DescribeNamedTensorRequest* request, v1::TensorInfo* response) {
  absl::StatusOr<v1::TensorInfo> info = core_->Describe(request->name());
  if (info.ok()) *response = *std::move(info);
  return control_internal::Done(context, info.status());
}

grpc::ServerUnaryReactor* ControlServiceImpl::CreateTensor(
    grpc::CallbackServerContext* context,
    const v1::CreateTensorRequest* request, v1::TensorInfo* response) {
  v1::ControlOp op;
  *op.mutable_create_tensor() = *request;
  return control_internal::RunLogged(
      core_, context, "CreateTensor", std::move(op),
      [response](OpResult& result) { *response = std::move(result.info); });
}

grpc::ServerUnaryReactor* ControlServiceImpl::DeleteTensor(
    grpc::CallbackServerContext* context,
    const v1::DeleteTensorRequest* request,
    v1::DeleteTensorResponse* response) {
  v1::ControlOp op;
  *op.mutable_delete_tensor() = *request;
  return control_internal::RunLogged(core_, context, "DeleteTensor",
                                     std::move(op), [](OpResult&) {});
}

grpc::ServerUnaryReactor* ControlServiceImpl::Reshard(
    grpc::CallbackServerContext* context, const v1::ReshardRequest* request,
    v1::TensorInfo* response) {
  v1::ControlOp op;
  *op.mutable_reshard() = *request;
  return control_internal::RunLogged(
      core_, context, "Reshard", std::move(op),
      [response](OpResult& result) { *response = std::move(result.info); });
}

grpc::ServerUnaryReactor* ControlServiceImpl::SaveCheckpoint(
    grpc::CallbackServerContext* context,
    const v1::SaveCheckpointRequest* request,
    v1::SaveCheckpointResponse* response) {
  v1::ControlOp op;
  *op.mutable_save_checkpoint() = *request;
  return control_internal::RunLogged(core_, context, "SaveCheckpoint",
                                     std::move(op),
                                     [response](OpResult& result) {
                                       for (std::string& name : result.names) {
                                         response->add_names(std::move(name));
                                       }
                                     });
}

grpc::ServerUnaryReactor* ControlServiceImpl::LoadCheckpoint(
    grpc::CallbackServerContext* context,
    const v1::LoadCheckpointRequest* request,
    v1::LoadCheckpointResponse* response) {
  v1::ControlOp op;
  *op.mutable_load_checkpoint() = *request;
  return control_internal::RunLogged(
      core_, context, "LoadCheckpoint", std::move(op),
      [response](OpResult& result) {
        for (v1::TensorInfo& info : result.infos) {
          *response->add_tensors() = std::move(info);
        }
      });
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* ControlServiceImpl::Gather(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  absl::StatusOr<v1::GatherRequest> parsed =
      control_internal::ParseRaw<v1::GatherRequest>(*request, "Gather");
  if (!parsed.ok()) return NewFailedChunkStream(parsed.status());
  if (parsed->chunk_bytes() < 0) {
    return NewFailedChunkStream(absl::InvalidArgumentError(
        absl::StrCat("Gather: negative chunk_bytes ", parsed->chunk_bytes())));
  }
  absl::Status accepting = core_->Accepting();
  if (!accepting.ok()) return NewFailedChunkStream(accepting);

  auto slot = std::make_shared<control_internal::ResultSlot>();
  std::shared_ptr<control_internal::PendingCall> call =
      core_->NewCall("Gather", absl::FromChrono(context->deadline()),
                     [slot](const absl::Status& status, OpResult result) {
                       slot->Set(status, std::move(result));
                     });
  const absl::Time deadline = call->deadline();
  const int rank = core_->rank();
  v1::ControlOp op;
  *op.mutable_gather() = *parsed;
  core_->Submit(std::move(op), call);
  // The stream's thread waits for the op (the submit thread completes the
  // call by its deadline at the latest; the grace only guards that).
  return NewDeferredChunkStream(
      [slot, deadline, rank]() -> absl::StatusOr<PreparedFetch> {
        ASSIGN_OR_RETURN(OpResult result,
                         slot->Wait(deadline + absl::Seconds(1)));
        const auto& sizes = result.info.metadata().size();
        ASSIGN_OR_RETURN(ShardMetadata whole,
                         ShardMetadata::Create(
                             std::vector<int64_t>(sizes.size(), 0),
                             std::vector<int64_t>(sizes.begin(), sizes.end()),
                             RemoteDevice::ForRank(rank, Device::Cpu())));
        return PrepareTensorFetch(result.gathered, whole);
      },
      ChunkBytesFor(core_->Chunks(), parsed->chunk_bytes()));
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* ControlServiceImpl::ReadRegion(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  absl::Status accepting = core_->Accepting();
  if (!accepting.ok()) return NewFailedChunkStream(accepting);
  return StartReadRegion(context, request, core_->Env(), core_->Chunks());
}

grpc::ServerReadReactor<v1::WriteRegionChunk>* ControlServiceImpl::WriteRegion(
    grpc::CallbackServerContext* context, v1::WriteRegionResponse* response) {
  absl::Status accepting = core_->Accepting();
  if (!accepting.ok()) {
    // A reader that fails at once.
    class Failed final : public grpc::ServerReadReactor<v1::WriteRegionChunk> {
     public:
      explicit Failed(const absl::Status& status) {
        Finish(ToGrpcStatus(status));
      }
      void OnDone() override { delete this; }
    };
    return new Failed(accepting);
  }
  return StartWriteRegion(context, response, core_->Env());
}

}  // namespace tessera
