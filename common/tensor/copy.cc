#include "common/tensor/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/tensor/cuda_util.h"
#include "common/tensor/tensor.h"
#include "common/tensor/tensor_internal.h"

namespace tessera {
using internal_tensor::CudaUnavailableError;
using internal_tensor::kIsComplex;
using internal_tensor::kIsInteger;
using internal_tensor::kIsReducedFloat;
using internal_tensor::SizesString;
#if TESSERA_TENSOR_CUDA
using internal_tensor::CudaError;
#endif

namespace {

// ---- Element conversions for ToDType -------------------------------------

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

// How a copy walks a box of `sizes` (strides in elements, `width` bytes an
// element): the dimensions without size-1 ones, in bytes, merged wherever
// a dimension is contiguous with the next in both tensors, and the
// innermost stretch contiguous in both split off as the run.
struct CopyShape {
  std::vector<CopyDim> dims;
  int64_t run = 0;  // Bytes.
};
CopyShape ShapeOfCopy(absl::Span<const int64_t> sizes,
                      absl::Span<const int64_t> src_strides,
                      absl::Span<const int64_t> dst_strides, int64_t width) {
  CopyShape shape;
  std::vector<CopyDim>& dims = shape.dims;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 1) continue;
    const CopyDim dim{sizes[d], src_strides[d] * width, dst_strides[d] * width};
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
  shape.run = width;
  if (!dims.empty() && dims.back().src_stride == width &&
      dims.back().dst_stride == width) {
    shape.run = dims.back().size * width;
    dims.pop_back();
  }
  return shape;
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

}  // namespace

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

namespace {

// The walk of a copy of `src` into its row-major (contiguous) layout.
CopyShape RowMajorShapeOf(const Tensor& src) {
  std::vector<int64_t> row_major(src.sizes().size());
  int64_t elements = 1;
  for (size_t d = row_major.size(); d-- > 0;) {
    row_major[d] = elements;
    elements *= src.sizes()[d];
  }
  return ShapeOfCopy(src.sizes(), src.strides(), row_major,
                     static_cast<int64_t>(src.element_size()));
}

}  // namespace

absl::Status ForEachRowMajorRun(
    const Tensor& src, int64_t offset, size_t bytes,
    absl::FunctionRef<void(const char*, size_t)> visit) {
  if (!src.defined() || !src.device().is_cpu()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "row-major bytes of ",
        src.defined() ? src.DebugString() : std::string("undefined tensor"),
        " is not a tensor in host memory"));
  }
  const int64_t total = static_cast<int64_t>(src.nbytes());
  if (offset < 0 || offset > total ||
      bytes > static_cast<uint64_t>(total - offset)) {
    return absl::OutOfRangeError(
        absl::StrCat("row-major bytes [", offset, ", +", bytes, ") of ",
                     src.DebugString(), ", which has ", total));
  }
  if (bytes == 0) return absl::OkStatus();
  // The walk of a copy into the row-major (contiguous) layout.
  const CopyShape shape = RowMajorShapeOf(src);
  const std::vector<CopyDim>& dims = shape.dims;
  const int64_t run = shape.run;
  // The run holding `offset`, as an index per remaining dimension.
  std::vector<int64_t> index(dims.size());
  int64_t rest = offset / run;
  int64_t at = 0;
  for (size_t d = dims.size(); d-- > 0;) {
    index[d] = rest % dims[d].size;
    rest /= dims[d].size;
    at += index[d] * dims[d].src_stride;
  }
  const char* base = static_cast<const char*>(src.data_ptr());
  int64_t within = offset % run;
  size_t left = bytes;
  while (true) {
    const size_t n = std::min(static_cast<size_t>(run - within), left);
    visit(base + at + within, n);
    left -= n;
    if (left == 0) return absl::OkStatus();
    within = 0;
    for (size_t d = dims.size(); d-- > 0;) {
      at += dims[d].src_stride;
      if (++index[d] < dims[d].size) break;
      at -= dims[d].src_stride * dims[d].size;
      index[d] = 0;
    }
  }
}

absl::Status CopyRowMajorBytes(const Tensor& src, int64_t offset, size_t bytes,
                               void* out) {
  char* to = static_cast<char*>(out);
  return ForEachRowMajorRun(src, offset, bytes,
                            [&to](const char* run, size_t n) {
                              std::memcpy(to, run, n);
                              to += n;
                            });
}

int64_t RowMajorRunBytes(const Tensor& src) {
  if (!src.defined() || src.nbytes() == 0) return 0;
  return RowMajorShapeOf(src).run;
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

  const int64_t width = static_cast<int64_t>(src.element_size());
  int64_t src_start = src.storage_offset_;
  int64_t dst_start = dst.storage_offset_;
  for (size_t d = 0; d < rank; ++d) {
    src_start += src_offsets[d] * src.strides_[d];
    dst_start += dst_offsets[d] * dst.strides_[d];
  }
  CopyShape shape = ShapeOfCopy(sizes, src.strides_, dst.strides_, width);
  std::vector<CopyDim>& dims = shape.dims;
  const int64_t run = shape.run;
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

}  // namespace tessera
