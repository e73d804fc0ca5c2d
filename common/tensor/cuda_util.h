// Small RAII helpers over the CUDA runtime: a device guard, streams, events
// and asynchronous copies, with every CUDA error turned into an
// absl::Status.
//
// The header does not need CUDA: its types hold the runtime's handles as
// opaque pointers, so code that uses them compiles in any build. Built
// without CUDA (TESSERA_WITH_CUDA off), every factory and operation returns
// FAILED_PRECONDITION; there can be no CUDA tensor to use them on then.
//
// Errors: a CUDA call that fails gives INTERNAL ("<call> failed: <CUDA's
// description> (<code>)"), RESOURCE_EXHAUSTED when it ran out of memory,
// UNAVAILABLE when the device or driver cannot be used now. Nothing here
// aborts. Non-sticky errors are cleared so that later calls succeed.
//
// Thread-safety: the objects are values owned by one user at a time;
// distinct objects may be used from distinct threads (the CUDA runtime is
// thread-safe). Destructors never fail: their errors are dropped.
#ifndef TESSERA_COMMON_TENSOR_CUDA_UTIL_H_
#define TESSERA_COMMON_TENSOR_CUDA_UTIL_H_

#include <cstddef>

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#if defined(TESSERA_WITH_CUDA) && TESSERA_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace tessera {

#if defined(TESSERA_WITH_CUDA) && TESSERA_WITH_CUDA
// OK for cudaSuccess; otherwise the status described above for `what`
// (e.g. "cudaMemcpyAsync"), after clearing a non-sticky error.
absl::Status CudaStatus(cudaError_t error, absl::string_view what);
#endif

// Makes CUDA device `device` current for the guard's lifetime and then
// restores the device that was current before.
class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(int device);
  ~CudaDeviceGuard();
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;

  // OK when `device` is current; otherwise why it could not be made so.
  const absl::Status& status() const { return status_; }

 private:
  int previous_ = -1;
  absl::Status status_;
};

// A CUDA stream on one device, created non-blocking
// (cudaStreamNonBlocking): its work does not wait for, nor hold up, the
// legacy default stream. Move-only. The destructor waits for the stream's
// work to end before destroying it, so memory its copies touch may be
// freed once the stream is gone.
class CudaStream {
 public:
  // A new stream on `device`.
  static absl::StatusOr<CudaStream> Create(int device);

  CudaStream() = default;
  CudaStream(CudaStream&& other) noexcept;
  CudaStream& operator=(CudaStream&& other) noexcept;
  ~CudaStream();

  bool valid() const { return stream_ != nullptr; }
  int device() const { return device_; }
  // The cudaStream_t.
  void* native() const { return stream_; }

  // Work enqueued on this stream from now on runs after all work enqueued
  // so far on the device's legacy default stream (and, through its
  // implicit synchronisation, on every blocking stream): what a
  // non-blocking stream needs before touching memory that synchronous
  // calls (cudaMemset, cudaMemcpy between devices) may still be writing.
  // Does not block the host.
  absl::Status WaitForLegacyStream() const;
  // Blocks until the stream's work is done; the first error of that work.
  absl::Status Synchronize() const;

 private:
  void Destroy();

  void* stream_ = nullptr;
  int device_ = -1;
};

// A CUDA event on one device, without timing. Move-only.
class CudaEvent {
 public:
  static absl::StatusOr<CudaEvent> Create(int device);

  CudaEvent() = default;
  CudaEvent(CudaEvent&& other) noexcept;
  CudaEvent& operator=(CudaEvent&& other) noexcept;
  ~CudaEvent();

  bool valid() const { return event_ != nullptr; }
  int device() const { return device_; }

  // Captures the work enqueued so far on `stream` (of the same device).
  absl::Status Record(const CudaStream& stream);
  // Blocks until the captured work is done; its error, if any.
  absl::Status Synchronize() const;

 private:
  void Destroy();

  void* event_ = nullptr;
  int device_ = -1;
};

// Enqueues a copy of `bytes` from `src` to `dst` on `stream`; either may be
// host or device memory (cudaMemcpyDefault). Host memory must be pinned for
// the copy to be asynchronous, and both must stay valid until the stream
// has run it. Zero bytes enqueue nothing.
absl::Status CudaMemcpyAsync(void* dst, const void* src, size_t bytes,
                             const CudaStream& stream);

// The 16-byte UUID of CUDA device `device` (cudaDeviceProp.uuid), which
// names the same GPU in every process whatever CUDA_VISIBLE_DEVICES says.
// Cached per device. FAILED_PRECONDITION without CUDA.
absl::StatusOr<std::string> CudaDeviceUuid(int device);
// The index of the visible device with that UUID; nullopt when none is.
std::optional<int> CudaDeviceWithUuid(absl::string_view uuid);

}  // namespace tessera

#endif  // TESSERA_COMMON_TENSOR_CUDA_UTIL_H_
