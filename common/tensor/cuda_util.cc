#include "common/tensor/cuda_util.h"

#include <map>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "common/tensor/tensor.h"

#if defined(TESSERA_WITH_CUDA) && TESSERA_WITH_CUDA
#define TESSERA_CUDA_UTIL_CUDA 1
#else
#define TESSERA_CUDA_UTIL_CUDA 0
#endif

namespace tessera {
namespace {

#if TESSERA_CUDA_UTIL_CUDA
cudaStream_t NativeStream(void* stream) {
  return static_cast<cudaStream_t>(stream);
}
cudaEvent_t NativeEvent(void* event) { return static_cast<cudaEvent_t>(event); }
#else
absl::Status NoCuda(absl::string_view what) {
  return absl::FailedPreconditionError(absl::StrCat(
      what, ": CUDA is not available: Tessera was built without CUDA support"));
}
#endif

}  // namespace

#if TESSERA_CUDA_UTIL_CUDA
absl::Status CudaStatus(cudaError_t error, absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();  // Clears a non-sticky error so later calls succeed.
  const std::string message =
      absl::StrCat(what, " failed: ", cudaGetErrorString(error), " (",
                   static_cast<int>(error), ")");
  switch (error) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}
#endif

// ---- CudaDeviceGuard --------------------------------------------------------

CudaDeviceGuard::CudaDeviceGuard(int device) {
#if TESSERA_CUDA_UTIL_CUDA
  if (cudaGetDevice(&previous_) != cudaSuccess) {
    cudaGetLastError();
    previous_ = -1;
  }
  if (previous_ != device) {
    status_ = CudaStatus(cudaSetDevice(device),
                         absl::StrCat("cudaSetDevice(", device, ")"));
  }
#else
  status_ = NoCuda("CudaDeviceGuard");
#endif
}

CudaDeviceGuard::~CudaDeviceGuard() {
#if TESSERA_CUDA_UTIL_CUDA
  if (previous_ >= 0 && cudaSetDevice(previous_) != cudaSuccess) {
    cudaGetLastError();
  }
#endif
}

// ---- CudaStream -------------------------------------------------------------

absl::StatusOr<CudaStream> CudaStream::Create(int device) {
#if TESSERA_CUDA_UTIL_CUDA
  CudaDeviceGuard guard(device);
  if (!guard.status().ok()) return guard.status();
  cudaStream_t native = nullptr;
  const absl::Status created =
      CudaStatus(cudaStreamCreateWithFlags(&native, cudaStreamNonBlocking),
                 absl::StrCat("cudaStreamCreateWithFlags on cuda:", device));
  if (!created.ok()) return created;
  CudaStream stream;
  stream.stream_ = native;
  stream.device_ = device;
  return stream;
#else
  return NoCuda("CudaStream::Create");
#endif
}

CudaStream::CudaStream(CudaStream&& other) noexcept
    : stream_(std::exchange(other.stream_, nullptr)),
      device_(std::exchange(other.device_, -1)) {}

CudaStream& CudaStream::operator=(CudaStream&& other) noexcept {
  if (this != &other) {
    Destroy();
    stream_ = std::exchange(other.stream_, nullptr);
    device_ = std::exchange(other.device_, -1);
  }
  return *this;
}

CudaStream::~CudaStream() { Destroy(); }

void CudaStream::Destroy() {
  if (stream_ == nullptr) return;
#if TESSERA_CUDA_UTIL_CUDA
  CudaDeviceGuard guard(device_);
  // Errors cannot be reported from here; the stream is released either
  // way (cudaStreamDestroy would not wait for its work).
  if (cudaStreamSynchronize(NativeStream(stream_)) != cudaSuccess) {
    cudaGetLastError();
  }
  if (cudaStreamDestroy(NativeStream(stream_)) != cudaSuccess) {
    cudaGetLastError();
  }
#endif
  stream_ = nullptr;
  device_ = -1;
}

absl::Status CudaStream::WaitForLegacyStream() const {
#if TESSERA_CUDA_UTIL_CUDA
  if (stream_ == nullptr) {
    return absl::FailedPreconditionError("WaitForLegacyStream: no stream");
  }
  CudaDeviceGuard guard(device_);
  if (!guard.status().ok()) return guard.status();
  // A temporary event: the wait captures its state when enqueued, and
  // destroying a pending event releases it once it completes.
  cudaEvent_t marker = nullptr;
  absl::Status status =
      CudaStatus(cudaEventCreateWithFlags(&marker, cudaEventDisableTiming),
                 "cudaEventCreateWithFlags");
  if (!status.ok()) return status;
  status = CudaStatus(cudaEventRecord(marker, cudaStreamLegacy),
                      "cudaEventRecord on the legacy default stream");
  if (status.ok()) {
    status = CudaStatus(cudaStreamWaitEvent(NativeStream(stream_), marker, 0),
                        "cudaStreamWaitEvent");
  }
  if (cudaEventDestroy(marker) != cudaSuccess) cudaGetLastError();
  return status;
#else
  return NoCuda("CudaStream::WaitForLegacyStream");
#endif
}

absl::Status CudaStream::Synchronize() const {
#if TESSERA_CUDA_UTIL_CUDA
  if (stream_ == nullptr) {
    return absl::FailedPreconditionError("Synchronize: no stream");
  }
  return CudaStatus(cudaStreamSynchronize(NativeStream(stream_)),
                    absl::StrCat("cudaStreamSynchronize on cuda:", device_));
#else
  return NoCuda("CudaStream::Synchronize");
#endif
}

// ---- CudaEvent --------------------------------------------------------------

absl::StatusOr<CudaEvent> CudaEvent::Create(int device) {
#if TESSERA_CUDA_UTIL_CUDA
  CudaDeviceGuard guard(device);
  if (!guard.status().ok()) return guard.status();
  cudaEvent_t native = nullptr;
  const absl::Status created =
      CudaStatus(cudaEventCreateWithFlags(&native, cudaEventDisableTiming),
                 absl::StrCat("cudaEventCreateWithFlags on cuda:", device));
  if (!created.ok()) return created;
  CudaEvent event;
  event.event_ = native;
  event.device_ = device;
  return event;
#else
  return NoCuda("CudaEvent::Create");
#endif
}

CudaEvent::CudaEvent(CudaEvent&& other) noexcept
    : event_(std::exchange(other.event_, nullptr)),
      device_(std::exchange(other.device_, -1)) {}

CudaEvent& CudaEvent::operator=(CudaEvent&& other) noexcept {
  if (this != &other) {
    Destroy();
    event_ = std::exchange(other.event_, nullptr);
    device_ = std::exchange(other.device_, -1);
  }
  return *this;
}

CudaEvent::~CudaEvent() { Destroy(); }

void CudaEvent::Destroy() {
  if (event_ == nullptr) return;
#if TESSERA_CUDA_UTIL_CUDA
  CudaDeviceGuard guard(device_);
  if (cudaEventDestroy(NativeEvent(event_)) != cudaSuccess) {
    cudaGetLastError();
  }
#endif
  event_ = nullptr;
  device_ = -1;
}

absl::Status CudaEvent::Record(const CudaStream& stream) {
#if TESSERA_CUDA_UTIL_CUDA
  if (event_ == nullptr || !stream.valid()) {
    return absl::FailedPreconditionError("CudaEvent::Record: no event/stream");
  }
  if (stream.device() != device_) {
    return absl::InvalidArgumentError(
        absl::StrCat("CudaEvent::Record: event of cuda:", device_,
                     " on a stream of cuda:", stream.device()));
  }
  CudaDeviceGuard guard(device_);
  if (!guard.status().ok()) return guard.status();
  return CudaStatus(
      cudaEventRecord(NativeEvent(event_), NativeStream(stream.native())),
      "cudaEventRecord");
#else
  return NoCuda("CudaEvent::Record");
#endif
}

absl::Status CudaEvent::Synchronize() const {
#if TESSERA_CUDA_UTIL_CUDA
  if (event_ == nullptr) {
    return absl::FailedPreconditionError("CudaEvent::Synchronize: no event");
  }
  return CudaStatus(cudaEventSynchronize(NativeEvent(event_)),
                    absl::StrCat("cudaEventSynchronize on cuda:", device_));
#else
  return NoCuda("CudaEvent::Synchronize");
#endif
}

// ---- Copies -----------------------------------------------------------------

absl::Status CudaMemcpyAsync(void* dst, const void* src, size_t bytes,
                             const CudaStream& stream) {
#if TESSERA_CUDA_UTIL_CUDA
  if (!stream.valid()) {
    return absl::FailedPreconditionError("CudaMemcpyAsync: no stream");
  }
  if (bytes == 0) return absl::OkStatus();
  CudaDeviceGuard guard(stream.device());
  if (!guard.status().ok()) return guard.status();
  return CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault,
                                    NativeStream(stream.native())),
                    absl::StrCat("cudaMemcpyAsync of ", bytes, " bytes"));
