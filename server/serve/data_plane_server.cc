#include "server/serve/data_plane_server.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "server/serve/chunk_source.h"
#include "wire/auth.h"
#include "wire/chunk_codec.h"
#include "xxhash.h"

namespace tessera {
namespace {

absl::Status SendReply(DataConnection& stream, const v1::BulkFetchReply& reply,
                       absl::Time deadline, bool more) {
  return stream.WriteFrame(reply.SerializeAsString(), deadline, more);
}

// Answers a request with `error`, ending it.
absl::Status SendError(DataConnection& stream, const absl::Status& error,
                       absl::Time deadline) {
  return SendReply(stream, ErrorReply<v1::BulkFetchReply>(error), deadline,
                   /*more=*/false);
}

}  // namespace

absl::StatusOr<std::unique_ptr<DataPlaneServer>> DataPlaneServer::Start(
    const std::string& host, std::shared_ptr<ShardRegistry> registry,
    DataPlaneServerOptions options) {
  if (registry == nullptr) {
    return absl::InvalidArgumentError("DataPlaneServer needs a registry");
  }
  ASSIGN_OR_RETURN(auto listening, ListenTcp(host));
  std::unique_ptr<DataPlaneServer> server(new DataPlaneServer(
      host, listening.second, std::move(registry), options));
  ASSIGN_OR_RETURN(
      server->connections_,
      ConnectionServer::StartServing(std::move(listening.first),
                                     options.max_connections, server.get()));
  return server;
}

DataPlaneServer::DataPlaneServer(std::string host, int port,
                                 std::shared_ptr<ShardRegistry> registry,
                                 DataPlaneServerOptions options)
    : host_(std::move(host)),
      port_(port),
      registry_(std::move(registry)),
      options_(options) {}

DataPlaneServer::~DataPlaneServer() { Shutdown(); }

std::string DataPlaneServer::address() const {
  return absl::StrCat(host_, ":", port_);
}

void DataPlaneServer::Serve(ConnectionServer::Connection& connection) {
  const int fd = connection.fd();
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  const absl::Time opening = absl::Now() + options_.io_timeout;
  DataConnection stream = DataConnection::PlainView(fd);
  if (options_.tls != nullptr) {
    // A client without the cluster's certificates ends here.
    absl::StatusOr<DataConnection> accepted =
        DataConnection::Accept(fd, *options_.tls, opening);
    if (!accepted.ok()) return;
    stream = *std::move(accepted);
  }
  char magic[kDataPlaneMagic.size()];
  if (!stream.ReadFull(magic, sizeof(magic), opening).ok()) return;
  std::optional<std::string> token;
  if (absl::string_view(magic, sizeof(magic)) == kDataPlaneTokenMagic) {
    absl::StatusOr<std::string> presented = stream.ReadFrame(opening);
    if (!presented.ok()) return;
    token = *std::move(presented);
  } else if (absl::string_view(magic, sizeof(magic)) != kDataPlaneMagic) {
    return;  // Not a Tessera data-plane client.
  }
  // The data plane serves FetchShard only.
  const absl::Status allowed = AuthorizeToken(
      token,
      absl::StrCat(v1::ShardService::service_full_name(), "/FetchShard"));
  connection.ServeRequests(
      [&] { return stream.ReadFrame(absl::Now() + options_.idle_timeout); },
      [&] {
        // Shutdown began after the request left the client: refuse it the
        // way a stopped gRPC server would.
        SendError(stream, ShuttingDownError(),
                  absl::Now() + options_.io_timeout)
            .IgnoreError();
      },
      [&](const std::string& frame) {
        if (!allowed.ok()) {
          SendError(stream, allowed, absl::Now() + options_.io_timeout)
              .IgnoreError();
          return false;
        }
        return Answer(stream, frame).ok();
      });
}

absl::Status DataPlaneServer::Answer(DataConnection& stream,
                                     const std::string& frame) {
  const absl::Time deadline = absl::Now() + options_.io_timeout;
  v1::FetchShardRequest request;
  if (!request.ParseFromString(frame)) {
    return SendError(stream, MalformedFetchError(), deadline);
  }
  absl::StatusOr<PreparedFetch> prepared = PrepareFetch(*registry_, request);
  if (!prepared.ok()) return SendError(stream, prepared.status(), deadline);
  const int64_t chunk_bytes =
      ChunkBytesFor(options_.chunks, request.chunk_bytes());
  // The first chunk is had before the reply, so that a source that cannot
  // even start (a CUDA error) is answered with its error; later errors can
  // only cut the stream (the connection closes).
  absl::StatusOr<std::unique_ptr<ChunkSource>> source = NewChunkSource(
      prepared->bytes, chunk_bytes, options_.chunks.staging_depth);
  absl::Status started = source.status();
  HostChunk chunk;  // Zero bytes: none.
  if (started.ok() && !(*source)->done()) {
    absl::StatusOr<HostChunk> first = (*source)->Next();
    started = first.status();
    if (first.ok()) chunk = *std::move(first);
  }
  if (!started.ok()) return SendError(stream, started, deadline);
  v1::BulkFetchReply reply;
  *reply.mutable_header() = prepared->header;
  reply.set_chunk_bytes(chunk_bytes);
  RETURN_IF_ERROR(SendReply(stream, reply, deadline, chunk.size > 0));
  char prefix[kDataPlaneChunkPrefixBytes];
  while (chunk.size > 0) {
    EncodeChunkPrefix(
        ChunkPrefix{chunk.offset, static_cast<int64_t>(chunk.size),
                    XXH3_64bits(chunk.data, chunk.size)},
        prefix);
    const absl::Time chunk_deadline = absl::Now() + options_.io_timeout;
    RETURN_IF_ERROR(stream.WriteFull(prefix, sizeof(prefix), chunk_deadline,
                                     /*more=*/true));
    // While this chunk is written, the copies of the next ones run.
    RETURN_IF_ERROR(stream.WriteFull(chunk.data, chunk.size, chunk_deadline));
    if ((*source)->done()) break;
    chunk = HostChunk();  // Written: its staging buffer may take a copy.
    ASSIGN_OR_RETURN(chunk, (*source)->Next());
  }
  return absl::OkStatus();
}

void DataPlaneServer::Shutdown(absl::Duration grace) {
  if (connections_ != nullptr) connections_->Shutdown(grace);
}

}  // namespace tessera
