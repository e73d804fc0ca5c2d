#include "server/daemon/stale_copies.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/nonce.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"
#include "wire/replicas.h"

namespace tessera::control_internal {
namespace {

std::string StaleKey(int rank) { return absl::StrCat("stale/", rank); }

struct Line {
  std::string token;
  std::string tensor_id;
};

// "<token> <tensor id>" lines; anything else is skipped.
std::vector<Line> ParseMarks(absl::string_view value) {
  std::vector<Line> lines;
  for (absl::string_view text :
       absl::StrSplit(value, '\n', absl::SkipEmpty())) {
    const size_t space = text.find(' ');
    if (space == absl::string_view::npos || space == 0 ||
        space + 1 == text.size()) {
      continue;
    }
    lines.push_back(Line{std::string(text.substr(0, space)),
                         std::string(text.substr(space + 1))});
  }
  return lines;
}

// The tensor id a registration id serves: "<id>/replicas" is <id>'s copies.
absl::string_view TensorIdOf(absl::string_view id) {
  absl::string_view base = id;
  absl::ConsumeSuffix(&base, ReplicaTensorId(""));
  return base;
}

}  // namespace

StaleCopies::StaleCopies(std::shared_ptr<Store> store, int rank,
                         StaleCopiesOptions options)
    : store_(std::move(store)), rank_(rank), options_(options) {}

StaleCopies::~StaleCopies() { Stop(); }

void StaleCopies::Start(
    std::function<void(const std::string& tensor_id)> on_stale,
    std::function<bool(absl::string_view tensor_id)> replicated) {
  on_stale_ = std::move(on_stale);
  replicated_ = std::move(replicated);
  // The key exists from here on (a look at an absent key is not told
  // apart from a store that does not answer in time). Marks left for an
  // earlier process of this rank are kept: they cost a refill more, while
  // dropping one a writer made as this process started could keep a copy
  // that missed a write.
  const absl::Status made =
      store_->CompareSet(StaleKey(rank_), "", "").status();
  if (!made.ok()) {
    spdlog::warn("control: cannot make this daemon's stale-marks key: {}",
                 made.ToString());
  }
  {
    absl::MutexLock lock(&mu_);
    if (running_) return;
    running_ = true;
  }
  Look();
  looker_ = std::thread([this] { Loop(); });
}

void StaleCopies::Stop() {
  {
    absl::MutexLock lock(&mu_);
    running_ = false;
    changed_.SignalAll();
  }
  if (looker_.joinable()) looker_.join();
}

void StaleCopies::Loop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      const absl::Time until = absl::Now() + options_.period;
      while (running_ && !look_now_ && absl::Now() < until) {
        changed_.WaitWithDeadline(&mu_, until);
      }
      if (!running_) return;
      look_now_ = false;
    }
    Look();
  }
}

void StaleCopies::Look() {
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> value =
      store_->Get(StaleKey(rank_), absl::ZeroDuration());
  if (!value.ok()) {
    absl::MutexLock lock(&mu_);
    changed_.SignalAll();  // Readers waiting for a look give up on time.
    return;
  }
  std::vector<std::string> start_refill;
  {
    absl::MutexLock lock(&mu_);
    fresh_from_ = std::max(fresh_from_, start);
    for (Line& line : ParseMarks(*value)) {
      State& state = stale_[line.tensor_id];
      state.seen.insert(std::move(line.token));
    }
    for (auto& [tensor_id, state] : stale_) {
      if (state.refilling || absl::Now() < state.retry_at) continue;
      state.refilling = true;
      state.covered.assign(state.seen.begin(), state.seen.end());
      start_refill.push_back(tensor_id);
    }
    changed_.SignalAll();
  }
  for (const std::string& tensor_id : start_refill) {
    spdlog::warn(
        "control: this daemon's copy of tensor id {} missed a write; it is "
        "not served until refilled from another holder",
        tensor_id);
    on_stale_(tensor_id);
  }
}

absl::Status StaleCopies::Clear(const std::vector<std::string>& tokens) {
  const absl::flat_hash_set<std::string> gone(tokens.begin(), tokens.end());
  std::string expected;
  ASSIGN_OR_RETURN(expected,
                   store_->Get(StaleKey(rank_), absl::ZeroDuration()));
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string kept;
    for (const Line& line : ParseMarks(expected)) {
      if (gone.contains(line.token)) continue;
      absl::StrAppend(&kept, line.token, " ", line.tensor_id, "\n");
    }
    ASSIGN_OR_RETURN(std::string now,
                     store_->CompareSet(StaleKey(rank_), expected, kept));
    if (now == kept) return absl::OkStatus();
    expected = std::move(now);
  }
  return absl::AbortedError("the stale marks kept changing");
}

