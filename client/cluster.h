// The connections a Client and its views share (internal to client/):
// one Worker per daemon (a channel with its control, health and shard
// stubs), found again when a daemon restarted elsewhere, and what a client
// remembers of the versions it read.
//
// Thread-safety: a Cluster is safe to share between threads (stubs and
// channels are thread-safe; its own state is under its mutexes).
#ifndef TESSERA_CLIENT_CLUSTER_H_
#define TESSERA_CLIENT_CLUSTER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/client.h"
#include "client/lease_keeper.h"
#include "client/passed_over.h"
#include "client/shard_client.h"
#include "common/status_macros.h"
#include "common/tensor/tensor.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/client_context.h"
#include "tessera/v1/control.grpc.pb.h"
#include "wire/call_deadline.h"
#include "wire/fork_guard.h"
#include "wire/grpc_status.h"
#include "wire/request_id.h"

namespace tessera {
namespace internal_client {

// One daemon: a channel shared by its control stub, its health stub and
// its shard client.
struct Worker {
  v1::WorkerAddress address;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::ControlService::Stub> control;
  std::unique_ptr<grpc::health::v1::Health::Stub> health;
  std::shared_ptr<ShardClient> shards;
};

// The connections of a Client and its views, safe to share between threads
// (stubs and channels are thread-safe). A daemon that restarted elsewhere
// (a new port or host) is found again by Reconnect.
class Cluster {
 public:
  static absl::StatusOr<std::shared_ptr<Cluster>> Connect(
      const std::string& address, const ClientOptions& options) {
    RETURN_IF_ERROR(
        CheckNotForkedAfterGrpc(absl::StrCat("connecting to ", address)));
    if (!options.request_id.empty() &&
        (!IsValidRequestId(options.request_id) ||
         options.request_id.size() > kMaxClientRequestIdBytes)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "request id ", QuotedRequestId(options.request_id), ": 1 to ",
          kMaxClientRequestIdBytes, " of A-Z a-z 0-9 . _ : -"));
    }
    if (options.list_page_bytes < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("list_page_bytes ", options.list_page_bytes,
                       ": a page holds at least 1 byte"));
    }
    auto cluster = std::shared_ptr<Cluster>(new Cluster(options));
    const std::shared_ptr<grpc::Channel> channel = NewShardChannel(address);
    const std::unique_ptr<v1::ControlService::Stub> stub =
        v1::ControlService::NewStub(channel);
    grpc::ClientContext context;
    SetCallDeadline(context, absl::Now() + options.timeout);
    RETURN_IF_ERROR(
        Annotate(FromGrpcStatus(stub->GetCluster(
                     &context, v1::GetClusterRequest(), &cluster->info_)),
                 absl::StrCat("connecting to ", address)));
    const v1::ClusterInfo& info = cluster->info_;
    RETURN_IF_ERROR(Check(info, address));
    for (int r = 0; r < info.workers_size(); ++r) {
      // The daemon answering is reached where the caller reached it; the
      // others where they advertise themselves.
      cluster->workers_.push_back(cluster->MakeWorker(
          info.workers(r), r == info.rank()
                               ? channel
                               : NewShardChannel(info.workers(r).address())));
    }
    cluster->coordinator_ = cluster->workers_[info.rank()];
    return cluster;
  }

  const v1::ClusterInfo& info() const { return info_; }
  const ClientOptions& options() const { return options_; }
  // The daemon Connect talked to: control calls go there.
  const Worker& coordinator() const { return *coordinator_; }
  std::vector<std::shared_ptr<const Worker>> workers() const {
    absl::MutexLock lock(&mu_);
    return workers_;
  }
  absl::StatusOr<std::shared_ptr<const Worker>> worker(int rank) const {
    absl::MutexLock lock(&mu_);
    if (rank < 0 || rank >= static_cast<int>(workers_.size())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", rank, " is not in the cluster of ", workers_.size()));
    }
    return workers_[rank];
  }
  // Asks the coordinator where the daemons are now; true when `rank`'s
  // connection is no longer `tried` (it restarted elsewhere, and a new
  // connection is in place, made now or by another caller meanwhile).
  // Every caller asks: a daemon skipped as dead while it serves elsewhere
  // would keep a stale copy.
  bool Reconnect(int rank, const std::shared_ptr<const Worker>& tried) const {
    absl::MutexLock serial(&reconnect_mu_);
    {
      absl::MutexLock lock(&mu_);
      if (rank < 0 || rank >= static_cast<int>(workers_.size())) return false;
      if (workers_[rank] != tried) return true;
    }
    v1::ClusterInfo now;
    // A short deadline: the caller waits for this on its failure path, and
    // the coordinator itself may be the daemon that is gone.
    auto context = std::make_unique<grpc::ClientContext>();
    SetCallDeadline(
        *context, absl::Now() + std::min(options_.timeout, kReconnectTimeout));
    if (!coordinator_->control
             ->GetCluster(context.get(), v1::GetClusterRequest(), &now)
             .ok() ||
        !Check(now, "").ok() || now.world_size() != info_.world_size() ||
        rank < 0 || rank >= now.workers_size()) {
      return false;
    }
    absl::MutexLock lock(&mu_);
    for (int r = 0; r < now.workers_size(); ++r) {
      const v1::WorkerAddress& there = now.workers(r);
      const v1::WorkerAddress& known = workers_[r]->address;
      if (r == info_.rank() ||
          (there.address() == known.address() &&
           there.data_address() == known.data_address() &&
           there.local_address() == known.local_address())) {
        continue;
      }
      workers_[r] = MakeWorker(there, NewShardChannel(there.address()));
    }
    return workers_[rank] != tried;
  }

  // A context whose deadline is the control timeout from now, or `at_most`
  // from now when that is sooner (wire/call_deadline.h).
  std::unique_ptr<grpc::ClientContext> ControlContext(
      absl::Duration at_most = absl::InfiniteDuration()) const {
    auto context = std::make_unique<grpc::ClientContext>();
    SetCallDeadline(*context,
                    absl::Now() + std::min(options_.timeout, at_most));
    SetRequestId(*context, CallId());
    return context;
  }
  // The newest published version of `tensor_id` a read through this
  // client returned (0: none yet): later reads return no older one.
  int64_t SeenVersion(const std::string& tensor_id) const {
    absl::MutexLock lock(&versions_mu_);
    auto it = seen_versions_.find(tensor_id);
    return it == seen_versions_.end() ? 0 : it->second;
  }
  void SawVersion(const std::string& tensor_id, int64_t version) const {
    absl::MutexLock lock(&versions_mu_);
    int64_t& seen = seen_versions_[tensor_id];
    seen = std::max(seen, version);
  }

  // The request id of a new control call: the options', else a new one.
  std::string CallId() const {
    return options_.request_id.empty() ? NewRequestId() : options_.request_id;
  }
  // The request id of the next logged call: a new one, or the options' for
  // the first and "<id>.N" for the N-th (ClientOptions::request_id).
  std::string LoggedCallId() const {
    if (options_.request_id.empty()) return NewRequestId();
    const int64_t n = logged_calls_.fetch_add(1) + 1;
    return n == 1 ? options_.request_id
                  : absl::StrCat(options_.request_id, ".", n);
  }

  // Renews the leases this client holds (open versions, pins) on every
  // daemon while their holders live.
  LeaseKeeper& leases() const { return *leases_; }

  ~Cluster() { leases_->Stop(); }
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

 private:
  explicit Cluster(ClientOptions options)
      : options_(std::move(options)),
        leases_(std::make_shared<LeaseKeeper>([this] { return workers(); },
                                              options_.timeout)) {}

  static absl::Status Check(const v1::ClusterInfo& info,
                            const std::string& address) {
    if (info.world_size() <= 0 || info.workers_size() != info.world_size() ||
        info.rank() < 0 || info.rank() >= info.world_size()) {
      return absl::DataLossError(absl::StrCat(
          "connecting to ", address, ": malformed cluster description (",
          info.workers_size(), " workers, world size ", info.world_size(),
          ", rank ", info.rank(), ")"));
    }
    for (int r = 0; r < info.workers_size(); ++r) {
      if (info.workers(r).rank() != r) {
        return absl::DataLossError(
            absl::StrCat("connecting to ", address, ": worker ", r,
                         " says it is rank ", info.workers(r).rank()));
      }
    }
    return absl::OkStatus();
  }

  std::shared_ptr<const Worker> MakeWorker(
      const v1::WorkerAddress& address,
      std::shared_ptr<grpc::Channel> channel) const {
    auto connection = std::make_shared<Worker>();
    connection->address = address;
    connection->channel = std::move(channel);
    connection->control = v1::ControlService::NewStub(connection->channel);
    connection->health = grpc::health::v1::Health::NewStub(connection->channel);
    connection->shards = std::make_shared<ShardClient>(
        connection->channel,
        options_.data_plane ? address.data_address() : std::string(),
        options_.use_local_path ? address.local_address() : std::string(),
        options_.data_lanes);
    return connection;
  }

  const ClientOptions options_;
  mutable std::atomic<int64_t> logged_calls_{0};
  v1::ClusterInfo info_;  // As Connect found it.
  std::shared_ptr<const Worker> coordinator_;
  static constexpr absl::Duration kReconnectTimeout = absl::Seconds(2);
  mutable absl::Mutex reconnect_mu_;
  mutable absl::Mutex mu_;
  mutable std::vector<std::shared_ptr<const Worker>> workers_
      ABSL_GUARDED_BY(mu_);
  mutable absl::Mutex versions_mu_;
  mutable absl::flat_hash_map<std::string, int64_t> seen_versions_
      ABSL_GUARDED_BY(versions_mu_);
  // Its thread asks workers(): stopped by the destructor, before the
  // members above go.
  const std::shared_ptr<LeaseKeeper> leases_;
};

