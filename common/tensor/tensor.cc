#include "common/tensor/tensor.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <complex>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <system_error>
#include <type_traits>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "common/tensor/cuda_util.h"

#if defined(TESSERA_WITH_CUDA) && TESSERA_WITH_CUDA
#include <cuda_runtime_api.h>
#define TESSERA_TENSOR_CUDA 1
#else
#define TESSERA_TENSOR_CUDA 0
#endif

namespace tessera {
namespace {

// Host allocations are aligned for any vector load.
constexpr size_t kHostAlignment = 64;
constexpr size_t kHugePageBytes = size_t{2} << 20;
constexpr double kPi = 3.14159265358979323846;

std::string ErrnoText(int error) {
  return std::error_code(error, std::generic_category()).message();
}

std::string SizesString(absl::Span<const int64_t> sizes) {
  return absl::StrCat("[", absl::StrJoin(sizes, ", "), "]");
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

#if TESSERA_TENSOR_CUDA
absl::Status CudaError(absl::string_view what, cudaError_t error) {
  cudaGetLastError();  // Clears a non-sticky error so later calls succeed.
  const std::string message =
      absl::StrCat(what, " failed: ", cudaGetErrorString(error), " (",
                   static_cast<int>(error), ")");
  if (error == cudaErrorMemoryAllocation) {
    return absl::ResourceExhaustedError(message);
  }
  return absl::InternalError(message);
}

#endif  // TESSERA_TENSOR_CUDA

absl::Status CudaUnavailableError() {
#if TESSERA_TENSOR_CUDA
  return absl::FailedPreconditionError(
      "CUDA is not available: no CUDA device is visible to this process "
      "(no driver, no device, or CUDA_VISIBLE_DEVICES hides them)");
#else
  return absl::FailedPreconditionError(
      "CUDA is not available: Tessera was built without CUDA support");
#endif
}

// Number of elements of `sizes`, INVALID_ARGUMENT for negative sizes or
// int64 overflow.
absl::StatusOr<int64_t> CheckedNumel(absl::Span<const int64_t> sizes) {
  int64_t numel = 1;
  for (int64_t size : sizes) {
    if (size < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("Trying to create tensor with negative dimension ", size,
                       ": ", SizesString(sizes)));
    }
  }
  for (int64_t size : sizes) {
    if (__builtin_mul_overflow(numel, size, &numel)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Tensor of sizes ", SizesString(sizes), " has too many elements"));
    }
  }
  return numel;
}

// Row-major strides; zero-size dimensions count as 1 as in PyTorch, so a
// [2, 0, 3] tensor has strides [3, 3, 1].
std::vector<int64_t> ContiguousStrides(absl::Span<const int64_t> sizes) {
  std::vector<int64_t> strides(sizes.size());
  int64_t stride = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= std::max<int64_t>(sizes[i], 1);
  }
  return strides;
}

// ---- Element conversions for ToDType -------------------------------------

template <typename T>
constexpr bool kIsComplex = std::is_same_v<T, std::complex<float>> ||
                            std::is_same_v<T, std::complex<double>>;
template <typename T>
constexpr bool kIsReducedFloat =
    std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;
template <typename T>
constexpr bool kIsFloat = std::is_floating_point_v<T> || kIsReducedFloat<T>;
template <typename T>
constexpr bool kIsInteger = std::is_integral_v<T> && !std::is_same_v<T, bool>;

// Reads element `i` of a buffer of T. Bools are read as bytes so that a
// non-0/1 byte (e.g. received from a peer) is still well-defined: true.
template <typename T>
T Load(const void* base, int64_t i) {
  if constexpr (std::is_same_v<T, bool>) {
    uint8_t byte;
    std::memcpy(&byte, static_cast<const char*>(base) + i, 1);
    return byte != 0;
  } else {
    T value;
    std::memcpy(&value, static_cast<const char*>(base) + i * sizeof(T),
                sizeof(T));
    return value;
  }
}

// Saturating double -> int64 (NaN gives 0): defined for every input, unlike
// a plain cast.
int64_t SaturatingToInt64(double value) {
  if (std::isnan(value)) return 0;
  if (value >= 9223372036854775808.0) {
    return std::numeric_limits<int64_t>::max();
  }
  if (value < -9223372036854775808.0) {
    return std::numeric_limits<int64_t>::min();
  }
  return static_cast<int64_t>(value);
}

template <typename To>
To FromReal(double value) {
  if constexpr (std::is_same_v<To, bool>) {
    return value != 0;
  } else if constexpr (kIsInteger<To>) {
    // Through int64 then wrapping, like PyTorch's CPU casts for narrow types.
    return static_cast<To>(SaturatingToInt64(value));
  } else {
    return FromDouble<To>(value);
  }
}

template <typename To, typename From>
To Convert(From value) {
  if constexpr (std::is_same_v<To, From>) {
    return value;
  } else if constexpr (kIsComplex<From>) {
    if constexpr (kIsComplex<To>) {
      using R = typename To::value_type;
      return To(static_cast<R>(value.real()), static_cast<R>(value.imag()));
    } else if constexpr (std::is_same_v<To, bool>) {
      return value.real() != 0 || value.imag() != 0;
    } else {
      return FromReal<To>(static_cast<double>(value.real()));
    }
  } else if constexpr (std::is_same_v<From, bool>) {
    return FromDouble<To>(value ? 1.0 : 0.0);
  } else if constexpr (kIsInteger<From> &&
                       (kIsInteger<To> || std::is_same_v<To, bool>)) {
    // Exact for int64 (no detour through double); wraps when narrowing.
    if constexpr (std::is_same_v<To, bool>) {
      return value != 0;
    } else {
      return static_cast<To>(value);
    }
  } else {
    return FromReal<To>(ToDouble(value));
  }
}

// ---- Strided box copies ---------------------------------------------------

// One dimension of a copy; strides in bytes.
struct CopyDim {
  int64_t size;
  int64_t src_stride;
  int64_t dst_stride;
};

template <size_t kSize>
void StridedCopyN(char* dst, int64_t dst_stride, const char* src,
                  int64_t src_stride, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    std::memcpy(dst + i * dst_stride, src + i * src_stride, kSize);
  }
}

