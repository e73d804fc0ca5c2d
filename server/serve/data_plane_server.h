// DataPlaneServer: the raw-TCP data plane of a shard server
// (docs/data_plane.md).
//
// It serves the same fetches as ShardService::FetchShard — same
// validation, same errors, same chunking and XXH3 checksums — without
// HTTP/2 framing, so that a client receives each chunk's payload straight
// into its destination tensor. gRPC remains the control plane.
//
// Chunks come from a ChunkSource (chunk_source.h): a host shard is written
// from its own memory; a strided box of one whose contiguous runs are at
// least kMinGatheredRunBytes long is written from its own memory too on a
// connection in the clear, each chunk's runs gathered by the kernel
// (sendmsg) after the prefix with their checksum, instead of copied into a
// staging buffer first; a CUDA shard (made contiguous on its device first,
// when strided) is staged device -> pinned host chunk by chunk on a CUDA
// stream, `chunks.staging_depth` chunks ahead, so that the copy of the next
// chunks overlaps writing this one to the socket. The first chunk is staged
// before the reply, so a CUDA error at the start is answered with its code
// and message (INTERNAL, UNAVAILABLE or RESOURCE_EXHAUSTED); one later in
// the stream can only close the connection, which the client sees as a
// stream cut short (UNAVAILABLE). Copies in flight are waited for before
// their buffers are freed, also when the client goes away mid-stream.
//
// It also takes writes (v1::BulkWriteRequest, on connections that open
// with kDataPlaneRequestMagic): a box of a host shard (or replica) this
// rank has registered, when the box is one dense run of the shard, is
// received straight into the shard's memory, chunk by chunk, each chunk
// verified where it landed. Anything else (an unregistered tensor id, a
// CUDA or meta shard, a strided box) is answered `fallback`, with nothing
// written, and the client writes through ControlService.WriteRegion
// instead. A write that fails after the go-ahead (a checksum mismatch, a
// cut connection, a stall past io_timeout) may have changed any byte of its
// box and no byte outside it (docs/data_plane.md, "Writes").
//
// One thread accepts; each connection gets a thread that serves its
// requests one after another (a client uses one connection per concurrent
// fetch; ConnectionServer keeps the books). Every read and write is bounded: a
// connection idle for `idle_timeout` or stalled mid-write for `io_timeout` is
// closed. Malformed input (wrong magic, oversized or unparsable frames) closes
// that connection only; the server never aborts.
//
// It answers DescribeDigestRequests too (with `describe`, a daemon's
// table): the digest of what DescribeTensor would answer for a name, so
// that a client's cached Open costs one small exchange on a pooled
// connection instead of a gRPC call (docs/data_plane.md, "Cached opens").
//
// Security (docs/security.md): with `tls`, every connection is TLS (mutual
// when the context has a CA), handshaken within io_timeout. With a
// process token table (wire/auth.h), a connection's token (sent after
// kDataPlaneTokenMagic) must allow ShardService/FetchShard for fetches,
// ControlService/WriteRegion for writes and ControlService/DescribeTensor
// for digests; otherwise the request is answered UNAUTHENTICATED or
// PERMISSION_DENIED and the connection closed.
//
// Thread-safety: Start/Shutdown from one owner thread; port()/address()
// from any. Shutdown(grace) (idempotent; also run by the destructor, with
// no grace) stops accepting, closes idle connections, answers requests that
// arrive from then on with UNAVAILABLE, lets requests being answered finish
// within `grace`, then interrupts every connection left and joins all
// threads.
#ifndef TESSERA_SERVER_SERVE_DATA_PLANE_SERVER_H_
#define TESSERA_SERVER_SERVE_DATA_PLANE_SERVER_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/serve/connection_server.h"
#include "server/serve/fetch.h"
#include "server/serve/shard_registry.h"
#include "server/serve/shard_service.h"
#include "tessera/v1/control.pb.h"
#include "wire/data_connection.h"

namespace tessera {

// A strided box whose contiguous runs are this long or longer is sent from
// the shard's memory run by run (gathered by the kernel); shorter runs are
// copied into a staging buffer first, as one sendmsg piece per run would
// cost more than the copy.
inline constexpr int64_t kMinGatheredRunBytes = 1024;

struct DataPlaneServerOptions {
  ShardServiceOptions chunks;
  // The TCP port to listen on; 0: one the kernel picks.
  int port = 0;
  // Longest wait for one read or write in the middle of a request.
  absl::Duration io_timeout = absl::Seconds(60);
  // How long a connection may sit between requests.
  absl::Duration idle_timeout = absl::Minutes(10);
  // Connections beyond this are refused (closed at once).
  int max_connections = 512;
  // Take writes (BulkWriteRequest) into any shard or replica registered
  // here, from clients whose token allows ControlService/WriteRegion.
  // Off: every write is answered `fallback`, with nothing written.
  bool accept_writes = false;
  // TLS for every connection (wire/data_connection.h); null: plaintext.
  std::shared_ptr<TlsContext> tls;
  // What ControlService.DescribeTensor answers for a name (a daemon's
  // table), to answer DescribeDigestRequests from clients whose token
  // allows DescribeTensor; null: they are answered UNIMPLEMENTED. Called
  // from connection threads; must be thread-safe and outlive Shutdown().
  std::function<absl::StatusOr<v1::TensorInfo>(const std::string& name)>
      describe;
};

class DataPlaneServer {
 public:
  // Listens on `host` (an IPv4 address) and options.port (0: one chosen by
  // the kernel); a port in use is UNAVAILABLE ("port in use").
  static absl::StatusOr<std::unique_ptr<DataPlaneServer>> Start(
      const std::string& host, std::shared_ptr<ShardRegistry> registry,
      DataPlaneServerOptions options = {});
  ~DataPlaneServer();
  DataPlaneServer(const DataPlaneServer&) = delete;
  DataPlaneServer& operator=(const DataPlaneServer&) = delete;

  int port() const { return port_; }
  // "host:port" as given to Start.
  std::string address() const;
  // Drains for at most `grace` (zero: cuts every connection at once).
  void Shutdown(absl::Duration grace = absl::ZeroDuration());

 private:
  DataPlaneServer(std::string host, int port,
                  std::shared_ptr<ShardRegistry> registry,
                  DataPlaneServerOptions options);
  // Answers one connection until it ends (ConnectionServer::StartServing).
  friend class ConnectionServer;
  void Serve(ConnectionServer::Connection& connection);
  // Answer one request each; an error means the connection must be
  // closed.
  absl::Status AnswerFetch(DataConnection& stream,
                           const v1::FetchShardRequest& request);
  // A strided host box, its runs sent in place (see above).
  absl::Status AnswerStridedFetch(DataConnection& stream,
                                  const PreparedFetch& prepared,
                                  int64_t chunk_bytes, absl::Time asked,
                                  absl::Time deadline);
  absl::Status AnswerWrite(DataConnection& stream,
                           const v1::BulkWriteRequest& request);
  // The rest of AnswerWrite for a box that came whole in the request
  // (`data`): checked, copied into `box`, answered with the last reply.
  absl::Status WriteInline(DataConnection& stream,
                           const v1::BulkWriteRequest& request,
                           const Tensor& box, const std::string& what);
  absl::Status AnswerDescribeDigest(DataConnection& stream,
                                    const v1::DescribeDigestRequest& request);

  const std::string host_;
  const int port_;
  const std::shared_ptr<ShardRegistry> registry_;
  const DataPlaneServerOptions options_;
  std::unique_ptr<ConnectionServer> connections_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_SERVE_DATA_PLANE_SERVER_H_
