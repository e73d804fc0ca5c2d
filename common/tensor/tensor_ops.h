// Dense tensor operators: the reference kernels that sharded operators
// (server/sharded/sharded_ops.h) are checked against and built from. Tessera is
// no tensor library; these are the few ops a sharded module needs, with
// PyTorch's semantics and error wording.
//
// Arithmetic runs on the host for float32 and float64; other dtypes are
// UNIMPLEMENTED ("asin: not implemented for int64; Tessera's dense kernels
// cover float32 and float64"). CUDA operands are copied to the host and the
// result back to the first operand's device. Copy-only ops (Cat) take any
// dtype. Inputs may be non-contiguous; results are new contiguous tensors.
//
// Thread-safety: pure functions of their arguments. Failure: bad shapes,
// dtypes or devices are INVALID_ARGUMENT, bad indices OUT_OF_RANGE; nothing
// is written to an input.
#ifndef TESSERA_COMMON_TENSOR_TENSOR_OPS_H_
#define TESSERA_COMMON_TENSOR_TENSOR_OPS_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/tensor/tensor.h"

namespace tessera {

// UNIMPLEMENTED "<op>: not implemented for int64; Tessera's dense kernels
// cover float32 and float64" unless the arithmetic kernels take `dtype`.
absl::Status CheckKernelDType(absl::string_view op, DType dtype);

// torch.asin, element-wise.
absl::StatusOr<Tensor> Asin(const Tensor& input);

// torch.nn.functional.linear: input [*, in] times weight [out, in]
// transposed, plus bias [out] when it is defined; the result is [*, out].
// INVALID_ARGUMENT "mat1 and mat2 shapes cannot be multiplied (15x31 and
// 32x16)" for mismatched sizes, and for operands of different dtypes or
// devices.
absl::StatusOr<Tensor> Linear(const Tensor& input, const Tensor& weight,
                              const Tensor& bias = Tensor());

// torch.nn.functional.embedding_bag with a 2-D input (each row one bag of
// int64 or int32 indices into weight's rows, no offsets): out[b] = sum of
// weight[input[b][l]] over l. Only mode "sum" is implemented ("mean" and
// "max" are UNIMPLEMENTED, other modes INVALID_ARGUMENT "mode has to be one
// of sum, mean or max"). OUT_OF_RANGE "index out of range in self" for an
// index outside [0, weight.size(0)).
absl::StatusOr<Tensor> EmbeddingBag(const Tensor& input, const Tensor& weight,
                                    absl::string_view mode = "sum");
// The bags' sums over rows [row_offset, row_offset + weight.size(0)) of a
// larger table of which `weight` holds those rows (a row-wise shard):
// indices outside that range contribute nothing, so summing every shard's
// result gives EmbeddingBag of the whole table.
absl::StatusOr<Tensor> EmbeddingBagRows(const Tensor& input,
                                        const Tensor& weight,
                                        int64_t row_offset,
                                        absl::string_view mode = "sum");

// The argument checks of Linear and EmbeddingBag (index bounds included)
// against a weight of `weight_sizes` and `weight_dtype`, with the same
// errors: for callers that compute the op piecewise from a sharded weight
// and must reject bad arguments before any piece is computed. Devices are
// not compared.
absl::Status CheckLinearArgs(const Tensor& input,
                             absl::Span<const int64_t> weight_sizes,
                             DType weight_dtype, const Tensor& bias);
absl::Status CheckEmbeddingBagArgs(const Tensor& input,
                                   absl::Span<const int64_t> weight_sizes,
                                   DType weight_dtype, absl::string_view mode);

// torch.cat: the tensors joined along `dim` (negative counts from the
// end). Same dtype, device and rank, equal sizes except along `dim`.
// INVALID_ARGUMENT "torch.cat(): expected a non-empty list of Tensors",
// "Sizes of tensors must match except in dimension 0. Expected size 20 but
// got size 10 for tensor number 1 in the list.".
absl::StatusOr<Tensor> Cat(absl::Span<const Tensor> tensors, int64_t dim = 0);

// Element-wise sum of tensors of one dtype and size, added in list order,
// so that members adding the same list get the same bits.
absl::StatusOr<Tensor> Sum(absl::Span<const Tensor> tensors);

}  // namespace tessera

#endif  // TESSERA_COMMON_TENSOR_TENSOR_OPS_H_
