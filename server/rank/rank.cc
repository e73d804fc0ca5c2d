#include "server/rank/rank.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "server/serve/shard_server.h"
#include "server/store/prefix_store.h"

namespace tessera {
namespace {

// Store keys of the RPC agent: one per worker, holding its record
// "name\naddress\ndata_plane_address\nlocal_address" (records of three fields,
// without the local address, are accepted too).
std::string WorkerKey(int rpc_rank) {
  return absl::StrCat("rpc/worker/", rpc_rank);
}
std::string WorkerNameKey(absl::string_view name) {
  return absl::StrCat("rpc/name/", name);
}

// The handle a non-member holds for a group (c10d's NON_GROUP_MEMBER): it
// knows the members, so placements on the group can be resolved, but it
// takes part in no collective.
class NonMemberGroup final : public ProcessGroup {
 public:
  NonMemberGroup(std::vector<int> global_ranks, std::string name,
                 std::string backend)
      : ProcessGroup(-1, std::move(global_ranks), std::move(name)),
        backend_(std::move(backend)) {}

  absl::string_view backend() const override { return backend_; }
  Device::Type device_type() const override {
    return backend_ == "nccl" ? Device::Type::kCuda : Device::Type::kCpu;
  }
  absl::Status Barrier() override { return NotMember(); }
  absl::Status Broadcast(const Tensor&, int) override { return NotMember(); }
  absl::Status AllGather(const Tensor&, absl::Span<const Tensor>) override {
    return NotMember();
  }
  absl::Status Gather(const Tensor&, absl::Span<const Tensor>, int) override {
    return NotMember();
  }
  absl::Status Scatter(absl::Span<const Tensor>, const Tensor&, int) override {
    return NotMember();
  }
  absl::Status AllToAll(absl::Span<const Tensor>,
                        absl::Span<const Tensor>) override {
    return NotMember();
  }
  void Shutdown() override {}

 private:
  absl::Status NotMember() const {
    return absl::FailedPreconditionError(
        absl::StrCat("this rank is not a member of process group ", name(),
                     " (ranks [", absl::StrJoin(global_ranks(), ", "), "])"));
  }
  std::string backend_;
};

absl::Status ValidateRankOptions(const RankOptions& options) {
  if (options.store == nullptr) {
    return absl::InvalidArgumentError("Rank::Init needs a store");
  }
  if (options.world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size must be >= 1, got ", options.world_size));
  }
  if (options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", options.rank, " is outside [0, ", options.world_size, ")"));
  }
  return absl::OkStatus();
}

// "host:port" -> host; the host of a bracketed IPv6 address keeps brackets.
}  // namespace

absl::StatusOr<std::shared_ptr<Rank>> Rank::Init(RankOptions options) {
  RETURN_IF_ERROR(ValidateRankOptions(options));
  if (options.device_index < 0) {
    int devices = CudaDeviceCount();
    options.device_index = devices > 0 ? options.rank % devices : 0;
  }
  std::shared_ptr<Rank> rank(new Rank(std::move(options)));
  std::vector<int> world(rank->options_.world_size);
  for (int r = 0; r < rank->options_.world_size; ++r) world[r] = r;
  // The default group outlives transport failures (generations).
  ProcessGroupOptions pg = rank->GroupOptions("0", world, rank->options_.rank);
  ASSIGN_OR_RETURN(rank->world_,
                   ReformableGroup::Create(rank->options_.backend, pg));
  return rank;
}

Rank::Rank(RankOptions options)
    : options_(std::move(options)),
      registry_(std::make_shared<ShardRegistry>()) {}

Rank::~Rank() {
  StopServer(RankShutdownOptions().grace);
  if (world_ != nullptr) world_->Shutdown();
  absl::MutexLock lock(&mu_);
  for (auto& group : groups_) group->Shutdown();
}

absl::StatusOr<std::shared_ptr<ProcessGroup>> Rank::CreateGroup(
    const std::string& name, const std::vector<int>& ranks,
    const std::string& backend) {
  auto member = std::find(ranks.begin(), ranks.end(), options_.rank);
  if (member == ranks.end()) {
    return std::make_shared<NonMemberGroup>(ranks, name, backend);
  }
  return CreateProcessGroup(
      backend,
      GroupOptions(name, ranks, static_cast<int>(member - ranks.begin())));
}

ProcessGroupOptions Rank::GroupOptions(const std::string& name,
                                       const std::vector<int>& ranks,
                                       int group_rank) const {
  ProcessGroupOptions pg;
  pg.store =
      std::make_shared<PrefixStore>(absl::StrCat("pg/", name), options_.store);
  pg.rank = group_rank;
  pg.global_ranks = ranks;
  pg.name = name;
  pg.timeout = options_.timeout;
  pg.hostname = options_.hostname;
  pg.device_index = options_.device_index;
  return pg;
}

absl::StatusOr<std::shared_ptr<ProcessGroup>> Rank::NewGroup(
    std::vector<int> ranks, const NewGroupOptions& options) {
  if (ranks.empty()) {
    return absl::InvalidArgumentError("new_group needs at least one rank");
  }
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("new_group ranks must be distinct: [",
                     absl::StrJoin(ranks, ", "), "]"));
  }
  if (sorted.front() < 0 || sorted.back() >= world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("new_group ranks must be in [0, ", world_size(), "): [",
                     absl::StrJoin(ranks, ", "), "]"));
  }
  // Named after its members and how often that member set was grouped, so
  // ranks agree on the name whether or not non-members take part.
  std::string name;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return absl::FailedPreconditionError("rank is shut down");
    int count = group_counts_[sorted]++;
    name = absl::StrCat("g", absl::StrJoin(sorted, "_"), ".", count);
  }
  ASSIGN_OR_RETURN(std::shared_ptr<ProcessGroup> group,
                   CreateGroup(name, sorted,
                               options.backend.empty() ? options_.backend
                                                       : options.backend));
  absl::MutexLock lock(&mu_);
  groups_.push_back(group);
  return group;
}

