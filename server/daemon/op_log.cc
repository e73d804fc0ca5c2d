#include "server/daemon/op_log.h"

#include <exception>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/log_context.h"
#include "common/status_macros.h"
#include "server/metrics/metrics.h"
#include "spdlog/spdlog.h"

namespace tessera::control_internal {
namespace {

// The message of the exception being handled (call inside a catch block).
std::string WhatWasThrown() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an unknown exception";
  }
}

// Store keys, under the "control" prefix.
constexpr char kSeqKey[] = "seq";
constexpr char kSkip[] = "skip";
constexpr char kOpPrefix[] = "op:";

std::string OpKey(int64_t n) { return absl::StrCat("op/", n); }

// The op of a log entry ("op:" and the serialized ControlOp); nullopt when
// it is malformed.
std::optional<v1::ControlOp> ParseEntry(absl::string_view entry) {
  v1::ControlOp op;
  if (!absl::ConsumePrefix(&entry, kOpPrefix) ||
      !op.ParseFromArray(entry.data(), static_cast<int>(entry.size()))) {
    return std::nullopt;
  }
  return op;
}

}  // namespace

OpLog::OpLog(std::shared_ptr<Rank> rank, std::shared_ptr<ProcessGroup> group,
             std::shared_ptr<Store> store, const ControlOptions& options,
             uint64_t incarnation, Membership* membership, ControlOps* ops)
    : rank_(std::move(rank)),
      group_(std::move(group)),
      store_(std::move(store)),
      options_(options),
      incarnation_(incarnation),
      membership_(membership),
      ops_(ops) {}

OpLog::~OpLog() {
  Stop();
  Join();
  FailWaiting();
}

absl::StatusOr<int64_t> OpLog::Position() {
  absl::StatusOr<int64_t> seq = store_->Add(kSeqKey, 0);
  if (!seq.ok()) {
    return absl::UnavailableError(
        absl::StrCat("rank 0 could not read the operation log's position: ",
                     seq.status().message()));
  }
  return *seq + 1;
}

void OpLog::Start(int64_t first) {
  absl::MutexLock lock(&mu_);
  if (state_ != State::kNew) return;
  first_entry_ = first;
  state_ = State::kRunning;
  submitter_ = std::thread([this] { SubmitLoop(); });
  executor_ = std::thread([this] { ExecutorLoop(); });
}

void OpLog::Stop() {
  absl::MutexLock lock(&mu_);
  state_ = State::kStopped;
  wake_.SignalAll();
}

void OpLog::Join() {
  if (submitter_.joinable()) submitter_.join();
  if (executor_.joinable()) executor_.join();
}

void OpLog::FailWaiting() {
  absl::flat_hash_map<uint64_t, std::shared_ptr<PendingCall>> pending;
  {
    absl::MutexLock lock(&mu_);
    pending.swap(pending_);
    deadlines_.clear();
    queue_.clear();
  }
  for (auto& [id, call] : pending) {
    call->Complete(absl::UnavailableError(kShuttingDown));
  }
}

absl::Status OpLog::AcceptingLocked() const {
  switch (state_) {
    case State::kNew:
      return absl::UnavailableError(kStarting);
    case State::kRunning:
      return absl::OkStatus();
    case State::kStopped:
      break;
  }
  return absl::UnavailableError(kShuttingDown);
}

bool OpLog::running() const {
  absl::MutexLock lock(&mu_);
  return state_ == State::kRunning;
}

bool OpLog::Pause(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  if (state_ == State::kRunning) wake_.WaitWithTimeout(&mu_, d);
  return state_ == State::kRunning;
}

WaitingCalls::Snapshot OpLog::Waiting() const {
  Snapshot waiting;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, call] : pending_) waiting.in_flight.push_back(call);
  for (const Queued& q : queue_) waiting.queued.insert(q.call->id());
  return waiting;
}

void OpLog::Submit(v1::ControlOp op, const std::shared_ptr<PendingCall>& call) {
  op.set_coordinator(rank_->rank());
  op.set_incarnation(incarnation_);
  op.set_request_id(call->id());
  op.set_client_request_id(call->request_id());
  if (call->deadline() != absl::InfiniteFuture()) {
    op.set_deadline_unix_nanos(absl::ToUnixNanos(call->deadline()));
  }
  // Admitted and queued in one step under membership's lock, so that a
  // daemon found silent meanwhile ends this call too (Waiting).
  const absl::Status accepting = membership_->Admit([&]() -> absl::Status {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(AcceptingLocked());
    pending_.emplace(call->id(), call);
    deadlines_.emplace(call->deadline(), call->id());
    queue_.push_back(Queued{std::move(op), call});
    wake_.SignalAll();
    return absl::OkStatus();
  });
  if (!accepting.ok()) call->Complete(accepting);
}

void OpLog::Finish(const std::shared_ptr<PendingCall>& call,
                   const absl::Status& status, OpResult result) {
  {
    absl::MutexLock lock(&mu_);
    pending_.erase(call->id());
    deadlines_.erase(DeadlineKey(call->deadline(), call->id()));
  }
  call->Complete(status, std::move(result));
}

