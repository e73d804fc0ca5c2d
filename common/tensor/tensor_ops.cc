#include "common/tensor/tensor_ops.h"

#include <cmath>
#include <initializer_list>
#include <utility>
#include <vector>

#include <Eigen/Core>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace tessera {
namespace {

std::string SizesText(const std::vector<int64_t>& sizes) {
  return absl::StrCat("[", absl::StrJoin(sizes, ", "), "]");
}

// Calls fn(TypeTag<T>{}) with T float or double; `dtype` must be one of
// them (checked by CheckOperands).
template <typename Fn>
void DispatchFloating(DType dtype, Fn&& fn) {
  if (dtype == DType::kFloat32) {
    fn(TypeTag<float>{});
  } else {
    fn(TypeTag<double>{});
  }
}

// The operands of one kernel: defined, of one dtype (float32/float64 when
// `arithmetic`) and on one device.
absl::Status CheckOperands(absl::string_view op,
                           std::initializer_list<const Tensor*> operands,
                           bool arithmetic = true) {
  const Tensor* first = nullptr;
  for (const Tensor* t : operands) {
    if (!t->defined()) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": expected a defined tensor, got None"));
    }
    if (first == nullptr) {
      first = t;
      continue;
    }
    if (t->dtype() != first->dtype()) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": expected all tensors to have the same dtype, but got ",
          DTypeName(first->dtype()), " and ", DTypeName(t->dtype())));
    }
    if (t->device() != first->device()) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": expected all tensors to be on the same device, but found ",
          first->device().ToString(), " and ", t->device().ToString()));
    }
  }
  if (!arithmetic || first == nullptr) return absl::OkStatus();
  return CheckKernelDType(op, first->dtype());
}

// A contiguous host copy (the tensor itself when it already is one).
absl::StatusOr<Tensor> OnHost(const Tensor& tensor) {
  if (tensor.device().is_cpu()) return tensor.Contiguous();
  return tensor.To(Device::Cpu());
}

// A host result moved to the device its operands came from.
absl::StatusOr<Tensor> OnDevice(Tensor result, const Device& device) {
  if (device.is_cpu()) return result;
  return result.To(device);
}

template <typename T>
using RowMajor =
    Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename T>
using RowVector = Eigen::Matrix<T, 1, Eigen::Dynamic>;

// The rows of a [*, n] tensor seen as a matrix: the product of all sizes
// but the last.
int64_t LeadingRows(const Tensor& t) {
  return *CheckedProduct(absl::MakeConstSpan(t.sizes()).first(t.dim() - 1));
}

absl::Status SameDType(absl::string_view op, DType a, DType b) {
  if (a == b) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      op, ": expected all tensors to have the same dtype, but got ",
      DTypeName(a), " and ", DTypeName(b)));
}

// Everything EmbeddingBag checks but the index values.
absl::Status CheckBagShapes(const Tensor& input,
                            absl::Span<const int64_t> weight_sizes,
                            DType weight_dtype, absl::string_view mode) {
  if (mode != "sum" && mode != "mean" && mode != "max") {
    return absl::InvalidArgumentError("mode has to be one of sum, mean or max");
  }
  if (mode != "sum") {
    return absl::UnimplementedError(absl::StrCat(
        "embedding_bag: mode '", mode, "' is not implemented (only 'sum')"));
  }
  if (!input.defined() ||
      (input.dtype() != DType::kInt64 && input.dtype() != DType::kInt32)) {
    return absl::InvalidArgumentError(
        "embedding_bag: expected indices of type int64 or int32");
  }
  if (input.dim() == 1) {
    return absl::UnimplementedError(
        "embedding_bag: a 1-D input needs offsets, which Tessera does not "
        "support; pass one bag per row of a 2-D input");
  }
  if (input.dim() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("input has to be 1D or 2D Tensor, but got Tensor of "
                     "dimension ",
                     input.dim()));
  }
  if (weight_sizes.size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("embedding_bag: weight has to be a 2-D Tensor, got ",
                     SizesText({weight_sizes.begin(), weight_sizes.end()})));
  }
  return CheckKernelDType("embedding_bag", weight_dtype);
}

// The indices of `input` (int64 or int32, any device), widened to int64.
absl::StatusOr<std::vector<int64_t>> HostIndices(const Tensor& input) {
  ASSIGN_OR_RETURN(Tensor host, OnHost(input));
  std::vector<int64_t> out(host.numel());
  for (int64_t i = 0; i < host.numel(); ++i) {
    out[i] = host.dtype() == DType::kInt64 ? host.data<int64_t>()[i]
                                           : host.data<int32_t>()[i];
  }
  return out;
}

absl::Status CheckBounds(const std::vector<int64_t>& indices, int64_t rows) {
  for (int64_t index : indices) {
    if (index < 0 || index >= rows) {
      return absl::OutOfRangeError(
          absl::StrCat("index out of range in self: index ", index,
                       " is not in [0, ", rows, ")"));
    }
  }
  return absl::OkStatus();
}

