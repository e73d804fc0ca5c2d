// Helpers shared by the files of common/tensor/ (tensor, storage, copy):
// not part of the API.
#ifndef TESSERA_COMMON_TENSOR_TENSOR_INTERNAL_H_
#define TESSERA_COMMON_TENSOR_TENSOR_INTERNAL_H_

#include <algorithm>
#include <complex>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/dtype.h"

#if defined(TESSERA_WITH_CUDA) && TESSERA_WITH_CUDA
#include <cuda_runtime_api.h>
#define TESSERA_TENSOR_CUDA 1
#else
#define TESSERA_TENSOR_CUDA 0
#endif

namespace tessera::internal_tensor {

// Element type classes of the dtypes' C++ types (common/dtype.h).
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

inline std::string SizesString(absl::Span<const int64_t> sizes) {
  return absl::StrCat("[", absl::StrJoin(sizes, ", "), "]");
}

#if TESSERA_TENSOR_CUDA
inline absl::Status CudaError(absl::string_view what, cudaError_t error) {
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

inline absl::Status CudaUnavailableError() {
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
inline absl::StatusOr<int64_t> CheckedNumel(absl::Span<const int64_t> sizes) {
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
// [2, 0, 3] tensor has strides [3, 3, 1]. The products saturate at
// INT64_MAX: only a tensor without elements (a zero dimension beside huge
// ones, e.g. a crafted .npy shape) gets there, and its strides address
// nothing.
inline std::vector<int64_t> ContiguousStrides(absl::Span<const int64_t> sizes) {
  std::vector<int64_t> strides(sizes.size());
  int64_t stride = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    strides[i] = stride;
    if (__builtin_mul_overflow(stride, std::max<int64_t>(sizes[i], 1),
                               &stride)) {
      stride = std::numeric_limits<int64_t>::max();
    }
  }
  return strides;
}

}  // namespace tessera::internal_tensor

#endif  // TESSERA_COMMON_TENSOR_TENSOR_INTERNAL_H_
