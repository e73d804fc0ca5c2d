#include "server/daemon/control_core.h"

#include <algorithm>
#include <exception>
#include <limits>
#include <optional>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/log_context.h"
#include "common/proto_convert.h"
#include "common/status_macros.h"
#include "server/collective/process_group.h"
#include "server/sharded/sharded_tensor.h"
#include "spdlog/spdlog.h"
#include "tessera/v1/control_internal.pb.h"
#include "wire/replicas.h"

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
// Why generation g was asked for, by the daemon that asked first.
std::string ReasonKey(int64_t generation) {
  return absl::StrCat("reason/", generation);
}
// Each daemon's liveness counter (ControlOptions::lease).
std::string AliveKey(int rank) { return absl::StrCat("alive/", rank); }
// With a store that has leases: present while the daemon renews its lease.
std::string LiveKey(int rank) { return absl::StrCat("live/", rank); }
// What watcher `watcher` found expired: "<generation>:<rank>,<rank>...".
std::string ExpiredKey(int watcher) {
  return absl::StrCat("expired/", watcher);
}

}  // namespace

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
  // after the agreed start, and every daemon runs all of them. A daemon
  // that restarted into a running cluster learns the position and the
  // table from the others instead (JoinInStep).
  int64_t next = 0;
  if (rank_->rank() == 0) {
    absl::StatusOr<int64_t> seq = store_->Add(kSeqKey, 0);
    if (!seq.ok()) {
      return absl::UnavailableError(
          absl::StrCat("rank 0 could not read the operation log's position: ",
                       seq.status().message()));
    }
    next = *seq + 1;
  }
  RETURN_IF_ERROR(JoinInStep(/*starting=*/true, &next));
  {
    absl::MutexLock lock(&mu_);
    if (state_ != State::kNew) {
      return absl::FailedPreconditionError("stopped");
    }
    first_entry_ = next;
    state_ = State::kRunning;
    formed_at_ = absl::Now();
    submitter_ = std::thread([this] { SubmitLoop(); });
    executor_ = std::thread([this] { ExecutorLoop(); });
    lease_keeper_ = std::thread([this] { LeaseLoop(); });
  }
  // Outside mu_: a scrape holds the gauges' lock, then mu_.
  RegisterGauges();
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
  gauges_.clear();
  if (submitter_.joinable()) submitter_.join();
  if (executor_.joinable()) executor_.join();
  if (lease_keeper_.joinable()) lease_keeper_.join();
  std::vector<std::thread> refills;
  {
    absl::MutexLock lock(&mu_);
    refills.swap(refills_);
  }
  for (std::thread& refill : refills) refill.join();
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
  op.set_client_request_id(call->request_id());
  if (call->deadline() != absl::InfiniteFuture()) {
    op.set_deadline_unix_nanos(absl::ToUnixNanos(call->deadline()));
  }
  absl::Status accepting;
  {
    absl::MutexLock lock(&mu_);
    accepting = AcceptingLocked();
    if (accepting.ok()) accepting = ReformingLocked(/*even_if_all_here=*/false);
    // A silent daemon while no generation is being formed: an op would wait
    // for it. (While one is, ReformingLocked decides: refused while ranks
    // are missing, queued once every daemon takes part.)
    if (accepting.ok() && reforming_.empty() && !published_expired_.empty()) {
      accepting = absl::UnavailableError(absl::StrCat(
          LeaseText(published_expired_), "; the cluster waits for ranks [",
          absl::StrJoin(published_expired_, ", "),
          "] (stalled, dead or unreachable); operations resume once every "
          "daemon takes part again"));
    }
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

bool Core::NeedsReform() const { return rank_->world_group()->NeedsReform(); }

absl::Status Core::ReformingLocked(bool even_if_all_here) const {
  if (!fenced_.empty()) return absl::UnavailableError(fenced_);
  if (reforming_.empty()) return absl::OkStatus();
  const GroupState state = rank_->world_group()->State();
  // Every daemon is taking part: the op runs once the generation formed.
  if (state.missing.empty() && !even_if_all_here) return absl::OkStatus();
  std::string waiting;
  if (state.forming > 0) {
    waiting =
        state.missing.empty()
            ? absl::StrCat("; forming generation ", state.forming)
            : absl::StrCat("; generation ", state.forming, " waits for ranks [",
                           absl::StrJoin(state.missing, ", "),
                           "] (stalled, dead or unreachable)");
  }
  return absl::UnavailableError(absl::StrCat(
      "the daemons are re-forming their process group after a failure (",
      reforming_, ")", waiting,
      "; operations resume once every daemon takes part again"));
}

bool Core::LeaseExpired() const {
  absl::MutexLock lock(&mu_);
  return !expired_.empty();
}

bool Core::Sleep(absl::Duration d) {
  const absl::Time until = absl::Now() + d;
  absl::MutexLock lock(&mu_);
  while (state_ == State::kRunning && absl::Now() < until) {
    wake_.WaitWithDeadline(&mu_, until);
  }
  return state_ == State::kRunning;
}

void Core::LeaseLoop() {
  const int world = rank_->world_size();
  const std::string mine = AliveKey(rank_->rank());
  // Renewed, and looked at, every tenth of the lease. A counter that did
  // not move for `silence` is expired: that leaves three periods (the
  // phase of the renewal, the phase of the look, a late loop) and the
  // executor's reaction within the lease, so a failure is reported within
  // the lease (at 5 s: silent 2.7 s, reported in about 3.5 to 4.5 s).
  const absl::Duration period = options_.lease / 10;
  const absl::Duration silence =
      std::max(options_.lease / 2,
               options_.lease - 3 * period - absl::Milliseconds(800));
  // Rank 0 watches every other daemon (one read per daemon per period) and
  // rank 1 watches rank 0 (which matters when the store outlives rank 0);
  // the watcher's executor starts the next generation and the others
  // follow it.
  std::vector<int> watched;
  if (rank_->rank() == 0) {
    for (int r = 1; r < world; ++r) watched.push_back(r);
  } else if (rank_->rank() == 1) {
    watched.push_back(0);
  }
  // With a store that has leases (etcd), each daemon holds a key bound to
  // a lease of `silence` and renews it every period; the store drops the
  // key by its own clock once the daemon stops, and a watcher counts a
  // daemon whose key is gone as expired. Otherwise each daemon bumps a
  // counter, and a watcher counts one that did not move for `silence`, by
  // its own clock (clocks of different hosts are never compared).
  enum class Kind { kUnknown, kLeases, kCounters } kind = Kind::kUnknown;
  int64_t lease = 0;
  auto renew = [&]() -> absl::Status {
    if (kind == Kind::kCounters) return store_->Add(mine, 1).status();
    absl::Status renewed =
        lease != 0 ? store_->Renew(lease) : absl::NotFoundError("no lease yet");
    if (!absl::IsNotFound(renewed)) return renewed;
    // None yet, or it ran out (this daemon stalled): a new one.
    absl::StatusOr<int64_t> granted =
        store_->SetLive(LiveKey(rank_->rank()), "", silence);
    if (absl::IsUnimplemented(granted.status())) {
      kind = Kind::kCounters;
      return store_->Add(mine, 1).status();
    }
    if (!granted.ok()) return granted.status();
    kind = Kind::kLeases;
    lease = *granted;
    return absl::OkStatus();
  };
  std::vector<int64_t> seen(world, -1);
  std::vector<absl::Time> moved(world, absl::Now());
  absl::Time counted_from = absl::InfinitePast();
  // What this watcher last published under ExpiredKey.
  std::vector<int> published;
  while (Sleep(period)) {
    // An unreachable store: nobody's lease can be judged (and each look
    // would wait for it again).
    if (!renew().ok()) {
      absl::MutexLock lock(&mu_);
      expired_.clear();
      continue;
    }
    const int64_t generation = rank_->world_group()->generation();
    ReadPublishedExpiry(generation);
    if (watched.empty()) continue;
    const absl::Time now = absl::Now();
    {
      absl::MutexLock lock(&mu_);
      if (formed_at_ > counted_from) {
        // A generation formed with everyone: leases count from here.
        counted_from = formed_at_;
        std::fill(moved.begin(), moved.end(), now);
      }
    }
    std::vector<int> expired;
    for (int r : watched) {
      if (!running()) break;
      if (kind == Kind::kLeases) {
        absl::StatusOr<bool> live = store_->Check({LiveKey(r)});
        if (!live.ok()) {
          expired.clear();
          break;
        }
        // A daemon has `silence` from the generation's start to show up.
        if (!*live && now - counted_from > silence) expired.push_back(r);
        continue;
      }
      absl::StatusOr<int64_t> count = store_->Add(AliveKey(r), 0);
      if (!count.ok()) {
        expired.clear();
        break;
      }
      if (*count != seen[r]) {
        seen[r] = *count;
        moved[r] = now;
      } else if (now - moved[r] > silence) {
        expired.push_back(r);
      }
    }
    {
      absl::MutexLock lock(&mu_);
      // A generation that formed meanwhile counts leases afresh.
      if (rank_->world_group()->generation() != generation) continue;
      if (expired != expired_ && !expired.empty()) {
        // One line per silent daemon, each naming it (peer, in JSON).
        for (const int silent : expired) {
          const ScopedLogContext about(LogContext{0, "", "", silent});
          spdlog::warn("control: the lease of rank {} expired (silent for {})",
                       silent, absl::FormatDuration(options_.lease));
        }
      }
      expired_ = expired;
    }
    // Every daemon reads it within a period (ReadPublishedExpiry).
    if (expired != published) {
      const std::string value =
          absl::StrCat(generation, ":", absl::StrJoin(expired, ","));
      if (store_->Set(ExpiredKey(rank_->rank()), value).ok()) {
        published = expired;
      }
    }
  }
}

void Core::ReadPublishedExpiry(int64_t generation) {
  std::vector<int> expired;
  for (int watcher = 0; watcher < std::min(2, rank_->world_size()); ++watcher) {
    // Absent (nothing published yet): DEADLINE_EXCEEDED at once.
    absl::StatusOr<std::string> value =
        store_->Get(ExpiredKey(watcher), absl::ZeroDuration());
    if (!value.ok()) continue;
    std::pair<std::string, std::string> parts = absl::StrSplit(*value, ':');
    int64_t of = 0;
    // Only what was found in this generation counts.
    if (!absl::SimpleAtoi(parts.first, &of) || of != generation) continue;
    for (absl::string_view rank :
         absl::StrSplit(parts.second, ',', absl::SkipEmpty())) {
      int r = 0;
      if (absl::SimpleAtoi(rank, &r)) expired.push_back(r);
    }
  }
  std::sort(expired.begin(), expired.end());
  expired.erase(std::unique(expired.begin(), expired.end()), expired.end());
  std::vector<std::shared_ptr<PendingCall>> in_flight;
  absl::flat_hash_set<uint64_t> queued;
  {
    absl::MutexLock lock(&mu_);
    // A generation that formed meanwhile made what was read stale.
    if (rank_->world_group()->generation() != generation) return;
    const bool newly = published_expired_.empty() && !expired.empty();
    published_expired_ = expired;
    if (!newly) return;
    for (const auto& [id, call] : pending_) in_flight.push_back(call);
    for (const Queued& q : queue_) queued.insert(q.call->id());
  }
  // Calls already submitted: their op may wait inside a collective for the
  // silent daemon until --timeout. Their callers hear it now. An op not yet
  // appended to the log never will be (the submit thread skips ended
  // calls); one already in the log may still complete.
  const std::string why = LeaseText(expired);
  for (const std::shared_ptr<PendingCall>& call : in_flight) {
    Finish(call,
           absl::UnavailableError(absl::StrCat(
               call->method(), ": ", why,
               queued.contains(call->id())
                   ? " before the operation was logged; it was not applied"
                   : " while the operation ran; it may still complete once "
                     "that daemon is back, or fail")));
  }
}

std::string Core::LeaseText(const std::vector<int>& expired) const {
  return absl::StrCat("the lease of ranks [", absl::StrJoin(expired, ", "),
                      "] expired: silent for ",
                      absl::FormatDuration(options_.lease));
}

bool Core::Reform(int64_t* next) {
  const std::shared_ptr<ReformableGroup>& group = rank_->world_group();
  const absl::Status usable = group->Usable();
  const int64_t broken = group->generation();
  // The first daemon to start a generation leaves its reason for the
  // others, which only see that a new one was asked for (and that their
  // transport was closed under them).
  const std::string reason_key = ReasonKey(broken + 1);
  absl::StatusOr<std::string> stored =
      store_->Get(reason_key, absl::ZeroDuration());
  std::string reason;
  if (stored.ok()) {
    reason = *std::move(stored);
  } else if (!usable.ok()) {
    reason = absl::StrCat("generation ", broken, ": ", usable.message());
  } else {
    absl::MutexLock lock(&mu_);
    if (!expired_.empty()) reason = LeaseText(expired_);
  }
  if (!stored.ok() && !reason.empty()) {
    absl::StatusOr<std::string> first = store_->CompareSet(
        reason_key, "", absl::StrCat("rank ", rank(), ": ", reason));
    if (first.ok()) reason = *std::move(first);
  } else if (reason.empty()) {
    absl::StatusOr<std::string> theirs =
        store_->Get(reason_key, options_.poll_interval);
    reason = theirs.ok() ? *theirs
                         : std::string(
                               "another daemon asked for a new "
                               "generation");
  }
  {
    absl::MutexLock lock(&mu_);
    reforming_ = reason;
    spdlog::warn("control: re-forming the default group: {}", reforming_);
  }
  ReformOptions options;
  options.cancelled = [this] { return !running(); };
  while (true) {
    absl::Status formed = group->Reform(options);
    if (!running()) return false;
    if (absl::IsFailedPrecondition(formed)) {
      spdlog::error("control: {}", formed.ToString());
      absl::MutexLock lock(&mu_);
      fenced_ = absl::StrCat("fenced: ", formed.message());
      reforming_.clear();
      return false;
    }
    if (formed.ok()) {
      formed = JoinInStep(/*starting=*/false, next);
      if (formed.ok()) break;
    }
    spdlog::warn("control: generation {} did not form: {}", group->generation(),
                 formed.ToString());
    if (!Pause(options_.poll_interval)) return false;
  }
  absl::MutexLock lock(&mu_);
  reforming_.clear();
  expired_.clear();
  published_expired_.clear();  // Published for the older generation.
  formed_at_ = absl::Now();
  spdlog::warn(
      "control: generation {} formed after generation {} failed; running the "
      "log again from entry {}",
      group->generation(), broken, *next);
  return true;
}

absl::Status Core::JoinInStep(bool starting, int64_t* next) {
  SetLogGeneration(rank_->world_group()->generation());
  v1::ResumeState mine;
  mine.set_next_entry(*next);
  mine.set_device(options_.device);
  mine.set_starting(starting);
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, entry] : table_) {
      *mine.add_infos() = entry.info;
      // Degraded entries of a daemon that restarted have no tensor; their
      // layout is the metadata's.
      *mine.add_specs() = entry.tensor.has_value()
                              ? ToProto(entry.tensor->sharding_spec())
                              : v1::ShardingSpec();
    }
  }
  ASSIGN_OR_RETURN(std::vector<std::string> gathered,
                   AllGatherBytes(*group_, mine.SerializeAsString()));
  std::vector<v1::ResumeState> all(gathered.size());
  for (size_t r = 0; r < gathered.size(); ++r) {
    if (!all[r].ParseFromString(gathered[r])) {
      return absl::DataLossError(absl::StrCat(
          "rank ", r, " sent no readable state when the group formed"));
    }
  }
  // Deterministic from here: every daemon reads the same states.
  std::vector<std::string> devices;
  std::set<int> starting_ranks;
  int64_t furthest = 0;
  int64_t earliest = std::numeric_limits<int64_t>::max();
  int source = -1;  // The lowest-ranked veteran.
  for (size_t r = 0; r < all.size(); ++r) {
    devices.push_back(all[r].device());
    furthest = std::max(furthest, all[r].next_entry());
    if (all[r].starting()) {
      starting_ranks.insert(static_cast<int>(r));
      continue;
    }
    earliest = std::min(earliest, all[r].next_entry());
    if (source < 0) source = static_cast<int>(r);
  }
  // Entries veterans passed while this one did not run them failed on the
  // others (they could not agree without it). A starting daemon skips the
  // whole log before it.
  if (!starting) {
    for (int64_t m = *next; m < furthest; ++m) Abandon(m);
  }
  *next = furthest;

  // The table: what every veteran holds alike stays; the rest was changed
  // on some daemons only when the last generation broke, and is dropped.
  const int veterans = static_cast<int>(all.size() - starting_ranks.size());
  absl::flat_hash_map<std::string, int> held;
  for (const v1::ResumeState& state : all) {
    if (state.starting()) continue;
    for (const v1::TensorInfo& info : state.infos()) {
      ++held[absl::StrCat(info.name(), " ", info.tensor_id())];
    }
  }
  auto kept = [&](const std::string& name, const std::string& id) {
    auto it = held.find(absl::StrCat(name, " ", id));
    return it != held.end() && it->second == veterans;
  };
  std::vector<std::string> dropped;
  std::vector<std::string> degraded;
  {
    absl::MutexLock lock(&mu_);
    devices_ = std::move(devices);
    for (auto it = table_.begin(); it != table_.end();) {
      if (kept(it->first, it->second.info.tensor_id())) {
        ++it;
        continue;
      }
      dropped.push_back(it->first);
      it = table_.erase(it);
    }
  }
  if (!dropped.empty()) {
    spdlog::error(
        "control: dropped tensors [{}]: the daemons did not all hold them "
        "alike when the last generation broke (an operation on them was "
        "applied on some daemons only)",
        absl::StrJoin(dropped, ", "));
  }
  if (!starting_ranks.empty() && source >= 0) {
    // Daemons that restarted lost their shards: the tensors with shards on
    // them are degraded everywhere; a starting daemon builds its table
    // from the source's.
    const v1::ResumeState& from = all[source];
    if (from.specs_size() != from.infos_size()) {
      return absl::DataLossError(
          absl::StrCat("rank ", source, " sent ", from.infos_size(),
                       " tensors but ", from.specs_size(), " layouts"));
    }
    for (int i = 0; i < from.infos_size(); ++i) {
      const v1::TensorInfo& info = from.infos(i);
      if (!kept(info.name(), info.tensor_id())) continue;
      v1::TensorInfo updated = info;
      for (int shard = 0; shard < info.shard_ranks_size(); ++shard) {
        // Lost when every holder restarted: its owner and its replicas.
        const std::vector<int> holders = HoldersOf(info, shard);
        const bool gone = std::all_of(
            holders.begin(), holders.end(),
            [&](int holder) { return starting_ranks.count(holder) > 0; });
        if (gone &&
            std::find(info.lost_shards().begin(), info.lost_shards().end(),
                      shard) == info.lost_shards().end()) {
          updated.add_lost_shards(shard);
        }
      }
      if (updated.lost_shards_size() > info.lost_shards_size()) {
        degraded.push_back(info.name());
      }
      if (starting) {
        RETURN_IF_ERROR(
            Rebuild(std::move(updated), from.specs(i), starting_ranks));
      } else {
        absl::MutexLock lock(&mu_);
        auto it = table_.find(info.name());
        if (it != table_.end()) it->second.info = std::move(updated);
      }
    }
    if (!degraded.empty()) {
      spdlog::error(
          "control: tensors [{}] are degraded: ranks [{}] restarted and lost "
          "their shards",
          absl::StrJoin(degraded, ", "), absl::StrJoin(starting_ranks, ", "));
    }
  }
  // A restarted daemon may listen elsewhere now; with a store that outlives
  // the daemons, one starting next to it may have read the address its old
  // process left there.
  if (!starting_ranks.empty()) RETURN_IF_ERROR(rank_->RefreshWorkers());
  ResyncTensorIds();
  if (rank_->rank() == 0 && !starting && earliest < furthest) {
    for (int64_t m = earliest; m < furthest; ++m) {
      store_->Delete(OpKey(m)).IgnoreError();
    }
  }
  return group_->Usable();
}

