#include "server/serve/local_path_server.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "common/tensor/cuda_util.h"
#include "io/unix_socket.h"
#include "server/metrics/metrics.h"
#include "tessera/v1/local.pb.h"
#include "wire/chunk_codec.h"

#if defined(TESSERA_WITH_CUDA) && TESSERA_WITH_CUDA
#include <cuda_runtime_api.h>
#define TESSERA_LOCAL_PATH_SERVER_CUDA 1
#else
#define TESSERA_LOCAL_PATH_SERVER_CUDA 0
#endif

namespace tessera {
namespace {

// Leases of fewer bytes than this are ended by a "done" that comes within
// about ReadSpin::kReadSpin (the client's copy of the box): it is polled
// for. Blocking for it instead cost a 64 KiB read 25-27 -> 55-57 us p50
// (the next request then finds this thread asleep).
constexpr int64_t kPolledLeaseBytes = int64_t{1} << 20;

// Answers a request with `error`, ending it.
absl::Status SendError(int fd, const absl::Status& error, absl::Time deadline) {
  return SendLocalMessage(
      fd, ErrorReply<v1::LocalFetchReply>(error).SerializeAsString(), deadline);
}

// Fills the CUDA_IPC part of `reply` for the allocation of `storage`.
absl::Status ExportCudaIpc(const Storage& storage, v1::LocalFetchReply* reply) {
#if TESSERA_LOCAL_PATH_SERVER_CUDA
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

absl::StatusOr<std::unique_ptr<LocalPathServer>> LocalPathServer::Start(
    std::shared_ptr<ShardRegistry> registry, LocalPathServerOptions options) {
  if (registry == nullptr) {
    return absl::InvalidArgumentError("LocalPathServer needs a registry");
  }
  const std::string& host = HostId();
  if (host.empty()) {
    return absl::FailedPreconditionError(
        "the local path needs this host's boot id, which cannot be read");
  }
  ASSIGN_OR_RETURN(auto listening, ListenLocal());
  std::unique_ptr<LocalPathServer> server(new LocalPathServer(
      LocalAddress(host, listening.second), std::move(registry), options));
  ASSIGN_OR_RETURN(
      server->connections_,
      ConnectionServer::StartServing(std::move(listening.first),
                                     options.max_connections, server.get()));
  return server;
}

LocalPathServer::LocalPathServer(std::string address,
                                 std::shared_ptr<ShardRegistry> registry,
                                 LocalPathServerOptions options)
    : address_(std::move(address)),
      registry_(std::move(registry)),
      options_(options) {}

LocalPathServer::~LocalPathServer() { Shutdown(); }

void LocalPathServer::Serve(ConnectionServer::Connection& connection) {
  const OpenConnection open(MetricsTransport::kLocalPath);
  const int fd = connection.fd();
  absl::StatusOr<std::string> magic =
      ReceiveLocalMessage(fd, absl::Now() + options_.io_timeout);
  if (!magic.ok() || *magic != kLocalMagic) return;
  // Memory files are lent read-only to the allowed users; CUDA IPC
  // handles give write access to device memory: only processes of this
  // user get them.
  const absl::StatusOr<uid_t> peer = PeerUid(fd);
  const bool same_user = peer.ok() && *peer == geteuid();
  const bool allowed =
      peer.ok() &&
      (same_user || *peer == 0 ||
       std::find(options_.allowed_users.begin(), options_.allowed_users.end(),
                 *peer) != options_.allowed_users.end());
  const bool may_write =
      options_.accept_writes && peer.ok() && (same_user || *peer == 0);
  const absl::Status refused = absl::FailedPreconditionError(absl::StrCat(
      "the local path serves only the daemon's allowed users (uid ",
      peer.ok() ? absl::StrCat(*peer) : "unknown", " is not one)"));
  connection.ServeRequests(
      [&] {
        return ReceiveLocalMessage(fd, absl::Now() + options_.idle_timeout);
      },
      [&] {
        // Shutdown began after the request left the client: refuse it the
        // way a stopped shard server would; the client's stream attempt
        // then hears the same.
        SendError(fd, ShuttingDownError(), absl::Now() + options_.io_timeout)
            .IgnoreError();
      },
      [&](const std::string& message) {
        if (!allowed) {
          return SendError(fd, refused, absl::Now() + options_.io_timeout).ok();
        }
        bool write = false;
        const absl::Time asked = absl::Now();
        absl::StatusOr<std::shared_ptr<const FetchView>> lent =
            Answer(fd, message, same_user, may_write, &write);
        if (!lent.ok()) return false;
        if (*lent == nullptr) return true;
        const int64_t bytes = (*lent)->header.total_bytes();
        // A small box's "done" follows the reply at once (polled for); a
        // large one's comes after the client's copy.
        absl::StatusOr<std::string> done =
            ReceiveLocalMessage(fd, absl::Now() + options_.lease_timeout,
                                nullptr, /*poll=*/bytes < kPolledLeaseBytes);
        // Anything but "done" (a close, a timeout, another message) ends
        // the connection; the lease ends either way. Counted first: whoever
        // sees the shard's memory go sees the lease gone too.
        active_leases_.fetch_sub(1);
        const bool completed =
            done.ok() && done->size() == 1 && (*done)[0] == kLocalDone;
        // A borrower that never said "done" may still read or write the
        // memory through its descriptor: it is never refilled with other
        // bytes (a later version's, storage.h).
        if (!completed) (*lent)->view.storage()->MarkNotReusable();
        lent->reset();
        if (completed) {
          CountTransfer(
              MetricsTransport::kLocalPath,
              write ? MetricsDirection::kWrite : MetricsDirection::kRead, bytes,
              absl::Now() - asked);
        }
        return completed;
      });
}

absl::StatusOr<std::shared_ptr<const FetchView>> LocalPathServer::Answer(
    int fd, const std::string& message, bool same_user, bool may_write,
    bool* lent_writable) {
  const absl::Time deadline = absl::Now() + options_.io_timeout;
  v1::LocalFetchRequest request;
  if (!request.ParseFromString(message)) {
    RETURN_IF_ERROR(SendError(fd, MalformedFetchError(), deadline));
    return nullptr;
  }
  absl::StatusOr<FetchView> found = PrepareFetchView(
      *registry_, request.request(), request.write(), deadline);
  if (!found.ok()) {
    // A write to an id or shard not registered here is no verdict: a
    // restarted daemon refilling it takes the write over a stream, which
    // routes it into the refill (FAILED_PRECONDITION: use a stream).
    const absl::Status refused =
        request.write() && absl::IsNotFound(found.status())
            ? absl::FailedPreconditionError(found.status().message())
            : found.status();
    RETURN_IF_ERROR(SendError(fd, refused, deadline));
    return nullptr;
  }
  if (request.write() && !found->writable) {
    // A published version (or a versioned tensor's own id) is never lent
    // writable: the data plane and WriteRegion refuse it alike.
    RETURN_IF_ERROR(
        SendError(fd,
                  ReadOnlyVersionError(request.request().tensor_id(),
                                       "WriteRegion over the local path"),
                  deadline));
    return nullptr;
  }
  v1::LocalFetchReply reply;
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

  // The descriptor lent: the storage's read-only one, or `lent_file`.
  int lent_fd = -1;
  UniqueFd lent_file;
  absl::Status shareable;
  const bool write = request.write();
  *lent_writable = write;
  if (write && !may_write) {
    shareable = absl::FailedPreconditionError(
        options_.accept_writes
            ? "memory is lent writable to processes of the server's own "
              "user only"
            : "this server takes no writes over the local path");
  } else if (write &&
             !(storage.device().is_cpu() && storage.shared_memory_fd() >= 0 &&
               view.is_contiguous())) {
    shareable = absl::FailedPreconditionError(
        "only a box that is one dense run of a shared memory file can be "
        "written over the local path");
  } else if (write) {  // A dense run of a memory file (checked above).
    // A description of its own, read-write (readers get the storage's
    // read-only one: they can map the pages but not write them).
    absl::StatusOr<int> reopened = storage.ReopenMemoryFile(/*writable=*/true);
    shareable = reopened.status();
    if (reopened.ok()) {
      lent_file = UniqueFd(*reopened);
      lent_fd = lent_file.get();
      reply.set_transport(v1::LOCAL_TRANSPORT_SHM);
    }
  } else if (storage.device().is_cpu() && storage.shared_memory_fd() >= 0) {
    // Readers share the storage's one read-only description (no path walk
    // per lease): what a reader does to it (its offset, its flags) touches
    // no other reader's mapping, and the daemon never reads through it.
    absl::StatusOr<int> read_only = storage.ReadOnlyMemoryFd();
    shareable = read_only.status();
    if (read_only.ok()) {
      lent_fd = *read_only;
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
    RETURN_IF_ERROR(SendError(fd,
                              absl::FailedPreconditionError(absl::StrCat(
                                  "shard ", request.request().shard_index(),
                                  " of tensor ", request.request().tensor_id(),
                                  " cannot be shared: ", shareable.message())),
                              deadline));
    return nullptr;
  }
  // Counted before the client can see the reply; Serve ends the count.
  active_leases_.fetch_add(1);
  // The kernel duplicates the descriptor into the message; a writable one
  // closes here when `lent_file` goes.
  const absl::Status sent =
      SendLocalMessage(fd, reply.SerializeAsString(), deadline, lent_fd);
  if (!sent.ok()) {
    active_leases_.fetch_sub(1);
    return sent;
  }
  return lent;
}

void LocalPathServer::Shutdown(absl::Duration grace) {
  if (connections_ != nullptr) connections_->Shutdown(grace);
}

}  // namespace tessera
