#include "server/daemon/op_log.h"

#include <algorithm>
#include <exception>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/log_context.h"
#include "common/status_macros.h"
#include "server/metrics/metrics.h"
#include "spdlog/spdlog.h"
#include "zlib.h"

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

// How often a held queue asks membership again whether it may log.
constexpr absl::Duration kHoldRecheck = absl::Milliseconds(50);

// Store keys, under the "control" prefix.
constexpr char kSeqKey[] = "seq";
constexpr char kSkip[] = "skip";
// "skip-to M": this number and every one after it below M are skipped.
constexpr char kSkipTo[] = "skip-to ";
constexpr char kOpPrefix[] = "op:";
// "opz:<size>:" and the serialized ControlOp deflated (zlib), for ops of
// more than kDeflateAbove bytes: a group of tens of thousands of names
// fits etcd's request limit (1.5 MiB by default) several times over.
constexpr char kDeflatedOpPrefix[] = "opz:";
constexpr size_t kDeflateAbove = size_t{32} << 10;
// The most a deflated entry may claim to inflate to (a bound on what a
// malformed or forged entry makes a daemon allocate).
constexpr uint64_t kMaxInflatedBytes = uint64_t{64} << 20;
// How many numbers after a hole rank 0 looks at for a written entry, to
// skip only up to it; an op of a live daemon written further on is
// submitted again by its coordinator (OpLog::Advance).
constexpr int64_t kSkipScan = 64;
// How many keys of a range the daemons passed while re-forming rank 0
// deletes: the range may be a jump over a forged "seq".
constexpr int64_t kMaxDeletes = 1024;

std::string OpKey(int64_t n) { return absl::StrCat("op/", n); }

// For messages: a value read from the store, escaped and cut short.
std::string Quoted(absl::string_view value) {
  constexpr size_t kMax = 64;
  std::string quoted = absl::CEscape(value.substr(0, kMax));
  if (value.size() > kMax) absl::StrAppend(&quoted, "...");
  return absl::StrCat("'", quoted, "'");
}

// The next log number after a "skip-to M" entry at `n`; nullopt when the
// entry is not one or M is not after n (then it is a plain skip).
std::optional<int64_t> SkipTarget(absl::string_view entry, int64_t n) {
  int64_t to = 0;
  if (!absl::ConsumePrefix(&entry, kSkipTo) || entry.empty() ||
      !std::all_of(entry.begin(), entry.end(), absl::ascii_isdigit) ||
      !absl::SimpleAtoi(entry, &to) || to <= n || to > kMaxLogNumber) {
    return std::nullopt;
  }
  return to;
}

// The log entry of `op`: "op:" and the serialized ControlOp, or, when that
// is large, "opz:<size>:" and it deflated.
std::string EntryOf(const v1::ControlOp& op) {
  const std::string serialized = op.SerializeAsString();
  if (serialized.size() <= kDeflateAbove) {
    return absl::StrCat(kOpPrefix, serialized);
  }
  uLongf size = compressBound(serialized.size());
  std::string deflated(size, '\0');
  if (compress2(reinterpret_cast<Bytef*>(deflated.data()), &size,
                reinterpret_cast<const Bytef*>(serialized.data()),
                serialized.size(), Z_BEST_SPEED) != Z_OK) {
    return absl::StrCat(kOpPrefix, serialized);  // Only out of memory.
  }
  deflated.resize(size);
  return absl::StrCat(kDeflatedOpPrefix, serialized.size(), ":", deflated);
}

// The op of a log entry (EntryOf's forms); nullopt when it is malformed.
std::optional<v1::ControlOp> ParseEntry(absl::string_view entry) {
  v1::ControlOp op;
  if (absl::ConsumePrefix(&entry, kOpPrefix)) {
    if (!op.ParseFromArray(entry.data(), static_cast<int>(entry.size()))) {
      return std::nullopt;
    }
    return op;
  }
  if (!absl::ConsumePrefix(&entry, kDeflatedOpPrefix)) return std::nullopt;
  const size_t colon = entry.find(':');
  uint64_t size = 0;
  if (colon == absl::string_view::npos ||
      !absl::SimpleAtoi(entry.substr(0, colon), &size) || size == 0 ||
      size > kMaxInflatedBytes) {
    return std::nullopt;
  }
  entry.remove_prefix(colon + 1);
  std::string serialized(size, '\0');
  uLongf inflated = size;
  if (uncompress(reinterpret_cast<Bytef*>(serialized.data()), &inflated,
                 reinterpret_cast<const Bytef*>(entry.data()),
                 entry.size()) != Z_OK ||
      inflated != size ||
      !op.ParseFromArray(serialized.data(), static_cast<int>(size))) {
    return std::nullopt;
  }
  return op;
}

}  // namespace

