// ShardServer: everything one rank serves its shards on, started and
// stopped as one: a gRPC server (the ShardService, plus the caller's
// services: the daemon's ControlService), the data plane (raw TCP,
// data_plane_server.h) and the local path (a Unix socket,
// local_path_server.h), all over one ShardRegistry.
//
// Start fails (UNAVAILABLE, naming the address) when the gRPC port is busy:
// a port is never shared with another server. The data plane is required
// when asked for; the local path is an optimisation, served when its
// socket can be made and silently left out otherwise.
//
// Thread-safety: the accessors may be called from any thread; Shutdown is
// idempotent and safe to call concurrently with fetches in flight (they
// drain for the grace, then are cancelled). Ownership: the server shares
// the registry; services passed in are not owned and must outlive
// Shutdown().
#ifndef TESSERA_SERVER_SERVE_SHARD_SERVER_H_
#define TESSERA_SERVER_SERVE_SHARD_SERVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/server.h"
#include "server/serve/data_plane_server.h"
#include "server/serve/local_path_server.h"
#include "server/serve/shard_registry.h"
#include "server/serve/shard_service.h"

namespace tessera {

struct ShardServerOptions {
  // Where the gRPC server listens; port 0 picks a free one. The data plane
  // listens on the same host, on `data_port` (0: a free one).
  std::string listen_address = "127.0.0.1:0";
  int data_port = 0;
  // The host peers dial (address()); empty: the listen host, or
  // `fallback_host` when that is a wildcard (0.0.0.0, [::]).
  std::string advertise_host;
  std::string fallback_host = "127.0.0.1";
  // Default chunk size of fetches served.
  int64_t chunk_bytes = int64_t{512} << 10;
  bool data_plane = true;
  // The data plane and the local path also take writes into registered
  // shards (DataPlaneServerOptions::accept_writes,
  // LocalPathServerOptions::accept_writes): the daemons' do; a rank of the
  // library, whose remote shards are read-only, does not.
  bool accept_writes = false;
  // Serving the local path turns host memory sharing on for the whole
  // process (SetHostMemorySharing), so that CPU shards can be lent.
  bool serve_local_path = true;
  // Users besides this process's own and root that may use the local path
  // (LocalPathServerOptions::allowed_users).
  std::vector<uid_t> local_users;
  // More services on the gRPC server. Not owned.
  std::vector<grpc::Service*> services;
  // The data plane's answer to DescribeDigestRequests
  // (DataPlaneServerOptions::describe): what DescribeTensor answers. Must
  // outlive Shutdown(), as the services.
  std::function<absl::StatusOr<v1::TensorInfo>(const std::string& name)>
      describe;
  // grpc.health.v1 (NOT_SERVING until the owner says otherwise through
  // grpc_server()->GetHealthCheckService()) and server reflection.
  // Process-wide gRPC settings.
  bool health_and_reflection = false;
};

class ShardServer {
 public:
  static absl::StatusOr<std::unique_ptr<ShardServer>> Start(
      std::shared_ptr<ShardRegistry> registry, ShardServerOptions options);
  ~ShardServer();
  ShardServer(const ShardServer&) = delete;
  ShardServer& operator=(const ShardServer&) = delete;

  // "host:port" of the gRPC server, as peers dial it.
  const std::string& address() const { return address_; }
  // Of the data plane; "" when not served.
  const std::string& data_plane_address() const { return data_plane_address_; }
  // The local path's "<host id>/<socket name>"; "" when not served.
  const std::string& local_address() const { return local_address_; }
  // Null once shut down.
  grpc::Server* grpc_server() const;

  // Every plane refuses new work at once, lets running fetches go on until
  // `grace` has passed, then cancels what is left; returns when all have
  // stopped.
  void Shutdown(absl::Duration grace);

 private:
  ShardServer() = default;

  std::string address_;
  std::string data_plane_address_;
  std::string local_address_;
  std::unique_ptr<ShardServiceImpl> service_;
  mutable absl::Mutex mu_;
  std::unique_ptr<grpc::Server> server_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<DataPlaneServer> data_plane_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<LocalPathServer> local_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_SERVER_SERVE_SHARD_SERVER_H_
