#include "server/daemon/control_core.h"

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/proto_convert.h"
#include "common/status_macros.h"
#include "server/daemon/region_io.h"
#include "server/sharded/sharded_tensor.h"
#include "tessera/v1/control_internal.pb.h"

#ifndef TESSERA_VERSION
#define TESSERA_VERSION "0.1.0"
#endif

namespace tessera::control_internal {

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

absl::StatusOr<ShardedTensor> Core::Lookup(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  auto it = table_.find(name);
  if (it == table_.end()) return UnknownTensor(name);
  if (it->second.info.lost_shards_size() > 0) {
    return DegradedError(it->second.info);
  }
  if (!it->second.tensor.has_value()) {
    return RefillingError(name, it->second);
  }
  return *it->second.tensor;
}

bool Core::Holds(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  return table_.count(name) > 0;
}

absl::Status DegradedError(const v1::TensorInfo& info) {
  std::vector<std::string> lost;
  std::set<int> owners;
  for (int shard : info.lost_shards()) {
    lost.push_back(absl::StrCat(shard));
    if (shard >= 0 && shard < info.shard_ranks_size()) {
      owners.insert(info.shard_ranks(shard));
    }
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "tensor ", info.name(), " is degraded: shards [",
      absl::StrJoin(lost, ", "), "] were lost when rank",
      owners.size() == 1 ? " " : "s ", absl::StrJoin(owners, ", "),
      " restarted; delete it, or load it from a checkpoint with replace"));
}

absl::StatusOr<v1::TensorInfo> Core::Describe(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(AcceptingLocked());
  auto it = table_.find(name);
  if (it == table_.end()) return UnknownTensor(name);
  return InfoWithState(it->second);
}

v1::ListTensorsResponse Core::List() const {
  v1::ListTensorsResponse response;
  absl::MutexLock lock(&mu_);
  for (const auto& [name, entry] : table_) {
    *response.add_tensors() = InfoWithState(entry);
  }
  return response;
}

absl::StatusOr<v1::ClusterInfo> Core::Cluster() const {
  std::vector<std::string> devices;
  std::string state = "serving";
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(AcceptingLocked());
    devices = devices_;
    if (!fenced_.empty()) {
      state = fenced_;
    } else if (absl::Status reforming =
                   ReformingLocked(/*even_if_all_here=*/true);
               !reforming.ok()) {
      state = absl::StrCat("re-forming: ", reforming.message());
    } else if (!published_expired_.empty()) {
      // An op may be waiting for the silent daemon inside a collective;
      // operations are refused meanwhile (Submit).
      state = absl::StrCat("waiting: ", LeaseText(published_expired_),
                           "; the cluster waits for ranks [",
                           absl::StrJoin(published_expired_, ", "), "]");
    }
  }
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
  add("tessera_tensors", "Named tensors in this daemon's table", [this, one] {
    absl::MutexLock lock(&mu_);
    return one(static_cast<double>(table_.size()));
  });
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
  add("tessera_generation",
      "Generation of the default process group this daemon runs", [this, one] {
        return one(static_cast<double>(rank_->world_group()->generation()));
      });
  add("tessera_peer_up",
      "1 while a daemon's liveness lease is current, 0 once it expired",
      [this] {
        std::vector<GaugeSample> peers;
        absl::MutexLock lock(&mu_);
        for (int r = 0; r < rank_->world_size(); ++r) {
          const bool expired = absl::c_linear_search(expired_, r) ||
                               absl::c_linear_search(published_expired_, r);
          peers.push_back({{{"peer", absl::StrCat(r)}}, expired ? 0.0 : 1.0});
        }
        return peers;
      });
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
    absl::MutexLock lock(&core->mu_);
    auto it = core->refilling_.find(tensor_id);
    return it == core->refilling_.end() ? nullptr : it->second;
  };
  return env;
}

}  // namespace tessera::control_internal