OpLog::OpLog(std::shared_ptr<Rank> rank, std::shared_ptr<ProcessGroup> group,
             std::shared_ptr<Store> store, const ControlOptions& options,
             uint64_t incarnation, Membership* membership, ControlOps* ops,
             OpOutcomes* outcomes, InDoubt* in_doubt)
    : rank_(std::move(rank)),
      group_(std::move(group)),
      store_(std::move(store)),
      options_(options),
      incarnation_(incarnation),
      membership_(membership),
      ops_(ops),
      outcomes_(outcomes),
      in_doubt_(in_doubt),
      claim_timeout_(std::min(options.claim_timeout, options.lease)) {}

OpLog::~OpLog() {
  Stop();
  Join();
  FailWaiting();
}

absl::StatusOr<int64_t> OpLog::Position() {
  absl::StatusOr<int64_t> seq = store_->Add(kSeqKey, 0);
  if (seq.ok() && *seq >= 0 && *seq < kMaxLogNumber) return *seq + 1;
  if (seq.ok() || absl::IsFailedPrecondition(seq.status()) ||
      absl::IsOutOfRange(seq.status())) {
    // Repairing needs a position to repair to, which is what is missing.
    return absl::FailedPreconditionError(absl::StrCat(
        "rank 0 cannot tell where the operation log stands: control/seq ",
        seq.ok() ? absl::StrCat("holds ", *seq)
                 : std::string(seq.status().message()),
        ", not a log number from 0 to ", kMaxLogNumber,
        "; set it to the last log number used, or start on a fresh store "
        "prefix"));
  }
  return absl::UnavailableError(
      absl::StrCat("rank 0 could not read the operation log's position: ",
                   seq.status().message()));
}

