#include "common/tensor/storage.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <deque>
#include <limits>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/tensor/cuda_util.h"
#include "common/tensor/tensor.h"
#include "common/tensor/tensor_internal.h"

#if defined(__SANITIZE_ADDRESS__)
#define TESSERA_STORAGE_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TESSERA_STORAGE_ASAN 1
#endif
#endif
#ifndef TESSERA_STORAGE_ASAN
#define TESSERA_STORAGE_ASAN 0
#endif

namespace tessera {
using internal_tensor::CudaUnavailableError;
#if TESSERA_TENSOR_CUDA
using internal_tensor::CudaError;
#endif

namespace {

// Host allocations are aligned for any vector load.
constexpr size_t kHostAlignment = 64;
constexpr size_t kHugePageBytes = size_t{2} << 20;

std::string ErrnoText(int error) {
  return std::error_code(error, std::generic_category()).message();
}

// Rounds `n` up to a multiple of `alignment` (a power of two); false on
// overflow.
bool RoundUp(size_t n, size_t alignment, size_t* out) {
  if (n > std::numeric_limits<size_t>::max() - (alignment - 1)) return false;
  *out = (n + alignment - 1) & ~(alignment - 1);
  return true;
}

size_t PageSize() {
  const long page_size = sysconf(_SC_PAGESIZE);
  return page_size > 0 ? static_cast<size_t>(page_size) : 4096;
}

absl::Status HostAllocError(size_t nbytes, int error) {
  return absl::ResourceExhaustedError(absl::StrCat(
      "Cannot allocate ", nbytes, " bytes of host memory: ", ErrnoText(error)));
}

// Host buffers freed recently, kept for the next allocation of the same
// rounded size. Two kinds are kept, each in a cache of its own:
// - large heap buffers (HostBufferCache::Heap()): a fresh one pays a page
//   fault and the kernel's zeroing for every page (tests/bench/alloc_bench:
//   fresh private memory fills at 6-13 GB/s, a reused buffer at 10-27), and
//   fetches, gathers and staging allocate the same sizes over and over;
//   TESSERA_HOST_CACHE_BYTES, default 256 MiB;
// - pinned buffers from cudaHostAlloc (HostBufferCache::Pinned()), the
//   staging buffers of every transfer to or from a GPU: pinning costs the
//   driver far more than the copy through the buffer (a cudaHostAlloc of a
//   few MiB takes milliseconds) and cudaFreeHost synchronizes the device;
//   TESSERA_PINNED_CACHE_BYTES, default 256 MiB. Whoever frees a pinned
//   buffer has waited for the copies that use it (ChunkSource and
//   ShardAssembler do), as cudaFreeHost would have made it.
// Bounded per process: at most `capacity` bytes in all (0 under
// AddressSanitizer by default; 0 turns a cache off), the least recently
// freed going first; one buffer may take all of it (a loop of
// `x = shard.to_here()` over a 256 MiB shard allocates each result while
// the previous one lives, then frees that one: the next result takes it,
// instead of faulting 256 MiB of fresh pages in again). A reused buffer holds
// whatever its last tensor left there (Empty promises nothing; Zeros and
// the fills write every byte). Thread-safe; never destroyed (storages may
// outlive static destructors).
class HostBufferCache {
 public:
  using Free = void (*)(void* data);

  static HostBufferCache& Heap() {
    static HostBufferCache* const cache =
        new HostBufferCache(CapacityFromEnv("TESSERA_HOST_CACHE_BYTES"),
                            [](void* data) { free(data); });
    return *cache;
  }
#if TESSERA_TENSOR_CUDA
  static HostBufferCache& Pinned() {
    static HostBufferCache* const cache = new HostBufferCache(
        CapacityFromEnv("TESSERA_PINNED_CACHE_BYTES"), [](void* data) {
          if (cudaFreeHost(data) != cudaSuccess) cudaGetLastError();
        });
    return *cache;
  }
#endif

  // A kept buffer of exactly `rounded` bytes (the most recently freed), or
  // null.
  void* Take(size_t rounded) {
    absl::MutexLock lock(&mu_);
    for (auto it = kept_.rbegin(); it != kept_.rend(); ++it) {
      if (it->first != rounded) continue;
      void* data = it->second;
      kept_bytes_ -= rounded;
      kept_.erase(std::next(it).base());
      return data;
    }
    return nullptr;
  }

  // Keeps `data` (`rounded` bytes, from this cache's allocator) or frees
  // it; frees the oldest kept buffers beyond the capacity.
  void Release(void* data, size_t rounded) {
    if (rounded > capacity_) {
      free_(data);
      return;
    }
    std::vector<void*> evicted;
    {
      absl::MutexLock lock(&mu_);
      kept_.emplace_back(rounded, data);
      kept_bytes_ += rounded;
      while (kept_bytes_ > capacity_) {
        kept_bytes_ -= kept_.front().first;
        evicted.push_back(kept_.front().second);
        kept_.pop_front();
      }
    }
    for (void* old : evicted) free_(old);
  }