absl::Status Rank::InitRpc(const RpcOptions& options) {
  int rpc_rank = options.rank < 0 ? options_.rank : options.rank;
  int rpc_world =
      options.world_size < 0 ? options_.world_size : options.world_size;
  if (rpc_rank >= rpc_world) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RPC rank ", rpc_rank, " is outside [0, ", rpc_world, ")"));
  }
  std::string name =
      options.name.empty() ? absl::StrCat("worker", rpc_rank) : options.name;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return absl::FailedPreconditionError("rank is shut down");
    if (rpc_rank_ >= 0) {
      return absl::FailedPreconditionError("RPC is already initialized");
    }
  }

  ShardServerOptions server_options;
  server_options.listen_address = options.listen_address;
  server_options.data_port = options.data_port;
  server_options.advertise_host = options.advertise_host;
  server_options.fallback_host = options_.hostname;
  server_options.chunk_bytes = options.chunk_bytes;
  server_options.data_plane = options.data_plane;
  server_options.accept_writes = options.accept_writes;
  server_options.serve_local_path = options.serve_local_path;
  server_options.services = options.services;
  server_options.health_and_reflection = options.health_and_reflection;
  server_options.local_users = options.local_users;
  server_options.describe = options.describe;
  ASSIGN_OR_RETURN(std::unique_ptr<ShardServer> server,
                   ShardServer::Start(registry_, std::move(server_options)));
  const std::string address = server->address();
  const std::string data_plane_address = server->data_plane_address();
  const std::string local_address = server->local_address();
  {
    absl::MutexLock lock(&mu_);
    server_ = std::move(server);
    data_lanes_ = options.data_lanes;
  }

  // Claim the name first: two workers with one name would make placements
  // ambiguous.
  ASSIGN_OR_RETURN(std::string owner,
                   options_.store->CompareSet(WorkerNameKey(name), "",
                                              absl::StrCat(rpc_rank)));
  if (owner != absl::StrCat(rpc_rank)) {
    StopServer(absl::ZeroDuration());
    return absl::AlreadyExistsError(
        absl::StrCat("worker name ", name, " is taken by RPC rank ", owner));
  }
  RETURN_IF_ERROR(options_.store->Set(
      WorkerKey(rpc_rank),
      absl::StrCat(name, "\n", address, "\n", data_plane_address, "\n",
                   local_address)));

  ASSIGN_OR_RETURN(std::vector<WorkerInfo> workers, ReadWorkers(rpc_world));
  absl::MutexLock lock(&mu_);
  rpc_rank_ = rpc_rank;
  rpc_address_ = address;
  workers_ = std::move(workers);
  clients_.assign(workers_.size(), nullptr);
  for (const WorkerInfo& worker : workers_)
    worker_ranks_[worker.name] = worker.id;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<WorkerInfo>> Rank::ReadWorkers(int rpc_world) const {
  std::vector<WorkerInfo> workers(rpc_world);
  for (int r = 0; r < rpc_world; ++r) {
    ASSIGN_OR_RETURN(std::string value,
                     options_.store->Get(WorkerKey(r), options_.timeout));
    std::vector<std::string> parts = absl::StrSplit(value, '\n');
    if (parts.size() != 3 && parts.size() != 4) {
      return absl::DataLossError(absl::StrCat(
          "malformed worker record for RPC rank ", r, ": ", value));
    }
    workers[r] = WorkerInfo{parts[0], r, parts[1], parts[2],
                            parts.size() == 4 ? parts[3] : std::string()};
  }
  return workers;
}

