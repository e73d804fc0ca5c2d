#include "client/local_path.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/region_transfer.h"
#include "common/int_math.h"
#include "common/proto_convert.h"
#include "common/status_macros.h"
#include "common/tensor/cuda_util.h"
#include "common/tensor/tensor.h"
#include "io/errno.h"
#include "io/file.h"
#include "io/mapping_cache.h"
#include "io/unix_socket.h"
#include "tessera/v1/local.pb.h"
#include "wire/chunk_codec.h"
#include "wire/fork_guard.h"
#include "wire/grpc_status.h"

#if defined(TESSERA_WITH_CUDA) && TESSERA_WITH_CUDA
#include <cuda_runtime_api.h>
#define TESSERA_LOCAL_PATH_CUDA 1
#else
#define TESSERA_LOCAL_PATH_CUDA 0
#endif

namespace tessera {
namespace {

LocalAttempt FallBack(absl::Status status) {
  return LocalAttempt{std::move(status), true};
}

LocalAttempt Final(absl::Status status) {
  return LocalAttempt{std::move(status), false};
}

// A transport failure: worth a stream, unless the time is up.
LocalAttempt TransportFailure(absl::Status status) {
  if (absl::IsDeadlineExceeded(status)) return Final(std::move(status));
  return FallBack(std::move(status));
}

std::string FetchName(const v1::FetchShardRequest& request) {
  return absl::StrCat("shard ", request.shard_index(), " of tensor ",
                      request.tensor_id());
}

// The view's layout, checked against the header: its element offset and
// the byte range [first, end) of the allocation it spans.
struct CheckedLayout {
  int64_t offset = 0;  // In elements.
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int64_t first_byte = 0;
  int64_t end_byte = 0;
};

absl::StatusOr<CheckedLayout> CheckLayout(const v1::LocalFetchReply& reply,
                                          DType dtype) {
  const v1::LocalLayout& layout = reply.layout();
  const int64_t width = static_cast<int64_t>(ElementSize(dtype));
  CheckedLayout checked;
  checked.sizes.assign(layout.sizes().begin(), layout.sizes().end());
  checked.strides.assign(layout.strides().begin(), layout.strides().end());
  const std::vector<int64_t> header_sizes(reply.header().sizes().begin(),
                                          reply.header().sizes().end());
  if (checked.sizes != header_sizes ||
      checked.strides.size() != checked.sizes.size() ||
      layout.offset_bytes() < 0 || layout.offset_bytes() % width != 0 ||
      layout.storage_bytes() < 0) {
    return absl::DataLossError("malformed layout");
  }
  checked.offset = layout.offset_bytes() / width;
  int64_t last = checked.offset;
  bool overflow = false;
  for (size_t d = 0; d < checked.sizes.size(); ++d) {
    if (checked.sizes[d] <= 0 || checked.strides[d] < 0) {
      return absl::DataLossError("malformed layout");
    }
    int64_t span;
    overflow |= __builtin_mul_overflow(checked.sizes[d] - 1, checked.strides[d],
                                       &span) ||
                __builtin_add_overflow(last, span, &last);
  }
  int64_t end;
  overflow |= __builtin_add_overflow(last, int64_t{1}, &end) ||
              __builtin_mul_overflow(end, width, &end);
  if (overflow || end > layout.storage_bytes()) {
    return absl::DataLossError("layout leaves the shared allocation");
  }
  checked.first_byte = layout.offset_bytes();
  checked.end_byte = end;
  return checked;
}

// The size of a page of virtual memory.
int64_t PageBytes() {
  const long page_size = sysconf(_SC_PAGESIZE);
  return page_size > 0 ? page_size : 4096;
}

// The fstat of memory file `fd` when it may be mapped for a view ending at
// byte `end_byte`: sealed against shrinking (pages past a file's end would
// fault with SIGBUS when touched; the seal keeps the owner from shrinking
// it after this check) and at least that long.
absl::StatusOr<struct stat> CheckLentFile(int fd, int64_t end_byte) {
  struct stat info;
  if (fstat(fd, &info) != 0) {
    return ErrnoError(errno, "fstat", absl::StatusCode::kUnavailable);
  }
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    return absl::FailedPreconditionError("memory file is not sealed");
  }
  if (info.st_size < end_byte) {
    return absl::DataLossError(
        absl::StrCat("memory file of ", info.st_size,
                     " bytes is shorter than the view's ", end_byte));
  }
  return info;
}

// MADV_POPULATE_READ (Linux 5.14), named here for C libraries that
// predate it; an older kernel refuses it with EINVAL (the pages are then
// filled as they are touched).
#ifdef MADV_POPULATE_READ
constexpr int kPopulateRead = MADV_POPULATE_READ;
#else
constexpr int kPopulateRead = 22;
#endif

// A writable mapping of all of memory file `fd` (lent writable, at least
// `end_byte` long), the one `mappings` kept from an earlier write lease of
// the same file when there is one: a small write then costs no mmap,
// munmap or page-table fill (4-64 KiB boxes took 31-59 us mapped and
// unmapped per lease). Writers go around it by pwrite until filling its
// page tables pays (WriteIntoMappedRun).
absl::StatusOr<std::shared_ptr<const MappedFile>> KeptWritableMapping(
    MappingCache& mappings, int fd, int64_t end_byte) {
  ASSIGN_OR_RETURN(const struct stat info, CheckLentFile(fd, end_byte));
  return mappings.Map(fd, info, end_byte, /*fresh=*/nullptr,
                      MappingCache::Access::kWrite);
}

// The view in memory file `fd`, through the mapping of the whole file
// that `mappings` keeps (made now, or for an earlier lease of the same
// file: its page tables are then filled already). With `populate`, the
// page tables of the view's bytes in a new mapping are filled at once
// rather than by faults.
absl::StatusOr<Tensor> KeptSharedView(MappingCache& mappings, int fd,
                                      const CheckedLayout& layout, DType dtype,
                                      bool populate) {
  ASSIGN_OR_RETURN(const struct stat info, CheckLentFile(fd, layout.end_byte));
  bool fresh = false;
  ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> mapping,
                   mappings.Map(fd, info, layout.end_byte, &fresh));
  char* const data = const_cast<char*>(mapping->data());
  if (fresh && populate && layout.end_byte > layout.first_byte) {
    const int64_t page = PageBytes();
    const int64_t start = layout.first_byte / page * page;
    (void)madvise(data + start, static_cast<size_t>(layout.end_byte - start),
                  kPopulateRead);
  }
  const size_t size = static_cast<size_t>(mapping->size());
  std::shared_ptr<Storage> storage = Storage::Wrap(
      data, size, Device::Cpu(),
      [mapping = std::move(mapping)]() mutable { mapping.reset(); });
  return Tensor::FromStorage(std::move(storage), dtype, layout.offset,
                             layout.sizes, layout.strides);
}