namespace {

// A rebuilt tensor's ShardedTensor, with `shards` (this daemon's, possibly
// none) under the cluster's tensor id.
absl::StatusOr<ShardedTensor> RebuiltTensor(const std::shared_ptr<Rank>& rank,
                                            const v1::TensorInfo& info,
                                            ShardedTensorMetadata metadata,
                                            const v1::ShardingSpec& spec_proto,
                                            std::vector<Shard> shards) {
  const ShardedTensorOptions options =
      ShardedTensorOptions()
          .WithDType(metadata.tensor_properties.dtype)
          .WithRank(rank)
          .WithTensorId(info.tensor_id());
  if (spec_proto.spec_case() == v1::ShardingSpec::SPEC_NOT_SET) {
    return ShardedTensor::InitFromLocalShardsAndGlobalMetadata(
        std::move(shards), std::move(metadata), options);
  }
  ASSIGN_OR_RETURN(ShardingSpec spec, FromProto(spec_proto));
  return ShardedTensor::InitFromLocalShardsWithSpec(
      std::move(shards), std::move(metadata), std::move(spec), options);
}

}  // namespace

absl::Status Core::Rebuild(v1::TensorInfo info,
                           const v1::ShardingSpec& spec_proto,
                           const std::set<int>& starting) {
  Entry entry;
  const bool mine_lost = std::any_of(
      info.lost_shards().begin(), info.lost_shards().end(), [&](int shard) {
        return shard < info.shard_ranks_size() &&
               info.shard_ranks(shard) == rank_->rank();
      });
  if (!mine_lost) {
    ASSIGN_OR_RETURN(ShardedTensorMetadata metadata,
                     FromProto(info.metadata()));
    // The shards it owns (they survive on replicas: else they would be
    // lost) and its replicas of others', to refill.
    std::vector<LocalShard> own;
    int64_t host_bytes = 0;
    for (int shard = 0; shard < info.shard_ranks_size(); ++shard) {
      if (info.shard_ranks(shard) != rank_->rank()) continue;
      const ShardMetadata& where = metadata.shards_metadata[shard];
      TensorOptions tensor_options =
          TensorOptions().WithDType(metadata.tensor_properties.dtype);
      if (where.placement().has_value()) {
        tensor_options = tensor_options.WithDevice(where.placement()->device());
      }
      ASSIGN_OR_RETURN(Tensor tensor,
                       Tensor::Empty(where.shard_sizes(), tensor_options));
      if (tensor.device().is_cpu()) {
        host_bytes += static_cast<int64_t>(tensor.nbytes());
      }
      own.push_back(LocalShard{shard, std::move(tensor)});
    }
    std::shared_ptr<RegisteredTensor> copies;
    if (info.replicas_size() > 0) {
      int64_t copy_bytes = 0;
      ASSIGN_OR_RETURN(copies, AllocateCopies(info, metadata, &copy_bytes));
      host_bytes += copy_bytes;
      if (copies->local_shards.empty()) copies.reset();
    }
    if (own.empty() && copies == nullptr) {
      // Nothing of it here: it takes part in the tensor's collectives with
      // nothing of its own.
      ASSIGN_OR_RETURN(
          entry.tensor,
          RebuiltTensor(rank_, info, std::move(metadata), spec_proto, {}));
    } else {
      ASSIGN_OR_RETURN(
          entry.held,
          budget_->Reserve(host_bytes, absl::StrCat("refilling \"", info.name(),
                                                    "\" on rank ", rank())));
      entry.refill =
          std::make_shared<Refill>(std::move(own), std::move(copies));
      absl::MutexLock lock(&mu_);
      refilling_[info.tensor_id()] = entry.refill;
      refills_.emplace_back(&Core::RunRefill, this, info, spec_proto, starting,
                            entry.refill);
    }
  }
  std::string name = info.name();
  entry.info = std::move(info);
  absl::MutexLock lock(&mu_);
  table_.insert_or_assign(std::move(name), std::move(entry));
  return absl::OkStatus();
}

