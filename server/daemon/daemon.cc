#include "server/daemon/daemon.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "io/file.h"
#include "io/output_file.h"
#include "io/socket.h"
#include "server/metrics/metrics.h"
#include "server/store/etcd_store.h"
#include "server/store/hash_store.h"
#include "server/store/metered_store.h"
#include "wire/auth.h"
#include "wire/chunk_assembler.h"
#include "wire/request_guard.h"
#include "wire/user_token.h"

namespace tessera::daemon {
namespace {

// Where rank 0 serves the store: only on loopback when the master address
// is loopback (nobody else could dial it), else on every interface.
std::string StoreListenAddress(const DaemonOptions& options) {
  if (!IsLoopbackHost(options.master_addr)) {
    return JoinHostPort("0.0.0.0", options.master_port);
  }
  if (options.master_addr == "localhost") {
    return JoinHostPort("127.0.0.1", options.master_port);
  }
  return JoinHostPort(std::string(absl::StripSuffix(
                          absl::StripPrefix(options.master_addr, "["), "]")),
                      options.master_port);
}

void SetServing(Rank& rank, bool serving) {
  grpc::Server* server = rank.rpc_server();
  if (server == nullptr) return;
  if (grpc::HealthCheckServiceInterface* health =
          server->GetHealthCheckService()) {
    health->SetServingStatus(serving);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(
    const DaemonOptions& options) {
  std::unique_ptr<Daemon> daemon(new Daemon(options));
  if (absl::Status status = daemon->Init(); !status.ok()) {
    daemon->Shutdown(absl::ZeroDuration());
    return status;
  }
  return daemon;
}

absl::Status Daemon::Init() {
  const DaemonOptions& o = options_;
  // Every channel and server of this process (the store's, the ranks',
  // the clients of peers) uses the daemon's TLS configuration.
  SetProcessTls(o.tls);
  // Every server of this process: the store's and the rank's.
  SetServerReflection(o.reflection);
  // Bytes this daemon fetches from others and finds corrupt, in its
  // metrics.
  SetChecksumFailureObserver([] { CountReceivedChecksumFailure(); });
  // Every gRPC call its servers answer, by method and code.
  SetRequestObserver(
      [](absl::string_view method, grpc::StatusCode code, absl::Duration took) {
        CountRpc(method, static_cast<absl::StatusCode>(code), took);
      });
  if (o.tls.enabled()) {
    spdlog::info("TLS on every gRPC surface ({})",
                 o.tls.ca_file.empty() ? "server certificate only"
                                       : "mutual, client certificates "
                                         "required");
  }
  if (o.uses_user_token()) {
    ASSIGN_OR_RETURN(const std::string path, EnsureUserTokenFile());
    ASSIGN_OR_RETURN(std::shared_ptr<TokenTable> tokens,
                     TokenTable::FromFile(path));
    if (tokens->cluster_token().empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          path, " has no token of role cluster for the daemons to present"));
    }
    SetProcessToken(tokens->cluster_token());
    const std::string user = CurrentUserName();
    SetProcessTokenTable(
        std::move(tokens),
        absl::StrCat("these daemons run as ", user, " and accept the token in ",
                     path, ", which clients of ", user, " send by default"));
    spdlog::info(
        "callers must present {}'s token from {} (other users are refused; "
        "--auth-token-file or --tls-ca to choose, --insecure for none)",
        user, path);
  } else if (!o.auth_token_file.empty()) {
    ASSIGN_OR_RETURN(std::shared_ptr<TokenTable> tokens,
                     TokenTable::FromFile(o.auth_token_file));
    // The daemons present the cluster token to each other and the store.
    SetProcessToken(tokens->cluster_token());
    SetProcessTokenTable(std::move(tokens));
    spdlog::info("tokens and roles from {}{}", o.auth_token_file,
                 o.tls.enabled() ? "" : " (sent in the clear: TLS is off)");
  }
  if (o.tls.enabled()) {
    spdlog::info("the data plane runs over TLS with the same certificates");
  }
  if (o.insecure && !o.authenticates()) {
    spdlog::warn(
        "--insecure: listening on {} without authenticating callers: anyone "
        "who reaches this port, every local user included, can read, change "
        "and delete every tensor",
        o.host);
  }
  // Before joining: a bad root must not leave the other ranks waiting.
  ASSIGN_OR_RETURN(CheckpointRoots roots,
                   CheckpointRoots::Open(o.checkpoint_roots));
  if (!roots.empty()) {
    spdlog::info("checkpoints allowed under {}",
                 absl::StrJoin(roots.paths(), ", "));
  }
  std::string budget_source = "--memory-limit";
  const int64_t memory_limit =
      o.memory_limit > 0
          ? o.memory_limit
          : DefaultMemoryLimit(o.local_world_size, &budget_source);
  std::shared_ptr<MemoryBudget> budget =
      MemoryBudget::Create(memory_limit, budget_source);
  spdlog::info("memory budget: {} MiB ({})", memory_limit >> 20, budget_source);
  // Before the rendezvous, so that a taken port fails this daemon alone.
  if (o.metrics_port >= 0) {
    absl::StatusOr<std::unique_ptr<MetricsEndpoint>> metrics =
        MetricsEndpoint::Start(o.metrics_host, o.metrics_port);
    if (!metrics.ok()) return metrics.status();
    metrics_ = *std::move(metrics);
    spdlog::info("metrics on http://{}/metrics", metrics_->address());
  }
  // The store's keys and values count against rank 0's budget: a quarter
  // of it at most, set aside now.
  HashStoreLimits store_limits;
  store_limits.max_total_bytes =
      std::min(store_limits.max_total_bytes, memory_limit / 4);
  store_limits.max_value_bytes =
      std::min(store_limits.max_value_bytes, store_limits.max_total_bytes);
  std::shared_ptr<Store> store;
  if (!o.store_url.empty()) {
    // Every rank alike: the store outlives any of them.
    ASSIGN_OR_RETURN(EtcdStoreOptions etcd, ParseEtcdUrl(o.store_url));
    etcd.connect_timeout = o.store_timeout;
    etcd.tls = o.store_tls;
    spdlog::info("waiting up to {} for the store at {}",
                 DurationText(o.store_timeout), o.store_url);
    ASSIGN_OR_RETURN(store, EtcdStore::Connect(std::move(etcd)));
  } else if (o.world_size == 1) {
    // Nobody to meet: the keys stay in this process.
    store = std::make_shared<HashStore>();
  } else if (o.rank == 0) {
    const std::string listen = StoreListenAddress(o);
    ASSIGN_OR_RETURN(store_reservation_,
                     budget->Reserve(store_limits.max_total_bytes,
                                     "the store's keys and values"));
    absl::StatusOr<std::unique_ptr<StoreServer>> server =
        StoreServer::Start(listen, store_limits);
    if (!server.ok()) {
      return absl::UnavailableError(
          absl::StrCat("cannot serve the store on ", listen,
                       ": port in use or address not local (--master-port)"));
    }
    store_server_ = *std::move(server);
    // Rank 0 reads and writes the served keys without RPCs.
    store = store_server_->service().store();
    spdlog::info("store serving on {}", listen);
  } else {
    spdlog::info("waiting up to {} for the store at {}",
                 DurationText(o.store_timeout), o.store_address());
    absl::StatusOr<std::shared_ptr<GrpcStore>> connected =
        GrpcStore::Connect(o.store_address(), o.store_timeout);
    if (!connected.ok()) {
      return absl::UnavailableError(
          absl::StrCat("store at ", o.store_address(), " unreachable after ",
                       DurationText(o.store_timeout)));
    }
    store = *std::move(connected);
  }

  RankOptions rank_options;
  rank_options.rank = o.rank;
  rank_options.world_size = o.world_size;
  // This daemon's calls on the store, in its metrics.
  rank_options.store = std::make_shared<MeteredStore>(std::move(store));
  rank_options.backend = o.backend;
  rank_options.timeout = o.timeout;
  rank_options.hostname = o.advertise_host;
  if (o.device.is_cuda()) rank_options.device_index = *o.device.index();
  spdlog::debug("joining the world: rank {}/{}, backend {}", o.rank,
                o.world_size, o.backend);
  absl::StatusOr<std::shared_ptr<Rank>> rank = Rank::Init(rank_options);
  if (!rank.ok()) {
    return absl::Status(
        rank.status().code(),
        absl::StrCat("joining the world as rank ", o.rank, "/", o.world_size,
                     ": ", rank.status().message()));
  }
  rank_ = *std::move(rank);

  ControlOptions control_options;
  control_options.op_timeout = o.timeout;
  control_options.lease = o.lease;
  control_options.device = o.device.ToString();
  control_options.checkpoint_roots = std::move(roots);
  control_options.memory_budget = budget;
  control_ = std::make_unique<ControlServiceImpl>(rank_, control_options);

  RpcOptions rpc;
  rpc.listen_address = JoinHostPort(o.host, o.port);
  rpc.data_port = o.data_port;
  rpc.data_lanes = o.data_lanes;
  // Clients' cached opens check their descriptions over the data plane.
  rpc.describe = [control = control_.get()](const std::string& name) {
    return control->Describe(name);
  };
  rpc.advertise_host = o.advertise_host;
  rpc.services = {control_.get()};
  rpc.health_and_reflection = true;
  // Clients write straight into the shards (ShardClient::WriteRegion).
  rpc.accept_writes = true;
  rpc.local_users = o.local_users;
  if (absl::Status status = rank_->InitRpc(rpc); !status.ok()) {
    return absl::Status(
        status.code(), absl::StrCat("starting the server: ", status.message()));
  }
  address_ = rank_->rpc_address();
  ASSIGN_OR_RETURN(WorkerInfo me, rank_->Worker(rank_->rpc_rank()));
  data_address_ = me.data_plane_address;

  if (absl::Status status = control_->Start(); !status.ok()) {
    return absl::Status(
        status.code(),
        absl::StrCat("starting the control service: ", status.message()));
  }
  SetServing(*rank_, true);
  return absl::OkStatus();
}

Daemon::~Daemon() { Shutdown(absl::ZeroDuration()); }

void Daemon::Shutdown(absl::Duration grace) {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  // Load balancers and clients polling health look elsewhere first.
  if (rank_ != nullptr) SetServing(*rank_, false);
  if (control_ != nullptr) control_->Shutdown();
  if (rank_ != nullptr) {
    RankShutdownOptions stop;
    stop.barrier = false;
    stop.grace = grace;
    if (absl::Status status = rank_->Shutdown(stop); !status.ok()) {
      spdlog::warn("stopping the rank: {}", status.ToString());
    }
  }
  if (store_server_ != nullptr) store_server_->Shutdown();
}

absl::Status WriteAddressFile(const std::string& path,
                              const std::string& address) {
  return Annotate(WriteOutputFile(path, absl::StrCat(address, "\n")),
                  absl::StrCat("cannot write address file ", path));
}

}  // namespace tessera::daemon