// Copies `count` elements of `width` bytes with the given byte strides.
void StridedCopy(char* dst, int64_t dst_stride, const char* src,
                 int64_t src_stride, int64_t count, size_t width) {
  switch (width) {
    case 1:
      return StridedCopyN<1>(dst, dst_stride, src, src_stride, count);
    case 2:
      return StridedCopyN<2>(dst, dst_stride, src, src_stride, count);
    case 4:
      return StridedCopyN<4>(dst, dst_stride, src, src_stride, count);
    case 8:
      return StridedCopyN<8>(dst, dst_stride, src, src_stride, count);
    case 16:
      return StridedCopyN<16>(dst, dst_stride, src, src_stride, count);
    default:
      for (int64_t i = 0; i < count; ++i) {
        std::memmove(dst + i * dst_stride, src + i * src_stride, width);
      }
  }
}

// Calls fn(src_byte_offset, dst_byte_offset) for every index of `dims`
// (row-major order). `dims` may be empty: one call with offsets 0.
template <typename Fn>
absl::Status ForEachIndex(const std::vector<CopyDim>& dims, Fn&& fn) {
  std::vector<int64_t> index(dims.size(), 0);
  int64_t src = 0;
  int64_t dst = 0;
  while (true) {
    RETURN_IF_ERROR(fn(src, dst));
    size_t d = dims.size();
    while (d > 0) {
      --d;
      if (++index[d] < dims[d].size) {
        src += dims[d].src_stride;
        dst += dims[d].dst_stride;
        break;
      }
      src -= (dims[d].size - 1) * dims[d].src_stride;
      dst -= (dims[d].size - 1) * dims[d].dst_stride;
      index[d] = 0;
      if (d == 0) return absl::OkStatus();
    }
    if (dims.empty()) return absl::OkStatus();
  }
}

absl::Status CheckBox(absl::string_view which, const Tensor& tensor,
                      absl::Span<const int64_t> offsets,
                      absl::Span<const int64_t> sizes) {
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (offsets[d] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("CopyBox: ", which, " offset ", offsets[d], " of dim ",
                       d, " is negative"));
    }
    const int64_t extent = tensor.sizes()[d];
    if (offsets[d] > extent || sizes[d] > extent - offsets[d]) {
      return absl::OutOfRangeError(absl::StrCat(
          "CopyBox: ", which, " box [", offsets[d], ", ",
          // Saturate instead of overflowing for absurd offsets.
          offsets[d] > std::numeric_limits<int64_t>::max() - sizes[d]
              ? std::numeric_limits<int64_t>::max()
              : offsets[d] + sizes[d],
          ") of dim ", d, " leaves tensor of size ", extent));
    }
  }
  return absl::OkStatus();
}

#if TESSERA_TENSOR_CUDA
// Copies a 2-d block (height rows of width bytes) with cudaMemcpy2D when the
// pitches allow it, row by row otherwise.
absl::Status CudaCopy2D(char* dst, int64_t dst_pitch, const char* src,
                        int64_t src_pitch, size_t width, int64_t height) {
  if (height == 1) {
    const cudaError_t error = cudaMemcpy(dst, src, width, cudaMemcpyDefault);
    if (error != cudaSuccess) return CudaError("cudaMemcpy", error);
    return absl::OkStatus();
  }
  if (dst_pitch >= static_cast<int64_t>(width) &&
      src_pitch >= static_cast<int64_t>(width)) {
    const cudaError_t error =
        cudaMemcpy2D(dst, static_cast<size_t>(dst_pitch), src,
                     static_cast<size_t>(src_pitch), width,
                     static_cast<size_t>(height), cudaMemcpyDefault);
    if (error == cudaSuccess) return absl::OkStatus();
    // Pitches above the device's limit are refused; fall back to rows.
    if (error != cudaErrorInvalidPitchValue && error != cudaErrorInvalidValue) {
      return CudaError("cudaMemcpy2D", error);
    }
    cudaGetLastError();
  }
  for (int64_t row = 0; row < height; ++row) {
    const cudaError_t error = cudaMemcpy(
        dst + row * dst_pitch, src + row * src_pitch, width, cudaMemcpyDefault);
    if (error != cudaSuccess) return CudaError("cudaMemcpy", error);
  }
  return absl::OkStatus();
}
#endif  // TESSERA_TENSOR_CUDA

