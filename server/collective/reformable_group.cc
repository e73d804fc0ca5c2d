#include "server/collective/reformable_group.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/nonce.h"
#include "common/status_macros.h"
#include "server/metrics/metrics.h"
#include "server/store/prefix_store.h"
#include "spdlog/spdlog.h"

namespace tessera {
namespace {

// Keys under the group's store; see the header.
constexpr char kGenerationKey[] = "generation";
std::string ArrivedKey(int64_t generation, int rank) {
  return absl::StrCat("gen/", generation, "/arrived/", rank);
}
// The process that holds a group rank now: a restarted member replaces its
// old incarnation here, which fences the old one off.
std::string MemberKey(int rank) { return absl::StrCat("member/", rank); }

// How long one look at the store may take before it counts as a failure.
constexpr absl::Duration kStoreLook = absl::Seconds(2);

absl::StatusOr<int64_t> ParseGeneration(absl::string_view value) {
  int64_t generation = 0;
  if (!absl::SimpleAtoi(value, &generation) || generation < 0) {
    return absl::DataLossError(absl::StrCat(
        "the store's group generation is not a number: '", value, "'"));
  }
  return generation;
}

}  // namespace

ReformableGroup::ReformableGroup(const std::string& backend,
                                 const ProcessGroupOptions& options)
    : ProcessGroup(options.rank, options.global_ranks, options.name),
      backend_(backend),
      options_(options),
      incarnation_(absl::StrCat(RandomNonce())) {}

ReformableGroup::~ReformableGroup() { Shutdown(); }

absl::Status ReformableGroup::ShutDownError() const {
  return absl::FailedPreconditionError(
      absl::StrCat("process group ", name(), " is shut down"));
}

absl::StatusOr<std::shared_ptr<ReformableGroup>> ReformableGroup::Create(
    const std::string& backend, const ProcessGroupOptions& options) {
  RETURN_IF_ERROR(CheckProcessGroupBackend(backend));
  if (options.store == nullptr) {
    return absl::InvalidArgumentError("a process group needs a store");
  }
  std::shared_ptr<ReformableGroup> group(new ReformableGroup(backend, options));
  Store& store = *options.store;
  // This process holds the rank from now on; an older one is fenced.
  RETURN_IF_ERROR(store.Set(MemberKey(options.rank), group->incarnation_));
  ASSIGN_OR_RETURN(std::string held, store.CompareSet(kGenerationKey, "", "0"));
  ASSIGN_OR_RETURN(int64_t stored, ParseGeneration(held));
  // A member that arrived in the store's generation before is a restarted
  // one: the others formed that generation with its old process, so it asks
  // for the next. Otherwise it joins the one being formed.
  int64_t current = 0;
  if (stored > 0) {
    ASSIGN_OR_RETURN(bool arrived,
                     store.Check({ArrivedKey(stored, options.rank)}));
    current = arrived ? stored : stored - 1;
  }
  ReformOptions reform;
  reform.deadline = absl::Now() + options.timeout;
  RETURN_IF_ERROR(group->FormFrom(current, reform));
  absl::MutexLock lock(&group->mu_);
  group->device_ = group->current_->device();
  return group;
}

absl::StatusOr<std::shared_ptr<ProcessGroup>> ReformableGroup::Current() const {
  absl::MutexLock lock(&mu_);
  if (shut_down_) {
    return ShutDownError();
  }
  if (current_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "process group ", name(), " is re-forming after generation ",
        generation_, " failed (", broken_.message(), ")"));
  }
  return current_;
}

absl::Status ReformableGroup::Forward(
    const char* collective,
    absl::FunctionRef<absl::Status(ProcessGroup&)> call) {
  ASSIGN_OR_RETURN(std::shared_ptr<ProcessGroup> group, Current());
  const absl::Time started = absl::Now();
  absl::Status status = call(*group);
  CountCollective(group->backend(), collective, status.ok(),
                  absl::Now() - started);
  if (!status.ok()) {
    absl::Status usable = group->Usable();
    if (!usable.ok()) {
      absl::MutexLock lock(&mu_);
      if (current_ == group && broken_.ok()) broken_ = usable;
    }
  }
  return status;
}

