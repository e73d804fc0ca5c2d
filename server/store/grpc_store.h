// The Store over gRPC (tessera.v1.StoreService, proto/tessera/v1/store.proto):
// the multi-host default, c10d's TCPStore re-done on gRPC.
//
//   StoreServiceImpl  the service, keys in a HashStore. Rank 0 registers it
//                     on its own grpc::ServerBuilder;
//   StoreServer       a standalone server hosting one StoreServiceImpl;
//   GrpcStore         the client, a Store.
//
// Waiting RPCs (Get, Wait) are parked without holding a gRPC thread: each
// keeps a HashStore watch and an entry in a deadline queue served by one
// timer thread, and is finished by whichever comes first: the keys being
// set (OK), its deadline, min(request timeout, call deadline)
// (DEADLINE_EXCEEDED naming the missing keys), the client cancelling
// (CANCELLED), or StoreServiceImpl::Shutdown() (UNAVAILABLE).
//
// Thread-safety: every class here may be used from any thread.
// Failure: the client maps grpc::Status to absl::Status with the same code
// and message; an unreachable server is UNAVAILABLE; every RPC carries a
// deadline. The service rejects empty keys and negative timeouts with
// INVALID_ARGUMENT and never aborts on a request.
#ifndef TESSERA_SERVER_STORE_GRPC_STORE_H_
#define TESSERA_SERVER_STORE_GRPC_STORE_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "server/store/hash_store.h"
#include "server/store/store.h"
#include "tessera/v1/store.grpc.pb.h"

namespace tessera {
namespace grpc_store_internal {
class ParkingLot;
}  // namespace grpc_store_internal

class StoreServiceImpl final : public v1::StoreService::CallbackService {
 public:
  // Serves the keys of `store`, which the owner may also use directly (a
  // rank 0 that hosts the service reads and writes it without RPCs).
  explicit StoreServiceImpl(
      std::shared_ptr<HashStore> store = std::make_shared<HashStore>());
  // Calls Shutdown(). Destroy the service only after the grpc::Server that
  // hosts it has shut down.
  ~StoreServiceImpl() override;

  StoreServiceImpl(const StoreServiceImpl&) = delete;
  StoreServiceImpl& operator=(const StoreServiceImpl&) = delete;

  // Finishes every parked call with UNAVAILABLE, and later waits at once,
  // so that grpc::Server::Shutdown() does not wait on them. Call it before
  // the server's Shutdown(). Idempotent. Non-waiting RPCs keep working.
  void Shutdown();

  // How many Get/Wait calls are parked now (for tests and monitoring).
  size_t parked_calls() const;
  const std::shared_ptr<HashStore>& store() const { return store_; }

  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext* context,
                                const v1::StoreSetRequest* request,
                                v1::StoreSetResponse* response) override;
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* context,
                                const v1::StoreGetRequest* request,
                                v1::StoreGetResponse* response) override;
  grpc::ServerUnaryReactor* Add(grpc::CallbackServerContext* context,
                                const v1::StoreAddRequest* request,
                                v1::StoreAddResponse* response) override;
  grpc::ServerUnaryReactor* CompareSet(
      grpc::CallbackServerContext* context,
      const v1::StoreCompareSetRequest* request,
      v1::StoreCompareSetResponse* response) override;
  grpc::ServerUnaryReactor* Delete(grpc::CallbackServerContext* context,
                                   const v1::StoreDeleteRequest* request,
                                   v1::StoreDeleteResponse* response) override;
  grpc::ServerUnaryReactor* Wait(grpc::CallbackServerContext* context,
                                 const v1::StoreWaitRequest* request,
                                 v1::StoreWaitResponse* response) override;
  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* context,
                                  const v1::StoreCheckRequest* request,
                                  v1::StoreCheckResponse* response) override;

 private:
  const std::shared_ptr<HashStore> store_;
  // Shared with the parked calls, which may outlive a Shutdown() by the
  // moment it takes their callbacks to return.
  const std::shared_ptr<grpc_store_internal::ParkingLot> lot_;
};

// A gRPC server hosting only a StoreServiceImpl.
class StoreServer {
 public:
  static constexpr absl::Duration kShutdownGrace = absl::Seconds(5);