// ---- Filling new tensors ----------------------------------------------------

// Creates a tensor and fills it on the host with fill(TypeTag<T>, T* data,
// numel); CUDA tensors are filled on the host and copied over. Meta tensors
// are not filled (and `fill` is not called).
template <typename Fill>
absl::StatusOr<Tensor> MakeFilled(absl::Span<const int64_t> sizes,
                                  const TensorOptions& options, Fill&& fill) {
  if (!options.device.is_cuda()) {
    // Meta tensors come back unfilled; CPU ones are filled in place.
    ASSIGN_OR_RETURN(Tensor tensor, Tensor::Empty(sizes, options));
    if (options.device.is_meta()) return tensor;
    DispatchDType(options.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      fill(tag, tensor.data<T>(), tensor.numel());
    });
    return tensor;
  }
  // Validate the CUDA request (as Empty would) before doing host work.
  if (options.pin_memory) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pin_memory is only supported for CPU tensors, got device ",
        options.device.ToString()));
  }
  RETURN_IF_ERROR(CheckedNumel(sizes).status());
  if (!CudaAvailable()) return CudaUnavailableError();
  TensorOptions host_options = options;
  host_options.device = Device::Cpu();
  ASSIGN_OR_RETURN(Tensor host, Tensor::Empty(sizes, host_options));
  DispatchDType(options.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    fill(tag, host.data<T>(), host.numel());
  });
  ASSIGN_OR_RETURN(Tensor device, host.To(options.device));
  device.set_requires_grad(options.requires_grad);
  return device;
}

absl::Status CheckRandomDType(absl::string_view op, DType dtype) {
  if (IsFloatingPoint(dtype) || IsComplex(dtype)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(op,
                   " is only supported for floating point and complex dtypes, "
                   "got ",
                   DTypeName(dtype)));
}

// Random mantissa bits that are exact in T and keep uniform draws below 1.
template <typename T>
constexpr int UniformBits() {
  if constexpr (std::is_same_v<T, float> ||
                std::is_same_v<T, std::complex<float>>) {
    return 24;
  } else if constexpr (std::is_same_v<T, Half>) {
    return 11;
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    return 8;
  } else {
    return 53;
  }
}

}  // namespace

absl::StatusOr<int64_t> WrapDim(int64_t d, int64_t ndim, bool wrap_scalar) {
  if (ndim == 0) {
    if (!wrap_scalar) {
      return absl::OutOfRangeError(absl::StrCat(
          "Dimension specified as ", d, " but tensor has no dimensions"));
    }
    ndim = 1;
  }
  const int64_t min = -ndim;
  const int64_t max = ndim - 1;
  if (d < min || d > max) {
    return absl::OutOfRangeError(
        absl::StrCat("Dimension out of range (expected to be in range of [",
                     min, ", ", max, "], but got ", d, ")"));
  }
  return d < 0 ? d + ndim : d;
}

// ---- Storage
// -------------------------------------------------------------------

