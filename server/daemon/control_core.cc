#include "server/daemon/control_core.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/nonce.h"
#include "common/status_macros.h"
#include "server/daemon/version_set.h"
#include "server/store/prefix_store.h"
#include "wire/request_id.h"
#include "wire/version_id.h"

#ifndef TESSERA_VERSION
#define TESSERA_VERSION "0.1.0"
#endif

namespace tessera::control_internal {
namespace {

// How long GetOperation waits for the outcome of an op the executor is
// running (Core::Operation), and how many calls may wait at once: the
// wait holds one of gRPC's callback threads, so a flood of GetOperation
// calls (40 at once held every thread for 20 s with a 1 s wait each) must
// not starve the daemon's other calls.
constexpr absl::Duration kSettleWait = absl::Milliseconds(100);
constexpr int kMaxSettling = 1;

// The budget of a daemon whose options name none: DefaultMemoryLimit for
// a daemon alone on its host.
std::shared_ptr<MemoryBudget> DefaultBudget() {
  std::string source;
  const int64_t limit = DefaultMemoryLimit(1, &source);
  return MemoryBudget::Create(limit, source);
}

}  // namespace

Core::Core(std::shared_ptr<Rank> rank, ControlOptions options)
    : rank_(std::move(rank)),
      options_(std::move(options)),
      budget_(options_.memory_budget != nullptr ? options_.memory_budget
                                                : DefaultBudget()),
      store_(std::make_shared<PrefixStore>("control", rank_->store())),
      incarnation_(RandomNonce()),
      table_(rank_->rank()),
      outcomes_(&table_),
      replication_(rank_, rank_->default_group(), budget_, options_.op_timeout,
                   &table_),
      membership_(rank_, rank_->default_group(), store_, options_, &table_,
                  &replication_, &outcomes_, &in_doubt_),
      ops_(rank_, rank_->default_group(), options_, budget_, &table_,
           &replication_, &membership_, &watch_),
      log_(rank_, rank_->default_group(), store_, options_, incarnation_,
           &membership_, &ops_, &outcomes_, &in_doubt_),
      stale_(store_, rank_->rank()) {}

Core::~Core() { Shutdown(); }

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
  // Rank 0 reads where the log stands before it joins the exchange, and the
  // others accept calls only after it: every op claimed from now on lies
  // after the agreed start, and every daemon runs all of them. A daemon
  // that restarted into a running cluster learns the position and the
  // table from the others instead (JoinInStep).
  int64_t next = 0;
  if (rank_->rank() == 0) {
    ASSIGN_OR_RETURN(next, log_.Position());
  }
  ASSIGN_OR_RETURN(const Membership::Resumed resumed,
                   membership_.JoinInStep(/*starting=*/true, next));
  {
    absl::MutexLock lock(&mu_);
    if (state_ != State::kNew) {
      return absl::FailedPreconditionError("stopped");
    }
    membership_.Start();
    log_.Start(resumed.next);
    version_leases_.Start();
    state_ = State::kRunning;
  }
  StartStaleCopies();
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
  }
  gauges_.clear();
  // The serve gate stays: the transports drain after this (Daemon::
  // Shutdown's grace), and a stopped StaleCopies still refuses a copy it
  // knew stale, or any copy of a replicated tensor once its last look is
  // older than the fence.
  stale_.Stop();
  log_.Stop();
  membership_.Stop();
  log_.Join();
  membership_.Join();
  version_leases_.Stop();
  replication_.Shutdown();
  log_.FailWaiting();
  absl::MutexLock lock(&mu_);
  state_ = State::kStopped;
}

absl::Status Core::Accepting() const {
  absl::MutexLock lock(&mu_);
  return AcceptingLocked();
}

absl::Status Core::AcceptingLocked() const {
  if (state_ == State::kRunning) return absl::OkStatus();
  return absl::UnavailableError(state_ == State::kNew ? kStarting
                                                      : kShuttingDown);
}

std::shared_ptr<PendingCall> Core::NewCall(std::string method,
                                           std::string request_id,
                                           absl::Time client_deadline,
                                           Completion completion) {
  const absl::Time deadline =
      std::min(client_deadline, absl::Now() + options_.op_timeout);
  return std::make_shared<PendingCall>(next_call_id_.fetch_add(1),
                                       std::move(method), std::move(request_id),
                                       deadline, std::move(completion));
}

void Core::Submit(v1::ControlOp op, const std::shared_ptr<PendingCall>& call) {
  // Refused here while starting or stopping; the log refuses calls itself
  // once stopped (Shutdown stops it after this state changed).
  if (absl::Status accepting = Accepting(); !accepting.ok()) {
    call->Complete(accepting);
    return;
  }
  log_.Submit(std::move(op), call);
}

void Core::Finish(const std::shared_ptr<PendingCall>& call,
                  const absl::Status& status, OpResult result) {
  log_.Finish(call, status, std::move(result));
}

