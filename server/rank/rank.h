// Rank: one process's membership of a Tessera world (torch.distributed's
// process group state plus its RPC agent).
//
//   Rank::Init      joins the world: creates the default process group
//                   (rendezvous through the Store) — init_process_group.
//   InitRpc         starts this rank's shard server (gRPC, its own threads),
//                   publishes "name -> rank -> address" in the store and
//                   learns every other worker's — rpc.init_rpc. Remote
//                   shards need it; collectives do not.
//                   The default group is a ReformableGroup: it can be
//                   formed again after a member failed (world_group()).
//   NewGroup        sub-groups (dist.new_group), with global <-> group rank
//                   translation.
//   Shutdown        barrier (optional), drain the shard server, stop;
//                   idempotent.
//
// A process normally holds one Rank and makes it the default
// (SetDefaultRank), which ShardedTensor factories use when no rank is
// given. Several Ranks may live in one process (threads as ranks in tests);
// they share nothing.
//
// Thread-safety: all methods are safe to call concurrently, except that
// collective calls (Init, InitRpc, NewGroup, Shutdown and the collectives of
// its groups) must be issued in the same order on every rank, as in c10d.
// Failure: rendezvous and collectives are bounded by options.timeout
// (DEADLINE_EXCEEDED names what was missing); nothing aborts the process.
#ifndef TESSERA_SERVER_RANK_RANK_H_
#define TESSERA_SERVER_RANK_RANK_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/remote_shard.h"
#include "client/shard_client.h"
#include "common/shard_metadata.h"
#include "server/collective/process_group.h"
#include "server/collective/reformable_group.h"
#include "server/serve/shard_registry.h"
#include "server/store/store.h"
#include "tessera/v1/control.pb.h"

namespace grpc {
class Server;
class Service;
}  // namespace grpc

namespace tessera {

class ShardServer;

struct RankOptions {
  int rank = 0;
  int world_size = 1;
  // Shared by every rank of the world; scoped per group internally.
  std::shared_ptr<Store> store;
  // Backend of the default group: "gloo" (CPU tensors) or "nccl".
  std::string backend = "gloo";
  // Bounds rendezvous and every collective.
  absl::Duration timeout = absl::Seconds(300);
  // Interface Gloo binds ("127.0.0.1" on one host).
  std::string hostname = "127.0.0.1";
  // CUDA device of this rank (NCCL); -1 picks rank % device count.
  int device_index = -1;
};

struct RpcOptions {
  // Worker name; empty means "worker<rank>".
  std::string name;
  // RPC rank and world size; -1 means the process group's.
  int rank = -1;
  int world_size = -1;
  // Where the shard server listens; port 0 picks a free one. The address
  // published for peers uses `advertise_host` (default: the listen host).
  std::string listen_address = "127.0.0.1:0";
  // The data plane's port, on the same host; 0 picks a free one.
  int data_port = 0;
  std::string advertise_host;
  // Default chunk size of fetches served by this rank. A chunk is hashed
  // before it is sent and after it arrives, so chunks must be small enough
  // for hashing to overlap the transfer even for 1 MiB shards: 512 KiB
  // moved 1 MiB shards at ~1.6 GB/s on loopback where 4 MiB managed ~0.7
  // (tests/bench/fetch_bench); larger shards are indifferent.
  int64_t chunk_bytes = int64_t{512} << 10;
  // Serve and fetch shard bytes over the raw-TCP data plane
  // (docs/data_plane.md) rather than gRPC streams. Needs an IPv4 host.
  bool data_plane = true;
  // Let the data plane and the local path take writes into this rank's
  // shards (ShardServerOptions::accept_writes): the daemons do.
  bool accept_writes = false;
  // Serve the local path (server/serve/local_path_server.h): clients on
  // this host map shard memory instead of receiving it over a socket. Turns
  // on host memory sharing for the whole process (SetHostMemorySharing with
  // its default threshold), so that CPU shards allocated from then on can
  // be lent. When its socket cannot be made the rank serves without it.
  bool serve_local_path = true;
  // Users besides this process's own and root whose processes may use the
  // local path.
  std::vector<uid_t> local_users;
  // More services served on the same gRPC server (the daemon's
  // ControlService). Not owned: each must outlive Shutdown().
  std::vector<grpc::Service*> services;
  // Also serve grpc.health.v1 (the default health service, NOT_SERVING
  // until the owner sets it through rpc_server()->GetHealthCheckService())
  // and server reflection. Process-wide gRPC settings: every server the
  // process builds afterwards gets them too.
  bool health_and_reflection = false;
  // What DescribeTensor answers for a name, for the data plane's
  // DescribeDigestRequests (ShardServerOptions::describe); null: none.
  // Must outlive Shutdown(), as the services.
  std::function<absl::StatusOr<v1::TensorInfo>(const std::string& name)>
      describe;
  // The most data-plane connections this rank stripes one large fetch
  // from a peer across (client/lanes.h): 0 the default, 1 one each.
  int data_lanes = 0;
};

struct RankShutdownOptions {
  // First wait for every rank (a collective), so that no peer is still
  // fetching from this one: the SPMD ending. A daemon stopping on its own
  // (SIGTERM) passes false: its peers may never call Shutdown.
  bool barrier = true;
  // Once the shard server refuses new calls (gRPC: UNAVAILABLE; data plane:
  // new connections and requests refused, idle connections closed), how
  // long fetches already running may go on before they are cancelled.
  absl::Duration grace = absl::Seconds(2);
};

struct NewGroupOptions {
  // Empty: the default group's backend.
  std::string backend;
  // Only members call NewGroup (use_local_synchronization=True). Otherwise
  // every rank of the world calls it, in the same order.
  bool local_synchronization = false;
};

class Rank : public WorkerResolver {
 public:
  // Joins the world and creates the default group (collective). The rank
  // and world size are validated; the store is required.
  static absl::StatusOr<std::shared_ptr<Rank>> Init(RankOptions options);
  ~Rank() override;
  Rank(const Rank&) = delete;
  Rank& operator=(const Rank&) = delete;

