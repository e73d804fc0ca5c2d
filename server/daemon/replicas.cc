// Replicas of shards (TensorInfo.replicas): placing, filling and serving a
// daemon's copies of other daemons' shards. docs/control_log.md
// ("Replicas") describes when they are written and refilled.
#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "client/region_transfer.h"
#include "client/shard_client.h"
#include "common/log_context.h"
#include "common/proto_convert.h"
#include "common/status_macros.h"
#include "server/daemon/control_core.h"
#include "spdlog/spdlog.h"
#include "wire/replicas.h"

namespace tessera::control_internal {

absl::StatusOr<std::shared_ptr<ReplicaCopies>> ReplicaCopies::Register(
    std::shared_ptr<Rank> rank, const std::string& tensor_id,
    std::shared_ptr<RegisteredTensor> copies, MemoryBudget::Reservation held) {
  std::string id = ReplicaTensorId(tensor_id);
  RETURN_IF_ERROR(rank->registry().Register(id, std::move(copies)));
  return std::shared_ptr<ReplicaCopies>(
      new ReplicaCopies(std::move(rank), std::move(id), std::move(held)));
}

// A fetch in flight keeps the copies alive (the registry hands out
// shared_ptrs); new fetches get NOT_FOUND.
ReplicaCopies::~ReplicaCopies() { rank_->registry().Unregister(id_); }

std::vector<std::string> Core::WorkerHosts() const {
  // The host part of each daemon's advertised address: what operators call
  // a host (a node's address). The local path's host id would not do: it
  // names the kernel, which network namespaces and containers on one
  // machine share although their addresses differ.
  std::vector<std::string> hosts;
  for (int r = 0; r < rank_->world_size(); ++r) {
    absl::StatusOr<WorkerInfo> worker = rank_->Worker(r);
    hosts.push_back(worker.ok()
                        ? worker->address.substr(0, worker->address.rfind(':'))
                        : absl::StrCat("rank ", r));  // unknown: a host alone
  }
  return hosts;
}

absl::StatusOr<std::shared_ptr<RegisteredTensor>> Core::AllocateCopies(
    const v1::TensorInfo& info, const ShardedTensorMetadata& metadata,
    int64_t* host_bytes) const {
  auto copies = std::make_shared<RegisteredTensor>();
  copies->metadata = std::make_shared<const ShardedTensorMetadata>(metadata);
  *host_bytes = 0;
  const DType dtype = metadata.tensor_properties.dtype;
  for (int shard = 0; shard < info.replicas_size(); ++shard) {
    const auto& ranks = info.replicas(shard).ranks();
    if (std::find(ranks.begin(), ranks.end(), rank()) == ranks.end()) continue;
    const ShardMetadata& where = metadata.shards_metadata[shard];
    ASSIGN_OR_RETURN(
        Tensor copy,
        Tensor::Empty(where.shard_sizes(), TensorOptions().WithDType(dtype)));
    *host_bytes += static_cast<int64_t>(copy.nbytes());
    copies->local_shards.push_back(LocalShard{shard, std::move(copy)});
  }
  return copies;
}

absl::Status Core::FetchFromHolders(const v1::TensorInfo& info,
                                    const std::vector<LocalShard>& shards,
                                    const std::set<int>& gone,
                                    absl::Time deadline) const {
  // The op's log context, for the lines the fetching threads log.
  const LogContext op = CurrentLogContext();
  return RunInParallel(shards.size(), 16, [&](size_t k) -> absl::Status {
    const LocalShard& local = shards[k];
    const int shard = static_cast<int>(local.index);
    std::vector<std::string> tried;
    for (const int holder : HoldersOf(info, shard)) {
      if (holder == rank() || gone.count(holder) > 0) continue;
      const bool owner = holder == info.shard_ranks(shard);
      const std::string id =
          owner ? info.tensor_id() : ReplicaTensorId(info.tensor_id());
      FetchOptions options;
      options.timeout = std::max(deadline - absl::Now(), absl::ZeroDuration());
      absl::StatusOr<std::shared_ptr<ShardClient>> client =
          rank_->ClientFor(holder);
      absl::Status fetched = client.ok() ? (*client)->FetchShardInto(
                                               id, shard, local.tensor, options)
                                         : client.status();
      if (fetched.ok()) return absl::OkStatus();
      {
        LogContext about = op;
        about.tensor = info.name();
        about.peer = holder;
        const ScopedLogContext context(std::move(about));
        spdlog::warn("shard {} of tensor '{}' from rank {} ({}): {}", shard,
                     absl::CEscape(info.name()), holder,
                     owner ? "its owner" : "a replica", fetched.ToString());
      }
      tried.push_back(absl::StrCat(owner ? "owner" : "replica", " rank ",
                                   holder, ": ", fetched.ToString()));
    }
    return absl::UnavailableError(absl::StrCat(
        "no holder of shard ", shard, " of tensor ", info.name(),
        " could give it (",
        tried.empty() ? "none is left" : absl::StrJoin(tried, "; "), ")"));
  });
}

absl::Status Core::Replicate(const std::string& name, int replicas,
                             const v1::CreateTensorRequest* init,
                             bool* agreed) {
  v1::TensorInfo info;
  {
    absl::MutexLock lock(&mu_);
    info = table_.at(name).info;
  }
  std::shared_ptr<ReplicaCopies> registered;
  absl::Status local = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(ShardedTensorMetadata metadata,
                     FromProto(info.metadata()));
    const std::vector<int> owners(info.shard_ranks().begin(),
                                  info.shard_ranks().end());
    ASSIGN_OR_RETURN(std::vector<std::vector<int>> placed,
                     PlaceReplicas(owners, replicas, WorkerHosts()));
    info.clear_replicas();
    for (const std::vector<int>& ranks : placed) {
      info.add_replicas()->mutable_ranks()->Add(ranks.begin(), ranks.end());
    }
    int64_t host_bytes = 0;
    ASSIGN_OR_RETURN(std::shared_ptr<RegisteredTensor> copies,
                     AllocateCopies(info, metadata, &host_bytes));
    ASSIGN_OR_RETURN(
        MemoryBudget::Reservation held,
        budget_->Reserve(host_bytes, absl::StrCat("replicas of \"", name,
                                                  "\" on rank ", rank())));
    const v1::InitKind kind =
        init != nullptr ? init->init() : v1::INIT_KIND_UNSPECIFIED;
    if (kind == v1::INIT_KIND_ZEROS || kind == v1::INIT_KIND_ONES ||
        kind == v1::INIT_KIND_FULL) {
      const double value = kind == v1::INIT_KIND_ZEROS  ? 0.0
                           : kind == v1::INIT_KIND_ONES ? 1.0
                                                        : init->fill_value();
      for (LocalShard& copy : copies->local_shards) {
        ASSIGN_OR_RETURN(
            Tensor filled,
            Tensor::Full(copy.tensor.sizes(), value,
                         TensorOptions().WithDType(copy.tensor.dtype())));
        copy.tensor = std::move(filled);
      }
    } else if (init == nullptr || kind == v1::INIT_KIND_RAND ||
               kind == v1::INIT_KIND_RANDN) {
      // From the owners, registered by now on every daemon (the op agreed
      // on the tensor before).
      RETURN_IF_ERROR(FetchFromHolders(info, copies->local_shards, {},
                                       absl::Now() + options_.op_timeout));
    }
    ASSIGN_OR_RETURN(registered, ReplicaCopies::Register(
                                     rank_, info.tensor_id(), std::move(copies),
                                     std::move(held)));
    return absl::OkStatus();
  }();
  const absl::Status status = Agree(local, agreed);
  if (status.ok()) {
    absl::MutexLock lock(&mu_);
    Entry& entry = table_.at(name);
    entry.info = std::move(info);
    entry.replicas = std::move(registered);
  }
  return status;
}

}  // namespace tessera::control_internal
