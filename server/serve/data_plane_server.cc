#include "server/serve/data_plane_server.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/checksum.h"
#include "common/proto_convert.h"
#include "common/status_macros.h"
#include "io/socket.h"
#include "server/metrics/metrics.h"
#include "server/serve/chunk_source.h"
#include "tessera/v1/control.grpc.pb.h"
#include "wire/auth.h"
#include "wire/chunk_assembler.h"
#include "wire/chunk_checksums.h"
#include "wire/chunk_codec.h"
#include "wire/message_digest.h"
#include "wire/replicas.h"

namespace tessera {
namespace {

// Sends a BulkFetchReply or a BulkWriteReply.
template <typename Reply>
absl::Status SendReply(DataConnection& stream, const Reply& reply,
                       absl::Time deadline, bool more = false) {
  return stream.WriteFrame(reply.SerializeAsString(), deadline, more);
}

// Answers a request with `error`, ending it.
absl::Status SendError(DataConnection& stream, const absl::Status& error,
                       absl::Time deadline) {
  return SendReply(stream, ErrorReply<v1::BulkFetchReply>(error), deadline,
                   /*more=*/false);
}

v1::BulkWriteReply WriteError(const absl::Status& status) {
  return ErrorReply<v1::BulkWriteReply>(status);
}

// CANCELLED when the client of an inline write has hung up: it gave up on
// the write (cancelled, or past its deadline, while this daemon was
// stalled), so the box it sent must not land now, after writes it made
// since. The connection is then closed without a reply (nobody reads it).
absl::Status CheckClientWaits(const DataConnection& stream,
                              absl::string_view what) {
  if (!PeerHungUp(stream.fd())) return absl::OkStatus();
  return absl::CancelledError(
      absl::StrCat(what, ": the client hung up; nothing written"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<DataPlaneServer>> DataPlaneServer::Start(
    const std::string& host, std::shared_ptr<ShardRegistry> registry,
    DataPlaneServerOptions options) {
  if (registry == nullptr) {
    return absl::InvalidArgumentError("DataPlaneServer needs a registry");
  }
  ASSIGN_OR_RETURN(auto listening, ListenTcp(host, options.port));
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
  const OpenConnection open(MetricsTransport::kDataPlane);
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
  const absl::string_view opened(magic, sizeof(magic));
  const bool with_token =
      opened == kDataPlaneTokenMagic || opened == kDataPlaneRequestTokenMagic;
  // Frames are DataPlaneRequests (fetches and writes), or bare fetches.
  const bool framed =
      opened == kDataPlaneRequestMagic || opened == kDataPlaneRequestTokenMagic;
  if (!with_token && !framed && opened != kDataPlaneMagic) {
    return;  // Not a Tessera data-plane client.
  }
  std::optional<std::string> token;
  if (with_token) {
    absl::StatusOr<std::string> presented = stream.ReadFrame(opening);
    if (!presented.ok()) return;
    token = *std::move(presented);
  }
  // A fetch needs what ShardService/FetchShard needs; a write what
  // ControlService/WriteRegion does.
  const absl::Status fetch_allowed = AuthorizeToken(
      token,
      absl::StrCat(v1::ShardService::service_full_name(), "/FetchShard"));
  const absl::Status write_allowed = AuthorizeToken(
      token,
      absl::StrCat(v1::ControlService::service_full_name(), "/WriteRegion"));
  const absl::Status describe_allowed = AuthorizeToken(
      token,
      absl::StrCat(v1::ControlService::service_full_name(), "/DescribeTensor"));
  // A refused request is answered, and its connection closed.
  const auto refuse = [&](const absl::Status& status) {
    SendError(stream, status, absl::Now() + options_.io_timeout).IgnoreError();
    return false;
  };
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
        // A bare fetch's connection is refused before its frame is read.
        if (!framed && !fetch_allowed.ok()) return refuse(fetch_allowed);
        v1::DataPlaneRequest request;
        const bool parsed =
            framed ? request.ParseFromString(frame) &&
                         request.request_case() !=
                             v1::DataPlaneRequest::REQUEST_NOT_SET
                   : request.mutable_fetch()->ParseFromString(frame);
        if (!parsed) {
          // Both replies carry the code and message as fields 1 and 2.
          return SendError(stream, MalformedFetchError(),
                           absl::Now() + options_.io_timeout)
              .ok();
        }
        if (request.has_write()) {
          if (!write_allowed.ok()) return refuse(write_allowed);
          return AnswerWrite(stream, request.write()).ok();
        }
        if (request.has_describe_digest()) {
          if (!describe_allowed.ok()) return refuse(describe_allowed);
          return AnswerDescribeDigest(stream, request.describe_digest()).ok();
        }
        if (!fetch_allowed.ok()) return refuse(fetch_allowed);
        return AnswerFetch(stream, request.fetch()).ok();
      });
}

absl::Status DataPlaneServer::AnswerFetch(
    DataConnection& stream, const v1::FetchShardRequest& request) {
  const absl::Time asked = absl::Now();
  const absl::Time deadline = asked + options_.io_timeout;
  absl::StatusOr<PreparedFetch> prepared =
      PrepareFetch(*registry_, request, deadline);
  if (!prepared.ok()) return SendError(stream, prepared.status(), deadline);
  const int64_t chunk_bytes =
      ChunkBytesFor(options_.chunks, request.chunk_bytes());
  const Tensor& bytes = prepared->bytes;
  if (bytes.defined() && bytes.device().is_cpu() && !bytes.is_contiguous() &&
      !stream.authenticated() &&
      RowMajorRunBytes(bytes) >= kMinGatheredRunBytes) {
    return AnswerStridedFetch(stream, *prepared, chunk_bytes, asked, deadline);
  }
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
  // A dense run of host bytes is hashed ahead on a helper
  // (wire/chunk_checksums.h).
  ChunkChecksums checksums(
      !stream.authenticated(),
      bytes.defined() && bytes.device().is_cpu() && bytes.is_contiguous()
          ? static_cast<const char*>(bytes.data_ptr())
          : nullptr,
      (*source)->total_bytes(), chunk_bytes);
  char prefix[kDataPlaneChunkPrefixBytes];
  while (chunk.size > 0) {
    const uint64_t checksum = checksums.For(chunk.offset, chunk.data,
                                            static_cast<int64_t>(chunk.size));
    EncodeChunkPrefix(
        ChunkPrefix{chunk.offset, static_cast<int64_t>(chunk.size), checksum},
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
  CountTransfer(MetricsTransport::kDataPlane, MetricsDirection::kRead,
                prepared->header.total_bytes(), absl::Now() - asked);
  return absl::OkStatus();
}

absl::Status DataPlaneServer::AnswerStridedFetch(DataConnection& stream,
                                                 const PreparedFetch& prepared,
                                                 int64_t chunk_bytes,
                                                 absl::Time asked,
                                                 absl::Time deadline) {
  const Tensor& bytes = prepared.bytes;
  const int64_t total = static_cast<int64_t>(bytes.nbytes());
  v1::BulkFetchReply reply;
  *reply.mutable_header() = prepared.header;
  reply.set_chunk_bytes(chunk_bytes);
  RETURN_IF_ERROR(SendReply(stream, reply, deadline, /*more=*/true));
  // Each chunk's runs go out as they lie in the shard, gathered by the
  // kernel (no staging copy), after its prefix with their checksum.
  char prefix[kDataPlaneChunkPrefixBytes];
  std::vector<struct iovec> pieces;
  for (int64_t offset = 0; offset < total; offset += chunk_bytes) {
    const size_t size =
        static_cast<size_t>(std::min(chunk_bytes, total - offset));
    pieces.clear();
    pieces.push_back(iovec{prefix, sizeof(prefix)});
    Checksum64Stream checksum;
    RETURN_IF_ERROR(
        ForEachRowMajorRun(bytes, offset, size, [&](const char* run, size_t n) {
          checksum.Update(run, n);
          pieces.push_back(iovec{const_cast<char*>(run), n});
        }));
    EncodeChunkPrefix(
        ChunkPrefix{offset, static_cast<int64_t>(size), checksum.Digest()},
        prefix);
    RETURN_IF_ERROR(stream.WriteVFull(pieces, absl::Now() + options_.io_timeout,
                                      /*more=*/offset + chunk_bytes < total));
  }
  CountTransfer(MetricsTransport::kDataPlane, MetricsDirection::kRead,
                prepared.header.total_bytes(), absl::Now() - asked);
  return absl::OkStatus();
}

absl::Status DataPlaneServer::AnswerWrite(DataConnection& stream,
                                          const v1::BulkWriteRequest& request) {
  const absl::Time asked = absl::Now();
  const absl::Time deadline = asked + options_.io_timeout;
  const std::string what = absl::StrCat(
      "data-plane write of ", request.replica() ? "the replica of " : "",
      "shard ", request.shard_index(), " of tensor ", request.tensor_id());
  // The write's target, validated as a fetch of the same box would be.
  v1::FetchShardRequest locate;
  locate.set_tensor_id(request.replica() ? ReplicaTensorId(request.tensor_id())
                                         : request.tensor_id());
  locate.set_shard_index(request.shard_index());
  *locate.mutable_region_offsets() = request.region_offsets();
  *locate.mutable_region_sizes() = request.region_sizes();
  v1::BulkWriteReply reply;
  const auto fall_back = [&](absl::string_view why) {
    reply.set_fallback(true);
    reply.set_message(absl::StrCat(what, ": ", why));
    return SendReply(stream, reply, deadline);
  };
  if (!options_.accept_writes) {
    return fall_back("this server takes no writes over the data plane");
  }
  absl::StatusOr<FetchView> target =
      PrepareFetchView(*registry_, locate, /*write=*/true);
  if (!target.ok()) {
    // Not registered here (yet: a daemon refilling it takes the write over
    // gRPC, which also names a tensor that is gone the way every other
    // write does).
    if (absl::IsNotFound(target.status()) ||
        absl::IsFailedPrecondition(target.status())) {
      return fall_back(target.status().message());
    }
    return SendReply(stream, WriteError(Annotate(target.status(), what)),
                     deadline);
  }
  if (!target->writable) {
    return SendReply(
        stream, WriteError(ReadOnlyVersionError(request.tensor_id(), what)),
        deadline);
  }
  const Tensor& box = target->view;
  const int64_t total = static_cast<int64_t>(box.nbytes());
  if (absl::Status checked =
          CheckWriteHeader(request.dtype(), request.total_bytes(), box.dtype(),
                           total, what, "box");
      !checked.ok()) {
    return SendReply(stream, WriteError(checked), deadline);
  }
  if (!box.device().is_cpu()) return fall_back("the shard is on a GPU");
  if (!box.is_contiguous()) {
    return fall_back("the box is not one dense run of the shard");
  }
  if (!request.data().empty()) return WriteInline(stream, request, box, what);
  const int64_t chunk_bytes =
      ChunkBytesFor(options_.chunks, request.chunk_bytes());
  reply.set_chunk_bytes(chunk_bytes);
  RETURN_IF_ERROR(SendReply(stream, reply, deadline));

  // Each chunk lands straight in the shard and is verified there; a chunk
  // whose checksum does not match leaves its bytes in place (documented
  // in docs/data_plane.md) and the rest of the stream is read and dropped,
  // so that the client hears why.
  char* const base = static_cast<char*>(box.data_ptr());
  ChunkSequence sequence(absl::StatusCode::kInvalidArgument, "box");
  sequence.Start(total);
  absl::Status failed;
  int64_t written = 0;
  std::string discard;
  char prefix[kDataPlaneChunkPrefixBytes];
  while (sequence.received_bytes() < total) {
    const absl::Time chunk_deadline = absl::Now() + options_.io_timeout;
    RETURN_IF_ERROR(stream.ReadFull(prefix, sizeof(prefix), chunk_deadline));
    const ChunkPrefix chunk = DecodeChunkPrefix(prefix);
    const std::string chunk_name =
        absl::StrCat(what, ": chunk at offset ", chunk.offset);
    absl::Status next =
        sequence.CheckNext(chunk.offset, chunk.length, chunk_name);
    if (next.ok() && (chunk.length <= 0 || chunk.length > chunk_bytes)) {
      next = absl::InvalidArgumentError(
          absl::StrCat(chunk_name, ": ", chunk.length, " bytes, not in [1, ",
                       chunk_bytes, "]"));
    }
    if (!next.ok()) {
      // The stream is out of step: answer, then close the connection.
      SendReply(stream, WriteError(next), deadline).IgnoreError();
      return next;
    }
    const size_t length = static_cast<size_t>(chunk.length);
    if (failed.ok()) {
      char* place = base + chunk.offset;
      RETURN_IF_ERROR(stream.ReadFull(place, length, chunk_deadline));
      if (!stream.authenticated()) {
        failed = ChunkSequence::CheckChecksum(Checksum64(place, length),
                                              chunk.checksum, chunk_name);
      }
      if (!failed.ok()) CountChecksumFailure(MetricsTransport::kDataPlane);
      if (failed.ok()) written += chunk.length;
    } else {
      discard.resize(std::min(length, size_t{1} << 20));
      for (size_t left = length; left > 0;) {
        const size_t part = std::min(left, discard.size());
        RETURN_IF_ERROR(stream.ReadFull(discard.data(), part, chunk_deadline));
        left -= part;
      }
    }
    sequence.Advance(chunk.length);
  }
  v1::BulkWriteReply done =
      failed.ok() ? v1::BulkWriteReply()
                  : WriteError(absl::DataLossError(absl::StrCat(
                        failed.message(), "; bytes [0, ", written,
                        ") of the box were written, the chunk's own bytes "
                        "hold what arrived, the rest is unchanged")));
  done.set_bytes_written(written);
  if (failed.ok()) {
    CountTransfer(MetricsTransport::kDataPlane, MetricsDirection::kWrite, total,
                  absl::Now() - asked);
  }
  return SendReply(stream, done, absl::Now() + options_.io_timeout);
}

absl::Status DataPlaneServer::WriteInline(DataConnection& stream,
                                          const v1::BulkWriteRequest& request,
                                          const Tensor& box,
                                          const std::string& what) {
  const absl::Time asked = absl::Now();
  const absl::Time deadline = asked + options_.io_timeout;
  const std::string& data = request.data();
  const int64_t total = static_cast<int64_t>(box.nbytes());
  if (static_cast<int64_t>(data.size()) != total || total > kInlineWriteBytes) {
    return SendReply(stream,
                     WriteError(absl::InvalidArgumentError(absl::StrCat(
                         what, ": the request carries ", data.size(),
                         " bytes for a box of ", total,
                         " (a request may carry a whole "
                         "box of at most ",
                         kInlineWriteBytes, " bytes); nothing written"))),
                     deadline);
  }
  if (!stream.authenticated()) {
    absl::Status intact = ChunkSequence::CheckChecksum(
        Checksum64(data.data(), data.size()), request.data_checksum(), what);
    if (!intact.ok()) {
      CountChecksumFailure(MetricsTransport::kDataPlane);
      return SendReply(stream,
                       WriteError(absl::Status(
                           intact.code(), absl::StrCat(intact.message(),
                                                       "; nothing written"))),
                       deadline);
    }
  }
  RETURN_IF_ERROR(CheckClientWaits(stream, what));
  std::memcpy(box.data_ptr(), data.data(), data.size());
  v1::BulkWriteReply done;
  done.set_bytes_written(total);
  CountTransfer(MetricsTransport::kDataPlane, MetricsDirection::kWrite, total,
                absl::Now() - asked);
  return SendReply(stream, done, deadline);
}

absl::Status DataPlaneServer::AnswerDescribeDigest(
    DataConnection& stream, const v1::DescribeDigestRequest& request) {
  const absl::Time deadline = absl::Now() + options_.io_timeout;
  v1::DescribeDigestReply reply;
  if (!options_.describe) {
    reply = ErrorReply<v1::DescribeDigestReply>(absl::UnimplementedError(
        "this server describes no tensors (it is no daemon)"));
    return SendReply(stream, reply, deadline);
  }
  absl::StatusOr<v1::TensorInfo> info = options_.describe(request.name());
  if (!info.ok()) {
    return SendReply(stream, ErrorReply<v1::DescribeDigestReply>(info.status()),
                     deadline);
  }
  reply.set_digest(MessageDigest(*info));
  return SendReply(stream, reply, deadline);
}

void DataPlaneServer::Shutdown(absl::Duration grace) {
  if (connections_ != nullptr) connections_->Shutdown(grace);
}

}  // namespace tessera