namespace {

// Shareable host memory (SetHostMemorySharing): the threshold (-1 while
// off), the live shared storages and how many may live, since each holds a
// file descriptor.
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

absl::StatusOr<std::shared_ptr<Storage>> Storage::Allocate(size_t nbytes,
                                                           Device device,
                                                           bool pinned) {
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
    if (share_min_bytes >= 0 &&
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
    void* data = nullptr;
    const int error =
        posix_memalign(&data, huge ? kHugePageBytes : kHostAlignment, rounded);
    if (error != 0) return HostAllocError(nbytes, error);
    if (huge) madvise(data, rounded, MADV_HUGEPAGE);  // Advice only.
    return std::shared_ptr<Storage>(
        new Storage(data, nbytes, device, false, Allocator::kHeap));
  }
#if TESSERA_TENSOR_CUDA
  if (CudaAvailable()) {
    void* data = nullptr;
    const cudaError_t error =
        cudaHostAlloc(&data, nbytes, cudaHostAllocPortable);
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

Storage::~Storage() {
  switch (allocator_) {
    case Allocator::kNone:
      break;
    case Allocator::kHeap:
      free(data_);
      break;
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
      munmap(data_, rounded);
      close(shared_memory_fd_);
      g_shared_storages.fetch_sub(1);
      break;
    }
    case Allocator::kForeign:
      if (release_) release_();
      break;
    case Allocator::kCudaHost:
#if TESSERA_TENSOR_CUDA
      if (cudaFreeHost(data_) != cudaSuccess) cudaGetLastError();
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

// ---- Generator
// -----------------------------------------------------------------

struct Generator::State {
  explicit State(uint64_t seed) : engine(seed) {}

  double UniformLocked(int bits) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    bits = std::clamp(bits, 1, 53);
    return static_cast<double>(engine() >> (64 - bits)) *
           std::ldexp(1.0, -bits);
  }

  absl::Mutex mu;
  std::mt19937_64 engine ABSL_GUARDED_BY(mu);
  // Box-Muller makes two normals per draw; the second one is kept here.
  bool has_cached_normal ABSL_GUARDED_BY(mu) = false;
  double cached_normal ABSL_GUARDED_BY(mu) = 0;
};

Generator::Generator(uint64_t seed) : state_(std::make_shared<State>(seed)) {}

void Generator::ManualSeed(uint64_t seed) {
  absl::MutexLock lock(&state_->mu);
  state_->engine.seed(seed);
  state_->has_cached_normal = false;
}

uint64_t Generator::NextU64() {
  absl::MutexLock lock(&state_->mu);
  return state_->engine();
}

double Generator::NextUniform(int bits) {
  absl::MutexLock lock(&state_->mu);
  return state_->UniformLocked(bits);
}

double Generator::NextNormal() {
  absl::MutexLock lock(&state_->mu);
  if (state_->has_cached_normal) {
    state_->has_cached_normal = false;
    return state_->cached_normal;
  }
  // u1 in (0, 1] keeps the logarithm finite.
  const double u1 = 1.0 - state_->UniformLocked(53);
  const double u2 = state_->UniformLocked(53);
  const double radius = std::sqrt(-2.0 * std::log(u1));
  const double theta = 2.0 * kPi * u2;
  state_->cached_normal = radius * std::sin(theta);
  state_->has_cached_normal = true;
  return radius * std::cos(theta);
}

Generator& DefaultGenerator() {
  static Generator* const generator = new Generator();
  return *generator;
}

void ManualSeed(uint64_t seed) { DefaultGenerator().ManualSeed(seed); }

// ---- Tensor: factories
// -------------------------------------------------------

absl::StatusOr<Tensor> Tensor::Empty(absl::Span<const int64_t> sizes,
                                     const TensorOptions& options) {
  if (options.pin_memory && !options.device.is_cpu()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pin_memory is only supported for CPU tensors, got device ",
        options.device.ToString()));
  }
  ASSIGN_OR_RETURN(const int64_t numel, CheckedNumel(sizes));
  const size_t element_size = ElementSize(options.dtype);
  size_t nbytes;
  if (__builtin_mul_overflow(static_cast<size_t>(numel), element_size,
                             &nbytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Tensor of sizes ", SizesString(sizes), " has too many bytes"));
  }
  ASSIGN_OR_RETURN(
      std::shared_ptr<Storage> storage,
      Storage::Allocate(nbytes, options.device, options.pin_memory));
  Tensor tensor;
  tensor.storage_ = std::move(storage);
  tensor.sizes_.assign(sizes.begin(), sizes.end());
  tensor.strides_ = ContiguousStrides(sizes);
  tensor.dtype_ = options.dtype;
  tensor.requires_grad_ = options.requires_grad;
  return tensor;
}

absl::StatusOr<Tensor> Tensor::FromStorage(std::shared_ptr<Storage> storage,
                                           DType dtype, int64_t storage_offset,
                                           absl::Span<const int64_t> sizes,
                                           absl::Span<const int64_t> strides) {
  if (storage == nullptr) {
    return absl::InvalidArgumentError("FromStorage: null storage");
  }
  if (sizes.size() != strides.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("FromStorage: ", sizes.size(), " sizes but ",
                     strides.size(), " strides"));
  }
  if (storage_offset < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("FromStorage: negative storage offset ", storage_offset));
  }
  for (int64_t stride : strides) {
    if (stride < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "FromStorage: negative stride in ", SizesString(strides)));
    }
  }
  ASSIGN_OR_RETURN(const int64_t numel, CheckedNumel(sizes));
  if (numel > 0) {
    // One past the last element's byte, overflow-checked.
    int64_t last = storage_offset;
    bool overflow = false;
    for (size_t d = 0; d < sizes.size(); ++d) {
      int64_t span;
      overflow |= __builtin_mul_overflow(sizes[d] - 1, strides[d], &span) ||
                  __builtin_add_overflow(last, span, &last);
    }
    int64_t end;
    overflow |= __builtin_add_overflow(last, int64_t{1}, &end) ||
                __builtin_mul_overflow(
                    end, static_cast<int64_t>(ElementSize(dtype)), &end);
    if (overflow || static_cast<uint64_t>(end) > storage->nbytes()) {
      return absl::OutOfRangeError(
          absl::StrCat("FromStorage: a view of sizes ", SizesString(sizes),
                       ", strides ", SizesString(strides), " at offset ",
                       storage_offset, " of ", DTypeName(dtype),
                       " leaves a storage of ", storage->nbytes(), " bytes"));
    }
  }
  Tensor tensor;
  tensor.storage_ = std::move(storage);
  tensor.storage_offset_ = storage_offset;
  tensor.sizes_.assign(sizes.begin(), sizes.end());
  tensor.strides_.assign(strides.begin(), strides.end());
  tensor.dtype_ = dtype;
  return tensor;
}

