#include "common/tensor/tensor.h"

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/tensor/cuda_util.h"
#include "common/tensor/tensor.h"
#include "common/tensor/tensor_internal.h"

namespace tessera {
using internal_tensor::CheckedNumel;
using internal_tensor::ContiguousStrides;
using internal_tensor::CudaUnavailableError;
using internal_tensor::kIsComplex;
using internal_tensor::kIsFloat;
using internal_tensor::SizesString;
#if TESSERA_TENSOR_CUDA
using internal_tensor::CudaError;
#endif

// ---- Filling new tensors ----------------------------------------------------

absl::Status Tensor::CheckFillValue(double value, DType dtype) {
  return DispatchDType(dtype, [&](auto tag) -> absl::Status {
    using T = typename decltype(tag)::type;
    double low = 0, high = 0;
    if constexpr (internal_tensor::kIsInteger<T>) {
      high = static_cast<double>(std::numeric_limits<T>::max());
      low = std::is_signed_v<T>
                ? static_cast<double>(std::numeric_limits<T>::min())
                : -high;
      // Past the range once truncated: int64's max is not a double, 2^63 is.
      if (!std::isnan(value) && std::trunc(value) >= low &&
          (std::is_same_v<T, int64_t> ? std::trunc(value) < 0x1p63
                                      : std::trunc(value) <= high)) {
        return absl::OkStatus();
      }
    } else if constexpr (std::is_same_v<T, Half>) {
      high = 65504.0;
    } else if constexpr (std::is_same_v<T, BFloat16>) {
      high = 0x1.fep127;
    } else if constexpr (std::is_same_v<T, float>) {
      high = std::numeric_limits<float>::max();
    } else {
      return absl::OkStatus();  // double, complex, bool
    }
    if constexpr (!internal_tensor::kIsInteger<T>) {
      if (!std::isfinite(value) || std::fabs(value) <= high) {
        return absl::OkStatus();
      }
      low = -high;
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "fill value ", value, " cannot be converted to ", DTypeName(dtype),
        " without overflow (", DTypeName(dtype), " takes ", low, " to ", high,
        low < 0 && std::is_unsigned_v<T> ? ", negative values wrapping" : "",
        ")"));
  });
}

namespace {

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
  ASSIGN_OR_RETURN(std::shared_ptr<Storage> storage,
                   Storage::Allocate(nbytes, options.device, options.pin_memory,
                                     options.sharing));
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
  if (storage->data() == nullptr || storage->nbytes() == 0 ||
      storage->allocated_zeroed()) {
    return tensor;
  }
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
  RETURN_IF_ERROR(CheckFillValue(value, options.dtype));
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
