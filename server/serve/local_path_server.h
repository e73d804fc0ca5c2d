// LocalPathServer: the local path of a shard server
// (docs/data_plane.md, "The local path"; protocol in
// proto/tessera/v1/local.proto).
//
// A client on this host asks for a shard (or a region of one) with the
// same FetchShardRequest as over gRPC or the data plane, validated the same
// way (PrepareFetchView), and gets, instead of the bytes, the means to read
// them where they lie:
//   - a CPU shard in shareable host memory (Storage::shared_memory_fd, see
//     SetHostMemorySharing): a read-only descriptor of its memory file;
//   - a CUDA shard: a CUDA IPC handle of its allocation, offered only to a
//     client of the same user that says it can open one;
// plus the view's layout in that allocation. Anything else (heap, pinned
// or small host memory, meta shards, a failed CUDA export) is answered
// FAILED_PRECONDITION with transport NONE: the client fetches it over a
// stream instead. Unknown tensors, bad regions and malformed requests get
// the errors a stream would give.
//
// Lease: from the reply until the client's one-byte "done", the closing of
// its connection, or `lease_timeout`, the connection holds the shard's
// registration, so the memory the client maps cannot be freed (nor
// recycled) under it even if the tensor is unregistered meanwhile. A lease
// that ends any other way than by "done" marks the memory not reusable
// (Storage::MarkNotReusable): the client may still hold it, so no later
// version of a tensor is ever written into it.
//
// One thread accepts; each connection gets a thread serving its requests
// one after another (clients pool connections, one per concurrent fetch),
// at most `max_connections` at once (ConnectionServer keeps the books). Every
// read and write is bounded: a connection idle for `idle_timeout`, stalled for
// `io_timeout` or holding a lease past `lease_timeout` is closed. Malformed
// input (a wrong magic, an oversized or unparsable message, an unexpected
// message instead of "done") closes that connection only; the server never
// aborts.
//
// Who: only processes of this process's user, root and
// `allowed_users` are lent anything (SO_PEERCRED); CUDA IPC handles, which
// give write access to device memory, only to this process's user.
// Writes (LocalFetchRequest.write, with `accept_writes`) lend the memory
// file writable, and only to processes of this user or root, which could
// write this process's memory anyway (ptrace, /proc/<pid>/mem); tokens
// do not apply to them for the same reason. Anyone else's write, a CUDA
// shard's or a box that is no dense run of its memory file is answered
// FAILED_PRECONDITION (use a stream: the data plane, where tokens apply).
// A write to a published version, or to a versioned tensor's own id, is
// FAILED_PRECONDITION (read-only) for everyone, as on every transport.
//
// Thread-safety: Start/Shutdown from one owner thread; address() and
// active_leases() from any. Shutdown(grace) (idempotent; also run by the
// destructor, with no grace) stops accepting, closes idle connections,
// answers requests arriving from then on with UNAVAILABLE (clients then
// use a stream, which says the same), lets leases end within `grace`, then
// closes every connection left and joins all threads.
#ifndef TESSERA_SERVER_SERVE_LOCAL_PATH_SERVER_H_
#define TESSERA_SERVER_SERVE_LOCAL_PATH_SERVER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <sys/types.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/serve/connection_server.h"
#include "server/serve/shard_registry.h"
#include "server/serve/shard_service.h"

namespace tessera {

struct LocalPathServerOptions {
  // Longest wait for one read or write in the middle of a request.
  absl::Duration io_timeout = absl::Seconds(60);
  // How long a connection may sit between requests.
  absl::Duration idle_timeout = absl::Minutes(10);
  // How long a client may hold a lease before its connection is closed
  // (and the lease released); as long as the longest transfer deadline.
  absl::Duration lease_timeout = absl::Minutes(5);
  // Connections beyond this are refused (closed at once).
  int max_connections = 512;
  // Users whose processes may use the local path besides this process's
  // own user and root (the kernel says who the peer is: SO_PEERCRED).
  // Requests of anyone else are answered FAILED_PRECONDITION before they
  // are read, so their clients fetch over a stream, where tokens and TLS
  // apply.
  std::vector<uid_t> allowed_users;
  // Lend memory files writable for writes (see above): the daemons do.
  bool accept_writes = false;
};

class LocalPathServer {
 public:
  // Listens on a fresh abstract Unix socket. FAILED_PRECONDITION when this
  // host's id cannot be read (no local path is possible then); UNAVAILABLE
  // when the socket cannot be made.
  static absl::StatusOr<std::unique_ptr<LocalPathServer>> Start(
      std::shared_ptr<ShardRegistry> registry,
      LocalPathServerOptions options = {});
  ~LocalPathServer();
  LocalPathServer(const LocalPathServer&) = delete;
  LocalPathServer& operator=(const LocalPathServer&) = delete;

  // "<host id>/<socket name>", what a worker publishes as local_address.
  const std::string& address() const { return address_; }
  // Leases held right now (replies whose client has not said "done").
  int64_t active_leases() const { return active_leases_.load(); }
  // Drains for at most `grace` (zero: cuts every connection at once).
  void Shutdown(absl::Duration grace = absl::ZeroDuration());

 private:
  LocalPathServer(std::string address, std::shared_ptr<ShardRegistry> registry,
                  LocalPathServerOptions options);
  // A lease counts as part of its request: Shutdown's grace covers it.
  // Answers one connection until it ends (ConnectionServer::StartServing).
  friend class ConnectionServer;
  void Serve(ConnectionServer::Connection& connection);
  // Answers one request. Returns what the client was lent (to hold until
  // it is done; null when nothing was), or an error meaning the connection
  // must be closed.
  // `may_write`: the peer may be lent memory writable; *lent_writable says
  // whether what was lent is lent for a write.
  absl::StatusOr<std::shared_ptr<const FetchView>> Answer(
      int fd, const std::string& message, bool same_user, bool may_write,
      bool* lent_writable);

  const std::string address_;
  const std::shared_ptr<ShardRegistry> registry_;
  const LocalPathServerOptions options_;
  std::atomic<int64_t> active_leases_{0};
  std::unique_ptr<ConnectionServer> connections_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_SERVE_LOCAL_PATH_SERVER_H_