absl::StatusOr<v1::OperationStatus> Core::Operation(
    const std::string& request_id) const {
  RETURN_IF_ERROR(Accepting());
  if (!IsValidRequestId(request_id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("GetOperation: ", QuotedRequestId(request_id),
                     " is not a request id (1 to ", kMaxRequestIdBytes,
                     " of A-Z a-z 0-9 . _ : -)"));
  }
  // The executor may be running the op's entry right now: the daemons
  // answer its caller once they agree, and each records the outcome just
  // after, so another daemon's caller may ask before this one recorded
  // it. Its outcome is moments away: wait for it (a little, one call at a
  // time) rather than answer PENDING, as Pending does after that.
  if (log_.Executing(request_id)) {
    if (settling_.fetch_add(1) < kMaxSettling) {
      const absl::Time settle_by = absl::Now() + kSettleWait;
      while (log_.Executing(request_id) && absl::Now() < settle_by) {
        absl::SleepFor(absl::Milliseconds(1));
      }
    }
    settling_.fetch_sub(1);
  }
  // A commit is final (a retry that committed through another daemon
  // settles a call still waiting here); else a call waiting here; else a
  // failure, which a retry may still turn into a commit.
  std::optional<v1::OperationStatus> found = outcomes_.Find(request_id);
  if (found.has_value() &&
      found->state() == v1::OperationStatus::STATE_COMMITTED) {
    return *std::move(found);
  }
  if (std::optional<v1::OperationStatus> pending = log_.Pending(request_id)) {
    return *std::move(pending);
  }
  if (found.has_value()) return *std::move(found);
  v1::OperationStatus unknown;
  unknown.set_request_id(request_id);
  unknown.set_state(v1::OperationStatus::STATE_UNKNOWN);
  return unknown;
}

absl::StatusOr<v1::TensorInfo> Core::Describe(const std::string& name) const {
  RETURN_IF_ERROR(Accepting());
  return table_.Describe(name);
}

ShardServiceOptions Core::Chunks() const {
  ShardServiceOptions chunks;
  chunks.default_chunk_bytes = options_.default_chunk_bytes;
  chunks.max_chunk_bytes = options_.max_chunk_bytes;
  return chunks;
}

int64_t Core::applied_ops() const { return log_.applied(); }

absl::StatusOr<v1::ClusterInfo> Core::Cluster() const {
  RETURN_IF_ERROR(Accepting());
  const std::vector<std::string> devices = membership_.devices();
  const std::string state = membership_.State();
  v1::ClusterInfo info;
  info.set_generation(rank_->world_group()->generation());
  info.set_state(state);
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

void Core::RegisterGauges() {
  const auto one = [](double value) {
    return std::vector<GaugeSample>{GaugeSample{{}, value}};
  };
  const auto add = [this](const char* name, const char* help,
                          GaugeSource::Reader read) {
    gauges_.push_back(GaugeSource::Register(name, help, std::move(read)));
  };
  add("tessera_rank", "This daemon's rank",
      [this, one] { return one(rank_->rank()); });
  add("tessera_world_size", "Daemons in the cluster",
      [this, one] { return one(rank_->world_size()); });
  add("tessera_tensors", "Named tensors in this daemon's table",
      [this, one] { return one(static_cast<double>(table_.size())); });
  add("tessera_shards", "Shards and replica copies this daemon holds",
      [this, one] {
        return one(static_cast<double>(rank_->registry().Held().shards));
      });
  add("tessera_shard_bytes", "Bytes of the shards this daemon holds", [this] {
    const ShardRegistry::Holdings held = rank_->registry().Held();
    return std::vector<GaugeSample>{
        {{{"device", "cpu"}}, static_cast<double>(held.cpu_bytes)},
        {{{"device", "cuda"}}, static_cast<double>(held.cuda_bytes)}};
  });
  add("tessera_memory_budget_bytes", "This daemon's host-memory budget",
      [this, one] { return one(static_cast<double>(budget_->limit())); });
  add("tessera_memory_budget_used_bytes", "Host memory reserved in the budget",
      [this, one] { return one(static_cast<double>(budget_->used())); });
  add("tessera_memory_kept_for_reuse_bytes",
      "Host memory reserved in the budget only for reuse (freed versions "
      "kept for the next begin; given back when a request would not fit)",
      [this, one] {
        return one(static_cast<double>(budget_->kept_for_reuse()));
      });
  add("tessera_generation",
      "Generation of the default process group this daemon runs", [this, one] {
        return one(static_cast<double>(rank_->world_group()->generation()));
      });
  add("tessera_peer_up",
      "1 while a daemon's liveness lease is current, 0 once it expired",
      [this] {
        std::vector<GaugeSample> peers;
        for (int r = 0; r < rank_->world_size(); ++r) {
          peers.push_back(
              {{{"peer", absl::StrCat(r)}}, membership_.PeerUp(r) ? 1.0 : 0.0});
        }
        return peers;
      });
}

void Core::StartStaleCopies() {
  std::weak_ptr<Core> weak = weak_from_this();
  stale_.Start(
      [weak](const std::string& tensor_id) {
        std::shared_ptr<Core> core = weak.lock();
        if (core == nullptr) return;
        core->replication_.RefillStale(tensor_id, [weak, tensor_id](bool ok) {
          if (std::shared_ptr<Core> core = weak.lock()) {
            core->stale_.Refilled(tensor_id, ok);
          }
        });
      },
      [this](absl::string_view tensor_id) {
        return table_.Replicated(tensor_id);
      });
  rank_->registry().SetServeGate([weak](absl::string_view id, bool write,
                                        absl::Time deadline) -> absl::Status {
    std::shared_ptr<Core> core = weak.lock();
    if (core == nullptr) {
      // The daemon is being torn down; no copy is vouched for any more.
      return absl::UnavailableError(absl::StrCat(
          "this daemon is shutting down: it no longer serves tensor id ", id));
    }
    return core->stale_.CheckServe(id, write, deadline);
  });
}

absl::Status Core::MarkStale(const v1::MarkStaleRequest& request,
                             absl::Time deadline) {
  RETURN_IF_ERROR(Accepting());
  std::vector<int> ranks;
  for (const int r : request.ranks()) {
    if (r < 0 || r >= rank_->world_size() || r == rank_->rank()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "MarkStale: rank ", r, " is not another daemon of the cluster"));
    }
    if (std::find(ranks.begin(), ranks.end(), r) == ranks.end()) {
      ranks.push_back(r);
    }
  }
  if (!table_.Replicated(request.tensor_id())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "MarkStale: tensor id ", request.tensor_id(),
        " is not an unversioned tensor with copies on this daemon's table"));
  }
  return stale_.Mark(ranks, request.tensor_id(),
                     std::min(deadline, absl::Now() + options_.op_timeout));
}