#if TESSERA_LOCAL_PATH_CUDA
// Opens the owner's device allocation and returns the view in it (the
// handle is closed when its storage goes).
absl::StatusOr<Tensor> OpenCudaView(const v1::LocalFetchReply& reply,
                                    const CheckedLayout& layout, DType dtype) {
  cudaIpcMemHandle_t handle;
  if (reply.cuda_ipc_handle().size() != sizeof(handle)) {
    return absl::DataLossError("malformed CUDA IPC handle");
  }
  std::memcpy(&handle, reply.cuda_ipc_handle().data(), sizeof(handle));
  const std::optional<int> device =
      CudaDeviceWithUuid(reply.cuda_device_uuid());
  if (!device.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the owner's GPU (its cuda:", reply.cuda_device(),
                     ") is not visible to this process"));
  }
  CudaDeviceGuard guard(*device);
  RETURN_IF_ERROR(guard.status());
  void* base = nullptr;
  // Fails (and the caller falls back) when the owner is this very process.
  RETURN_IF_ERROR(CudaStatus(
      cudaIpcOpenMemHandle(&base, handle, cudaIpcMemLazyEnablePeerAccess),
      "cudaIpcOpenMemHandle"));
  const int index = *device;
  std::shared_ptr<Storage> storage =
      Storage::Wrap(base, static_cast<size_t>(reply.layout().storage_bytes()),
                    Device::Cuda(index), [base, index] {
                      CudaDeviceGuard close_guard(index);
                      if (cudaIpcCloseMemHandle(base) != cudaSuccess)
                        cudaGetLastError();
                    });
  return Tensor::FromStorage(std::move(storage), dtype, layout.offset,
                             layout.sizes, layout.strides);
}
#endif  // TESSERA_LOCAL_PATH_CUDA