// Sums each bag over the rows [row_offset, row_offset + rows) `weight`
// holds; with `check`, any other index is OUT_OF_RANGE.
absl::StatusOr<Tensor> SumBags(const Tensor& input, const Tensor& weight,
                               int64_t row_offset, absl::string_view mode,
                               bool check) {
  RETURN_IF_ERROR(CheckOperands("embedding_bag", {&weight}));
  RETURN_IF_ERROR(CheckBagShapes(input, weight.sizes(), weight.dtype(), mode));
  if (input.device() != weight.device()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "embedding_bag: expected all tensors to be on the same device, but "
        "found ",
        input.device().ToString(), " and ", weight.device().ToString()));
  }
  ASSIGN_OR_RETURN(const std::vector<int64_t> indices, HostIndices(input));
  const int64_t rows = weight.sizes()[0];
  if (check) RETURN_IF_ERROR(CheckBounds(indices, rows));
  ASSIGN_OR_RETURN(Tensor w, OnHost(weight));
  const int64_t bags = input.sizes()[0];
  const int64_t per_bag = input.sizes()[1];
  const int64_t width = weight.sizes()[1];
  ASSIGN_OR_RETURN(
      Tensor out,
      Tensor::Zeros({bags, width}, TensorOptions().WithDType(w.dtype())));
  DispatchFloating(w.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    Eigen::Map<const RowMajor<T>> table(w.data<T>(), rows, width);
    Eigen::Map<RowMajor<T>> sums(out.data<T>(), bags, width);
    for (int64_t b = 0; b < bags; ++b) {
      for (int64_t l = 0; l < per_bag; ++l) {
        const int64_t row = indices[b * per_bag + l] - row_offset;
        if (row >= 0 && row < rows) sums.row(b) += table.row(row);
      }
    }
  });
  return OnDevice(std::move(out), weight.device());
}

}  // namespace

absl::Status CheckKernelDType(absl::string_view op, DType dtype) {
  if (dtype == DType::kFloat32 || dtype == DType::kFloat64) {
    return absl::OkStatus();
  }
  return absl::UnimplementedError(
      absl::StrCat(op, ": not implemented for ", DTypeName(dtype),
                   "; Tessera's dense kernels cover float32 and float64"));
}

absl::StatusOr<Tensor> Asin(const Tensor& input) {
  RETURN_IF_ERROR(CheckOperands("asin", {&input}));
  ASSIGN_OR_RETURN(Tensor x, OnHost(input));
  ASSIGN_OR_RETURN(
      Tensor out,
      Tensor::Empty(x.sizes(), TensorOptions().WithDType(x.dtype())));
  DispatchFloating(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* in = x.data<T>();
    T* result = out.data<T>();
    for (int64_t i = 0; i < x.numel(); ++i) result[i] = std::asin(in[i]);
  });
  return OnDevice(std::move(out), input.device());
}

absl::Status CheckLinearArgs(const Tensor& input,
                             absl::Span<const int64_t> weight_sizes,
                             DType weight_dtype, const Tensor& bias) {
  if (!input.defined()) {
    return absl::InvalidArgumentError(
        "linear: expected a defined tensor, got None");
  }
  if (weight_sizes.size() != 2 || input.dim() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("linear: expected a 2-D weight and an input of at least 1 "
                     "dimension, got weight ",
                     SizesText({weight_sizes.begin(), weight_sizes.end()}),
                     " and input ", SizesText(input.sizes())));
  }
  RETURN_IF_ERROR(SameDType("linear", input.dtype(), weight_dtype));
  if (bias.defined()) {
    RETURN_IF_ERROR(SameDType("linear", bias.dtype(), weight_dtype));
  }
  RETURN_IF_ERROR(CheckKernelDType("linear", weight_dtype));
  const int64_t in = input.sizes().back();
  const int64_t out_features = weight_sizes[0];
  if (weight_sizes[1] != in) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mat1 and mat2 shapes cannot be multiplied (", LeadingRows(input), "x",
        in, " and ", weight_sizes[1], "x", out_features, ")"));
  }
  if (bias.defined() && bias.sizes() != std::vector<int64_t>{out_features}) {
    return absl::InvalidArgumentError(
        absl::StrCat("linear: bias has size ", SizesText(bias.sizes()),
                     ", but should be [", out_features, "]"));
  }
  return absl::OkStatus();
}

absl::Status CheckEmbeddingBagArgs(const Tensor& input,
                                   absl::Span<const int64_t> weight_sizes,
                                   DType weight_dtype, absl::string_view mode) {
  RETURN_IF_ERROR(CheckBagShapes(input, weight_sizes, weight_dtype, mode));
  ASSIGN_OR_RETURN(const std::vector<int64_t> indices, HostIndices(input));
  return CheckBounds(indices, weight_sizes[0]);
}