void OpLog::Start(int64_t first) {
  absl::MutexLock lock(&mu_);
  if (state_ != State::kNew) return;
  position_ = first;
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
    appended_.clear();
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

OpLog::DeadlineKey OpLog::AnswerBy(const PendingCall& call) {
  const absl::Time deadline = call.deadline();
  return DeadlineKey(
      deadline == absl::InfiniteFuture() ? deadline : deadline - kAnswerMargin,
      call.id());
}

const v1::ControlOp* OpLog::QueuedOpLocked(uint64_t id) const {
  for (const Queued& queued : queue_) {
    if (queued.call->id() == id) return &queued.op;
  }
  return nullptr;
}

int64_t OpLog::EntryOfLocked(uint64_t id) const {
  for (const auto& [n, appended] : appended_) {
    if (appended.queued.call->id() == id) return n;
  }
  return 0;
}

namespace {

// How the caller of an unfinished `call` learns what became of it.
std::string OutcomeAdvice(const PendingCall& call) {
  if (call.request_id().empty()) {
    return ". It carried no request id, so its outcome cannot be asked for: "
           "list or describe the tensors";
  }
  return absl::StrCat(", and keep its outcome: `tessera op ", call.request_id(),
                      "` tells it, and a retry with the same request id "
                      "returns it without applying it twice");
}

}  // namespace

std::string OpLog::UnfinishedLocked(const PendingCall& call) const {
  const int64_t entry = EntryOfLocked(call.id());
  if (std::optional<InDoubt::Held> doubt = in_doubt_->held();
      entry == 0 && doubt.has_value() && FromThisDaemon(doubt->op) &&
      doubt->op.request_id() == call.id()) {
    return absl::StrCat(
        call.method(), " did not finish within its deadline: it is log entry ",
        doubt->entry,
        ", in doubt: the daemons' process group broke in its final exchange (",
        doubt->broke.message(),
        "), so some daemons may have committed it; the daemons decide it when "
        "their group forms again",
        OutcomeAdvice(call));
  }
  const std::string where =
      entry > 0 ? absl::StrCat("it is log entry ", entry)
                : std::string("it was being written to the log");
  const std::string id =
      call.request_id().empty()
          ? std::string()
          : absl::StrCat(" (request id ", call.request_id(), ")");
  return absl::StrCat(
      call.method(), " did not finish within its deadline: ", where, id,
      "; the daemons fail it unless it started in time", OutcomeAdvice(call));
}

bool OpLog::ExecutingLocked(const std::string& request_id) const {
  return !request_id.empty() && executing_.entry > 0 &&
         executing_.request_id == request_id;
}

bool OpLog::Executing(const std::string& request_id) const {
  absl::MutexLock lock(&mu_);
  return ExecutingLocked(request_id);
}

std::optional<v1::OperationStatus> OpLog::Pending(
    const std::string& request_id) const {
  if (request_id.empty()) return std::nullopt;
  auto pending = [&](std::string method, std::string tensor, int64_t n) {
    v1::OperationStatus status;
    status.set_request_id(request_id);
    status.set_state(v1::OperationStatus::STATE_PENDING);
    status.set_method(std::move(method));
    status.set_tensor(std::move(tensor));
    status.set_log_entry(n);
    return status;
  };
  absl::MutexLock lock(&mu_);
  // Running now (any daemon's op): its outcome is moments away.
  if (ExecutingLocked(request_id)) {
    return pending(executing_.method, executing_.tensor, executing_.entry);
  }
  // In the log and not passed by the executor, even when its call ended
  // at its deadline already: it may still run.
  for (const auto& [n, appended] : appended_) {
    const v1::ControlOp& op = appended.queued.op;
    if (op.client_request_id() == request_id) {
      return pending(OpName(op), OpTensor(op), n);
    }
  }
  // Queued or held: it runs once logged unless its call ends first.
  for (const Queued& queued : queue_) {
    if (queued.op.client_request_id() == request_id && !queued.call->done()) {
      return pending(OpName(queued.op), OpTensor(queued.op), 0);
    }
  }
  return std::nullopt;
}

void OpLog::Submit(v1::ControlOp op, const std::shared_ptr<PendingCall>& call) {
  op.set_coordinator(rank_->rank());
  op.set_incarnation(incarnation_);
  op.set_request_id(call->id());
  op.set_client_request_id(call->request_id());
  if (call->deadline() != absl::InfiniteFuture()) {
    op.set_deadline_unix_nanos(absl::ToUnixNanos(call->deadline()));
  }
  // A retry of an op that committed already: its first outcome, at once.
  if (std::optional<Replayed> replayed = outcomes_->Replay(op)) {
    spdlog::info("control: {} (request {}) is a retry of log entry {}: {}",
                 OpName(op), op.client_request_id(), replayed->first_entry,
                 replayed->status.ok() ? "answered with its outcome"
                                       : replayed->status.ToString());
    call->Complete(replayed->status, std::move(replayed->result));
    return;
  }
  // Admitted and queued in one step under membership's lock.
  const absl::Status accepting = membership_->Admit([&]() -> absl::Status {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(AcceptingLocked());
    pending_.emplace(call->id(), call);
    deadlines_.insert(AnswerBy(*call));
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
    deadlines_.erase(AnswerBy(*call));
  }
  call->Complete(status, std::move(result));
}

void OpLog::SubmitLoop() {
  mu_.Lock();
  while (state_ == State::kRunning) {
    // Calls at their deadline end now: certain when their op is still
    // queued (it never will be logged), else it may still run.
    if (!deadlines_.empty() && deadlines_.begin()->first <= absl::Now()) {
      auto it = pending_.find(deadlines_.begin()->second);
      deadlines_.erase(deadlines_.begin());
      if (it == pending_.end()) continue;
      std::shared_ptr<PendingCall> call = std::move(it->second);
      pending_.erase(it);
      absl::Status ended;
      // A copy: the queue may change once mu_ is released below.
      std::optional<v1::ControlOp> queued_op;
      if (const v1::ControlOp* op = QueuedOpLocked(call->id())) {
        queued_op = *op;
      }
      // A retry (same client request id) of an op that is running here
      // now, or that committed since the retry was queued, is not "not
      // applied": the first attempt may still commit, or did.
      const bool first_running = ExecutingLocked(call->request_id());
      const int64_t running_entry = first_running ? executing_.entry : 0;
      if (!queued_op.has_value()) {
        ended = absl::DeadlineExceededError(UnfinishedLocked(*call));
      } else if (first_running) {
        ended = absl::DeadlineExceededError(absl::StrCat(
            call->method(),
            " did not finish within its deadline: an earlier "
            "attempt with its request id ",
            call->request_id(), ", log entry ", running_entry,
            ", is running and may still commit; `tessera op ",
            call->request_id(),
            "` tells its outcome, and a retry with the "
            "same request id returns it without applying it twice"));
      } else if (!held_.empty()) {
        ended = absl::UnavailableError(absl::StrCat(
            call->method(),
            " was not applied: its deadline came while the cluster held new "
            "operations: ",
            held_, "; retry once every daemon takes part again"));
      } else {
        ended = absl::DeadlineExceededError(absl::StrCat(
            call->method(),
            " was not applied: its deadline came before the operation was "
            "logged"));
      }
      mu_.Unlock();
      // Outside mu_ (the outcomes read the table): an earlier attempt that
      // committed while this one was queued answers it, as Submit would.
      std::optional<Replayed> replayed;
      if (queued_op.has_value() && !first_running) {
        replayed = outcomes_->Replay(*queued_op);
      }
      if (replayed.has_value()) {
        call->Complete(replayed->status, std::move(replayed->result));
      } else {
        call->Complete(ended);
      }
      mu_.Lock();
      continue;
    }
    if (queue_.empty()) {
      held_.clear();
      if (deadlines_.empty()) {
        wake_.Wait(&mu_);
      } else {
        wake_.WaitWithDeadline(&mu_, deadlines_.begin()->first);
      }
      continue;
    }
    // Held while a daemon is silent or missing: a logged op would wait for
    // it inside a collective, an unlogged one can still end certain.
    // Membership's lock comes before the log's: asked without it.
    mu_.Unlock();
    std::string hold = membership_->HoldReason();
    mu_.Lock();
    if (state_ != State::kRunning) continue;
    if (!hold.empty()) {
      if (held_.empty()) {
        spdlog::warn(
            "control: holding {} operation(s) until every daemon "
            "takes part: {}",
            queue_.size(), hold);
      }
      held_ = std::move(hold);
      absl::Time until = absl::Now() + kHoldRecheck;
      if (!deadlines_.empty()) {
        until = std::min(until, deadlines_.begin()->first);
      }
      wake_.WaitWithDeadline(&mu_, until);
      continue;
    }
    if (!held_.empty()) {
      spdlog::info("control: logging the held operations again");
      held_.clear();
    }
    Queued queued = std::move(queue_.front());
    queue_.pop_front();
    mu_.Unlock();
    // A call that ended already (deadline, cancellation) needs no op.
    if (!queued.call->done()) {
      absl::Status appended = Append(queued);
      if (!appended.ok()) Finish(queued.call, appended);
    }
    mu_.Lock();
  }
  mu_.Unlock();
}

absl::Status OpLog::Append(const Queued& queued) {
  const v1::ControlOp& op = queued.op;
  const std::string value = EntryOf(op);
  while (true) {
    ASSIGN_OR_RETURN(const int64_t n, Claim(queued));
    absl::StatusOr<std::string> held = store_->CompareSet(OpKey(n), "", value);
    absl::MutexLock lock(&mu_);
    auto it = appended_.find(n);
    // Gone: the executor ran the op already.
    const Appended::State state =
        it != appended_.end() ? it->second.state : Appended::State::kWritten;
    if (!held.ok() || *held != value || state != Appended::State::kWriting) {
      if (it != appended_.end()) appended_.erase(it);
    }
    if (absl::IsResourceExhausted(held.status())) {
      // Refused (too large, or the store is full): nothing was written.
      // The number is skipped at once rather than after claim_timeout; a
      // retry would be refused alike, so the error is not UNAVAILABLE.
      absl::StatusOr<std::string> skipped =
          store_->CompareSet(OpKey(n), "", kSkip);
      if (!skipped.ok()) {
        spdlog::warn("control: could not skip log entry {} at once: {}", n,
                     std::string(skipped.status().message()));
      }
      return absl::ResourceExhaustedError(absl::StrCat(
          OpName(op), ": not applied: its log entry (", value.size(),
          " bytes) was refused: ", held.status().message(),
          "; make the call smaller (fewer tensors at once)"));
    }
    if (!held.ok()) {
      // The write may have landed before the store failed to answer.
      return absl::UnavailableError(absl::StrCat(
          OpName(op), ": cannot write the operation log (entry ", n,
          "): ", held.status().message(),
          op.client_request_id().empty()
              ? "; it may have been written: list the tensors before "
                "retrying, or call with a request id"
              : absl::StrCat("; it may have been written: a retry with "
                             "request id ",
                             op.client_request_id(),
                             " applies it at most once")));
    }
    if (*held != value) {
      // Rank 0 gave up on this number before we wrote it, or an entry
      // holds it already: claim another.
      spdlog::warn("control: log entry {} was taken before {} wrote it", n,
                   OpName(op));
      continue;
    }
    switch (state) {
      case Appended::State::kWriting:
        it->second.state = Appended::State::kWritten;
        return absl::OkStatus();
      case Appended::State::kWritten:
        return absl::OkStatus();
      case Appended::State::kSkipped:
        spdlog::warn("control: the log jumped over entry {} while {} wrote it",
                     n, OpName(op));
        continue;
      case Appended::State::kAbandoned:
        break;
    }
    return absl::UnavailableError(absl::StrCat(
        OpName(op),
        " was not applied: the daemons' process group broke while it was "
        "logged; retry it"));
  }
}

absl::StatusOr<int64_t> OpLog::Claim(const Queued& queued) {
  const v1::ControlOp& op = queued.op;
  while (true) {
    if (absl::Now() >= queued.call->deadline()) {
      return absl::DeadlineExceededError(absl::StrCat(
          OpName(op), ": the deadline passed before the operation was logged"));
    }
    absl::StatusOr<int64_t> n = store_->Add(kSeqKey, 1);
    if (absl::IsFailedPrecondition(n.status()) ||
        absl::IsOutOfRange(n.status())) {
      // Not a decimal integer, or at the end of int64.
      absl::StatusOr<std::string> held =
          store_->Get(kSeqKey, options_.poll_interval);
      if (held.ok()) RepairSeq(*held, SeqFloor(), n.status().message());
      continue;
    }
    if (!n.ok()) {
      return absl::UnavailableError(absl::StrCat(
          OpName(op),
          ": cannot reach the operation log: ", n.status().message()));
    }
    int64_t floor;
    {
      absl::MutexLock lock(&mu_);
      if (*n >= position_ && *n <= kMaxLogNumber && appended_.count(*n) == 0) {
        appended_.emplace(*n, Appended{queued, Appended::State::kWriting});
        return *n;
      }
      floor = std::max(position_ - 1,
                       appended_.empty() ? 0 : appended_.rbegin()->first);
    }
    // Passed already (the log jumped over it, or "seq" went back), beyond
    // the last log number, or holding one of our own ops.
    if (floor > *n || *n > kMaxLogNumber) {
      RepairSeq(absl::StrCat(*n), floor,
                absl::StrCat("it gave ", *n, " to ", OpName(op),
                             *n > kMaxLogNumber ? ", beyond the last log number"
                                                : ", a number the log passed"));
    }
  }
}

int64_t OpLog::SeqFloor() const {
  absl::MutexLock lock(&mu_);
  return std::max(position_ - 1,
                  appended_.empty() ? 0 : appended_.rbegin()->first);
}

void OpLog::RepairSeq(absl::string_view held, int64_t floor,
                      absl::string_view why) {
  const std::string repaired = absl::StrCat(floor);
  absl::StatusOr<std::string> now = store_->CompareSet(kSeqKey, held, repaired);
  if (!now.ok()) {
    spdlog::warn("control: repairing control/seq: {}", now.status().ToString());
    return;
  }
  if (*now == repaired && held != repaired) {
    spdlog::error(
        "control: the operation log's sequence number control/seq held {} "
        "({}); set it to {}",
        Quoted(held), std::string(why), floor);
  }
}

void OpLog::ExecutorLoop() {
  int64_t n;
  {
    absl::MutexLock lock(&mu_);
    n = position_;
  }
  while (true) {
    bool reform = false;
    std::optional<std::string> entry = AwaitEntry(n, &reform);
    if (reform) {
      if (!Reform(&n)) return;
      continue;
    }
    if (!entry.has_value()) return;
    std::optional<uint64_t> ran;
    const int64_t next = Execute(*entry, n, &ran);
    applied_.fetch_add(1);
    Advance(n, next, Passed::kSubmitAgain, ran);
    n = next;
    // A transport failure in the op: form the next generation before the
    // next op, so that it runs on a working group.
    // An op left in doubt is decided as the next generation forms.
    if ((!group_->Usable().ok() || in_doubt_->held_entry() != 0) &&
        !Reform(&n)) {
      return;
    }
  }
}

bool OpLog::Reform(int64_t* next) {
  std::optional<Membership::Resumed> resumed = membership_->Reform(*next);
  if (!resumed.has_value()) return false;
  // The op in doubt, decided as the group formed (JoinInStep).
  if (std::optional<InDoubt::Resolved> decided = in_doubt_->TakeResolved()) {
    if (decided->status.ok()) {
      outcomes_->Committed(decided->op, decided->entry, decided->result);
    } else {
      outcomes_->Failed(decided->op, decided->entry, decided->status);
    }
    {
      absl::MutexLock lock(&mu_);
      executing_ = {};
    }
    FinishOwnCall(decided->op, decided->status, std::move(decided->result));
  }
  // Entries the others passed while this daemon did not run them failed on
  // the others (they could not agree without it).
  Advance(*next, std::max(*next, resumed->next), Passed::kAbandon);
  // Every daemon has read the entries before the furthest position (a
  // range a jump made long is left to the store).
  if (rank_->rank() == 0) {
    const int64_t end =
        std::min(resumed->next, resumed->earliest + kMaxDeletes);
    for (int64_t m = resumed->earliest; m < end; ++m) {
      store_->Delete(OpKey(m)).IgnoreError();
    }
  }
  *next = std::max(*next, resumed->next);
  return true;
}

void OpLog::Advance(int64_t from, int64_t to, Passed passed,
                    std::optional<uint64_t> ran) {
  std::vector<std::pair<int64_t, Queued>> abandoned;
  {
    absl::MutexLock lock(&mu_);
    position_ = to;
    auto it = appended_.lower_bound(from);
    while (it != appended_.end() && it->first < to) {
      Appended& appended = it->second;
      // The op ran (entry `from`), or its call ended otherwise.
      if ((it->first == from && ran == appended.queued.call->id()) ||
          appended.queued.call->done()) {
        it = appended_.erase(it);
        continue;
      }
      if (appended.state == Appended::State::kWriting) {
        // The submit thread claims again or fails the call when its write
        // returns.
        appended.state = passed == Passed::kSubmitAgain
                             ? Appended::State::kSkipped
                             : Appended::State::kAbandoned;
        ++it;
        continue;
      }
      if (passed == Passed::kSubmitAgain) {
        spdlog::warn(
            "control: the log passed entry {} ({}) without running it; "
            "submitting it again",
            it->first, OpName(appended.queued.op));
        queue_.push_front(std::move(appended.queued));
        wake_.SignalAll();
      } else {
        abandoned.emplace_back(it->first, std::move(appended.queued));
      }
      it = appended_.erase(it);
    }
  }
  for (const auto& [n, queued] : abandoned) {
    const absl::Status status = absl::UnavailableError(
        absl::StrCat(OpName(queued.op),
                     " was not applied: the daemons' process group broke "
                     "while it ran; retry it"));
    outcomes_->Failed(queued.op, n, status);
    Finish(queued.call, status);
  }
}

bool OpLog::FromThisDaemon(const v1::ControlOp& op) const {
  return op.coordinator() == rank_->rank() && op.incarnation() == incarnation_;
}

std::shared_ptr<PendingCall> OpLog::OwnCall(const v1::ControlOp& op) const {
  if (!FromThisDaemon(op)) return nullptr;
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
  while (running()) {
    // Get waits for the key: one round trip to the store, not a wait and
    // then a read.
    absl::StatusOr<std::string> value =
        store_->Get(key, options_.poll_interval);
    if (value.ok()) return *std::move(value);
    const absl::Status waited = value.status();
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
    if (std::optional<std::string> held = SkipUnwritten(n)) return held;
  }
  return std::nullopt;
}

std::optional<int64_t> OpLog::ReadSeq(int64_t n) {
  absl::StatusOr<int64_t> seq = store_->Add(kSeqKey, 0);
  std::string held;
  std::string why;
  if (seq.ok()) {
    if (*seq >= n - 1 && *seq <= kMaxLogNumber) return *seq;
    // Someone set it back (below numbers the log passed: the next claims
    // would be lost) or beyond the last log number.
    held = absl::StrCat(*seq);
    why = *seq > kMaxLogNumber
              ? "beyond the last log number"
              : absl::StrCat("behind the log, which is at ", n);
  } else if (absl::IsFailedPrecondition(seq.status()) ||
             absl::IsOutOfRange(seq.status())) {
    absl::StatusOr<std::string> raw =
        store_->Get(kSeqKey, options_.poll_interval);
    if (!raw.ok()) return std::nullopt;
    held = *std::move(raw);
    why = std::string(seq.status().message());
  } else {
    return std::nullopt;
  }
  const int64_t floor = std::max(
      {n - 1, SeqFloor(), claim_wait_.has_value() ? claim_wait_->through : 0});
  RepairSeq(held, floor, why);
  return std::nullopt;
}

std::optional<std::string> OpLog::SkipUnwritten(int64_t n) {
  std::optional<int64_t> seq = ReadSeq(n);
  if (!seq.has_value() || *seq < n) return std::nullopt;
  // One wait for every number claimed by now, however many: holes cost
  // one claim timeout in all, not one each. Numbers claimed later wait
  // for a wait of their own.
  const absl::Time now = absl::Now();
  if (!claim_wait_.has_value() || claim_wait_->through < n) {
    claim_wait_ = ClaimWait{now, *seq};
  }
  if (now - claim_wait_->since < claim_timeout_) return std::nullopt;
  // Every number from n to `through` had its time: skip up to the first
  // one written, looked for at both ends of the range (after a forged
  // jump, live claims lie at its top). The middle of a long range is
  // skipped unseen; an op a live daemon wrote there is submitted again by
  // that daemon (Advance).
  const int64_t through = claim_wait_->through;
  int64_t to = through + 1;
  const int64_t low_end = std::min(through, n + kSkipScan);
  const int64_t high_begin = std::max(low_end + 1, through - kSkipScan + 1);
  for (int64_t m = n + 1; m <= through; ++m) {
    if (m > low_end && m < high_begin) m = high_begin;
    absl::StatusOr<bool> written = store_->Check({OpKey(m)});
    if (!written.ok()) return std::nullopt;
    if (*written) {
      to = m;
      break;
    }
  }
  const std::string marker =
      to == n + 1 ? std::string(kSkip) : absl::StrCat(kSkipTo, to);
  absl::StatusOr<std::string> held = store_->CompareSet(OpKey(n), "", marker);
  if (!held.ok()) return std::nullopt;
  if (*held == marker) {
    if (to == n + 1) {
      spdlog::warn(
          "control: log entry {} was claimed but never written; skipping it",
          n);
    } else {
      spdlog::warn(
          "control: log entries {} to {} were claimed but never written; "
          "skipping them",
          n, to - 1);
    }
  }
  return *std::move(held);
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

int64_t OpLog::Execute(absl::string_view entry, int64_t n,
                       std::optional<uint64_t>* own_request) {
  if (entry == kSkip) return n + 1;
  // Every daemon reads the same bytes, so every daemon jumps alike.
  if (absl::StartsWith(entry, kSkipTo)) {
    if (std::optional<int64_t> to = SkipTarget(entry, n)) return *to;
    spdlog::error(
        "control: log entry {} is a malformed skip marker ({}); "
        "skipping it alone",
        n, Quoted(entry));
    return n + 1;
  }
  std::optional<v1::ControlOp> parsed = ParseEntry(entry);
  if (!parsed.has_value()) {
    // Every daemon reads the same bytes, so every daemon skips it.
    spdlog::error("control: log entry {} is malformed; skipping it", n);
    return n + 1;
  }
  const v1::ControlOp& op = *parsed;
  if (op.request_case() == v1::ControlOp::REQUEST_NOT_SET) {
    spdlog::error("control: log entry {} holds no request; skipping it", n);
    return n + 1;
  }
  if (FromThisDaemon(op)) {
    *own_request = op.request_id();
  }
  // A retry of an op that committed already is not run again; every
  // daemon decides alike (they hold the same records).
  if (std::optional<Replayed> replayed = outcomes_->Replay(op)) {
    spdlog::info(
        "op {} {} from rank {} (request {}): a retry of log entry {}, not run "
        "again: {}",
        n, OpName(op), op.coordinator(), op.client_request_id(),
        replayed->first_entry,
        replayed->status.ok() ? "OK" : replayed->status.ToString());
    FinishOwnCall(op, replayed->status, std::move(replayed->result));
    return n + 1;
  }
  const absl::Time started = absl::Now();
  if (std::shared_ptr<PendingCall> own = OwnCall(op)) {
    CountControlOpWait(OpName(op), started - own->created());
  }
  // Every line logged while the op runs carries it (--log-format json).
  const std::string tensor = OpTensor(op);
  const ScopedLogContext context(LogContext{n, tensor, op.client_request_id()});
  if (!op.client_request_id().empty()) {
    absl::MutexLock lock(&mu_);
    executing_ = {n, op.client_request_id(), OpName(op), tensor};
  }
  OpOutcome outcome = RunGuarded(op, n);
  if (outcome.late.has_value()) {
    // In doubt: stays running (executing_) until the group re-forms and
    // decides it (Reform), which answers its call.
    spdlog::warn(
        "op {} {} from rank {} (request {}): in doubt: {}; the re-formed "
        "group decides whether it committed",
        n, OpName(op), op.coordinator(),
        op.client_request_id().empty() ? "-" : op.client_request_id(),
        outcome.status.ToString());
    in_doubt_->Hold(n, op, *std::move(outcome.late), outcome.status);
    return n + 1;
  }
  // Agreed: the op committed on every daemon or failed on every daemon
  // (a failed confirmation below does not undo the commit).
  const bool committed = outcome.status.ok();
  if (committed) in_doubt_->Committed(n);
  if (!committed) outcomes_->Failed(op, n, outcome.status);
  // The call returns once every daemon shows the change
  // (proto/tessera/v1/control.proto: after a call returns, every daemon lists
  // and describes the same tensors), so the daemons confirm their commits to
  // each other first. Every daemon decides alike, from the agreed status.
  const bool changes_table =
      op.request_case() != v1::ControlOp::kGather &&
      op.request_case() != v1::ControlOp::kSaveCheckpoint;
  if (committed && changes_table) {
    absl::Status confirmed = group_->Barrier();
    if (!confirmed.ok()) {
      outcome.status = absl::Status(
          confirmed.code(),
          absl::StrCat(OpName(op),
                       " was applied, but not every daemon confirmed it: ",
                       confirmed.message()));
    }
  }
  // A commit is recorded once confirmed (or given up on): a retry answered
  // from the record (OpOutcomes::Replay) returns, like the first call,
  // only when every daemon shows the change.
  if (committed) outcomes_->Committed(op, n, outcome.result);
  {
    absl::MutexLock lock(&mu_);
    executing_ = {};
  }
  // Every daemon has committed (or gave up): what the op replaced may go.
  outcome.retired.reset();
  const absl::Duration ran = absl::Now() - started;
  CountControlOp(OpName(op), outcome.status.code(), ran);
  // One line per op on every daemon: grep "op 17 " (or the request id)
  // follows it across the cluster.
  // Names are escaped: a client's name must not forge log lines.
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
  return n + 1;
}

}  // namespace tessera::control_internal