#else
  return NoCuda("CudaMemcpyAsync");
#endif
}

// ---- CUDA devices -----------------------------------------------------------

absl::StatusOr<std::string> CudaDeviceUuid(int device) {
#if TESSERA_CUDA_UTIL_CUDA
  static absl::Mutex mu(absl::kConstInit);
  static auto* const cache = new std::map<int, std::string>();
  {
    absl::MutexLock lock(&mu);
    auto it = cache->find(device);
    if (it != cache->end()) return it->second;
  }
  cudaDeviceProp properties;
  RETURN_IF_ERROR(CudaStatus(cudaGetDeviceProperties(&properties, device),
                             "cudaGetDeviceProperties"));
  std::string uuid(properties.uuid.bytes, sizeof(properties.uuid.bytes));
  absl::MutexLock lock(&mu);
  cache->emplace(device, uuid);
  return uuid;
#else
  (void)device;
  return absl::FailedPreconditionError("built without CUDA");
#endif
}

std::optional<int> CudaDeviceWithUuid(absl::string_view uuid) {
  for (int device = 0; device < CudaDeviceCount(); ++device) {
    absl::StatusOr<std::string> found = CudaDeviceUuid(device);
    if (found.ok() && *found == uuid) return device;
  }
  return std::nullopt;
}

}  // namespace tessera