absl::StatusOr<Tensor> Tensor::Zeros(absl::Span<const int64_t> sizes,
                                     const TensorOptions& options) {
  ASSIGN_OR_RETURN(Tensor tensor, Empty(sizes, options));
  // All-zero bytes are zero in every dtype (0.0, +0 half, false, 0+0i).
  const std::shared_ptr<Storage>& storage = tensor.storage();
  if (storage->data() == nullptr || storage->nbytes() == 0) return tensor;
  if (storage->device().is_cuda()) {
#if TESSERA_TENSOR_CUDA
    CudaDeviceGuard guard(storage->device().index().value_or(0));
    const cudaError_t error = cudaMemset(storage->data(), 0, storage->nbytes());
    if (error != cudaSuccess) return CudaError("cudaMemset", error);
#endif
    return tensor;
  }
  std::memset(storage->data(), 0, tensor.nbytes());
  return tensor;
}

absl::StatusOr<Tensor> Tensor::Ones(absl::Span<const int64_t> sizes,
                                    const TensorOptions& options) {
  return Full(sizes, 1.0, options);
}

absl::StatusOr<Tensor> Tensor::Full(absl::Span<const int64_t> sizes,
                                    double value,
                                    const TensorOptions& options) {
  return MakeFilled(sizes, options,
                    [value](auto tag, auto* data, int64_t numel) {
                      using T = typename decltype(tag)::type;
                      const T element = FromDouble<T>(value);
                      std::fill(data, data + numel, element);
                    });
}

absl::StatusOr<Tensor> Tensor::Rand(absl::Span<const int64_t> sizes,
                                    const TensorOptions& options,
                                    Generator* generator) {
  RETURN_IF_ERROR(CheckRandomDType("rand", options.dtype));
  Generator& gen = generator != nullptr ? *generator : DefaultGenerator();
  return MakeFilled(sizes, options,
                    [&gen](auto tag, auto* data, int64_t numel) {
                      using T = typename decltype(tag)::type;
                      constexpr int kBits = UniformBits<T>();
                      for (int64_t i = 0; i < numel; ++i) {
                        if constexpr (kIsComplex<T>) {
                          using R = typename T::value_type;
                          const R real = static_cast<R>(gen.NextUniform(kBits));
                          const R imag = static_cast<R>(gen.NextUniform(kBits));
                          data[i] = T(real, imag);
                        } else if constexpr (kIsFloat<T>) {
                          data[i] = FromDouble<T>(gen.NextUniform(kBits));
                        }
                      }
                    });
}

absl::StatusOr<Tensor> Tensor::Randn(absl::Span<const int64_t> sizes,
                                     const TensorOptions& options,
                                     Generator* generator) {
  RETURN_IF_ERROR(CheckRandomDType("randn", options.dtype));
  Generator& gen = generator != nullptr ? *generator : DefaultGenerator();
  return MakeFilled(
      sizes, options, [&gen](auto tag, auto* data, int64_t numel) {
        using T = typename decltype(tag)::type;
        for (int64_t i = 0; i < numel; ++i) {
          if constexpr (kIsComplex<T>) {
            // As torch.randn: each part has variance 1/2, so |z|^2 has mean 1.
            using R = typename T::value_type;
            const double scale = std::sqrt(0.5);
            const R real = static_cast<R>(gen.NextNormal() * scale);
            const R imag = static_cast<R>(gen.NextNormal() * scale);
            data[i] = T(real, imag);
          } else if constexpr (kIsFloat<T>) {
            data[i] = FromDouble<T>(gen.NextNormal());
          }
        }
      });
}

// The member T() would hide a template parameter named T here.
template <typename Elem>
absl::StatusOr<Tensor> Tensor::FromVector(absl::Span<const Elem> values,
                                          absl::Span<const int64_t> sizes) {
  ASSIGN_OR_RETURN(const int64_t numel, CheckedNumel(sizes));
  if (static_cast<uint64_t>(numel) != values.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("FromVector: got ", values.size(), " values for sizes ",
                     SizesString(sizes), " (", numel, " elements)"));
  }
  ASSIGN_OR_RETURN(
      Tensor tensor,
      Empty(sizes, TensorOptions().WithDType(DTypeOf<Elem>::value)));
  if (!values.empty()) {
    std::memcpy(tensor.data_ptr(), values.data(), values.size() * sizeof(Elem));
  }
  return tensor;
}

#define TESSERA_INSTANTIATE_FROM_VECTOR(Elem)               \
  template absl::StatusOr<Tensor> Tensor::FromVector<Elem>( \
      absl::Span<const Elem> values, absl::Span<const int64_t> sizes);
