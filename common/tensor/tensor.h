// Storage and Tensor: N-d strided tensors of any of the 12 dtypes, in host
// memory (pageable or pinned), on a CUDA device (when Tessera is built with
// CUDA), or on the meta device (shape only, no bytes).
//
// A Tensor is a view: (storage, storage offset, sizes, strides, dtype).
// Views created by Narrow/Transpose/T share the storage and may be
// non-contiguous; Contiguous()/Clone() copy. Copying a Tensor object copies
// the view, not the bytes (like torch.Tensor's Python references).
//
// Thread-safety: a Tensor object is a value; const methods may be called
// concurrently. Writing the same elements from several threads at once is
// a data race, as for any buffer. The default random generator is
// internally synchronised.
//
// Failure: every operation that can fail returns absl::Status[Or] and
// leaves its outputs untouched on failure. Nothing aborts on bad input.
#ifndef TESSERA_COMMON_TENSOR_TENSOR_H_
#define TESSERA_COMMON_TENSOR_TENSOR_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/device.h"
#include "common/dtype.h"
#include "common/tensor/random.h"
#include "common/tensor/storage.h"

namespace tessera {

// How to create a tensor.
struct TensorOptions {
  DType dtype = DType::kFloat32;
  Device device = Device::Cpu();
  bool pin_memory = false;     // Only meaningful on the CPU.
  bool requires_grad = false;  // Metadata only: Tessera has no autograd.
  // Unpinned host memory only (see HostSharing, storage.h).
  HostSharing sharing = HostSharing::kIfEnabled;

  TensorOptions& WithDType(DType d) {
    dtype = d;
    return *this;
  }
  TensorOptions& WithDevice(Device d) {
    device = d;
    return *this;
  }
  TensorOptions& WithPinMemory(bool p) {
    pin_memory = p;
    return *this;
  }
  TensorOptions& WithRequiresGrad(bool r) {
    requires_grad = r;
    return *this;
  }
  TensorOptions& WithSharing(HostSharing s) {
    sharing = s;
    return *this;
  }
  // Memory that stays in this process (HostSharing::kPrivate).
  TensorOptions& Private() { return WithSharing(HostSharing::kPrivate); }
};

class Tensor {
 public:
  // An undefined tensor: no storage, defined() is false.
  Tensor() = default;