absl::Status Rank::RefreshWorkers() {
  int rpc_world;
  {
    absl::MutexLock lock(&mu_);
    if (rpc_rank_ < 0) {
      return absl::FailedPreconditionError("RPC is not initialized");
    }
    rpc_world = static_cast<int>(workers_.size());
  }
  ASSIGN_OR_RETURN(std::vector<WorkerInfo> workers, ReadWorkers(rpc_world));
  absl::MutexLock lock(&mu_);
  for (int r = 0; r < rpc_world; ++r) {
    const WorkerInfo& was = workers_[r];
    const WorkerInfo& now = workers[r];
    if (was.address == now.address &&
        was.data_plane_address == now.data_plane_address &&
        was.local_address == now.local_address && was.name == now.name) {
      continue;
    }
    worker_ranks_.erase(was.name);
    worker_ranks_[now.name] = r;
    workers_[r] = now;
    clients_[r] = nullptr;
  }
  return absl::OkStatus();
}

bool Rank::rpc_initialized() const {
  absl::MutexLock lock(&mu_);
  return rpc_rank_ >= 0;
}

int Rank::rpc_rank() const {
  absl::MutexLock lock(&mu_);
  return rpc_rank_;
}

std::string Rank::rpc_address() const {
  absl::MutexLock lock(&mu_);
  return rpc_address_;
}

grpc::Server* Rank::rpc_server() const {
  absl::MutexLock lock(&mu_);
  return server_ == nullptr ? nullptr : server_->grpc_server();
}

std::optional<int> Rank::RankOf(absl::string_view worker_name) const {
  absl::MutexLock lock(&mu_);
  auto it = worker_ranks_.find(worker_name);
  if (it == worker_ranks_.end()) return std::nullopt;
  return it->second;
}

absl::StatusOr<WorkerInfo> Rank::Worker(int rpc_rank) const {
  absl::MutexLock lock(&mu_);
  if (rpc_rank < 0 || rpc_rank >= static_cast<int>(workers_.size())) {
    return absl::NotFoundError(
        absl::StrCat("no worker with RPC rank ", rpc_rank));
  }
  return workers_[rpc_rank];
}

absl::StatusOr<std::shared_ptr<ShardClient>> Rank::ClientFor(
    int rpc_rank) const {
  absl::MutexLock lock(&mu_);
  if (rpc_rank < 0 || rpc_rank >= static_cast<int>(workers_.size())) {
    return absl::NotFoundError(
        absl::StrCat("no worker with RPC rank ", rpc_rank));
  }
  // Channels are created on first use and shared by every tensor's remote
  // shards, so a rank holds at most one channel per peer.
  if (clients_[rpc_rank] == nullptr) {
    clients_[rpc_rank] = ShardClient::Create(
        workers_[rpc_rank].address, workers_[rpc_rank].data_plane_address,
        workers_[rpc_rank].local_address, data_lanes_);
  }
  return clients_[rpc_rank];
}

std::string Rank::NextTensorId(const ProcessGroup& group) {
  absl::MutexLock lock(&mu_);
  return absl::StrCat(group.name(), "/", tensor_counts_[group.name()]++);
}

void Rank::StopServer(absl::Duration grace) {
  std::unique_ptr<ShardServer> server;
  {
    absl::MutexLock lock(&mu_);
    server = std::move(server_);
  }
  if (server != nullptr) server->Shutdown(grace);
}

absl::Status Rank::Barrier() {
  uint64_t mark = registry_->RetirementMark();
  RETURN_IF_ERROR(world_->Barrier());
  registry_->ReleaseRetired(mark);
  return absl::OkStatus();
}

absl::Status Rank::Shutdown(const RankShutdownOptions& options) {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return absl::OkStatus();
    shut_down_ = true;
  }
  // Nobody stops serving while a peer may still fetch from it.
  absl::Status barrier = options.barrier ? Barrier() : absl::OkStatus();
  StopServer(options.grace);
  world_->Shutdown();
  absl::MutexLock lock(&mu_);
  for (auto& group : groups_) group->Shutdown();
  return barrier;
}

namespace {
absl::Mutex default_rank_mu(absl::kConstInit);
std::shared_ptr<Rank>* default_rank ABSL_GUARDED_BY(default_rank_mu) = nullptr;
}  // namespace

std::shared_ptr<Rank> DefaultRank() {
  absl::MutexLock lock(&default_rank_mu);
  return default_rank == nullptr ? nullptr : *default_rank;
}

void SetDefaultRank(std::shared_ptr<Rank> rank) {
  absl::MutexLock lock(&default_rank_mu);
  if (default_rank == nullptr) default_rank = new std::shared_ptr<Rank>();
  *default_rank = std::move(rank);
}

}  // namespace tessera