TESSERA_INSTANTIATE_FROM_VECTOR(float)
TESSERA_INSTANTIATE_FROM_VECTOR(double)
TESSERA_INSTANTIATE_FROM_VECTOR(std::complex<float>)
TESSERA_INSTANTIATE_FROM_VECTOR(std::complex<double>)
TESSERA_INSTANTIATE_FROM_VECTOR(Half)
TESSERA_INSTANTIATE_FROM_VECTOR(BFloat16)
TESSERA_INSTANTIATE_FROM_VECTOR(uint8_t)
TESSERA_INSTANTIATE_FROM_VECTOR(int8_t)
TESSERA_INSTANTIATE_FROM_VECTOR(int16_t)
TESSERA_INSTANTIATE_FROM_VECTOR(int32_t)
TESSERA_INSTANTIATE_FROM_VECTOR(int64_t)
TESSERA_INSTANTIATE_FROM_VECTOR(bool)
#undef TESSERA_INSTANTIATE_FROM_VECTOR

// ---- Tensor: properties
// --------------------------------------------------------

const Device& Tensor::device() const {
  static const Device kCpu = Device::Cpu();
  return storage_ != nullptr ? storage_->device() : kCpu;
}

absl::StatusOr<int64_t> Tensor::size(int64_t d) const {
  ASSIGN_OR_RETURN(const int64_t wrapped,
                   WrapDim(d, dim(), /*wrap_scalar=*/false));
  return sizes_[wrapped];
}

int64_t Tensor::numel() const {
  int64_t numel = 1;
  for (int64_t size : sizes_) numel *= size;
  return numel;
}

bool Tensor::is_pinned() const {
  return storage_ != nullptr && storage_->pinned();
}

bool Tensor::is_contiguous() const {
  if (numel() == 0) return true;
  int64_t expected = 1;
  for (size_t i = sizes_.size(); i-- > 0;) {
    if (sizes_[i] == 1) continue;
    if (strides_[i] != expected) return false;
    expected *= sizes_[i];
  }
  return true;
}

void* Tensor::data_ptr() const {
  if (storage_ == nullptr || storage_->data() == nullptr) return nullptr;
  return static_cast<char*>(storage_->data()) +
         storage_offset_ * static_cast<int64_t>(element_size());
}

// ---- Tensor: views
// -------------------------------------------------------------

absl::StatusOr<Tensor> Tensor::Narrow(int64_t dim, int64_t start,
                                      int64_t length) const {
  if (this->dim() == 0) {
    return absl::InvalidArgumentError(
        "narrow() cannot be applied to a 0-dim tensor.");
  }
  ASSIGN_OR_RETURN(const int64_t d,
                   WrapDim(dim, this->dim(), /*wrap_scalar=*/false));
  if (length < 0) {
    return absl::InvalidArgumentError("narrow(): length must be non-negative.");
  }
  const int64_t extent = sizes_[d];
  if (start < -extent || start > extent) {
    return absl::OutOfRangeError(
        absl::StrCat("start out of range (expected to be in range of [",
                     -extent, ", ", extent, "], but got ", start, ")"));
  }
  if (start < 0) start += extent;
  if (start > extent - length) {
    return absl::OutOfRangeError(
        absl::StrCat("start (", start, ") + length (", length,
                     ") exceeds dimension size (", extent, ")."));
  }
  Tensor result = *this;
  result.storage_offset_ += start * strides_[d];
  result.sizes_[d] = length;
  return result;
}

absl::StatusOr<Tensor> Tensor::Transpose(int64_t dim0, int64_t dim1) const {
  ASSIGN_OR_RETURN(const int64_t d0, WrapDim(dim0, dim(), true));
  ASSIGN_OR_RETURN(const int64_t d1, WrapDim(dim1, dim(), true));
  Tensor result = *this;
  if (dim() == 0 || d0 == d1) return result;
  std::swap(result.sizes_[d0], result.sizes_[d1]);
  std::swap(result.strides_[d0], result.strides_[d1]);
  return result;
}

absl::StatusOr<Tensor> Tensor::T() const {
  if (dim() > 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "t() expects a tensor with <= 2 dimensions, but self is ", dim(), "D"));
  }
  if (dim() < 2) return *this;
  return Transpose(0, 1);
}

absl::StatusOr<Tensor> Tensor::View(absl::Span<const int64_t> sizes) const {
  std::vector<int64_t> new_sizes(sizes.begin(), sizes.end());
  std::optional<size_t> inferred;
  int64_t known = 1;
  for (size_t i = 0; i < new_sizes.size(); ++i) {
    if (new_sizes[i] == -1) {
      if (inferred.has_value()) {
        return absl::InvalidArgumentError("only one dimension can be inferred");
      }
      inferred = i;
    } else if (new_sizes[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid shape dimension ", new_sizes[i]));
    } else if (__builtin_mul_overflow(known, new_sizes[i], &known)) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape '", SizesString(sizes), "' is too large"));
    }
  }
  const int64_t total = numel();
  const absl::Status mismatch = absl::InvalidArgumentError(absl::StrCat(
      "shape '", SizesString(sizes), "' is invalid for input of size ", total));
  if (inferred.has_value()) {
    if (known == 0 || total % known != 0) return mismatch;
    new_sizes[*inferred] = total / known;
  } else if (known != total) {
    return mismatch;
  }
  if (!is_contiguous()) {
    return absl::InvalidArgumentError(
        "view size is not compatible with input tensor's size and stride (at "
        "least one dimension spans across two contiguous subspaces). Use "
        ".reshape(...) instead.");
  }
  Tensor result = *this;
  result.strides_ = ContiguousStrides(new_sizes);
  result.sizes_ = std::move(new_sizes);
  return result;
}