void Core::RunRefill(v1::TensorInfo info, v1::ShardingSpec spec,
                     std::set<int> starting, std::shared_ptr<Refill> refill) {
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + options_.op_timeout;
  absl::Status status =
      FetchFromHolders(info, refill->own(), starting, deadline);
  if (status.ok() && refill->copies() != nullptr) {
    status = FetchFromHolders(info, refill->copies()->local_shards, starting,
                              deadline);
  }
  if (status.ok()) {
    status = refill->Complete([&]() -> absl::Status {
      ASSIGN_OR_RETURN(ShardedTensorMetadata metadata,
                       FromProto(info.metadata()));
      std::vector<Shard> shards;
      for (const LocalShard& local : refill->own()) {
        shards.push_back(
            Shard{local.tensor, metadata.shards_metadata[local.index]});
      }
      ASSIGN_OR_RETURN(ShardedTensor tensor,
                       RebuiltTensor(rank_, info, std::move(metadata), spec,
                                     std::move(shards)));
      std::shared_ptr<ReplicaCopies> copies;
      if (refill->copies() != nullptr) {
        ASSIGN_OR_RETURN(copies, ReplicaCopies::Register(
                                     rank_, info.tensor_id(), refill->copies(),
                                     MemoryBudget::Reservation()));
      }
      absl::MutexLock lock(&mu_);
      auto it = table_.find(info.name());
      // Deleted or replaced meanwhile: what was refilled goes.
      if (it == table_.end() || it->second.refill != refill) {
        return absl::OkStatus();
      }
      it->second.tensor = std::move(tensor);
      it->second.replicas = std::move(copies);
      it->second.refill.reset();
      return absl::OkStatus();
    });
  }
  {
    // Done either way: later writes find the registered shards, or (after
    // a failure) are refused as for a shard this daemon does not hold.
    absl::MutexLock lock(&mu_);
    auto it = refilling_.find(info.tensor_id());
    if (it != refilling_.end() && it->second == refill) refilling_.erase(it);
  }
  if (status.ok()) {
    spdlog::info(
        "control: refilled tensor {} ({} shards, {} replicas) in {}",
        info.name(), refill->own().size(),
        refill->copies() == nullptr ? 0 : refill->copies()->local_shards.size(),
        absl::FormatDuration(absl::Now() - start));
    return;
  }
  spdlog::error("control: refilling tensor {} failed: {}", info.name(),
                status.ToString());
  absl::MutexLock lock(&mu_);
  auto it = table_.find(info.name());
  if (it != table_.end() && it->second.refill == refill) {
    it->second.refill_error = status.ToString();
  }
}

