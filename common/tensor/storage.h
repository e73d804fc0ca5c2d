// Storage: one allocation of host memory (pageable, pinned or shareable),
// CUDA device memory, or none (meta), freed by the allocator that made it;
// the process-wide switch for shareable host memory; whether CUDA devices
// are visible.
//
// Thread-safety: a Storage does not change after creation (its bytes are
// its users' to synchronise) but for its reuse flag, which is atomic; the
// sharing switch and CudaAvailable are thread-safe. Failure: allocation errors
// are Status values (RESOURCE_EXHAUSTED, FAILED_PRECONDITION,
// INVALID_ARGUMENT), never aborts.
#ifndef TESSERA_COMMON_TENSOR_STORAGE_H_
#define TESSERA_COMMON_TENSOR_STORAGE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "common/device.h"

namespace tessera {

// Owns one allocation. Frees it with the allocator that made it.
//
// Shareable host memory: while host memory sharing is on (see
// SetHostMemorySharing), non-pinned CPU allocations of at least its
// min_bytes are backed by an anonymous memory file (memfd) mapped
// MAP_SHARED, so that another process on the same host can map the same
// pages (the local path of docs/data_plane.md). shared_memory_fd()
// is that file; its size is sealed (it can neither shrink nor grow), so a
// process that maps it cannot fault past its end. Freeing the storage
// frees the file's pages (a hole punched over all of it) even where
// another process still maps the file or holds a descriptor of it.
// Whether a host allocation may be lent to other processes.
enum class HostSharing {
  // Shareable when the process shares host memory (SetHostMemorySharing)
  // and the allocation is large enough: what a shard that the local path
  // may lend needs. The default.
  kIfEnabled,
  // Never: private memory, huge pages when large, several times faster to
  // fill fresh than a memory file (tests/bench/alloc_bench). For what stays
  // in this process: fetched copies, gather outputs, staging and
  // collective buffers.
  kPrivate,
};

class Storage {
 public:
  // Allocates `nbytes` on `device`. `sharing` applies to unpinned host
  // memory (see HostSharing). For the CPU, `pinned` asks for
  // page-locked memory (cudaHostAlloc when CUDA is usable, otherwise
  // mlock); pinned memory that cannot be had is RESOURCE_EXHAUSTED, never a
  // silent fallback. CUDA without a CUDA build or device is
  // FAILED_PRECONDITION; an index past the visible devices is
  // INVALID_ARGUMENT, and "cuda" without an index means the current device
  // (the storage records the resolved index). `pinned` off the CPU is
  // INVALID_ARGUMENT. The meta device allocates nothing, and neither do zero
  // bytes: data() is null for both. Host memory is 64-byte aligned.
  static absl::StatusOr<std::shared_ptr<Storage>> Allocate(
      size_t nbytes, Device device, bool pinned,
      HostSharing sharing = HostSharing::kIfEnabled);
  // Memory this storage does not own, such as another process's shared
  // memory mapped here or a CUDA IPC mapping: `release` (may be empty) runs
  // once when the storage is destroyed and must not fail. `data` must stay
  // valid until then; null only with zero bytes.
  static std::shared_ptr<Storage> Wrap(void* data, size_t nbytes, Device device,
                                       std::function<void()> release);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  const Device& device() const { return device_; }
  bool pinned() const { return pinned_; }
  // The memory file behind shareable host memory; -1 for every other
  // storage. Owned by the storage: do not close it (dup it to keep it).
  int shared_memory_fd() const { return shared_memory_fd_; }
  // A read-only open file description of that memory file, for lending its
  // pages to readers that must not write them (the local path): reopened
  // through /proc/self/fd on the first call, then kept (and closed) with
  // the storage, so that lending it again costs no path walk. Owned by the
  // storage: do not close it. FAILED_PRECONDITION for a storage without a
  // memory file, when shared storages hold as many descriptors as they may
  // (SetHostMemorySharing), or with the reopen's errno; tried again on the
  // next call. Thread-safe.
  absl::StatusOr<int> ReadOnlyMemoryFd() const;
  // A new open file description of that memory file, read-write when
  // `writable` (a writer's lease) else read-only, reopened through
  // /proc/self/fd and owned by the caller (who closes it; not counted
  // against SetHostMemorySharing's descriptors). FAILED_PRECONDITION for a
  // storage without a memory file, or with the reopen's errno.
  // Thread-safe.
  absl::StatusOr<int> ReopenMemoryFile(bool writable) const;
  // Whether every byte was zero when Allocate returned it (a new memory
  // file, or no bytes), so that zeroing it then would be wasted work. Says
  // nothing of the bytes since; heap memory (which may be reused) is
  // never known zero.
  bool allocated_zeroed() const {
    return allocator_ == Allocator::kSharedMemory ||
           allocator_ == Allocator::kNone;
  }
  // Whether its owner may fill this memory with other bytes of its own
  // once every other holder let go (a versioned tensor's next version in a
  // freed version's shards, server/daemon/version_set.h). False for good
  // once MarkNotReusable was called: the memory was lent to another process
  // that may still read or write it (a local-path lease that ended without
  // the borrower's "done"). Thread-safe.
  bool reusable() const { return reusable_.load(std::memory_order_acquire); }
  void MarkNotReusable() const {
    reusable_.store(false, std::memory_order_release);
  }