// ---- Tensor: copies
// ------------------------------------------------------------

absl::StatusOr<Tensor> Tensor::Contiguous() const {
  if (!defined()) return absl::InvalidArgumentError("Tensor is undefined");
  if (is_contiguous()) return *this;
  return Clone();
}

absl::StatusOr<Tensor> Tensor::Clone() const {
  if (!defined()) return absl::InvalidArgumentError("Tensor is undefined");
  return To(device(), is_pinned());
}

absl::StatusOr<Tensor> Tensor::To(Device device, bool pin_memory) const {
  if (!defined()) return absl::InvalidArgumentError("Tensor is undefined");
  ASSIGN_OR_RETURN(Tensor result,
                   Empty(sizes_, TensorOptions()
                                     .WithDType(dtype_)
                                     .WithDevice(device)
                                     .WithPinMemory(pin_memory)
                                     .WithRequiresGrad(requires_grad_)));
  RETURN_IF_ERROR(CopyInto(*this, result));
  return result;
}

absl::StatusOr<Tensor> Tensor::ToDType(DType dtype) const {
  if (!defined()) return absl::InvalidArgumentError("Tensor is undefined");
  const TensorOptions options = TensorOptions()
                                    .WithDType(dtype)
                                    .WithDevice(device())
                                    .WithPinMemory(is_pinned())
                                    .WithRequiresGrad(requires_grad_);
  if (device().is_meta()) return Empty(sizes_, options);
  if (dtype == dtype_) return Clone();
  // Convert on the host; CUDA tensors go there and back.
  Tensor host = *this;
  if (!device().is_cpu()) {
    ASSIGN_OR_RETURN(host, To(Device::Cpu()));
  } else {
    ASSIGN_OR_RETURN(host, Contiguous());
  }
  ASSIGN_OR_RETURN(
      Tensor converted,
      Empty(sizes_, TensorOptions(options)
                        .WithDevice(Device::Cpu())
                        .WithPinMemory(device().is_cpu() && is_pinned())));
  const void* in = host.data_ptr();
  void* out = converted.data_ptr();
  const int64_t n = numel();
  DispatchDType(dtype_, [&](auto from_tag) {
    using From = typename decltype(from_tag)::type;
    DispatchDType(dtype, [&](auto to_tag) {
      using To = typename decltype(to_tag)::type;
      To* typed_out = static_cast<To*>(out);
      for (int64_t i = 0; i < n; ++i) {
        typed_out[i] = Convert<To>(Load<From>(in, i));
      }
    });
  });
  if (device().is_cpu()) return converted;
  return converted.To(device());
}

std::string Tensor::DebugString() const {
  if (!defined()) return "Tensor(undefined)";
  return absl::StrCat("Tensor(", DTypeName(dtype_), ", ", SizesString(sizes_),
                      ", ", device().ToString(), ")");
}