 private:
  HostBufferCache(size_t capacity, Free free)
      : capacity_(capacity), free_(free) {}

  static size_t CapacityFromEnv(const char* variable) {
#if TESSERA_STORAGE_ASAN
    // Reuse would hide a use after free from AddressSanitizer.
    constexpr size_t kDefault = 0;
#else
    constexpr size_t kDefault = size_t{256} << 20;
#endif
    const char* text = std::getenv(variable);
    if (text == nullptr || *text == '\0') return kDefault;
    char* end = nullptr;
    const unsigned long long value = std::strtoull(text, &end, 10);
    if (end == text || *end != '\0' || text[0] == '-') return kDefault;
    return static_cast<size_t>(value);
  }

  const size_t capacity_;
  const Free free_;
  absl::Mutex mu_;
  // Oldest first.
  std::deque<std::pair<size_t, void*>> kept_ ABSL_GUARDED_BY(mu_);
  size_t kept_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

// ---- Storage
// -------------------------------------------------------------------

namespace {

// Shareable host memory (SetHostMemorySharing): the threshold (-1 while
// off), the descriptors shared storages hold (each its memory file, and
// the read-only one once lent: Storage::ReadOnlyMemoryFd) and how many
// they may hold.
std::atomic<int64_t> g_sharing_min_bytes{-1};
std::atomic<int64_t> g_shared_storages{0};
std::atomic<int64_t> g_shared_storage_limit{0};

// Maps `rounded` bytes (a multiple of the page size) of a new sealed
// memory file; null (and no descriptor spent) when any step fails, for the
// caller to fall back to the heap.
void* MapSharedMemory(size_t rounded, int* fd_out) {
  if (g_shared_storages.fetch_add(1) >= g_shared_storage_limit.load()) {
    g_shared_storages.fetch_sub(1);
    return nullptr;
  }
  const int fd =
      memfd_create("tessera-storage", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  void* data = MAP_FAILED;
  if (fd >= 0 && ftruncate(fd, static_cast<off_t>(rounded)) == 0 &&
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0) {
    data = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  if (data != MAP_FAILED && rounded >= kHugePageBytes) {
    madvise(data, rounded, MADV_HUGEPAGE);  // Advice only.
  }
  if (data == MAP_FAILED) {
    if (fd >= 0) close(fd);
    g_shared_storages.fetch_sub(1);
    return nullptr;
  }
  *fd_out = fd;
  return data;
}

}  // namespace

void SetHostMemorySharing(int64_t min_bytes) {
  struct rlimit rlim;
  int64_t limit = int64_t{1} << 20;
  if (getrlimit(RLIMIT_NOFILE, &rlim) == 0 && rlim.rlim_cur != RLIM_INFINITY) {
    limit = static_cast<int64_t>(rlim.rlim_cur / 2);
  }
  g_shared_storage_limit.store(limit);
  g_sharing_min_bytes.store(std::max<int64_t>(min_bytes, 1));
}

void DisableHostMemorySharing() { g_sharing_min_bytes.store(-1); }

std::optional<int64_t> HostMemorySharingMinBytes() {
  const int64_t min_bytes = g_sharing_min_bytes.load();
  if (min_bytes < 0) return std::nullopt;
  return min_bytes;
}

std::shared_ptr<Storage> Storage::Wrap(void* data, size_t nbytes, Device device,
                                       std::function<void()> release) {
  std::shared_ptr<Storage> storage(
      new Storage(data, nbytes, device, false, Allocator::kForeign));
  storage->release_ = std::move(release);
  return storage;
}

absl::StatusOr<std::shared_ptr<Storage>> Storage::Allocate(
    size_t nbytes, Device device, bool pinned, HostSharing sharing) {
  if (pinned && !device.is_cpu()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Only CPU memory can be pinned, got device ", device.ToString()));
  }
  if (device.is_meta()) {
    return std::shared_ptr<Storage>(
        new Storage(nullptr, nbytes, device, false, Allocator::kNone));
  }
  if (device.is_cuda()) {
#if TESSERA_TENSOR_CUDA
    const int count = CudaDeviceCount();
    if (count == 0) return CudaUnavailableError();
    int index = 0;
    if (device.index().has_value()) {
      index = *device.index();
      if (index >= count) {
        return absl::InvalidArgumentError(
            absl::StrCat("Invalid CUDA device index ", index, ": ", count,
                         " device(s) visible"));
      }
    } else {
      const cudaError_t error = cudaGetDevice(&index);
      if (error != cudaSuccess) return CudaError("cudaGetDevice", error);
    }
    const Device resolved = Device::Cuda(index);
    if (nbytes == 0) {
      return std::shared_ptr<Storage>(
          new Storage(nullptr, 0, resolved, false, Allocator::kNone));
    }
    CudaDeviceGuard guard(index);
    if (!guard.status().ok()) return guard.status();
    void* data = nullptr;
    const cudaError_t error = cudaMalloc(&data, nbytes);
    if (error != cudaSuccess) {
      return CudaError(absl::StrCat("cudaMalloc of ", nbytes, " bytes on ",
                                    resolved.ToString()),
                       error);
    }
    return std::shared_ptr<Storage>(
        new Storage(data, nbytes, resolved, false, Allocator::kCudaDevice));
#else
    return CudaUnavailableError();
#endif
  }

  // The CPU. Zero bytes need no allocation (and aligned allocators may
  // return null for them, which is not an error).
  if (nbytes == 0) {
    return std::shared_ptr<Storage>(
        new Storage(nullptr, 0, device, pinned, Allocator::kNone));
  }
  if (!pinned) {
    const int64_t share_min_bytes = g_sharing_min_bytes.load();
    size_t page_rounded;
    if (sharing == HostSharing::kIfEnabled && share_min_bytes >= 0 &&
        nbytes >= static_cast<uint64_t>(share_min_bytes) &&
        RoundUp(nbytes, PageSize(), &page_rounded)) {
      int fd = -1;
      // Page-aligned, so 64-byte aligned too.
      if (void* data = MapSharedMemory(page_rounded, &fd); data != nullptr) {
        std::shared_ptr<Storage> storage(
            new Storage(data, nbytes, device, false, Allocator::kSharedMemory));
        storage->shared_memory_fd_ = fd;
        return storage;
      }
    }
    size_t rounded;
    if (!RoundUp(nbytes, kHostAlignment, &rounded)) {
      return HostAllocError(nbytes, ENOMEM);
    }
    // Large buffers are aligned to and advised as huge pages: first touch
    // of a fresh 64 MiB shard then costs 32 page faults instead of 16384
    // (a fetched shard is written once, right after allocation).
    const bool huge = rounded >= kHugePageBytes;
    void* data = huge ? HostBufferCache::Heap().Take(rounded) : nullptr;
    if (data == nullptr) {
      const int error = posix_memalign(
          &data, huge ? kHugePageBytes : kHostAlignment, rounded);
      if (error != 0) return HostAllocError(nbytes, error);
      if (huge) madvise(data, rounded, MADV_HUGEPAGE);  // Advice only.
    }
    return std::shared_ptr<Storage>(
        new Storage(data, nbytes, device, false, Allocator::kHeap));
  }
#if TESSERA_TENSOR_CUDA
  if (CudaAvailable()) {
    // Whole pages, so that buffers of nearly the same size are reused.
    size_t rounded;
    if (!RoundUp(nbytes, PageSize(), &rounded)) {
      return HostAllocError(nbytes, ENOMEM);
    }
    void* data = HostBufferCache::Pinned().Take(rounded);
    const cudaError_t error =
        data != nullptr ? cudaSuccess
                        : cudaHostAlloc(&data, rounded, cudaHostAllocPortable);
    if (error != cudaSuccess) {
      cudaGetLastError();
      return absl::ResourceExhaustedError(absl::StrCat(
          "Cannot allocate ", nbytes, " bytes of pinned host memory: ",
          "cudaHostAlloc failed: ", cudaGetErrorString(error)));
    }
    return std::shared_ptr<Storage>(
        new Storage(data, nbytes, device, true, Allocator::kCudaHost));
  }
#endif
  // Without CUDA, page-lock whole pages of our own: munlock does not nest,
  // so two locked allocations must never share a page.
  const size_t page_size = PageSize();
  size_t rounded;
  if (!RoundUp(nbytes, page_size, &rounded)) {
    return HostAllocError(nbytes, ENOMEM);
  }
  void* data = nullptr;
  const int alloc_error = posix_memalign(&data, page_size, rounded);
  if (alloc_error != 0) return HostAllocError(nbytes, alloc_error);
  if (mlock(data, rounded) != 0) {
    const int error = errno;
    munlock(data, rounded);  // In case some pages were locked; harmless.
    free(data);
    std::string limit;
    struct rlimit rlim;
    if (getrlimit(RLIMIT_MEMLOCK, &rlim) == 0 &&
        rlim.rlim_cur != RLIM_INFINITY) {
      limit = absl::StrCat(" (RLIMIT_MEMLOCK is ", rlim.rlim_cur, " bytes)");
    }
    return absl::ResourceExhaustedError(absl::StrCat(
        "Cannot pin ", nbytes,
        " bytes of host memory: mlock: ", ErrnoText(error), limit));
  }
  return std::shared_ptr<Storage>(
      new Storage(data, nbytes, device, true, Allocator::kHeapLocked));
}

absl::StatusOr<int> Storage::ReadOnlyMemoryFd() const {
  if (const int kept = read_only_fd_.load(std::memory_order_acquire);
      kept >= 0) {
    return kept;
  }
  if (shared_memory_fd_ < 0) {
    return absl::FailedPreconditionError("the storage has no memory file");
  }
  // Counted with the memory files' own descriptors, so that shared
  // storages never take more than their share of the process's.
  if (g_shared_storages.fetch_add(1) >= g_shared_storage_limit.load()) {
    g_shared_storages.fetch_sub(1);
    return absl::FailedPreconditionError(
        "the process holds as many memory file descriptors as it may");
  }
  absl::StatusOr<int> opened = ReopenMemoryFile(/*writable=*/false);
  if (!opened.ok()) {
    g_shared_storages.fetch_sub(1);
    return opened.status();
  }
  // Two first callers at once: one description is kept, the other closed.
  int expected = -1;
  if (!read_only_fd_.compare_exchange_strong(expected, *opened,
                                             std::memory_order_acq_rel)) {
    close(*opened);
    g_shared_storages.fetch_sub(1);
    return expected;
  }
  return *opened;
}

absl::StatusOr<int> Storage::ReopenMemoryFile(bool writable) const {
  if (shared_memory_fd_ < 0) {
    return absl::FailedPreconditionError("the storage has no memory file");
  }
  const std::string path = absl::StrCat("/proc/self/fd/", shared_memory_fd_);
  const int opened =
      open(path.c_str(), (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
  if (opened < 0) {
    const int error = errno;
    return absl::FailedPreconditionError(absl::StrCat(
        "reopening its memory file ", writable ? "read-write" : "read-only",
        " failed: ", ErrnoText(error)));
  }
  return opened;
}

Storage::~Storage() {
  switch (allocator_) {
    case Allocator::kNone:
      break;
    case Allocator::kHeap: {
      // Allocate's rounding: large buffers may be kept for reuse.
      size_t rounded = nbytes_;
      RoundUp(nbytes_, kHostAlignment, &rounded);
      if (rounded >= kHugePageBytes) {
        HostBufferCache::Heap().Release(data_, rounded);
      } else {
        free(data_);
      }
      break;
    }
    case Allocator::kHeapLocked: {
      // Allocate locked whole pages; unlock the same range.
      size_t rounded = nbytes_;
      RoundUp(nbytes_, PageSize(), &rounded);
      munlock(data_, rounded);
      free(data_);
      break;
    }
    case Allocator::kSharedMemory: {
      size_t rounded = nbytes_;
      RoundUp(nbytes_, PageSize(), &rounded);
      // The pages go now, also where another process still maps the file
      // (a client keeps its mapping of a lent file for the next lease,
      // io/mapping_cache.h; a client may keep the descriptor it was lent):
      // this process's memory budget counts them as freed. Costs what the
      // last close would.
      (void)fallocate(shared_memory_fd_,
                      FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
                      static_cast<off_t>(rounded));
      munmap(data_, rounded);
      if (const int read_only = read_only_fd_.load(); read_only >= 0) {
        close(read_only);
        g_shared_storages.fetch_sub(1);
      }
      close(shared_memory_fd_);
      g_shared_storages.fetch_sub(1);
      break;
    }
    case Allocator::kForeign:
      if (release_) release_();
      break;
    case Allocator::kCudaHost:
#if TESSERA_TENSOR_CUDA
    {
      // Allocate's rounding.
      size_t rounded = nbytes_;
      RoundUp(nbytes_, PageSize(), &rounded);
      HostBufferCache::Pinned().Release(data_, rounded);
    }
#endif
    break;
    case Allocator::kCudaDevice:
#if TESSERA_TENSOR_CUDA
    {
      // Errors here (e.g. the runtime unloading at exit) cannot be
      // reported; the memory goes with the context.
      CudaDeviceGuard guard(device_.index().value_or(0));
      if (cudaFree(data_) != cudaSuccess) cudaGetLastError();
    }
#endif
    break;
  }
}

// ---- CUDA availability
// ---------------------------------------------------------

int CudaDeviceCount() {
#if TESSERA_TENSOR_CUDA
  // Cached: the visible devices cannot change once the runtime initialised.
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return n;
  }();
  return count;
#else
  return 0;
#endif
}

bool CudaAvailable() { return CudaDeviceCount() > 0; }

}  // namespace tessera