  // Factories. INVALID_ARGUMENT for negative sizes or an unsupported
  // combination (pin_memory off the CPU); allocation errors as Storage.
  static absl::StatusOr<Tensor> Empty(absl::Span<const int64_t> sizes,
                                      const TensorOptions& options = {});
  static absl::StatusOr<Tensor> Zeros(absl::Span<const int64_t> sizes,
                                      const TensorOptions& options = {});
  static absl::StatusOr<Tensor> Ones(absl::Span<const int64_t> sizes,
                                     const TensorOptions& options = {});
  // Every element set to `value` converted to the dtype (real part for
  // complex dtypes, value != 0 for bool, truncated toward zero for
  // integers). INVALID_ARGUMENT, as torch.full, for a value the dtype
  // cannot hold: NaN or one out of range for an integer dtype (unsigned
  // ones wrap from down to minus their maximum, as in PyTorch), a finite
  // one beyond a floating dtype's largest.
  static absl::StatusOr<Tensor> Full(absl::Span<const int64_t> sizes,
                                     double value,
                                     const TensorOptions& options = {});
  // Full's check of `value` alone (OK or its INVALID_ARGUMENT).
  static absl::Status CheckFillValue(double value, DType dtype);
  // Uniform in [0, 1) / standard normal, for floating and complex dtypes
  // (both parts drawn); INVALID_ARGUMENT for integer and bool dtypes.
  // Elements are drawn in row-major order from `generator` (the default
  // generator when null), so equal seeds give equal tensors; complex
  // elements draw the real part, then the imaginary part. As in PyTorch, a
  // complex standard normal has variance 1/2 in each part. CUDA tensors are
  // drawn on the host and copied, so they equal CPU draws with the same
  // seed. Meta tensors draw nothing.
  static absl::StatusOr<Tensor> Rand(absl::Span<const int64_t> sizes,
                                     const TensorOptions& options = {},
                                     Generator* generator = nullptr);
  static absl::StatusOr<Tensor> Randn(absl::Span<const int64_t> sizes,
                                      const TensorOptions& options = {},
                                      Generator* generator = nullptr);
  // A CPU tensor holding a copy of `values`, with the given sizes;
  // INVALID_ARGUMENT unless values.size() is the product of `sizes`.
  // Defined for the 12 element types of DTypeOf (explicitly instantiated in
  // tensor.cc).
  template <typename T>
  static absl::StatusOr<Tensor> FromVector(absl::Span<const T> values,
                                           absl::Span<const int64_t> sizes);
  // A view of `storage` (torch.as_strided): element 0 at `storage_offset`
  // elements of `dtype` from the storage's start, with the given sizes and
  // strides (in elements). INVALID_ARGUMENT for a null storage, negative
  // numbers or mismatched sizes/strides counts; OUT_OF_RANGE when an
  // element of a non-empty view would lie outside the storage's bytes
  // (checked on the meta device too, against nbytes()).
  static absl::StatusOr<Tensor> FromStorage(std::shared_ptr<Storage> storage,
                                            DType dtype, int64_t storage_offset,
                                            absl::Span<const int64_t> sizes,
                                            absl::Span<const int64_t> strides);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  const Device& device() const;
  const std::vector<int64_t>& sizes() const { return sizes_; }
  const std::vector<int64_t>& strides() const { return strides_; }
  int64_t dim() const { return static_cast<int64_t>(sizes_.size()); }
  // Size of dimension `d`; negative d counts from the end. OUT_OF_RANGE
  // "Dimension out of range (expected to be in range of [-2, 1], but got
  // 2)" otherwise.
  absl::StatusOr<int64_t> size(int64_t d) const;
  int64_t numel() const;
  size_t element_size() const { return ElementSize(dtype_); }
  size_t nbytes() const {
    return static_cast<size_t>(numel()) * element_size();
  }
  int64_t storage_offset() const { return storage_offset_; }
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  bool requires_grad() const { return requires_grad_; }
  void set_requires_grad(bool r) { requires_grad_ = r; }
  bool is_pinned() const;
  // Row-major with no gaps (dimensions of size 1 may have any stride).
  bool is_contiguous() const;

  // Address of element 0 of the view (null for meta or empty storage, and
  // for undefined tensors).
  void* data_ptr() const;
  template <typename T>
  T* data() const {
    return static_cast<T*>(data_ptr());
  }

  // View of `length` entries of dimension `dim` starting at `start`
  // (torch.narrow). INVALID_ARGUMENT / OUT_OF_RANGE for bad arguments.
  absl::StatusOr<Tensor> Narrow(int64_t dim, int64_t start,
                                int64_t length) const;
  // View with two dimensions swapped (negative dims allowed).
  absl::StatusOr<Tensor> Transpose(int64_t dim0, int64_t dim1) const;
  // Transpose of a tensor with at most 2 dimensions (torch.Tensor.t()).
  absl::StatusOr<Tensor> T() const;
  // Same view reinterpreted with new sizes; requires a contiguous tensor
  // and an equal number of elements.
  absl::StatusOr<Tensor> View(absl::Span<const int64_t> sizes) const;

  // This tensor when contiguous, otherwise a contiguous copy.
  absl::StatusOr<Tensor> Contiguous() const;
  // A contiguous copy with its own storage, on the same device.
  absl::StatusOr<Tensor> Clone() const;
  // A contiguous copy on `device` (pinned when asked and on the CPU).
  absl::StatusOr<Tensor> To(Device device, bool pin_memory = false) const;
  // A copy with elements converted to `dtype` (same device). Complex to
  // real keeps the real part; to bool tests != 0 (either part for complex);
  // floating to integer truncates toward zero through int64, saturating at
  // the int64 range with NaN giving 0, then wraps to narrower types like a
  // C cast (so results are defined for every input).
  absl::StatusOr<Tensor> ToDType(DType dtype) const;