  int rank() const { return options_.rank; }
  int world_size() const { return options_.world_size; }
  const RankOptions& options() const { return options_; }
  const std::shared_ptr<Store>& store() const { return options_.store; }
  std::shared_ptr<ProcessGroup> default_group() const { return world_; }
  // The same group, with its generations
  // (server/collective/reformable_group.h): the daemon forms it again after a
  // member failed.
  const std::shared_ptr<ReformableGroup>& world_group() const { return world_; }

  // dist.new_group(ranks): a group of the given global ranks. Members get a
  // working group; non-members (when every rank calls) get a handle whose
  // rank() is -1, usable to describe tensors of that group but not for
  // collectives. INVALID_ARGUMENT for empty, duplicate or out-of-range
  // ranks.
  absl::StatusOr<std::shared_ptr<ProcessGroup>> NewGroup(
      std::vector<int> ranks, const NewGroupOptions& options = {});

  // Starts the shard server (gRPC, and the data plane and local path
  // server as options say) and exchanges worker names and addresses with
  // all `world_size` RPC ranks (collective). FAILED_PRECONDITION when
  // already initialised; ALREADY_EXISTS when two workers share a name.
  absl::Status InitRpc(const RpcOptions& options = {});
  bool rpc_initialized() const;
  // This rank's RPC rank (-1 before InitRpc).
  int rpc_rank() const;
  // The address the shard server listens on ("" before InitRpc).
  std::string rpc_address() const;
  // The gRPC server InitRpc started (null before it and after Shutdown);
  // for its health service. Not owned; valid until Shutdown.
  grpc::Server* rpc_server() const;
  // WorkerResolver: a worker name's rank (nullopt when unknown or before
  // InitRpc).
  std::optional<int> RankOf(absl::string_view worker_name) const override;
  // The worker with RPC rank `rpc_rank`; NOT_FOUND when there is none.
  absl::StatusOr<WorkerInfo> Worker(int rpc_rank) const;
  // Reads every worker's record from the store again: a worker that
  // restarted may listen elsewhere. The cached client of each worker whose
  // record changed is dropped. FAILED_PRECONDITION before InitRpc.
  absl::Status RefreshWorkers();
  // A client for that worker's shard server (one channel per worker).
  absl::StatusOr<std::shared_ptr<ShardClient>> ClientFor(int rpc_rank) const;

  // The shards this rank serves.
  ShardRegistry& registry() { return *registry_; }
  const ShardRegistry& registry() const { return *registry_; }

  // The id of the next tensor created on `group`: "<group>/<n>", counted
  // per group, so ranks that create the same tensors in the same order (the
  // SPMD contract) agree on it without exchanging a message.
  std::string NextTensorId(const ProcessGroup& group);

  // dist.barrier() over the world (collective). Also the point where shards
  // of tensors freed before it stop being served (see ShardRegistry's
  // retiring): every peer has passed the code that could fetch them.
  absl::Status Barrier();

  // Barrier with every rank (bounded by the timeout; skipped when
  // !options.barrier), then stops the shard server, letting in-flight
  // fetches finish within options.grace, and the groups. Idempotent.
  // Returns the barrier's error, if any; the rank is shut down either way.
  absl::Status Shutdown(const RankShutdownOptions& options = {});

 private:
  explicit Rank(RankOptions options);
  absl::StatusOr<std::shared_ptr<ProcessGroup>> CreateGroup(
      const std::string& name, const std::vector<int>& ranks,
      const std::string& backend);
  // The options of the group `name` of global `ranks`, for group rank
  // `group_rank`.
  ProcessGroupOptions GroupOptions(const std::string& name,
                                   const std::vector<int>& ranks,
                                   int group_rank) const;
  // Every worker's record, from the store.
  absl::StatusOr<std::vector<WorkerInfo>> ReadWorkers(int rpc_world) const;
  // Stops the shard server (gRPC, data plane, local path), draining it
  // for `grace`.
  void StopServer(absl::Duration grace);

  RankOptions options_;
  std::shared_ptr<ShardRegistry> registry_;
  std::shared_ptr<ReformableGroup> world_;

  mutable absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::shared_ptr<ProcessGroup>> groups_ ABSL_GUARDED_BY(mu_);
  // Groups created per rank list, so repeated new_group calls get fresh names.
  std::map<std::vector<int>, int> group_counts_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int64_t> tensor_counts_ ABSL_GUARDED_BY(mu_);
  // RPC state, set once by InitRpc.
  int rpc_rank_ ABSL_GUARDED_BY(mu_) = -1;
  int data_lanes_ ABSL_GUARDED_BY(mu_) = 0;
  std::string rpc_address_ ABSL_GUARDED_BY(mu_);
  std::vector<WorkerInfo> workers_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int> worker_ranks_ ABSL_GUARDED_BY(mu_);
  mutable std::vector<std::shared_ptr<ShardClient>> clients_
      ABSL_GUARDED_BY(mu_);
  std::unique_ptr<ShardServer> server_ ABSL_GUARDED_BY(mu_);
};

// The process's default rank, used by ShardedTensor factories when no rank
// is given (torch.distributed's global state). Null until set.
std::shared_ptr<Rank> DefaultRank();
void SetDefaultRank(std::shared_ptr<Rank> rank);

}  // namespace tessera

#endif  // TESSERA_SERVER_RANK_RANK_H_