v1::TensorInfo Core::InfoWithState(const Entry& entry) const {
  v1::TensorInfo info = entry.info;
  if (entry.refill == nullptr || entry.refill->complete()) return info;
  for (const LocalShard& local : entry.refill->own()) {
    if (local.index < info.replicas_size()) {
      info.mutable_replicas(static_cast<int>(local.index))
          ->add_refilling(rank());
    }
  }
  if (entry.refill->copies() != nullptr) {
    for (const LocalShard& local : entry.refill->copies()->local_shards) {
      info.mutable_replicas(static_cast<int>(local.index))
          ->add_refilling(rank());
    }
  }
  return info;
}

absl::Status Core::RefillingError(const std::string& name,
                                  const Entry& entry) const {
  if (!entry.refill_error.empty()) {
    return absl::UnavailableError(absl::StrCat(
        "tensor ", name, ": rank ", rank(),
        " restarted and could not refill its shards from their replicas (",
        entry.refill_error,
        "); load it from a checkpoint (with replace) or "
        "delete it"));
  }
  return absl::UnavailableError(absl::StrCat(
      "tensor ", name, ": rank ", rank(),
      " restarted and is refilling its shards from their replicas; retry "
      "once it is done"));
}

void Core::Abandon(int64_t n) {
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

std::optional<v1::ControlOp> Core::ParseEntry(absl::string_view entry) {
  v1::ControlOp op;
  if (!absl::ConsumePrefix(&entry, kOpPrefix) ||
      !op.ParseFromArray(entry.data(), static_cast<int>(entry.size()))) {
    return std::nullopt;
  }
  return op;
}

std::shared_ptr<PendingCall> Core::OwnCall(const v1::ControlOp& op) const {
  if (op.coordinator() != rank_->rank() || op.incarnation() != incarnation_) {
    return nullptr;
  }
  absl::MutexLock lock(&mu_);
  auto it = pending_.find(op.request_id());
  return it != pending_.end() ? it->second : nullptr;
}

void Core::FinishOwnCall(const v1::ControlOp& op, const absl::Status& status,
                         OpResult result) {
  if (std::shared_ptr<PendingCall> call = OwnCall(op)) {
    Finish(call, status, std::move(result));
  }
}

std::optional<std::string> Core::AwaitEntry(int64_t n, bool* reform) {
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
    if (NeedsReform() || LeaseExpired()) {
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

// The op boundary: request handling never throws out of here (docs/
// thread_model.md). What an op throws after all (an allocation refused, a
// library's exception) fails it on this daemon with INTERNAL, agreed like
// any other failure where the op still can.
Core::Outcome Core::RunGuarded(const v1::ControlOp& op, int64_t n) {
  try {
    return Run(op);
  } catch (...) {
    const std::string what = WhatWasThrown();
    spdlog::error("control: op {} threw: {}", n, what);
    Outcome outcome;
    outcome.status = absl::InternalError(absl::StrCat(
        OpName(op), " failed on rank ", rank_->rank(), ": ", what));
    return outcome;
  }
}

Core::Outcome Core::Run(const v1::ControlOp& op) {
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
      break;
  }
  return outcome;
}

void Core::Execute(absl::string_view entry, int64_t n) {
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
  Outcome outcome = RunGuarded(op, n);
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

std::string OpTensor(const v1::ControlOp& op) {
  switch (op.request_case()) {
    case v1::ControlOp::kCreateTensor:
      return op.create_tensor().name();
    case v1::ControlOp::kDeleteTensor:
      return op.delete_tensor().name();
    case v1::ControlOp::kReshard:
      return op.reshard().name();
    case v1::ControlOp::kGather:
      return op.gather().name();
    case v1::ControlOp::kSaveCheckpoint:
      return absl::StrJoin(op.save_checkpoint().names(), ",");
    case v1::ControlOp::kLoadCheckpoint:
      return absl::StrJoin(op.load_checkpoint().names(), ",");
    case v1::ControlOp::REQUEST_NOT_SET:
      break;
  }
  return "";
}

}  // namespace tessera::control_internal
