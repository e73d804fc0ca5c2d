#include "server/serve/shard_server.h"

#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "wire/credentials.h"
#include "wire/request_guard.h"

namespace tessera {
namespace {

std::string HostOf(absl::string_view address) {
  const size_t colon = address.rfind(':');
  return std::string(
      colon == absl::string_view::npos ? address : address.substr(0, colon));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShardServer>> ShardServer::Start(
    std::shared_ptr<ShardRegistry> registry, ShardServerOptions options) {
  std::unique_ptr<ShardServer> server(new ShardServer());
  ShardServiceOptions service_options;
  service_options.default_chunk_bytes = options.chunk_bytes;
  server->service_ =
      std::make_unique<ShardServiceImpl>(registry, service_options);
  if (options.health_and_reflection) {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  }
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.listen_address,
                           ServerCredentialsFor(ProcessTls()), &port);
  // A busy port must fail here, not be shared with another server (gRPC
  // sets SO_REUSEPORT by default).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  AddRequestGuard(builder);
  ConfigureShardServer(&builder);
  builder.RegisterService(server->service_.get());
  for (grpc::Service* service : options.services) {
    builder.RegisterService(service);
  }
  std::unique_ptr<grpc::Server> grpc_server = builder.BuildAndStart();
  if (grpc_server == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("shard server could not listen on ",
                     options.listen_address, " (port in use?)"));
  }
  // Not serving until the owner says so: its services may need starting.
  if (options.health_and_reflection) {
    grpc_server->GetHealthCheckService()->SetServingStatus(false);
  }
  {
    absl::MutexLock lock(&server->mu_);
    server->server_ = std::move(grpc_server);
  }
  std::string host = options.advertise_host.empty()
                         ? HostOf(options.listen_address)
                         : options.advertise_host;
  if (host == "0.0.0.0" || host == "[::]" || host.empty()) {
    host = options.fallback_host;
  }
  server->address_ = absl::StrCat(host, ":", port);
  if (options.data_plane) {
    DataPlaneServerOptions data_plane_options;
    data_plane_options.chunks = service_options;
    data_plane_options.accept_writes = options.accept_writes;
    data_plane_options.port = options.data_port;
    data_plane_options.describe = options.describe;
    // TLS like the gRPC server's (the process's configuration).
    absl::StatusOr<std::shared_ptr<TlsContext>> tls = ProcessServerTlsContext();
    if (!tls.ok()) {
      server->Shutdown(absl::ZeroDuration());
      return tls.status();
    }
    data_plane_options.tls = *std::move(tls);
    absl::StatusOr<std::unique_ptr<DataPlaneServer>> data_plane =
        DataPlaneServer::Start(HostOf(options.listen_address), registry,
                               data_plane_options);
    if (!data_plane.ok()) {
      server->Shutdown(absl::ZeroDuration());
      return data_plane.status();
    }
    server->data_plane_address_ =
        absl::StrCat(host, ":", (*data_plane)->port());
    absl::MutexLock lock(&server->mu_);
    server->data_plane_ = *std::move(data_plane);
  }
  if (options.serve_local_path) {
    SetHostMemorySharing();
    LocalPathServerOptions local_options;
    local_options.allowed_users = options.local_users;
    local_options.accept_writes = options.accept_writes;
    // An optimisation only: without it, clients on this host use the
    // streams like everyone else.
    absl::StatusOr<std::unique_ptr<LocalPathServer>> local =
        LocalPathServer::Start(registry, local_options);
    if (local.ok()) {
      server->local_address_ = (*local)->address();
      absl::MutexLock lock(&server->mu_);
      server->local_ = *std::move(local);
    }
  }
  return server;
}

ShardServer::~ShardServer() { Shutdown(absl::ZeroDuration()); }

grpc::Server* ShardServer::grpc_server() const {
  absl::MutexLock lock(&mu_);
  return server_.get();
}

void ShardServer::Shutdown(absl::Duration grace) {
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<DataPlaneServer> data_plane;
  std::unique_ptr<LocalPathServer> local;
  {
    absl::MutexLock lock(&mu_);
    server = std::move(server_);
    data_plane = std::move(data_plane_);
    local = std::move(local_);
  }
  // The planes drain at once, each on its own thread.
  const absl::Time deadline = absl::Now() + grace;
  std::thread data_plane_drain;
  if (data_plane != nullptr) {
    data_plane_drain = std::thread(
        [server = data_plane.get(), grace] { server->Shutdown(grace); });
  }
  std::thread local_drain;
  if (local != nullptr) {
    local_drain =
        std::thread([local = local.get(), grace] { local->Shutdown(grace); });
  }
  if (server != nullptr) {
    server->Shutdown(absl::ToChronoTime(deadline));
    server->Wait();
  }
  if (data_plane_drain.joinable()) data_plane_drain.join();
  if (local_drain.joinable()) local_drain.join();
}

}  // namespace tessera