absl::StatusOr<Tensor> Linear(const Tensor& input, const Tensor& weight,
                              const Tensor& bias) {
  if (bias.defined()) {
    RETURN_IF_ERROR(CheckOperands("linear", {&input, &weight, &bias}));
  } else {
    RETURN_IF_ERROR(CheckOperands("linear", {&input, &weight}));
  }
  RETURN_IF_ERROR(CheckLinearArgs(input, weight.sizes(), weight.dtype(), bias));
  const int64_t in = input.sizes().back();
  const int64_t out_features = weight.sizes()[0];
  const int64_t rows = LeadingRows(input);
  ASSIGN_OR_RETURN(Tensor x, OnHost(input));
  ASSIGN_OR_RETURN(Tensor w, OnHost(weight));
  Tensor b;
  if (bias.defined()) {
    ASSIGN_OR_RETURN(b, OnHost(bias));
  }
  std::vector<int64_t> sizes = input.sizes();
  sizes.back() = out_features;
  ASSIGN_OR_RETURN(Tensor out,
                   Tensor::Empty(sizes, TensorOptions().WithDType(x.dtype())));
  DispatchFloating(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    Eigen::Map<const RowMajor<T>> xm(x.data<T>(), rows, in);
    Eigen::Map<const RowMajor<T>> wm(w.data<T>(), out_features, in);
    Eigen::Map<RowMajor<T>> ym(out.data<T>(), rows, out_features);
    ym.noalias() = xm * wm.transpose();
    if (b.defined()) {
      ym.rowwise() += Eigen::Map<const RowVector<T>>(b.data<T>(), out_features);
    }
  });
  return OnDevice(std::move(out), input.device());
}

absl::StatusOr<Tensor> EmbeddingBag(const Tensor& input, const Tensor& weight,
                                    absl::string_view mode) {
  return SumBags(input, weight, /*row_offset=*/0, mode, /*check=*/true);
}

absl::StatusOr<Tensor> EmbeddingBagRows(const Tensor& input,
                                        const Tensor& weight,
                                        int64_t row_offset,
                                        absl::string_view mode) {
  return SumBags(input, weight, row_offset, mode, /*check=*/false);
}

absl::StatusOr<Tensor> Cat(absl::Span<const Tensor> tensors, int64_t dim) {
  if (tensors.empty()) {
    return absl::InvalidArgumentError(
        "torch.cat(): expected a non-empty list of Tensors");
  }
  const Tensor& first = tensors.front();
  ASSIGN_OR_RETURN(const int64_t d,
                   WrapDim(dim, first.dim(), /*wrap_scalar=*/false));
  std::vector<int64_t> sizes = first.sizes();
  sizes[d] = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    RETURN_IF_ERROR(CheckOperands("torch.cat()", {&first, &t},
                                  /*arithmetic=*/false));
    if (t.dim() != first.dim()) {
      return absl::InvalidArgumentError(
          absl::StrCat("Tensors must have same number of dimensions: got ",
                       first.dim(), " and ", t.dim()));
    }
    for (int64_t k = 0; k < t.dim(); ++k) {
      if (k == d || t.sizes()[k] == first.sizes()[k]) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          "Sizes of tensors must match except in dimension ", d,
          ". Expected size ", first.sizes()[k], " but got size ", t.sizes()[k],
          " for tensor number ", i, " in the list."));
    }
    sizes[d] += t.sizes()[d];
  }
  ASSIGN_OR_RETURN(
      Tensor out,
      Tensor::Empty(
          sizes,
          TensorOptions().WithDType(first.dtype()).WithDevice(first.device())));
  std::vector<int64_t> offsets(sizes.size(), 0);
  const std::vector<int64_t> zeros(sizes.size(), 0);
  for (const Tensor& t : tensors) {
    RETURN_IF_ERROR(CopyBox(t, zeros, out, offsets, t.sizes()));
    offsets[d] += t.sizes()[d];
  }
  return out;
}

absl::StatusOr<Tensor> Sum(absl::Span<const Tensor> tensors) {
  if (tensors.empty()) {
    return absl::InvalidArgumentError("sum: expected a non-empty list");
  }
  const Tensor& first = tensors.front();
  for (const Tensor& t : tensors) {
    RETURN_IF_ERROR(CheckOperands("sum", {&first, &t}));
    if (t.sizes() != first.sizes()) {
      return absl::InvalidArgumentError(
          absl::StrCat("sum: sizes differ: ", SizesText(first.sizes()), " and ",
                       SizesText(t.sizes())));
    }
  }
  ASSIGN_OR_RETURN(Tensor out, OnHost(first));
  if (out.storage() == first.storage()) {
    ASSIGN_OR_RETURN(out, out.Clone());
  }
  for (size_t i = 1; i < tensors.size(); ++i) {
    ASSIGN_OR_RETURN(Tensor t, OnHost(tensors[i]));
    DispatchFloating(out.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      using Array = Eigen::Array<T, Eigen::Dynamic, 1>;
      Eigen::Map<Array>(out.data<T>(), out.numel()) +=
          Eigen::Map<const Array>(t.data<T>(), t.numel());
    });
  }
  return OnDevice(std::move(out), first.device());
}

}  // namespace tessera