  // Listens on `listen_address` ("host:port"; port 0 picks a free one).
  // UNAVAILABLE when it cannot listen there.
  static absl::StatusOr<std::unique_ptr<StoreServer>> Start(
      const std::string& listen_address = "127.0.0.1:0",
      HashStoreLimits limits = {});
  ~StoreServer();  // Shutdown()

  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const { return port_; }
  // Where clients connect: the listen host (127.0.0.1 for a wildcard host)
  // and the bound port.
  std::string address() const;
  StoreServiceImpl& service() { return *service_; }

  // Ends parked calls, then stops the server, cancelling calls still
  // running after kShutdownGrace. Idempotent; returns within about
  // kShutdownGrace.
  void Shutdown();

 private:
  StoreServer(std::string host, int port,
              std::unique_ptr<StoreServiceImpl> service,
              std::unique_ptr<grpc::Server> server);

  const std::string host_;
  const int port_;
  const std::unique_ptr<StoreServiceImpl> service_;
  absl::Mutex mu_;
  std::unique_ptr<grpc::Server> server_ ABSL_GUARDED_BY(mu_);
};

// A Store that talks to a StoreService.
class GrpcStore : public Store {
 public:
  // As long as c10d waits for its TCPStore server.
  static constexpr absl::Duration kDefaultConnectTimeout = kDefaultTimeout;
  // Added to a wait's own timeout for the RPC deadline, so that the
  // server's DEADLINE_EXCEEDED (which names the missing keys) wins.
  static constexpr absl::Duration kWaitSlack = absl::Seconds(5);

  // How long a call waits for a lost connection to come back (a store
  // server restarting) before it fails with UNAVAILABLE: an operation that
  // needs an unreachable store fails in seconds, not at its deadline.
  static constexpr absl::Duration kReconnectWait = absl::Seconds(2);

  // Connects to `address`, retrying until `connect_timeout` since ranks may
  // start before the server. UNAVAILABLE when it stays unreachable.
  // Later calls wait up to kReconnectWait (within their deadline) for a
  // lost connection to come back, then fail with UNAVAILABLE naming the
  // store's address.
  static absl::StatusOr<std::shared_ptr<GrpcStore>> Connect(
      const std::string& address,
      absl::Duration connect_timeout = kDefaultConnectTimeout);

  // Deadlines: waits get their timeout plus kWaitSlack, every other call
  // the store's timeout().
  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key,
                                  absl::Duration timeout) override;
  using Store::Get;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;
  absl::StatusOr<std::string> CompareSet(absl::string_view key,
                                         absl::string_view expected,
                                         absl::string_view desired) override;
  absl::StatusOr<bool> Delete(absl::string_view key) override;
  absl::Status Wait(absl::Span<const std::string> keys,
                    absl::Duration timeout) override;
  using Store::Wait;
  absl::StatusOr<bool> Check(absl::Span<const std::string> keys) override;

  const std::string& address() const { return address_; }

 private:
  using Stub = v1::StoreService::StubInterface;

  GrpcStore(std::string address, std::shared_ptr<grpc::Channel> channel,
            std::unique_ptr<Stub> stub)
      : address_(std::move(address)),
        channel_(std::move(channel)),
        stub_(std::move(stub)) {}

  // Calls `method`, waiting for the channel to be ready until `deadline`.
  template <typename Request, typename Response>
  absl::Status Call(grpc::Status (Stub::*method)(grpc::ClientContext*,
                                                 const Request&, Response*),
                    const Request& request, Response* response,
                    absl::Time deadline);
  // Call() for Get and Wait: a client-side timeout is reported like the
  // server's, naming `keys`.
  template <typename Request, typename Response>
  absl::Status CallWait(grpc::Status (Stub::*method)(grpc::ClientContext*,
                                                     const Request&, Response*),
                        const Request& request, Response* response,
                        absl::Span<const std::string> keys,
                        absl::Duration timeout);

  const std::string address_;
  const std::shared_ptr<grpc::Channel> channel_;
  const std::unique_ptr<Stub> stub_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_STORE_GRPC_STORE_H_