absl::Status ReformableGroup::Barrier() {
  return Forward("barrier",
                 [](ProcessGroup& group) { return group.Barrier(); });
}
absl::Status ReformableGroup::Broadcast(const Tensor& tensor, int root) {
  return Forward("broadcast", [&](ProcessGroup& group) {
    return group.Broadcast(tensor, root);
  });
}
absl::Status ReformableGroup::AllGather(const Tensor& input,
                                        absl::Span<const Tensor> outputs) {
  return Forward("all_gather", [&](ProcessGroup& group) {
    return group.AllGather(input, outputs);
  });
}
absl::Status ReformableGroup::Gather(const Tensor& input,
                                     absl::Span<const Tensor> outputs,
                                     int root) {
  return Forward("gather", [&](ProcessGroup& group) {
    return group.Gather(input, outputs, root);
  });
}
absl::Status ReformableGroup::AllGatherAgreed(
    const Tensor& input, absl::Span<const Tensor> outputs) {
  return Forward("all_gather", [&](ProcessGroup& group) {
    return group.AllGatherAgreed(input, outputs);
  });
}
absl::Status ReformableGroup::GatherAgreed(const Tensor& input,
                                           absl::Span<const Tensor> outputs,
                                           int root) {
  return Forward("gather", [&](ProcessGroup& group) {
    return group.GatherAgreed(input, outputs, root);
  });
}
absl::Status ReformableGroup::Scatter(absl::Span<const Tensor> inputs,
                                      const Tensor& output, int root) {
  return Forward("scatter", [&](ProcessGroup& group) {
    return group.Scatter(inputs, output, root);
  });
}
absl::Status ReformableGroup::AllToAll(absl::Span<const Tensor> inputs,
                                       absl::Span<const Tensor> outputs) {
  return Forward("all_to_all", [&](ProcessGroup& group) {
    return group.AllToAll(inputs, outputs);
  });
}

absl::Status ReformableGroup::Usable() const {
  absl::MutexLock lock(&mu_);
  if (shut_down_) {
    return ShutDownError();
  }
  if (current_ == nullptr && broken_.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("process group ", name(), " is re-forming"));
  }
  return broken_;
}

void ReformableGroup::Shutdown() {
  std::shared_ptr<ProcessGroup> current;
  {
    absl::MutexLock lock(&mu_);
    shut_down_ = true;
    current = std::move(current_);
  }
  if (current != nullptr) current->Shutdown();
}

int64_t ReformableGroup::generation() const {
  absl::MutexLock lock(&mu_);
  return generation_;
}

GroupState ReformableGroup::State() const {
  absl::MutexLock lock(&mu_);
  GroupState state;
  state.generation = generation_;
  state.usable =
      shut_down_ ? absl::FailedPreconditionError("shut down") : broken_;
  state.forming = forming_;
  state.missing = missing_;
  state.all_arrived = all_arrived_;
  return state;
}

absl::StatusOr<int64_t> ReformableGroup::WantedGeneration() const {
  absl::StatusOr<std::string> held =
      options_.store->Get(kGenerationKey, kStoreLook);
  if (!held.ok()) {
    return absl::UnavailableError(
        absl::StrCat("cannot read the group's generation from the store: ",
                     held.status().message()));
  }
  return ParseGeneration(*held);
}

bool ReformableGroup::NeedsReform() const {
  if (!Usable().ok()) return true;
  absl::StatusOr<int64_t> wanted = WantedGeneration();
  return wanted.ok() && *wanted > generation();
}

absl::Status ReformableGroup::Reform(const ReformOptions& options) {
  std::shared_ptr<ProcessGroup> old;
  int64_t current;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return ShutDownError();
    old = std::move(current_);
    current = generation_;
    if (broken_.ok()) {
      broken_ = absl::FailedPreconditionError(
          absl::StrCat("another member asked for generation ", current + 1));
    }
  }
  // Closing the old transport's connections makes members still inside a
  // collective of it (a resumed one) fail at once, and fences it off.
  if (old != nullptr) old->Shutdown();
  return FormFrom(current, options);
}