// Whether the view is one dense run of bytes, [first_byte, end_byte) in
// row-major order.
bool IsDense(const CheckedLayout& layout) {
  int64_t expected = 1;
  for (size_t d = layout.sizes.size(); d-- > 0;) {
    if (layout.sizes[d] != 1 && layout.strides[d] != expected) return false;
    expected *= layout.sizes[d];
  }
  return true;
}

// Copies of at least this many bytes per thread are split between
// several threads (up to kMaxCopyThreads, and the machine's cores), each
// its own range: one thread copying between a memory file and fresh pages
// is bound by the kernel's work per page rather than by memory bandwidth
// (2 threads: 0.62 -> 0.75x memcpy at 64 MiB on a 2-core box).
constexpr int64_t kParallelCopyBytes = 8 << 20;
constexpr int64_t kMaxCopyThreads = 4;

// MADV_POPULATE_WRITE (Linux 5.14), named here for C libraries that
// predate it; an older kernel refuses it with EINVAL.
#ifdef MADV_POPULATE_WRITE
constexpr int kPopulateWrite = MADV_POPULATE_WRITE;
#else
constexpr int kPopulateWrite = 23;
#endif

// How many threads CopyInPieces splits `size` bytes between. The cores
// are counted once: the C library reads sysfs for them (3 system calls),
// and a small local read asked twice (6 of its 14 system calls).
int64_t CopyThreads(int64_t size) {
  static const int64_t cores =
      std::max<int64_t>(1, std::thread::hardware_concurrency());
  return std::clamp<int64_t>(size / kParallelCopyBytes, 1,
                             std::min(kMaxCopyThreads, cores));
}

// copy(begin, length) over [0, size), in pieces copied at once when the
// range is large. The error of the first failed piece, or OK.
absl::Status CopyInPieces(
    int64_t size, const std::function<absl::Status(int64_t, int64_t)>& copy) {
  const int64_t threads = CopyThreads(size);
  const int64_t piece = CeilDiv(size, threads);
  return RunInParallel(static_cast<size_t>(threads), static_cast<int>(threads),
                       [&](size_t k) -> absl::Status {
                         const int64_t begin = static_cast<int64_t>(k) * piece;
                         const int64_t length = std::min(piece, size - begin);
                         if (length <= 0) return absl::OkStatus();
                         return copy(begin, length);
                       });
}

// How many times its size a writable mapping takes by pwrite(2) before
// its page tables are filled (ski rental: pay rent until the rent paid
// would have bought the thing). Filling page tables is what a write into
// a memory file through a new mapping mostly costs, above all on a VM
// whose page tables the hypervisor shadows: on a 2-core one, 28 MiB of
// fresh pages took 33-62 ms populated and copied with memcpy against
// 8-10 ms by pwrite, which copies through the kernel's own mapping; into
// pages written before, pwrite took 6-9 ms and memcpy through a filled
// mapping 1-2 ms, once a 55-70 ms fill was paid. A 112 MiB state dict
// written over 4 daemons: 37-44 ms by pwrite, 27-30 ms through filled
// mappings, 150-230 ms while filling them. A write every step through a
// mapping kept that long (io/mapping_cache.h) pays for the fill after
// about 16; a first write, or one after the mapping expired, never does.
constexpr int64_t kWritesAroundBeforeFilling = 16;