absl::Status CopyBox(const Tensor& src, absl::Span<const int64_t> src_offsets,
                     const Tensor& dst, absl::Span<const int64_t> dst_offsets,
                     absl::Span<const int64_t> sizes) {
  if (!src.defined() || !dst.defined()) {
    return absl::InvalidArgumentError("CopyBox: tensor is undefined");
  }
  const size_t rank = sizes.size();
  if (src.dim() != static_cast<int64_t>(rank) ||
      dst.dim() != static_cast<int64_t>(rank) || src_offsets.size() != rank ||
      dst_offsets.size() != rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CopyBox: rank mismatch: src has ", src.dim(), " dims, dst has ",
        dst.dim(), ", src offsets ", src_offsets.size(), ", dst offsets ",
        dst_offsets.size(), ", sizes ", rank));
  }
  if (src.dtype() != dst.dtype()) {
    return absl::InvalidArgumentError(
        absl::StrCat("CopyBox: dtype mismatch: src is ", DTypeName(src.dtype()),
                     ", dst is ", DTypeName(dst.dtype())));
  }
  for (size_t d = 0; d < rank; ++d) {
    if (sizes[d] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CopyBox: size ", sizes[d], " of dim ", d, " is negative"));
    }
  }
  RETURN_IF_ERROR(CheckBox("src", src, src_offsets, sizes));
  RETURN_IF_ERROR(CheckBox("dst", dst, dst_offsets, sizes));

  for (int64_t size : sizes) {
    if (size == 0) return absl::OkStatus();
  }
  if (dst.device().is_meta()) return absl::OkStatus();
  if (src.device().is_meta()) {
    return absl::InvalidArgumentError(
        "CopyBox: cannot copy out of a meta tensor: it has no data");
  }

  // Byte strides of the box, without its size-1 dimensions, then merged
  // wherever a dimension is contiguous with the next in both tensors.
  const int64_t width = static_cast<int64_t>(src.element_size());
  int64_t src_start = src.storage_offset_;
  int64_t dst_start = dst.storage_offset_;
  std::vector<CopyDim> dims;
  for (size_t d = 0; d < rank; ++d) {
    src_start += src_offsets[d] * src.strides_[d];
    dst_start += dst_offsets[d] * dst.strides_[d];
    if (sizes[d] == 1) continue;
    const CopyDim dim{sizes[d], src.strides_[d] * width,
                      dst.strides_[d] * width};
    if (!dims.empty()) {
      CopyDim& outer = dims.back();
      if (outer.src_stride == dim.src_stride * dim.size &&
          outer.dst_stride == dim.dst_stride * dim.size) {
        outer = CopyDim{outer.size * dim.size, dim.src_stride, dim.dst_stride};
        continue;
      }
    }
    dims.push_back(dim);
  }
  // A run is a stretch of bytes contiguous in both tensors.
  int64_t run = width;
  if (!dims.empty() && dims.back().src_stride == width &&
      dims.back().dst_stride == width) {
    run = dims.back().size * width;
    dims.pop_back();
  }
  const char* src_base =
      static_cast<const char*>(src.storage_->data()) + src_start * width;
  char* dst_base = static_cast<char*>(dst.storage_->data()) + dst_start * width;

  if (src.device().is_cuda() || dst.device().is_cuda()) {
#if TESSERA_TENSOR_CUDA
    // Rows of `run` bytes along the innermost remaining dimension.
    CopyDim rows{1, 0, 0};
    if (!dims.empty()) {
      rows = dims.back();
      dims.pop_back();
    }
    return ForEachIndex(dims, [&](int64_t src_off, int64_t dst_off) {
      return CudaCopy2D(dst_base + dst_off, rows.dst_stride, src_base + src_off,
                        rows.src_stride, static_cast<size_t>(run), rows.size);
    });
#else
    return CudaUnavailableError();
#endif
  }

  if (run == width && !dims.empty()) {
    // Element by element along the innermost dimension.
    const CopyDim inner = dims.back();
    dims.pop_back();
    return ForEachIndex(dims, [&](int64_t src_off, int64_t dst_off) {
      StridedCopy(dst_base + dst_off, inner.dst_stride, src_base + src_off,
                  inner.src_stride, inner.size, static_cast<size_t>(width));
      return absl::OkStatus();
    });
  }
  return ForEachIndex(dims, [&](int64_t src_off, int64_t dst_off) {
    std::memmove(dst_base + dst_off, src_base + src_off,
                 static_cast<size_t>(run));
    return absl::OkStatus();
  });
}

absl::Status CopyInto(const Tensor& src, const Tensor& dst) {
  if (!src.defined() || !dst.defined()) {
    return absl::InvalidArgumentError("CopyInto: tensor is undefined");
  }
  if (src.sizes() != dst.sizes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CopyInto: size mismatch: src is ", SizesString(src.sizes()),
        ", dst is ", SizesString(dst.sizes())));
  }
  const std::vector<int64_t> zeros(src.sizes().size(), 0);
  return CopyBox(src, zeros, dst, zeros, src.sizes());
}

bool Equal(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  if (a.dtype() != b.dtype() || a.sizes() != b.sizes()) return false;
  if (a.device().is_meta() || b.device().is_meta()) {
    return a.device().is_meta() && b.device().is_meta();
  }
  auto host_contiguous = [](const Tensor& t) -> absl::StatusOr<Tensor> {
    if (t.device().is_cpu()) return t.Contiguous();
    return t.To(Device::Cpu());
  };
  absl::StatusOr<Tensor> ha = host_contiguous(a);
  absl::StatusOr<Tensor> hb = host_contiguous(b);
  if (!ha.ok() || !hb.ok()) return false;
  const void* pa = ha->data_ptr();
  const void* pb = hb->data_ptr();
  const int64_t n = a.numel();
  return DispatchDType(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    for (int64_t i = 0; i < n; ++i) {
      const T x = Load<T>(pa, i);
      const T y = Load<T>(pb, i);
      if constexpr (kIsReducedFloat<T>) {
        if (!(ToDouble(x) == ToDouble(y))) return false;
      } else {
        if (!(x == y)) return false;
      }
    }
    return true;
  });
}

std::optional<int64_t> CheckedProduct(absl::Span<const int64_t> sizes) {
  for (int64_t size : sizes) {
    if (size == 0) return 0;
  }
  int64_t product = 1;
  for (int64_t size : sizes) {
    if (__builtin_mul_overflow(product, size, &product)) return std::nullopt;
  }
  return product;
}

}  // namespace tessera
