// ConnectionServer: the connection bookkeeping shared by the shard
// server's socket transports, the raw-TCP data plane (DataPlaneServer) and the
// same-host path (LocalPathServer).
//
// It owns a listening socket (TCP or Unix, any kind accept(2) takes), one
// accept thread and one thread per connection, which runs the owner's
// handler with that connection. The handler serves requests through
// Connection::ServeRequests, which tells Shutdown idle connections (closed
// at once) from busy ones (given a grace to finish). At most `max_connections`
// are open at once; more are closed as soon as they are accepted. Accepted
// sockets are non-blocking and close-on-exec: handlers do bounded I/O with
// deadlines (io/socket.h, io/unix_socket.h).
//
// Thread-safety: Start/Shutdown from one owner thread; Connection's
// methods from its handler's thread. The handler may run until Shutdown
// returns, so everything it uses must outlive Shutdown (owners call it
// first in their destructor).
//
// Shutdown(grace) (idempotent; also run by the destructor, with no grace):
// stops accepting and closes the listener (new clients are refused at
// once), interrupts idle connections, waits up to `grace` for the busy
// ones to end their request (new requests are refused meanwhile),
// then interrupts every connection left and joins all threads.
#ifndef TESSERA_SERVER_SERVE_CONNECTION_SERVER_H_
#define TESSERA_SERVER_SERVE_CONNECTION_SERVER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "io/socket.h"

namespace tessera {

class ConnectionServer {
 public:
  // One accepted connection, handed to the handler for its lifetime.
  class Connection {
   public:
    int fd() const { return fd_; }
    // Serves the connection's requests one after another. `next` reads a
    // request; an error (the client closed, went idle too long or broke
    // the protocol) ends the loop. Once Shutdown has begun, a request read
    // is given to `refuse` instead and the loop ends. Otherwise `answer`
    // answers it, counted busy meanwhile (Shutdown's grace covers it), and
    // says whether the connection stays open; the loop also ends when
    // Shutdown began during the answer. Returns true when Shutdown ended
    // the loop.
    bool ServeRequests(
        const std::function<absl::StatusOr<std::string>()>& next,
        const std::function<void()>& refuse,
        const std::function<bool(const std::string& request)>& answer);

   private:
    friend class ConnectionServer;
    // Marks the connection busy; false once Shutdown has begun.
    bool BeginRequest();
    // Ends what BeginRequest began; false once Shutdown has begun.
    bool EndRequest();
    Connection(ConnectionServer* server, uint64_t id, int fd)
        : server_(server), id_(id), fd_(fd) {}
    ConnectionServer* const server_;
    const uint64_t id_;
    const int fd_;
  };
  using Handler = std::function<void(Connection&)>;

  // Serves `listener` (already listening) until Shutdown. UNAVAILABLE when
  // the wake-up descriptor cannot be made.
  static absl::StatusOr<std::unique_ptr<ConnectionServer>> Start(
      UniqueFd listener, int max_connections, Handler handler);
  // The same, handing every connection to `server->Serve(connection)`
  // (the data plane's and the local path's protocol loops). `server` must
  // outlive the ConnectionServer's Shutdown.
  template <typename Server>
  static absl::StatusOr<std::unique_ptr<ConnectionServer>> StartServing(
      UniqueFd listener, int max_connections, Server* server) {
    return Start(
        std::move(listener), max_connections,
        [server](Connection& connection) { server->Serve(connection); });
  }
  ~ConnectionServer();
  ConnectionServer(const ConnectionServer&) = delete;
  ConnectionServer& operator=(const ConnectionServer&) = delete;

  void Shutdown(absl::Duration grace = absl::ZeroDuration());

 private:
  ConnectionServer(UniqueFd listener, UniqueFd wake, int max_connections,
                   Handler handler);
  void AcceptLoop();
  void Serve(uint64_t id, int fd);
  void JoinFinished();
  bool Drained() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return busy_.empty();
  }

  UniqueFd listener_;
  // An eventfd that wakes the accept loop for Shutdown.
  const UniqueFd wake_;
  const int max_connections_;
  const Handler handler_;
  std::thread acceptor_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  // Open connections (id -> socket) and their threads; finished threads
  // are joined by the accept loop and Shutdown.
  std::map<uint64_t, UniqueFd> connections_ ABSL_GUARDED_BY(mu_);
  // Connections between BeginRequest and EndRequest.
  std::set<uint64_t> busy_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::thread> threads_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> finished_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_SERVER_SERVE_CONNECTION_SERVER_H_
