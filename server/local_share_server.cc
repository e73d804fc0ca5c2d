#include "server/local_share_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/local_fetch.h"
#include "client/local_socket.h"
#include "common/cuda_util.h"
#include "common/status_macros.h"
#include "tessera/v1/local.pb.h"

#if defined(TESSERA_WITH_CUDA) && TESSERA_WITH_CUDA
#include <cuda_runtime_api.h>
#define TESSERA_LOCAL_SHARE_CUDA 1
#else
#define TESSERA_LOCAL_SHARE_CUDA 0
#endif

namespace tessera {
namespace {

// A new read-only open file description of the memory file `fd`, so that
// the client can map the pages but not write them.
absl::StatusOr<Socket> ReopenReadOnly(int fd) {
  const std::string path = absl::StrCat("/proc/self/fd/", fd);
  Socket readonly(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!readonly.valid()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "reopening its memory file read-only failed: ", std::strerror(errno)));
  }
  return readonly;
}

// Fills the CUDA_IPC part of `reply` for the allocation of `storage`.
absl::Status ExportCudaIpc(const Storage& storage, v1::LocalFetchReply* reply) {
#if TESSERA_LOCAL_SHARE_CUDA
  const int device = storage.device().index().value_or(0);
  CudaDeviceGuard guard(device);
  RETURN_IF_ERROR(guard.status());
  cudaIpcMemHandle_t handle;
  // Storage::data() of a device storage is cudaMalloc's own pointer, the
  // base an IPC handle must name.
  RETURN_IF_ERROR(CudaStatus(cudaIpcGetMemHandle(&handle, storage.data()),
                             "cudaIpcGetMemHandle"));
  ASSIGN_OR_RETURN(std::string uuid, CudaDeviceUuid(device));
  reply->set_cuda_ipc_handle(
      std::string(reinterpret_cast<const char*>(&handle), sizeof(handle)));
  reply->set_cuda_device(device);
  reply->set_cuda_device_uuid(std::move(uuid));
  return absl::OkStatus();
#else
  (void)storage;
  (void)reply;
  return absl::FailedPreconditionError("this server is built without CUDA");
#endif
}

}  // namespace