// Writes `size` bytes from `from` into the run of memory file `fd` that
// starts at byte `first_byte`, mapped writable by `mapping`, in pieces
// copied by CopyInPieces' threads. Until the mapping took
// kWritesAroundBeforeFilling times its size around it, each piece is
// written around it (MemoryWriteAll: by pwrite, or through a pipe where
// the kernel's first read of a page is dear; eight new 16 MiB tensors,
// their pages never read by the kernel, took 176-216 ms by pwrite and
// 56-89 ms through the pipe on a 2-core VM), its page tables unfilled;
// from then on each thread first fills the page tables of its piece for
// writing (MADV_POPULATE_WRITE), then copies it with memcpy. A piece whose
// pages cannot be populated (a kernel before 5.14, memory that cannot be
// had) is written around it too, which reports such failures as errors where
// a fault would raise SIGBUS. The error of the first piece that failed,
// or OK.
absl::Status WriteIntoMappedRun(const char* from, int fd, int64_t first_byte,
                                const MappedFile& mapping, int64_t size) {
  const uintptr_t page = static_cast<uintptr_t>(PageBytes());
  char* const to = mapping.writable_data() + first_byte;
  const bool fill =
      mapping.copied_around() >= kWritesAroundBeforeFilling * mapping.size();
  return CopyInPieces(size, [&](int64_t begin, int64_t length) {
    const uintptr_t start =
        reinterpret_cast<uintptr_t>(to + begin) / page * page;
    const uintptr_t end = reinterpret_cast<uintptr_t>(to + begin + length);
    if (fill && madvise(reinterpret_cast<void*>(start), end - start,
                        kPopulateWrite) == 0) {
      std::memcpy(to + begin, from + begin, static_cast<size_t>(length));
      return absl::OkStatus();
    }
    if (!fill) mapping.AddCopiedAround(length);
    return MemoryWriteAll(fd, from + begin, static_cast<size_t>(length),
                          first_byte + begin, "the lent memory file");
  });
}

// How many times its size a read-only mapping gives by pread(2) before
// its page tables are filled. Reads are rented for less long than writes:
// a filled mapping reads much faster than pread, and a reader that comes
// back within the mapping's second of keep tends to come back again. On a
// 2-core VM: 256 MiB read in a loop took 30-40 ms by pread (6.6-9.2
// GB/s), about 90 ms while filling and 10-12 ms through a filled mapping
// (21-26 GB/s); a read plan of a 112 MiB state dict from 4 daemons ran
// in 21-24 ms by pread, 14-17 ms through filled mappings and 193 ms while
// filling them. A read that finds its mapping expired (a weight-sync
// reader that runs its plan every few seconds) never fills it: that plan
// took 24-30 ms by pread against 71-80 ms filling each time.
constexpr int64_t kReadsAroundBeforeFilling = 2;