absl::Status Core::RenewLeases(const v1::RenewLeasesRequest& request,
                               v1::RenewLeasesResponse* response) {
  // Each pin is looked for in every versioned tensor.
  constexpr int kMaxVersions = 100000;
  constexpr int kMaxPins = 1024;
  RETURN_IF_ERROR(Accepting());
  if (request.versions_size() > kMaxVersions ||
      request.pins_size() > kMaxPins) {
    return absl::InvalidArgumentError(
        absl::StrCat("RenewLeases: ", request.versions_size(), " versions and ",
                     request.pins_size(), " pins (at most ", kMaxVersions,
                     " and ", kMaxPins, " in one call)"));
  }
  const absl::Time now = absl::Now();
  for (const v1::VersionHandle& handle : request.versions()) {
    std::shared_ptr<VersionSet> versions;
    // A handle of another tensor of that name (deleted and created again)
    // is gone too.
    const bool held =
        table_
            .Update(handle.name(),
                    [&](TableEntry& entry) { versions = entry.versions; })
            .ok() &&
        versions != nullptr &&
        (handle.tensor_id().empty() ||
         handle.tensor_id() ==
             VersionId(versions->tensor_id(), handle.number())) &&
        versions->Renew(handle.number(), now);
    if (!held) *response->add_gone() = handle;
  }
  if (request.pins_size() > 0) {
    const std::vector<std::shared_ptr<VersionSet>> sets = table_.VersionSets();
    for (const std::string& pin : request.pins()) {
      bool held = false;
      for (const std::shared_ptr<VersionSet>& versions : sets) {
        held = versions->RenewPin(pin, now) || held;
      }
      if (!held) response->add_gone_pins(pin);
    }
  }
  return absl::OkStatus();
}

RegionEnv Core::Env() {
  RegionEnv env;
  env.rank = rank_;
  env.max_call_time = options_.op_timeout;
  env.budget = budget_;
  env.resolve = [weak = weak_from_this()](
                    const std::string& name) -> absl::StatusOr<v1::TensorInfo> {
    std::shared_ptr<Core> core = weak.lock();
    if (core == nullptr) return absl::UnavailableError(kShuttingDown);
    return core->Describe(name);
  };
  env.refilling = [weak = weak_from_this()](
                      const std::string& tensor_id) -> std::shared_ptr<Refill> {
    std::shared_ptr<Core> core = weak.lock();
    if (core == nullptr) return nullptr;
    return core->replication_.Refilling(tensor_id);
  };
  env.mark_stale = [weak = weak_from_this()](const std::string& tensor_id,
                                             const std::vector<int>& ranks,
                                             absl::Time deadline) {
    std::shared_ptr<Core> core = weak.lock();
    if (core == nullptr) return absl::UnavailableError(kShuttingDown);
    return core->stale_.Mark(ranks, tensor_id, deadline);
  };
  return env;
}

}  // namespace tessera::control_internal