absl::Status ReformableGroup::FormFrom(int64_t current,
                                       const ReformOptions& options) {
  Store& store = *options_.store;
  std::vector<std::string> arrived_keys(global_ranks().size());
  int64_t target = 0;
  absl::Status last_error;
  absl::Time next_census = absl::InfinitePast();
  auto set_forming = [&](int64_t forming, std::vector<int> missing,
                         bool all_arrived = false) {
    absl::MutexLock lock(&mu_);
    forming_ = forming;
    missing_ = std::move(missing);
    all_arrived_ = all_arrived;
  };
  auto stopped = [&]() -> absl::Status {
    {
      absl::MutexLock lock(&mu_);
      if (shut_down_) {
        return ShutDownError();
      }
    }
    if (options.cancelled && options.cancelled()) {
      return absl::CancelledError(
          absl::StrCat("re-forming process group ", name(), " was cancelled"));
    }
    if (absl::Now() >= options.deadline) {
      GroupState state = State();
      return absl::DeadlineExceededError(absl::StrCat(
          "process group ", name(), " could not form generation ",
          std::max(target, current + 1),
          state.missing.empty()
              ? std::string()
              : absl::StrCat(": ranks [", absl::StrJoin(state.missing, ", "),
                             "] did not take part"),
          last_error.ok() ? std::string()
                          : absl::StrCat(" (", last_error.message(), ")")));
    }
    return absl::OkStatus();
  };
  // Store failures are retried: the store may come back before the
  // deadline.
  auto pause = [&](absl::Status error) {
    last_error = std::move(error);
    absl::SleepFor(std::min(
        options.poll_interval,
        std::max(absl::ZeroDuration(), options.deadline - absl::Now())));
  };

  while (true) {
    RETURN_IF_ERROR(stopped());
    // A newer process holds this rank: this one is a zombie.
    absl::StatusOr<std::string> holder =
        store.Get(MemberKey(rank()), kStoreLook);
    if (!holder.ok()) {
      pause(holder.status());
      continue;
    }
    if (*holder != incarnation_) {
      Shutdown();
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", global_ranks()[rank()], " of process group ", name(),
          " was taken over by a newer process; this one is fenced off"));
    }
    if (target == 0) {
      absl::StatusOr<std::string> held = store.CompareSet(
          kGenerationKey, absl::StrCat(current), absl::StrCat(current + 1));
      if (!held.ok()) {
        pause(held.status());
        continue;
      }
      ASSIGN_OR_RETURN(int64_t wanted, ParseGeneration(*held));
      target = std::max(wanted, current + 1);
      set_forming(target, {});
    }
    absl::Status arrived = store.Set(ArrivedKey(target, rank()), incarnation_);
    if (!arrived.ok()) {
      pause(arrived);
      continue;
    }
    for (int r = 0; r < size(); ++r) arrived_keys[r] = ArrivedKey(target, r);

    // Wait for everyone, following the store to a newer generation.
    bool all_here = false;
    while (!all_here) {
      RETURN_IF_ERROR(stopped());
      const absl::Duration wait =
          std::clamp(options.deadline - absl::Now(), absl::ZeroDuration(),
                     options.poll_interval);
      absl::Status waited = store.Wait(arrived_keys, wait);
      if (waited.ok()) {
        all_here = true;
        break;
      }
      if (!absl::IsDeadlineExceeded(waited)) {
        pause(waited);
        continue;
      }
      absl::StatusOr<int64_t> wanted = WantedGeneration();
      if (wanted.ok() && *wanted > target) break;
      if (absl::Now() >= next_census) {
        next_census = absl::Now() + absl::Seconds(1);
        std::vector<int> missing;
        for (int r = 0; r < size(); ++r) {
          absl::StatusOr<bool> here = store.Check({arrived_keys[r]});
          if (here.ok() && !*here) missing.push_back(global_ranks()[r]);
        }
        set_forming(target, std::move(missing));
      }
    }
    if (!all_here) {
      // Someone asked for a newer generation meanwhile: follow.
      current = target;
      target = 0;
      continue;
    }
    set_forming(target, {}, /*all_arrived=*/true);

    ProcessGroupOptions formed_options = options_;
    formed_options.store = std::make_shared<PrefixStore>(
        absl::StrCat("gen/", target), options_.store);
    formed_options.timeout =
        std::min(options_.timeout,
                 std::max(absl::Seconds(1), options.deadline - absl::Now()));
    absl::StatusOr<std::shared_ptr<ProcessGroup>> formed =
        CreateProcessGroup(backend_, formed_options);
    if (formed.ok()) {
      absl::MutexLock lock(&mu_);
      if (shut_down_) {
        (*formed)->Shutdown();
        return ShutDownError();
      }
      current_ = *std::move(formed);
      generation_ = target;
      broken_ = absl::OkStatus();
      forming_ = 0;
      missing_.clear();
      all_arrived_ = false;
      return absl::OkStatus();
    }
    // A member gave up or vanished during the rendezvous: ask for the next
    // generation; the others follow once theirs fails too.
    spdlog::warn("process group {}: forming generation {} failed: {}", name(),
                 target, formed.status().ToString());
    last_error = formed.status();
    set_forming(target, {});
    current = target;
    target = 0;
  }
}

}  // namespace tessera