// Reads the dense run of memory file `fd` (lent for reading, at least
// `layout.end_byte` long) that `layout` describes into `destination`, one
// contiguous block of host memory of as many bytes, in pieces read by
// CopyInPieces' threads. Until the mapping `mappings` keeps of the file
// gave kReadsAroundBeforeFilling times its size around it, each piece is
// read with pread; from then on it is copied with memcpy through the
// mapping, whose page tables the copy fills by faulting (a read fault maps
// several pages of a memory file; populating every read's range first
// cost as much again once they were filled). UNAVAILABLE or
// INVALID_ARGUMENT when the file cannot be mapped (nothing read); an
// error of pread, or DATA_LOSS when the file ends early.
absl::Status ReadDenseRun(MappingCache& mappings, int fd,
                          const CheckedLayout& layout,
                          const Tensor& destination) {
  ASSIGN_OR_RETURN(const struct stat info, CheckLentFile(fd, layout.end_byte));
  ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> mapping,
                   mappings.Map(fd, info, layout.end_byte));
  const int64_t size = layout.end_byte - layout.first_byte;
  char* const to = static_cast<char*>(destination.data_ptr());
  if (mapping->copied_around() < kReadsAroundBeforeFilling * mapping->size()) {
    return CopyInPieces(
        size, [&](int64_t begin, int64_t length) -> absl::Status {
          mapping->AddCopiedAround(length);
          ASSIGN_OR_RETURN(
              const size_t got,
              PreadAll(fd, to + begin, static_cast<size_t>(length),
                       layout.first_byte + begin, "the lent memory file"));
          if (got != static_cast<size_t>(length)) {
            return absl::DataLossError(
                "the lent memory file ended before the shard's bytes");
          }
          return absl::OkStatus();
        });
  }
  const char* const from = mapping->data() + layout.first_byte;
  return CopyInPieces(size, [&](int64_t begin, int64_t length) {
    std::memcpy(to + begin, from + begin, static_cast<size_t>(length));
    return absl::OkStatus();
  });
}

// The view the reply lends: a mapping of `fd` (SHM) or an opened IPC
// handle (CUDA_IPC).
absl::StatusOr<Tensor> LentView(MappingCache& mappings,
                                const v1::LocalFetchReply& reply, int fd,
                                const CheckedLayout& layout, DType dtype,
                                bool populate) {
  switch (reply.transport()) {
    case v1::LOCAL_TRANSPORT_SHM:
      if (fd < 0) return absl::DataLossError("no memory file attached");
      return KeptSharedView(mappings, fd, layout, dtype, populate);
    case v1::LOCAL_TRANSPORT_CUDA_IPC:
#if TESSERA_LOCAL_PATH_CUDA
      return OpenCudaView(reply, layout, dtype);
#else
      return absl::FailedPreconditionError("built without CUDA");
#endif
    default:
      return absl::DataLossError(
          absl::StrCat("unknown transport ", reply.transport()));
  }
}

// Waits for the copies this thread issued on the default stream: a
// device-to-device cudaMemcpy may return before it has run, and the lent
// memory must not be released (nor the fetch reported done) before.
absl::Status AwaitCopies() {
#if TESSERA_LOCAL_PATH_CUDA
  return CudaStatus(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize");
#else
  return absl::OkStatus();
#endif
}

// Whether an error of the assembler is about the request (final) rather
// than about the copy from lent memory (worth a stream).
bool IsFinalAssemblerError(const absl::Status& status) {
  return absl::IsInvalidArgument(status) || absl::IsDataLoss(status) ||
         absl::IsOutOfRange(status) || absl::IsNotFound(status);
}

}  // namespace

LocalPathClient::LocalPathClient(std::string local_address)
    : address_(std::move(local_address)) {
  absl::StatusOr<std::pair<std::string, std::string>> parsed =
      ParseLocalAddress(address_);
  if (!parsed.ok()) {
    unusable_ = std::string(parsed.status().message());
  } else if (HostId().empty()) {
    unusable_ = "this host's boot id cannot be read";
  } else if (parsed->first != HostId()) {
    unusable_ = absl::StrCat("the owner runs on another host (host id ",
                             parsed->first, ", ours ", HostId(), ")");
  } else {
    socket_name_ = std::move(parsed->second);
    same_host_ = true;
  }
}

LocalPathClient::~LocalPathClient() = default;