absl::StatusOr<std::unique_ptr<LocalShareServer>> LocalShareServer::Start(
    std::shared_ptr<ShardRegistry> registry, LocalShareServerOptions options) {
  if (registry == nullptr) {
    return absl::InvalidArgumentError("LocalShareServer needs a registry");
  }
  const std::string& host = HostId();
  if (host.empty()) {
    return absl::FailedPreconditionError(
        "the local fast path needs this host's boot id, which cannot be read");
  }
  ASSIGN_OR_RETURN(auto listening, ListenLocal());
  Socket wake(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid()) {
    return absl::UnavailableError(
        absl::StrCat("eventfd: ", std::strerror(errno)));
  }
  std::unique_ptr<LocalShareServer> server(new LocalShareServer(
      LocalAddress(host, listening.second), std::move(listening.first),
      std::move(wake), std::move(registry), options));
  server->acceptor_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

LocalShareServer::LocalShareServer(std::string address, Socket listener,
                                   Socket wake,
                                   std::shared_ptr<ShardRegistry> registry,
                                   LocalShareServerOptions options)
    : address_(std::move(address)),
      listener_(std::move(listener)),
      wake_(std::move(wake)),
      registry_(std::move(registry)),
      options_(options) {}

LocalShareServer::~LocalShareServer() { Shutdown(); }

void LocalShareServer::AcceptLoop() {
  while (true) {
    pollfd fds[2] = {{listener_.fd(), POLLIN, 0}, {wake_.fd(), POLLIN, 0}};
    const int ready = poll(fds, 2, -1);
    const int poll_errno = errno;
    JoinFinished();
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
    }
    if (ready <= 0) {
      if (ready < 0 && poll_errno != EINTR) {
        absl::SleepFor(absl::Milliseconds(10));
      }
      continue;
    }
    const int fd =
        accept4(listener_.fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      // A peer that gave up before the accept is harmless; anything else
      // (EMFILE...) is retried after a pause rather than spun on.
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR &&
          errno != ECONNABORTED) {
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

void LocalShareServer::Serve(uint64_t id, int fd) {
  absl::StatusOr<std::string> magic =
      ReceiveLocalMessage(fd, absl::Now() + options_.io_timeout);
  bool open = magic.ok() && *magic == kLocalMagic;
  // CUDA IPC handles give write access to device memory: only processes of
  // this user get them (memory files are lent read-only to anyone who can
  // reach the socket, the same bytes the data plane would send).
  const absl::StatusOr<uid_t> peer = PeerUid(fd);
  const bool same_user = peer.ok() && *peer == geteuid();
  while (open) {
    absl::StatusOr<std::string> message =
        ReceiveLocalMessage(fd, absl::Now() + options_.idle_timeout);
    if (!message.ok()) break;
    bool stopping;
    {
      absl::MutexLock lock(&mu_);
      stopping = stopping_;
      if (!stopping) busy_.insert(id);
    }
    if (stopping) {
      // Shutdown began after the request left the client: refuse it the way
      // a stopped shard server would; the client's stream attempt then
      // hears the same.
      v1::LocalFetchReply reply;
      reply.set_code(static_cast<int>(absl::StatusCode::kUnavailable));
      reply.set_message("shard server is shutting down");
      SendLocalMessage(fd, reply.SerializeAsString(),
                       absl::Now() + options_.io_timeout)
          .IgnoreError();
      break;
    }
    absl::StatusOr<std::shared_ptr<const FetchView>> lent =
        Answer(fd, *message, same_user);
    open = lent.ok();
    if (open && *lent != nullptr) {
      absl::StatusOr<std::string> done =
          ReceiveLocalMessage(fd, absl::Now() + options_.lease_timeout);
      // Anything but "done" (a close, a timeout, another message) ends the
      // connection; the lease ends either way.
      open = done.ok() && done->size() == 1 && (*done)[0] == kLocalDone;
      lent->reset();
      active_leases_.fetch_sub(1);
    }
    absl::MutexLock lock(&mu_);
    busy_.erase(id);
    if (stopping_) break;  // Drained: no more requests on this connection.
  }
  absl::MutexLock lock(&mu_);
  connections_.erase(id);  // Closes the socket.
  finished_.push_back(id);
}

absl::StatusOr<std::shared_ptr<const FetchView>> LocalShareServer::Answer(
    int fd, const std::string& message, bool same_user) {
  const absl::Time deadline = absl::Now() + options_.io_timeout;
  v1::LocalFetchRequest request;
  v1::LocalFetchReply reply;
  if (!request.ParseFromString(message)) {
    reply.set_code(static_cast<int>(absl::StatusCode::kInvalidArgument));
    reply.set_message("FetchShard: malformed request");
    RETURN_IF_ERROR(SendLocalMessage(fd, reply.SerializeAsString(), deadline));
    return nullptr;
  }
  absl::StatusOr<FetchView> found =
      PrepareFetchView(*registry_, request.request());
  if (!found.ok()) {
    reply.set_code(static_cast<int>(found.status().code()));
    reply.set_message(std::string(found.status().message()));
    RETURN_IF_ERROR(SendLocalMessage(fd, reply.SerializeAsString(), deadline));
    return nullptr;
  }
  auto lent = std::make_shared<const FetchView>(*std::move(found));
  *reply.mutable_header() = lent->header;
  if (lent->header.total_bytes() == 0) {
    // Nothing to copy: OK with transport NONE.
    RETURN_IF_ERROR(SendLocalMessage(fd, reply.SerializeAsString(), deadline));
    return nullptr;
  }
  const Tensor& view = lent->view;
  const Storage& storage = *view.storage();
  v1::LocalLayout* layout = reply.mutable_layout();
  layout->set_offset_bytes(view.storage_offset() *
                           static_cast<int64_t>(view.element_size()));
  layout->mutable_sizes()->Add(view.sizes().begin(), view.sizes().end());
  layout->mutable_strides()->Add(view.strides().begin(), view.strides().end());
  layout->set_storage_bytes(static_cast<int64_t>(storage.nbytes()));

  Socket readonly;
  absl::Status shareable;
  if (storage.device().is_cpu() && storage.shared_memory_fd() >= 0) {
    absl::StatusOr<Socket> reopened =
        ReopenReadOnly(storage.shared_memory_fd());
    shareable = reopened.status();
    if (reopened.ok()) {
      readonly = *std::move(reopened);
      reply.set_transport(v1::LOCAL_TRANSPORT_SHM);
    }
  } else if (storage.device().is_cuda()) {
    if (!request.accept_cuda_ipc()) {
      shareable = absl::FailedPreconditionError(
          "it is CUDA memory and the client cannot open CUDA IPC handles");
    } else if (!same_user) {
      shareable = absl::FailedPreconditionError(
          "CUDA IPC handles are lent to processes of the same user only");
    } else {
      shareable = ExportCudaIpc(storage, &reply);
      if (shareable.ok()) reply.set_transport(v1::LOCAL_TRANSPORT_CUDA_IPC);
    }
  } else {
    shareable = absl::FailedPreconditionError(
        "its storage is not shareable memory (heap, pinned or below the "
        "sharing threshold, or without bytes)");
  }
  if (!shareable.ok()) {
    v1::LocalFetchReply refusal;
    refusal.set_code(static_cast<int>(absl::StatusCode::kFailedPrecondition));
    refusal.set_message(
        absl::StrCat("shard ", request.request().shard_index(), " of tensor ",
                     request.request().tensor_id(),
                     " cannot be shared: ", shareable.message()));
    RETURN_IF_ERROR(
        SendLocalMessage(fd, refusal.SerializeAsString(), deadline));
    return nullptr;
  }
  // Counted before the client can see the reply; Serve ends the count.
  active_leases_.fetch_add(1);
  // The kernel duplicates the descriptor into the message; ours closes
  // when `readonly` goes.
  const absl::Status sent =
      SendLocalMessage(fd, reply.SerializeAsString(), deadline, readonly.fd());
  if (!sent.ok()) {
    active_leases_.fetch_sub(1);
    return sent;
  }
  return lent;
}

void LocalShareServer::JoinFinished() {
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

void LocalShareServer::Shutdown(absl::Duration grace) {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    // Idle connections (between requests) are closed now; busy ones finish
    // their request and lease first (see Serve).
    for (const auto& [id, socket] : connections_) {
      if (busy_.count(id) == 0) socket.Interrupt();
    }
  }
  const uint64_t one = 1;
  while (write(wake_.fd(), &one, sizeof(one)) < 0 && errno == EINTR) {
  }
  if (acceptor_.joinable()) acceptor_.join();
  // Unbinds the name: new clients are refused at once and use a stream.
  listener_ = Socket();
  std::map<uint64_t, std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(this, &LocalShareServer::Drained),
                         grace);
    for (const auto& [id, socket] : connections_) socket.Interrupt();
    threads.swap(threads_);
    finished_.clear();
  }
  for (auto& [id, thread] : threads) thread.join();
}

}  // namespace tessera