// Reads the part of shard `shard` of the tensor `info` describes that
// starts at `offsets_in_shard` into `view` (any strides, CPU), from the
// id `id` (the tensor's, or a version's): from its owner, and when the
// owner is dead, stalled or not yet refilled after a restart, from each
// replica in turn (ReplicaTensorId(id)). Each try but the last is given up
// once it moved no byte for ClientOptions::holder_patience
// (StallWatchdog), else it may take the time left before `deadline`; with
// no patience set, each try gets an even share of that time. A
// holder that restarted elsewhere is
// asked again where it is now. `fetch` gives the chunk size, progress,
// cancellation and served_version; its timeout is set here. Errors name
// the holder, prefixed with `what`. With `passed_over` (shared by the
// pieces of one operation), a holder given up on is recorded there, and
// holders recorded there are skipped while another is left to ask.
absl::Status FetchFromHolders(const Cluster& cluster,
                              const v1::TensorInfo& info, const std::string& id,
                              size_t shard,
                              absl::Span<const int64_t> offsets_in_shard,
                              const Tensor& view, FetchOptions fetch,
                              absl::Time deadline, absl::string_view what,
                              PassedOver* passed_over = nullptr);

}  // namespace internal_client
}  // namespace tessera

#endif  // TESSERA_CLIENT_CLUSTER_H_