absl::StatusOr<UniqueFd> LocalPathClient::TakeConnection(absl::Time deadline,
                                                         bool reuse,
                                                         bool* pooled) const {
  *pooled = false;
  // Pooled connections may be the parent's (wire/fork_guard.h).
  RETURN_IF_ERROR(CheckNotForkedAfterGrpc(
      absl::StrCat("connecting to local path ", socket_name_)));
  if (reuse) {
    absl::MutexLock lock(&mu_);
    if (!idle_.empty()) {
      UniqueFd socket = std::move(idle_.back());
      idle_.pop_back();
      *pooled = true;
      return socket;
    }
  }
  absl::StatusOr<UniqueFd> socket = ConnectLocal(socket_name_, deadline);
  absl::Status greeted = socket.status();
  if (socket.ok()) {
    greeted = SendLocalMessage(socket->get(), kLocalMagic, deadline);
  }
  if (!greeted.ok()) {
    absl::MutexLock lock(&mu_);
    retry_after_ = absl::Now() + kRetryAfterConnectFailure;
    return greeted;
  }
  return socket;
}

void LocalPathClient::ReturnConnection(UniqueFd socket) const {
  absl::MutexLock lock(&mu_);
  idle_.push_back(std::move(socket));
}

void LocalPathClient::DropIdleConnections() const {
  std::vector<UniqueFd> closing;
  absl::MutexLock lock(&mu_);
  closing.swap(idle_);
}

LocalAttempt LocalPathClient::Fetch(const v1::FetchShardRequest& request,
                                    absl::Time deadline,
                                    bool skip_after_failure,
                                    ShardAssembler* assembler) const {
  if (absl::Status usable = Usable(skip_after_failure); !usable.ok()) {
    return FallBack(usable);
  }
  v1::LocalFetchRequest local_request;
  *local_request.mutable_request() = request;
  local_request.set_accept_cuda_ipc(TESSERA_LOCAL_PATH_CUDA && CudaAvailable());
  const std::string serialized = local_request.SerializeAsString();
  const std::string what =
      absl::StrCat("fetching ", FetchName(request), " over the local path");

  Answer answer;
  LocalAttempt outcome;
  if (!Ask(serialized, deadline, assembler->cancel(), what, &answer,
           &outcome)) {
    return Cancelled(assembler->cancel()) ? Final(assembler->CheckCancel())
                                          : outcome;
  }
  const v1::LocalFetchReply& reply = answer.reply;
  UniqueFd& attached = answer.attached;
  const bool leased = reply.transport() != v1::LOCAL_TRANSPORT_NONE;
  // The lent memory could not be reached (worth a stream).
  absl::Status unreachable;
  absl::Status copied;
  absl::StatusOr<DType> dtype = FromProto(reply.header().dtype());
  // Nothing lent: nothing to copy, unless the header says otherwise.
  absl::StatusOr<CheckedLayout> layout = CheckedLayout();
  if (!dtype.ok()) {
    layout = dtype.status();
  } else if (leased) {
    layout = CheckLayout(reply, *dtype);
  } else if (reply.header().total_bytes() != 0) {
    layout = absl::DataLossError("no transport for a non-empty shard");
  }
  if (!layout.ok()) unreachable = Annotate(layout.status(), what);
  auto fill = [&](const Tensor& destination) -> absl::Status {
    if (!leased) return absl::OkStatus();  // No bytes.
    // A dense run of the memory file into one block of host memory:
    // read around the mapping kept of the file, or through it once filled
    // (ReadDenseRun). Anything else through a mapping of the file kept
    // from an earlier lease, or a new one (io/mapping_cache.h), populated
    // at once when one thread copies out of it (1 MiB: 225-229 us
    // populated, 249-266 faulted in).
    const bool dense = reply.transport() == v1::LOCAL_TRANSPORT_SHM &&
                       attached.valid() && IsDense(*layout) &&
                       destination.device().is_cpu() &&
                       destination.is_contiguous() &&
                       static_cast<int64_t>(destination.nbytes()) ==
                           layout->end_byte - layout->first_byte;
    if (dense) {
      const absl::Status read =
          ReadDenseRun(mappings_, attached.get(), *layout, destination);
      if (!read.ok()) unreachable = Annotate(read, what);
      return unreachable;
    }
    const bool populate =
        CopyThreads(layout->end_byte - layout->first_byte) == 1;
    absl::StatusOr<Tensor> view =
        LentView(mappings_, reply, attached.get(), *layout, *dtype, populate);
    if (!view.ok()) {
      unreachable = Annotate(view.status(), what);
      return unreachable;
    }
    // The view goes on return, before "done" lets the owner free the
    // memory: an IPC handle is closed then; a mapping stays kept for the
    // next lease of its file, for a short while (io/mapping_cache.h).
    RETURN_IF_ERROR(CopyInto(*view, destination));
    return view->device().is_cuda() ? AwaitCopies() : absl::OkStatus();
  };
  if (unreachable.ok()) copied = assembler->FillFrom(reply.header(), fill);
  // Closes the lent file, then lets the owner go.
  EndLease(std::move(answer), deadline);
  if (!unreachable.ok()) return FallBack(unreachable);
  if (copied.ok() || IsFinalAssemblerError(copied) ||
      absl::IsDeadlineExceeded(copied)) {
    return Final(copied);
  }
  return FallBack(copied);
}

