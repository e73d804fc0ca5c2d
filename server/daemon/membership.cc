#include "server/daemon/membership.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/log_context.h"
#include "common/proto_convert.h"
#include "common/status_macros.h"
#include "server/daemon/agreement.h"
#include "spdlog/spdlog.h"
#include "tessera/v1/control_internal.pb.h"
#include "wire/replicas.h"

namespace tessera::control_internal {
namespace {

// Store keys, under the "control" prefix.
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

Membership::Membership(std::shared_ptr<Rank> rank,
                       std::shared_ptr<ProcessGroup> group,
                       std::shared_ptr<Store> store,
                       const ControlOptions& options, TensorTable* table,
                       Replication* replication, OpOutcomes* outcomes,
                       InDoubt* in_doubt)
    : rank_(std::move(rank)),
      group_(std::move(group)),
      store_(std::move(store)),
      options_(options),
      table_(table),
      replication_(replication),
      outcomes_(outcomes),
      in_doubt_(in_doubt) {}

Membership::~Membership() {
  Stop();
  Join();
}

void Membership::Start() {
  absl::MutexLock lock(&mu_);
  formed_at_ = absl::Now();
  lease_keeper_ = std::thread([this] { LeaseLoop(); });
}

void Membership::Stop() {
  absl::MutexLock lock(&mu_);
  stopped_ = true;
  stopping_.SignalAll();
}

void Membership::Join() {
  if (lease_keeper_.joinable()) lease_keeper_.join();
}

bool Membership::running() const {
  absl::MutexLock lock(&mu_);
  return !stopped_;
}

bool Membership::Sleep(absl::Duration d) const {
  const absl::Time until = absl::Now() + d;
  absl::MutexLock lock(&mu_);
  while (!stopped_ && absl::Now() < until) {
    stopping_.WaitWithDeadline(&mu_, until);
  }
  return !stopped_;
}

bool Membership::NeedsReform() const {
  if (rank_->world_group()->NeedsReform()) return true;
  absl::MutexLock lock(&mu_);
  return !expired_.empty();
}

absl::Status Membership::Admit(
    const std::function<absl::Status()>& enqueue) const {
  absl::MutexLock lock(&mu_);
  // Only a fenced daemon refuses: it can take part in no generation. While
  // the group re-forms or a daemon is silent, the op is queued and held
  // (HoldReason) within its deadline.
  if (!fenced_.empty()) return absl::UnavailableError(fenced_);
  return enqueue();
}

std::string Membership::HoldReason() const {
  absl::MutexLock lock(&mu_);
  if (!fenced_.empty()) return fenced_;
  if (absl::Status reforming = ReformingLocked(/*even_if_all_here=*/false);
      !reforming.ok()) {
    return std::string(reforming.message());
  }
  // A silent daemon while no generation is being formed: an op would wait
  // for it inside a collective.
  if (reforming_.empty() && !published_expired_.empty()) {
    return absl::StrCat(LeaseText(published_expired_),
                        "; the cluster waits for ranks [",
                        absl::StrJoin(published_expired_, ", "),
                        "] (stalled, dead or unreachable)");
  }
  return "";
}

std::vector<std::string> Membership::devices() const {
  absl::MutexLock lock(&mu_);
  return devices_;
}

std::string Membership::State() const {
  absl::MutexLock lock(&mu_);
  if (!fenced_.empty()) return fenced_;
  if (absl::Status reforming = ReformingLocked(/*even_if_all_here=*/true);
      !reforming.ok()) {
    return absl::StrCat("re-forming: ", reforming.message());
  }
  if (!published_expired_.empty()) {
    // An op may be waiting for the silent daemon inside a collective; new
    // ones are held before the log meanwhile (HoldReason).
    return absl::StrCat("waiting: ", LeaseText(published_expired_),
                        "; the cluster waits for ranks [",
                        absl::StrJoin(published_expired_, ", "), "]");
  }
  return "serving";
}

bool Membership::PeerUp(int r) const {
  absl::MutexLock lock(&mu_);
  return std::find(expired_.begin(), expired_.end(), r) == expired_.end() &&
         std::find(published_expired_.begin(), published_expired_.end(), r) ==
             published_expired_.end();
}

absl::Status Membership::ReformingLocked(bool even_if_all_here) const {
  if (!fenced_.empty()) return absl::UnavailableError(fenced_);
  if (reforming_.empty()) return absl::OkStatus();
  const GroupState state = rank_->world_group()->State();
  // Every daemon is taking part: the op runs once the generation formed.
  // Not before every one arrived (before that, and before the group first
  // counts who is missing, a partitioned daemon may never come: an op
  // logged then would wait for it inside a collective and end in doubt).
  if (state.all_arrived && !even_if_all_here) return absl::OkStatus();
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

void Membership::LeaseLoop() {
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

void Membership::ReadPublishedExpiry(int64_t generation) {
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
  absl::MutexLock lock(&mu_);
  // A generation that formed meanwhile made what was read stale.
  if (rank_->world_group()->generation() != generation) return;
  // Published only: operations already in the log wait for the silent
  // daemon inside their collectives (up to --timeout) and new ones are held
  // before the log (OpLog, HoldReason) until it is back or their deadline
  // comes. A stall shorter than a call's deadline delays it, never fails it.
  published_expired_ = expired;
}

std::string Membership::LeaseText(const std::vector<int>& expired) const {
  return absl::StrCat("the lease of ranks [", absl::StrJoin(expired, ", "),
                      "] expired: silent for ",
                      absl::FormatDuration(options_.lease));
}

std::optional<Membership::Resumed> Membership::Reform(int64_t next) {
  const std::shared_ptr<ReformableGroup>& group = rank_->world_group();
  std::optional<Resumed> resumed;
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
        reason_key, "", absl::StrCat("rank ", rank_->rank(), ": ", reason));
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
    if (!running()) return std::nullopt;
    if (absl::IsFailedPrecondition(formed)) {
      spdlog::error("control: {}", formed.ToString());
      absl::MutexLock lock(&mu_);
      fenced_ = absl::StrCat("fenced: ", formed.message());
      reforming_.clear();
      return std::nullopt;
    }
    if (formed.ok()) {
      absl::StatusOr<Resumed> joined = JoinInStep(/*starting=*/false, next);
      if (joined.ok()) {
        resumed = *joined;
        break;
      }
      formed = joined.status();
    }
    spdlog::warn("control: generation {} did not form: {}", group->generation(),
                 formed.ToString());
    if (!Sleep(options_.poll_interval)) return std::nullopt;
  }
  absl::MutexLock lock(&mu_);
  reforming_.clear();
  expired_.clear();
  published_expired_.clear();  // Published for the older generation.
  formed_at_ = absl::Now();
  spdlog::warn(
      "control: generation {} formed after generation {} failed; running the "
      "log again from entry {}",
      group->generation(), broken, resumed->next);
  return resumed;
}

absl::Status Membership::DecideInDoubt(bool starting) {
  v1::CommitState mine;
  if (!starting) {
    mine.set_last_committed_entry(in_doubt_->last_committed());
    mine.set_in_doubt_entry(in_doubt_->held_entry());
  }
  ASSIGN_OR_RETURN(std::vector<std::string> gathered,
                   AllGatherBytes(*group_, mine.SerializeAsString()));
  const int64_t doubt = in_doubt_->held_entry();
  if (doubt == 0) return absl::OkStatus();
  // Committed when some daemon committed its entry: no later entry can
  // have committed anywhere, as this daemon never ran one. (A starting
  // daemon sends 0: what it committed before it restarted is gone.)
  bool committed_somewhere = false;
  for (size_t r = 0; r < gathered.size(); ++r) {
    v1::CommitState theirs;
    if (!theirs.ParseFromString(gathered[r])) {
      return absl::DataLossError(absl::StrCat(
          "rank ", r, " sent no readable commit state when the group formed"));
    }
    committed_somewhere |= theirs.last_committed_entry() == doubt;
  }
  in_doubt_->Resolve(committed_somewhere);
  return absl::OkStatus();
}

absl::StatusOr<Membership::Resumed> Membership::JoinInStep(bool starting,
                                                           int64_t next) {
  SetLogGeneration(rank_->world_group()->generation());
  // First the op a daemon may be in doubt about, so that the states
  // compared below are the decided ones.
  RETURN_IF_ERROR(DecideInDoubt(starting));
  v1::ResumeState mine;
  mine.set_next_entry(next);
  mine.set_device(options_.device);
  mine.set_starting(starting);
  table_
      ->ForEach([&](const std::string& name, const TableEntry& entry) {
        v1::TensorInfo* info = mine.add_infos();
        *info = entry.info;
        if (entry.versions != nullptr) {
          // Its versions, for a starting daemon to refill, and their pins.
          entry.versions->Describe(info);
          const absl::Time now = absl::Now();
          for (const VersionSet::PinState& pin : entry.versions->Pins()) {
            v1::VersionPin* held = mine.add_pins();
            held->set_tensor(name);
            held->set_id(pin.id);
            held->set_number(pin.number);
            held->set_lease_left_ms(absl::ToInt64Milliseconds(
                std::max(pin.until - now, absl::ZeroDuration())));
            held->set_renewal_ms(absl::ToInt64Milliseconds(pin.renewal));
          }
        }
        // Degraded entries of a daemon that restarted have no tensor; their
        // layout is the metadata's.
        *mine.add_specs() = entry.tensor.has_value()
                                ? ToProto(entry.tensor->sharding_spec())
                                : v1::ShardingSpec();
        return absl::OkStatus();
      })
      .IgnoreError();  // The visitor never fails.
  if (!starting) {
    for (v1::CommittedOp& committed : outcomes_->Export()) {
      *mine.add_committed() = std::move(committed);
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
  // others (they could not agree without it): the log abandons them. A
  // starting daemon skips the whole log before it.
  Resumed resumed;
  resumed.next = furthest;
  resumed.earliest = std::min(earliest, furthest);

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
  }
  dropped = table_->RemoveUnless(
      [&](const std::string& name, const TableEntry& entry) {
        return kept(name, entry.info.tensor_id());
      });
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
        std::vector<v1::VersionPin> pins;
        for (const v1::VersionPin& pin : from.pins()) {
          if (pin.tensor() == info.name()) pins.push_back(pin);
        }
        RETURN_IF_ERROR(replication_->Rebuild(std::move(updated), from.specs(i),
                                              starting_ranks, std::move(pins)));
      } else {
        table_
            ->Update(
                info.name(),
                [&](TableEntry& entry) { entry.info = std::move(updated); })
            .IgnoreError();  // Kept: held by every veteran, this one too.
      }
    }
    if (!degraded.empty()) {
      spdlog::error(
          "control: tensors [{}] are degraded: ranks [{}] restarted and lost "
          "their shards",
          absl::StrJoin(degraded, ", "), absl::StrJoin(starting_ranks, ", "));
    }
  }
  // Every daemon tells retries alike from here (op_outcomes.h). A create
  // or reshard that committed on some daemons only left a tensor dropped
  // above: its record goes too, so that a retry runs it again. Both from
  // every daemon's states, so every daemon keeps the same records.
  absl::flat_hash_set<std::string> unkept_ids;
  for (const v1::ResumeState& state : all) {
    if (state.starting()) continue;
    for (const v1::TensorInfo& info : state.infos()) {
      if (!kept(info.name(), info.tensor_id())) {
        unkept_ids.insert(info.tensor_id());
      }
    }
  }
  outcomes_->Adopt(
      source >= 0 ? all[source].committed() : v1::ResumeState().committed(),
      unkept_ids);
  // A restarted daemon may listen elsewhere now; with a store that outlives
  // the daemons, one starting next to it may have read the address its old
  // process left there.
  if (!starting_ranks.empty()) RETURN_IF_ERROR(rank_->RefreshWorkers());
  ResyncTensorIds(*rank_, *group_);
  RETURN_IF_ERROR(group_->Usable());
  return resumed;
}

}  // namespace tessera::control_internal