 private:
  enum class Allocator {
    kNone,
    kHeap,
    kHeapLocked,
    kCudaHost,
    kCudaDevice,
    kSharedMemory,
    kForeign,
  };
  Storage(void* data, size_t nbytes, Device device, bool pinned,
          Allocator allocator)
      : data_(data),
        nbytes_(nbytes),
        device_(device),
        pinned_(pinned),
        allocator_(allocator) {}

  void* data_;
  size_t nbytes_;
  Device device_;
  bool pinned_;
  Allocator allocator_;
  int shared_memory_fd_ = -1;  // kSharedMemory
  // ReadOnlyMemoryFd's, once opened; -1 before.
  mutable std::atomic<int> read_only_fd_{-1};
  mutable std::atomic<bool> reusable_{true};
  std::function<void()> release_;  // kForeign
};

// The process-wide switch for shareable host memory (see Storage). Off by
// default. While on, non-pinned CPU allocations of at least `min_bytes`
// bytes are memfd-backed unless they ask for HostSharing::kPrivate;
// smaller ones, pinned ones and device ones are not. Sharing is an
// optimisation: when a memory file cannot be had (no memfd support, descriptors
// exhausted, a mapping refused) the allocation silently uses the heap, as with
// sharing off. Each shared storage holds one file descriptor while it lives
// (two once lent: ReadOnlyMemoryFd); at most half of the process's
// RLIMIT_NOFILE soft limit (as it was when sharing was turned on) is spent on
// them, later allocations use the heap (and a read-only one is refused). Large
// shared mappings are advised as huge pages, which the kernel grants only where
// shmem huge pages are enabled
// (/sys/kernel/mm/transparent_hugepage/shmem_enabled); elsewhere first touch
// faults in small pages, where large private buffers use huge pages.
// Thread-safe; storages already allocated keep their kind.
inline constexpr int64_t kDefaultHostSharingMinBytes = int64_t{64} << 10;
void SetHostMemorySharing(int64_t min_bytes = kDefaultHostSharingMinBytes);
void DisableHostMemorySharing();
// The current threshold; nullopt while sharing is off.
std::optional<int64_t> HostMemorySharingMinBytes();

// Whether a CUDA device is usable by this process (built with CUDA and a
// device visible). Never fails: no driver or no device means false. The
// device count is probed once and cached for the life of the process.
bool CudaAvailable();
int CudaDeviceCount();

}  // namespace tessera

#endif  // TESSERA_COMMON_TENSOR_STORAGE_H_