absl::Status LocalPathClient::Usable(bool skip_after_failure) const {
  if (!same_host_) return absl::FailedPreconditionError(unusable_);
  if (skip_after_failure) {
    absl::MutexLock lock(&mu_);
    if (absl::Now() < retry_after_) {
      return absl::FailedPreconditionError(
          absl::StrCat("the owner's local socket ", socket_name_,
                       " could not be reached recently"));
    }
  }
  return absl::OkStatus();
}

bool LocalPathClient::Ask(const std::string& serialized, absl::Time deadline,
                          const std::shared_ptr<Cancellation>& cancel,
                          const std::string& what, Answer* answer,
                          LocalAttempt* outcome) const {
  // A pooled connection may have been closed by the server meanwhile (its
  // idle timeout); a fresh one is tried once before giving up.
  for (int attempt = 0;; ++attempt) {
    bool pooled = false;
    absl::StatusOr<UniqueFd> socket =
        TakeConnection(deadline, attempt == 0, &pooled);
    if (!socket.ok()) {
      *outcome = TransportFailure(Annotate(socket.status(), what));
      return false;
    }
    UniqueFd attached;
    // Cancelling interrupts the wait for a stalled owner's reply (the
    // socket is then not pooled again).
    Cancellation::Registration interrupt =
        OnCancel(cancel, [fd = socket->get()] { InterruptSocket(fd); });
    absl::Status sent = SendLocalMessage(socket->get(), serialized, deadline);
    absl::StatusOr<std::string> message =
        sent.ok() ? ReceiveLocalMessage(socket->get(), deadline, &attached)
                  : sent;
    interrupt.Reset();
    if (Cancelled(cancel)) {
      *outcome = Final(absl::CancelledError(
          absl::StrCat(what, ": cancelled by the caller")));
      return false;
    }
    if (!message.ok()) {
      if (pooled && absl::IsUnavailable(message.status())) {
        DropIdleConnections();
        continue;
      }
      *outcome = TransportFailure(Annotate(message.status(), what));
      return false;
    }
    v1::LocalFetchReply& reply = answer->reply;
    if (!reply.ParseFromString(*message) || reply.code() < 0 ||
        reply.code() > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
      *outcome = FallBack(
          absl::DataLossError(absl::StrCat(what, ": malformed reply")));
      return false;
    }
    if (reply.code() != 0) {
      const absl::Status verdict =
          Annotate(absl::Status(static_cast<absl::StatusCode>(reply.code()),
                                reply.message()),
                   what);
      // FAILED_PRECONDITION: the memory cannot be lent; UNAVAILABLE: the
      // server is stopping. A stream gives the authoritative answer for
      // both; the rest is the server's verdict on the request.
      if (absl::IsFailedPrecondition(verdict)) {
        ReturnConnection(*std::move(socket));
        *outcome = FallBack(verdict);
      } else if (absl::IsUnavailable(verdict)) {
        *outcome = FallBack(verdict);
      } else {
        ReturnConnection(*std::move(socket));
        *outcome = Final(verdict);
      }
      return false;
    }
    answer->socket = *std::move(socket);
    answer->attached = std::move(attached);
    return true;
  }
}