void StaleCopies::Refilled(const std::string& tensor_id, bool ok) {
  std::vector<std::string> covered;
  {
    absl::MutexLock lock(&mu_);
    auto it = stale_.find(tensor_id);
    if (it == stale_.end()) return;
    State& state = it->second;
    state.refilling = false;
    if (!ok) {
      state.retry_at = absl::Now() + options_.fence;
      return;
    }
    covered = std::move(state.covered);
    for (const std::string& token : covered) state.seen.erase(token);
    // Marked again while it refilled: the next look refills it again.
    if (state.seen.empty()) stale_.erase(it);
  }
  if (absl::Status cleared = Clear(covered); !cleared.ok()) {
    // Seen again by the next look: one more refill, nothing lost.
    spdlog::warn("control: cannot clear the stale marks of tensor id {}: {}",
                 tensor_id, cleared.ToString());
  }
}

bool StaleCopies::Stale(absl::string_view tensor_id) const {
  absl::MutexLock lock(&mu_);
  return stale_.contains(tensor_id);
}

absl::Status StaleCopies::CheckServe(absl::string_view id, bool write,
                                     absl::Time deadline) {
  const absl::string_view tensor_id = TensorIdOf(id);
  if (!replicated_ || !replicated_(tensor_id)) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  if (write) {
    if (!stale_.contains(tensor_id)) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank_, "'s copy of tensor id ", tensor_id,
                     " is being refilled: write it over a stream"));
  }
  // A stale copy is refused at once; a fresh look is waited for, and may
  // find it stale.
  const absl::Time until = std::min(deadline, absl::Now() + options_.max_wait);
  while (!stale_.contains(tensor_id) &&
         absl::Now() - fresh_from_ >= options_.fence) {
    if (!running_ || absl::Now() >= until) {
      return absl::UnavailableError(absl::StrFormat(
          "rank %d has not seen its stale marks in the store within %s "
          "(stalled, or the store is unreachable), so it does not serve its "
          "copies of tensor id %s; read another holder",
          rank_, absl::FormatDuration(options_.fence), tensor_id));
    }
    look_now_ = true;
    changed_.SignalAll();
    changed_.WaitWithDeadline(&mu_, until);
  }
  if (stale_.contains(tensor_id)) {
    return absl::UnavailableError(absl::StrCat(
        "rank ", rank_, "'s copy of tensor id ", tensor_id,
        " missed a write and is being refilled; read another holder"));
  }
  return absl::OkStatus();
}

absl::Status StaleCopies::Mark(absl::Span<const int> holders,
                               const std::string& tensor_id,
                               absl::Time deadline) {
  for (const int holder : holders) {
    const std::string line = absl::StrCat(
        absl::Hex(RandomNonce(), absl::kZeroPad16), " ", tensor_id, "\n");
    std::string expected;
    bool marked = false;
    for (int attempt = 0; attempt < 100 && !marked; ++attempt) {
      if (ParseMarks(expected).size() >=
          static_cast<size_t>(options_.max_marks)) {
        return absl::ResourceExhaustedError(
            absl::StrCat("rank ", holder, " has ", options_.max_marks,
                         " copies marked stale and not yet refilled"));
      }
      const std::string desired = absl::StrCat(expected, line);
      ASSIGN_OR_RETURN(std::string now,
                       store_->CompareSet(StaleKey(holder), expected, desired));
      marked = now == desired;
      expected = std::move(now);
    }
    if (!marked) {
      return absl::AbortedError(
          absl::StrCat("the stale marks of rank ", holder, " kept changing"));
    }
  }
  // Until every look that started before the marks has expired.
  const absl::Time fenced = absl::Now() + options_.fence;
  if (fenced > deadline) {
    absl::SleepFor(std::max(deadline - absl::Now(), absl::ZeroDuration()));
    return absl::DeadlineExceededError(absl::StrCat(
        "the copies were marked stale, but the deadline came before the "
        "fence of ",
        absl::FormatDuration(options_.fence), " passed"));
  }
  absl::SleepFor(fenced - absl::Now());
  return absl::OkStatus();
}

}  // namespace tessera::control_internal
