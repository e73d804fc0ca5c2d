#include "server/bulk_server.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "server/chunk_source.h"
#include "xxhash.h"

namespace tessera {
namespace {

absl::Status SendReply(int fd, const v1::BulkFetchReply& reply,
                       absl::Time deadline, bool more) {
  return WriteFrame(fd, reply.SerializeAsString(), deadline, more);
}

}  // namespace

absl::StatusOr<std::unique_ptr<BulkServer>> BulkServer::Start(
    const std::string& host, std::shared_ptr<ShardRegistry> registry,
    BulkServerOptions options) {
  if (registry == nullptr) {
    return absl::InvalidArgumentError("BulkServer needs a registry");
  }
  ASSIGN_OR_RETURN(auto listening, ListenTcp(host));
  std::unique_ptr<BulkServer> server(
      new BulkServer(host, listening.second, std::move(listening.first),
                     std::move(registry), options));
  server->acceptor_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

BulkServer::BulkServer(std::string host, int port, Socket listener,
                       std::shared_ptr<ShardRegistry> registry,
                       BulkServerOptions options)
    : host_(std::move(host)),
      port_(port),
      listener_(std::move(listener)),
      registry_(std::move(registry)),
      options_(options) {}

BulkServer::~BulkServer() { Shutdown(); }

std::string BulkServer::address() const {
  return absl::StrCat(host_, ":", port_);
}

void BulkServer::AcceptLoop() {
  while (true) {
    const int fd = accept4(listener_.fd(), nullptr, nullptr, SOCK_CLOEXEC);
    const int accept_errno = errno;
    JoinFinished();
    if (fd < 0) {
      {
        absl::MutexLock lock(&mu_);
        if (stopping_) return;
      }
      // A peer that gave up before the accept is harmless; anything else
      // (EMFILE...) is retried after a pause rather than spun on.
      if (accept_errno != EINTR && accept_errno != ECONNABORTED) {
        absl::SleepFor(absl::Milliseconds(10));
      }
      continue;
    }
    Socket socket(fd);
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    if (static_cast<int>(connections_.size()) >= options_.max_connections) {
      continue;  // Refused: the socket closes here.
    }
    const uint64_t id = next_id_++;
    connections_.emplace(id, std::move(socket));
    threads_.emplace(id, std::thread([this, id, fd] { Serve(id, fd); }));
  }
}

void BulkServer::Serve(uint64_t id, int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  char magic[kBulkMagic.size()];
  absl::Status status =
      ReadFull(fd, magic, sizeof(magic), absl::Now() + options_.io_timeout);
  if (status.ok() && absl::string_view(magic, sizeof(magic)) != kBulkMagic) {
    status = absl::InvalidArgumentError("not a Tessera data-plane client");
  }
  while (status.ok()) {
    absl::StatusOr<std::string> frame =
        ReadFrame(fd, absl::Now() + options_.idle_timeout);
    if (!frame.ok()) break;
    bool stopping;
    {
      absl::MutexLock lock(&mu_);
      stopping = stopping_;
      if (!stopping) busy_.insert(id);
    }
    if (stopping) {
      // Shutdown began after the request left the client: refuse it the way
      // a stopped gRPC server would.
      v1::BulkFetchReply reply;
      reply.set_code(static_cast<int>(absl::StatusCode::kUnavailable));
      reply.set_message("shard server is shutting down");
      SendReply(fd, reply, absl::Now() + options_.io_timeout, false)
          .IgnoreError();
      break;
    }
    status = Answer(fd, *frame);
    absl::MutexLock lock(&mu_);
    busy_.erase(id);
    if (stopping_) break;  // Drained: no more requests on this connection.
  }
  absl::MutexLock lock(&mu_);
  connections_.erase(id);  // Closes the socket.
  finished_.push_back(id);
}

absl::Status BulkServer::Answer(int fd, const std::string& frame) {
  const absl::Time deadline = absl::Now() + options_.io_timeout;
  v1::FetchShardRequest request;
  v1::BulkFetchReply reply;
  if (!request.ParseFromString(frame)) {
    reply.set_code(static_cast<int>(absl::StatusCode::kInvalidArgument));
    reply.set_message("FetchShard: malformed request");
    return SendReply(fd, reply, deadline, false);
  }
  absl::StatusOr<PreparedFetch> prepared = PrepareFetch(*registry_, request);
  if (!prepared.ok()) {
    reply.set_code(static_cast<int>(prepared.status().code()));
    reply.set_message(std::string(prepared.status().message()));
    return SendReply(fd, reply, deadline, false);
  }
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
  if (!started.ok()) {
    reply.set_code(static_cast<int>(started.code()));
    reply.set_message(std::string(started.message()));
    return SendReply(fd, reply, deadline, false);
  }
  *reply.mutable_header() = prepared->header;
  reply.set_chunk_bytes(chunk_bytes);
  RETURN_IF_ERROR(SendReply(fd, reply, deadline, chunk.size > 0));
  char prefix[kBulkChunkPrefixBytes];
  while (chunk.size > 0) {
    StoreLe64(static_cast<uint64_t>(chunk.offset), prefix);
    StoreLe64(chunk.size, prefix + 8);
    StoreLe64(XXH3_64bits(chunk.data, chunk.size), prefix + 16);
    const absl::Time chunk_deadline = absl::Now() + options_.io_timeout;
    RETURN_IF_ERROR(
        WriteFull(fd, prefix, sizeof(prefix), chunk_deadline, /*more=*/true));
    // While this chunk is written, the copies of the next ones run.
    RETURN_IF_ERROR(WriteFull(fd, chunk.data, chunk.size, chunk_deadline));
    if ((*source)->done()) break;
    chunk = HostChunk();  // Written: its staging buffer may take a copy.
    ASSIGN_OR_RETURN(chunk, (*source)->Next());
  }
  return absl::OkStatus();
}

void BulkServer::JoinFinished() {
  std::vector<std::thread> done;
  {
    absl::MutexLock lock(&mu_);
    for (uint64_t id : finished_) {
      auto it = threads_.find(id);
      if (it == threads_.end()) continue;
      done.push_back(std::move(it->second));
      threads_.erase(it);
    }
    finished_.clear();
  }
  for (std::thread& t : done) t.join();
}

void BulkServer::Shutdown(absl::Duration grace) {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    // Idle connections (between requests) are closed now; busy ones finish
    // their request first (see Serve).
    for (const auto& [id, socket] : connections_) {
      if (busy_.count(id) == 0) socket.Interrupt();
    }
  }
  listener_.Interrupt();
  if (acceptor_.joinable()) acceptor_.join();
  std::map<uint64_t, std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(this, &BulkServer::Drained), grace);
    for (const auto& [id, socket] : connections_) socket.Interrupt();
    threads.swap(threads_);
    finished_.clear();
  }
  for (auto& [id, thread] : threads) thread.join();
}

}  // namespace tessera