void LocalPathClient::EndLease(Answer answer, absl::Time deadline) const {
  answer.attached = UniqueFd();
  if (answer.reply.transport() != v1::LOCAL_TRANSPORT_NONE) {
    const char done = kLocalDone;
    if (!SendLocalMessage(answer.socket.get(), absl::string_view(&done, 1),
                          deadline)
             .ok()) {
      return;  // Closing the connection ends the lease as well.
    }
  }
  ReturnConnection(std::move(answer.socket));
}

LocalAttempt LocalPathClient::Write(
    const v1::FetchShardRequest& request, const Tensor& bytes,
    absl::Time deadline, const std::shared_ptr<Cancellation>& cancel) const {
  if (absl::Status usable = Usable(/*skip_after_failure=*/true); !usable.ok()) {
    return FallBack(usable);
  }
  if (!bytes.device().is_cpu() || !bytes.is_contiguous()) {
    return FallBack(absl::FailedPreconditionError(
        "only contiguous host bytes are written over the local path"));
  }
  v1::LocalFetchRequest local_request;
  *local_request.mutable_request() = request;
  local_request.set_write(true);
  const std::string what =
      absl::StrCat("writing ", FetchName(request), " over the local path");
  Answer answer;
  LocalAttempt outcome;
  if (!Ask(local_request.SerializeAsString(), deadline, cancel, what, &answer,
           &outcome)) {
    return outcome;
  }
  const v1::LocalFetchReply& reply = answer.reply;
  const int64_t total = static_cast<int64_t>(bytes.nbytes());
  absl::Status written;
  bool began = false;  // Once the copy began, the box may have changed.
  absl::StatusOr<DType> dtype = FromProto(reply.header().dtype());
  if (!dtype.ok() || *dtype != bytes.dtype() ||
      reply.header().total_bytes() != total) {
    // The owner validated the box; a reply that disagrees is broken.
    written = absl::DataLossError(
        absl::StrCat(what, ": the owner's reply does not describe the box"));
  } else if (total > 0) {
    absl::StatusOr<CheckedLayout> layout = CheckLayout(reply, *dtype);
    if (!layout.ok()) {
      written = Annotate(layout.status(), what);
    } else if (reply.transport() != v1::LOCAL_TRANSPORT_SHM ||
               !answer.attached.valid() || !IsDense(*layout) ||
               layout->end_byte - layout->first_byte != total) {
      written = absl::DataLossError(
          absl::StrCat(what, ": the owner lent no dense memory file run"));
    } else {
      const int fd = answer.attached.get();
      absl::StatusOr<std::shared_ptr<const MappedFile>> mapping =
          KeptWritableMapping(mappings_, fd, layout->end_byte);
      if (!mapping.ok()) {
        written = Annotate(mapping.status(), what);  // Nothing written yet.
      } else {
        began = true;
        written = WriteIntoMappedRun(static_cast<const char*>(bytes.data_ptr()),
                                     fd, layout->first_byte, **mapping, total);
        if (!written.ok()) {
          written = Annotate(
              written, absl::StrCat(what, " (the box may be partly written)"));
        }
      }
    }
  }
  EndLease(std::move(answer), deadline);
  // Until the copy began nothing was written: a stream may still take it.
  return began || written.ok() ? Final(written) : FallBack(written);
}

}  // namespace tessera