  // "Tensor(float32, [3, 20], cpu)".
  std::string DebugString() const;

 private:
  friend absl::Status CopyBox(const Tensor&, absl::Span<const int64_t>,
                              const Tensor&, absl::Span<const int64_t>,
                              absl::Span<const int64_t>);
  std::shared_ptr<Storage> storage_;
  int64_t storage_offset_ = 0;  // In elements.
  std::vector<int64_t> sizes_;
  std::vector<int64_t> strides_;  // In elements.
  DType dtype_ = DType::kFloat32;
  bool requires_grad_ = false;
};

// Copies the box of extent `sizes` at `src_offsets` in `src` to the box at
// `dst_offsets` in `dst` (any strides, any devices: host<->CUDA via
// cudaMemcpy). The dtypes must match. INVALID_ARGUMENT for rank or dtype
// mismatches and negative offsets or sizes, OUT_OF_RANGE when a box leaves
// its tensor (checked even for empty boxes). `dst` is a view, so it is taken
// by const reference: the bytes it points at are written. Dimensions that
// are contiguous in both tensors are merged, so copies between contiguous
// layouts are single memcpys. Overlapping src and dst bytes give unspecified
// (but memory-safe) results. A meta `dst` takes nothing (OK); a meta `src`
// with a non-empty box and a real `dst` is INVALID_ARGUMENT (no data).
absl::Status CopyBox(const Tensor& src, absl::Span<const int64_t> src_offsets,
                     const Tensor& dst, absl::Span<const int64_t> dst_offsets,
                     absl::Span<const int64_t> sizes);
// Copies all of `src` into `dst` (same sizes and dtype).
absl::Status CopyInto(const Tensor& src, const Tensor& dst);
// Copies bytes [offset, offset + bytes) of the row-major bytes of `src`
// (what src.Contiguous() would hold; any strides) to `out`, which must
// have room for them. A range may start and end anywhere, also inside an
// element. Runs that are contiguous in `src` are single memcpys.
// INVALID_ARGUMENT for an undefined tensor or one not on the CPU,
// OUT_OF_RANGE for a range outside [0, src.nbytes()].
absl::Status CopyRowMajorBytes(const Tensor& src, int64_t offset, size_t bytes,
                               void* out);
// The same range handed to `visit` as the runs that are contiguous in
// `src`, in order, without a copy (for a sender that gathers them with
// one writev): visit(pointer into src, length). Same errors, before any
// visit.
absl::Status ForEachRowMajorRun(
    const Tensor& src, int64_t offset, size_t bytes,
    absl::FunctionRef<void(const char*, size_t)> visit);
// The bytes of the longest runs ForEachRowMajorRun hands out for `src`
// (all of them for a contiguous tensor); 0 for an undefined or empty one.
int64_t RowMajorRunBytes(const Tensor& src);

// True when both tensors have the same dtype, sizes and element values
// (torch.equal: NaN != NaN, -0 == +0). Tensors on CUDA are compared via a
// host copy; meta tensors compare by dtype and sizes (a meta and a non-meta
// tensor are never equal). Two undefined tensors are equal.
bool Equal(const Tensor& a, const Tensor& b);

// Maps a possibly negative dimension index onto [0, ndim) (PyTorch's
// maybe_wrap_dim). OUT_OF_RANGE "Dimension out of range (expected to be in
// range of [-2, 1], but got 2)"; a 0-d shape accepts 0 and -1 when
// `wrap_scalar` is set and nothing otherwise.
absl::StatusOr<int64_t> WrapDim(int64_t d, int64_t ndim, bool wrap_scalar);

// Product of `sizes` (the element count of a box or tensor): 0 when any
// size is 0, even if the others would overflow; nullopt on int64 overflow.
// Sizes must be non-negative.
std::optional<int64_t> CheckedProduct(absl::Span<const int64_t> sizes);

}  // namespace tessera

#endif  // TESSERA_COMMON_TENSOR_TENSOR_H_