void OpLog::SubmitLoop() {
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

absl::Status OpLog::Append(const v1::ControlOp& op, absl::Time deadline) {
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

void OpLog::ExecutorLoop() {
  int64_t n;
  {
    absl::MutexLock lock(&mu_);
    n = first_entry_;
  }
  while (true) {
    bool reform = false;
    std::optional<std::string> entry = AwaitEntry(n, &reform);
    if (reform) {
      if (!Reform(&n)) return;
      continue;
    }
    if (!entry.has_value()) return;
    Execute(*entry, n);
    applied_.fetch_add(1);
    ++n;
    // A transport failure in the op: form the next generation before the
    // next op, so that it runs on a working group.
    if (!group_->Usable().ok() && !Reform(&n)) return;
  }
}

bool OpLog::Reform(int64_t* next) {
  std::optional<Membership::Resumed> resumed = membership_->Reform(*next);
  if (!resumed.has_value()) return false;
  // Entries the others passed while this daemon did not run them failed on
  // the others (they could not agree without it).
  for (int64_t m = *next; m < resumed->next; ++m) Abandon(m);
  // Every daemon has read the entries before the furthest position.
  if (rank_->rank() == 0) {
    for (int64_t m = resumed->earliest; m < resumed->next; ++m) {
      store_->Delete(OpKey(m)).IgnoreError();
    }
  }
  *next = resumed->next;
  return true;
}

void OpLog::Abandon(int64_t n) {
  absl::StatusOr<std::string> entry =
      store_->Get(OpKey(n), options_.poll_interval);
  if (!entry.ok()) return;
  std::optional<v1::ControlOp> op = ParseEntry(*entry);
  if (!op.has_value()) return;
  FinishOwnCall(*op, absl::UnavailableError(absl::StrCat(
                         OpName(*op),
                         " was not applied: the daemons' process group broke "
                         "while it ran; retry it")));
}

std::shared_ptr<PendingCall> OpLog::OwnCall(const v1::ControlOp& op) const {
  if (op.coordinator() != rank_->rank() || op.incarnation() != incarnation_) {
    return nullptr;
  }
  absl::MutexLock lock(&mu_);
  auto it = pending_.find(op.request_id());
  return it != pending_.end() ? it->second : nullptr;
}

void OpLog::FinishOwnCall(const v1::ControlOp& op, const absl::Status& status,
                          OpResult result) {
  if (std::shared_ptr<PendingCall> call = OwnCall(op)) {
    Finish(call, status, std::move(result));
  }
}

std::optional<std::string> OpLog::AwaitEntry(int64_t n, bool* reform) {
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
    // Idle: a daemon that broke or restarted may ask for a new generation,
    // or one may have gone silent.
    if (membership_->NeedsReform()) {
      *reform = true;
      return std::nullopt;
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

// The op boundary: request handling never throws out of here
// (docs/thread_model.md). What an op throws after all (an allocation refused, a
// library's exception) fails it on this daemon with INTERNAL, agreed like
// any other failure where the op still can.
OpOutcome OpLog::RunGuarded(const v1::ControlOp& op, int64_t n) {
  try {
    return ops_->Run(op);
  } catch (...) {
    const std::string what = WhatWasThrown();
    spdlog::error("control: op {} threw: {}", n, what);
    OpOutcome outcome;
    outcome.status = absl::InternalError(absl::StrCat(
        OpName(op), " failed on rank ", rank_->rank(), ": ", what));
    return outcome;
  }
}

void OpLog::Execute(absl::string_view entry, int64_t n) {
  if (entry == kSkip) return;
  std::optional<v1::ControlOp> parsed = ParseEntry(entry);
  if (!parsed.has_value()) {
    // Every daemon reads the same bytes, so every daemon skips it.
    spdlog::error("control: log entry {} is malformed; skipping it", n);
    return;
  }
  const v1::ControlOp& op = *parsed;
  if (op.request_case() == v1::ControlOp::REQUEST_NOT_SET) {
    spdlog::error("control: log entry {} holds no request; skipping it", n);
    return;
  }
  const absl::Time started = absl::Now();
  if (std::shared_ptr<PendingCall> own = OwnCall(op)) {
    CountControlOpWait(OpName(op), started - own->created());
  }
  // Every line logged while the op runs carries it (--log-format json).
  const ScopedLogContext context(
      LogContext{n, OpTensor(op), op.client_request_id()});
  OpOutcome outcome = RunGuarded(op, n);
  // The call returns once every daemon shows the change
  // (proto/tessera/v1/control.proto: after a call returns, every daemon lists
  // and describes the same tensors), so the daemons confirm their commits to
  // each other first. Every daemon decides alike, from the agreed status.
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
  const absl::Duration ran = absl::Now() - started;
  CountControlOp(OpName(op), outcome.status.code(), ran);
  // One line per op on every daemon: grep "op 17 " (or the request id)
  // follows it across the cluster.
  // Names are escaped: a client's name must not forge log lines.
  const std::string tensor = OpTensor(op);
  spdlog::info(
      "op {} {}{} from rank {} (request {}): {} in {}", n, OpName(op),
      tensor.empty() ? "" : absl::StrCat(" '", absl::CEscape(tensor), "'"),
      op.coordinator(),
      op.client_request_id().empty() ? "-" : op.client_request_id(),
      outcome.status.ok() ? "OK" : outcome.status.ToString(),
      absl::FormatDuration(ran));
  FinishOwnCall(op, outcome.status, std::move(outcome.result));
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

}  // namespace tessera::control_internal
