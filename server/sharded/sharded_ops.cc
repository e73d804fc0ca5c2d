#include "server/sharded/sharded_ops.h"

#include <functional>
#include <type_traits>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/sharding_spec.h"
#include "common/tensor/tensor_ops.h"

namespace tessera {
namespace {

// ---- Arguments -------------------------------------------------------------

template <typename T>
constexpr absl::string_view KindName() {
  if constexpr (std::is_same_v<T, Tensor>) {
    return "Tensor";
  } else if constexpr (std::is_same_v<T, ShardedTensor>) {
    return "ShardedTensor";
  } else if constexpr (std::is_same_v<T, int64_t>) {
    return "int";
  } else if constexpr (std::is_same_v<T, double>) {
    return "float";
  } else if constexpr (std::is_same_v<T, std::string>) {
    return "str";
  } else {
    return "NoneType";
  }
}

bool IsNone(const OpValue& value) {
  if (std::holds_alternative<std::monostate>(value)) return true;
  const Tensor* tensor = std::get_if<Tensor>(&value);
  return tensor != nullptr && !tensor->defined();
}

std::string TypeNameOf(const OpValue& value) {
  if (IsNone(value)) return "NoneType";
  return std::visit(
      [](const auto& v) {
        return std::string(KindName<std::decay_t<decltype(v)>>());
      },
      value);
}

// The argument at `position`, else the keyword `name`; null when absent.
const OpValue* FindArg(const OpArgs& args, const OpKwargs& kwargs,
                       size_t position, const std::string& name) {
  if (position < args.size()) return &args[position];
  auto it = kwargs.find(name);
  return it == kwargs.end() ? nullptr : &it->second;
}

absl::Status WrongType(absl::string_view op, const std::string& name,
                       size_t position, absl::string_view expected,
                       const OpValue& found) {
  return absl::InvalidArgumentError(
      absl::StrCat(op, "(): argument '", name, "' (position ", position + 1,
                   ") must be ", expected, ", not ", TypeNameOf(found)));
}

template <typename T>
absl::StatusOr<T> Required(absl::string_view op, const OpArgs& args,
                           const OpKwargs& kwargs, size_t position,
                           const std::string& name) {
  const OpValue* value = FindArg(args, kwargs, position, name);
  if (value == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, "() missing required argument '", name, "' (position ",
                     position + 1, ")"));
  }
  if (const T* typed = std::get_if<T>(value)) return *typed;
  return WrongType(op, name, position, KindName<T>(), *value);
}

// An argument that may be absent or None: `fallback` then.
template <typename T>
absl::StatusOr<T> Optional(absl::string_view op, const OpArgs& args,
                           const OpKwargs& kwargs, size_t position,
                           const std::string& name, T fallback) {
  const OpValue* value = FindArg(args, kwargs, position, name);
  if (value == nullptr || IsNone(*value)) return fallback;
  if (const T* typed = std::get_if<T>(value)) return *typed;
  return WrongType(op, name, position, KindName<T>(), *value);
}

// embedding_bag's offsets (position 2): Tessera takes 2-D bags only.
absl::Status NoOffsets(const OpArgs& args, const OpKwargs& kwargs) {
  const OpValue* offsets = FindArg(args, kwargs, 2, "offsets");
  if (offsets == nullptr || IsNone(*offsets)) return absl::OkStatus();
  return absl::UnimplementedError(
      "embedding_bag: offsets are not supported; pass one bag per row of a "
      "2-D input");
}

template <typename T>
absl::StatusOr<OpValue> AsValue(absl::StatusOr<T> result) {
  if (!result.ok()) return result.status();
  return OpValue(*std::move(result));
}

// The entry of a {name, fn} table named `op`; null when there is none.
template <typename Entry, size_t N>
const Entry* FindOp(const Entry (&table)[N], absl::string_view op) {
  for (const Entry& entry : table) {
    if (entry.name == op) return &entry;
  }
  return nullptr;
}

// Calls fn on every ShardedTensor among the arguments, positional first.
void ForEachSharded(const OpArgs& args, const OpKwargs& kwargs,
                    const std::function<void(const ShardedTensor&)>& fn) {
  for (const OpValue& value : args) {
    if (const auto* st = std::get_if<ShardedTensor>(&value)) fn(*st);
  }
  for (const auto& [name, value] : kwargs) {
    if (const auto* st = std::get_if<ShardedTensor>(&value)) fn(*st);
  }
}

std::string ArgsString(const OpArgs& args) {
  std::vector<std::string> parts;
  for (const OpValue& value : args) parts.push_back(OpValueString(value));
  return absl::StrCat("(", absl::StrJoin(parts, ", "),
                      args.size() == 1 ? ",)" : ")");
}

std::string KwargsString(const OpKwargs& kwargs) {
  std::vector<std::string> parts;
  for (const auto& [name, value] : kwargs) {
    parts.push_back(absl::StrCat("'", name, "': ", OpValueString(value)));
  }
  return absl::StrCat("{", absl::StrJoin(parts, ", "), "}");
}

// PyTorch's _basic_validation.
absl::Status BasicValidation(absl::string_view op, const OpArgs& args,
                             const OpKwargs& kwargs) {
  const ProcessGroup* group = nullptr;
  bool first = true;
  bool mixed = false;
  ForEachSharded(args, kwargs, [&](const ShardedTensor& st) {
    mixed |= !first && st.process_group().get() != group;
    group = st.process_group().get();
    first = false;
  });
  if (mixed) {
    return absl::InvalidArgumentError(
        "All distributed tensors should use the same ProcessGroup if used "
        "together in an op.");
  }
  return absl::OkStatus();
}

// ---- Dense kernels ---------------------------------------------------------

absl::StatusOr<OpValue> DenseAsin(const OpArgs& args, const OpKwargs& kwargs) {
  ASSIGN_OR_RETURN(Tensor input,
                   Required<Tensor>("asin", args, kwargs, 0, "input"));
  return AsValue(Asin(input));
}

absl::StatusOr<OpValue> DenseLinear(const OpArgs& args,
                                    const OpKwargs& kwargs) {
  ASSIGN_OR_RETURN(Tensor input,
                   Required<Tensor>("linear", args, kwargs, 0, "input"));
  ASSIGN_OR_RETURN(Tensor weight,
                   Required<Tensor>("linear", args, kwargs, 1, "weight"));
  ASSIGN_OR_RETURN(Tensor bias, Optional<Tensor>("linear", args, kwargs, 2,
                                                 "bias", Tensor()));
  return AsValue(Linear(input, weight, bias));
}

absl::StatusOr<std::string> EmbeddingBagMode(const OpArgs& args,
                                             const OpKwargs& kwargs) {
  RETURN_IF_ERROR(NoOffsets(args, kwargs));
  // PyTorch's default mode is "mean" (Tessera implements "sum" only).
  return Optional<std::string>("embedding_bag", args, kwargs, 6, "mode",
                               "mean");
}

absl::StatusOr<OpValue> DenseEmbeddingBag(const OpArgs& args,
                                          const OpKwargs& kwargs) {
  ASSIGN_OR_RETURN(Tensor input,
                   Required<Tensor>("embedding_bag", args, kwargs, 0, "input"));
  ASSIGN_OR_RETURN(Tensor weight, Required<Tensor>("embedding_bag", args,
                                                   kwargs, 1, "weight"));
  ASSIGN_OR_RETURN(std::string mode, EmbeddingBagMode(args, kwargs));
  return AsValue(EmbeddingBag(input, weight, mode));
}

absl::StatusOr<OpValue> DenseCat(const OpArgs& args, const OpKwargs& kwargs) {
  std::vector<Tensor> tensors;
  for (size_t i = 0; i < args.size(); ++i) {
    ASSIGN_OR_RETURN(Tensor t, Required<Tensor>("cat", args, {}, i, "tensors"));
    tensors.push_back(std::move(t));
  }
  ASSIGN_OR_RETURN(int64_t dim,
                   Optional<int64_t>("cat", {}, kwargs, 0, "dim", 0));
  return AsValue(Cat(tensors, dim));
}

using DenseFn = absl::StatusOr<OpValue> (*)(const OpArgs&, const OpKwargs&);
struct DenseOp {
  absl::string_view name;
  DenseFn fn;
};
constexpr DenseOp kDenseOps[] = {
    {"asin", DenseAsin},
    {"linear", DenseLinear},
    {"embedding_bag", DenseEmbeddingBag},
    {"cat", DenseCat},
};

absl::StatusOr<OpValue> CallDense(absl::string_view op, const OpArgs& args,
                                  const OpKwargs& kwargs) {
  if (const DenseOp* dense = FindOp(kDenseOps, op)) {
    return dense->fn(args, kwargs);
  }
  return absl::UnimplementedError(absl::StrCat(
      "torch function '", op,
      "' has no dense kernel in Tessera (asin, linear, embedding_bag, cat)"));
}

// ---- Built-in sharded ops --------------------------------------------------

absl::StatusOr<OpValue> ShardedAsin(const std::vector<std::string>&,
                                    const OpArgs& args, const OpKwargs& kwargs,
                                    const std::shared_ptr<ProcessGroup>&) {
  ASSIGN_OR_RETURN(ShardedTensor st,
                   Required<ShardedTensor>("asin", args, kwargs, 0, "input"));
  // Judged from the metadata, so members without local shards fail too.
  RETURN_IF_ERROR(CheckKernelDType("asin", st.dtype()));
  std::vector<Shard> shards;
  for (const Shard& shard : st.local_shards()) {
    ASSIGN_OR_RETURN(Tensor result, Asin(shard.tensor));
    shards.push_back(Shard{std::move(result), shard.metadata});
  }
  return AsValue(ShardedTensor::InitFromLocalShardsWithSpec(
      std::move(shards), st.metadata(), st.sharding_spec(), st.options()));
}

// How members' parts of a result combine into each member's result.
enum class Combine {
  kConcat,  // Each shard gives columns [offset, offset + size) of it.
  kSum,     // Each shard gives a full-size addend.
};

// A 2-D weight cut along one dimension, as the parts see it.
struct SplitWeight {
  std::shared_ptr<ProcessGroup> group;
  int64_t dim = 0;  // 0: cut into row blocks; 1: into column blocks.
  const std::vector<ShardMetadata>* shards = nullptr;
  std::vector<int> owner;  // Per shard: its owner's group rank.
  // This member's shards: their tensors on the host, and their metadata.
  std::vector<Tensor> local;
  std::vector<const ShardMetadata*> local_metadata;
  DType dtype = DType::kFloat32;

  int64_t Offset(const ShardMetadata& shard) const {
    return shard.shard_offsets()[dim];
  }
  int64_t Width(const ShardMetadata& shard) const {
    return shard.shard_sizes()[dim];
  }
};

// `tensor` on `device` (a collective's: group.device()), contiguous.
absl::StatusOr<Tensor> ToDevice(const Tensor& tensor, const Device& device) {
  if (tensor.device() == device) return tensor.Contiguous();
  return tensor.To(device);
}

absl::StatusOr<int64_t> CutDim(absl::string_view op,
                               const ShardedTensor& weight) {
  const std::vector<int64_t>& size = weight.size();
  bool whole_rows = true;  // Every shard spans all columns.
  bool whole_cols = true;  // Every shard spans all rows.
  for (const ShardMetadata& shard : weight.metadata().shards_metadata) {
    whole_rows &= shard.shard_sizes()[1] == size[1];
    whole_cols &= shard.shard_sizes()[0] == size[0];
  }
  int64_t dim = whole_rows ? 0 : 1;
  if (const auto* chunk =
          std::get_if<ChunkShardingSpec>(&weight.sharding_spec())) {
    ASSIGN_OR_RETURN(dim, WrapDim(chunk->dim(), 2, /*wrap_scalar=*/false));
  }
  if (dim == 0 ? !whole_rows : !whole_cols) {
    return absl::UnimplementedError(absl::StrCat(
        op,
        ": the weight must be sharded along one dimension (row-wise or "
        "column-wise)"));
  }
  return dim;
}

absl::StatusOr<SplitWeight> Split(absl::string_view op,
                                  const ShardedTensor& weight) {
  if (weight.dim() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": the sharded weight must be 2-D, got [",
                     absl::StrJoin(weight.size(), ", "), "]"));
  }
  SplitWeight split;
  split.group = weight.process_group();
  if (split.group == nullptr || !split.group->is_member()) {
    return absl::FailedPreconditionError(absl::StrCat(
        op, ": this rank is not a member of the weight's process group"));
  }
  ASSIGN_OR_RETURN(split.dim, CutDim(op, weight));
  split.shards = &weight.metadata().shards_metadata;
  if (split.shards->empty()) {
    return absl::UnimplementedError(
        absl::StrCat(op,
                     ": the sharded weight has no shards (a dimension of "
                     "size 0)"));
  }
  split.dtype = weight.dtype();
  const Rank* rank = weight.rank().get();
  const WorkerResolver* resolver =
      rank != nullptr && rank->rpc_initialized() ? rank : nullptr;
  for (const ShardMetadata& shard : *split.shards) {
    ASSIGN_OR_RETURN(auto placement,
                     ParseAndValidateRemoteDevice(split.group->global_ranks(),
                                                  shard.placement(), resolver));
    split.owner.push_back(*split.group->GroupRank(placement.first));
  }
  for (const Shard& shard : weight.local_shards()) {
    ASSIGN_OR_RETURN(Tensor host, ToDevice(shard.tensor, Device::Cpu()));
    split.local.push_back(std::move(host));
    split.local_metadata.push_back(&shard.metadata);
  }
  return split;
}

// "3,30" -> {3, 30}; "" -> {} (a 0-d shape); nullopt when malformed.
std::optional<std::vector<int64_t>> ParseShape(absl::string_view record) {
  std::vector<int64_t> shape;
  if (record.empty()) return shape;
  for (absl::string_view size : absl::StrSplit(record, ',')) {
    int64_t value = 0;
    if (!absl::SimpleAtoi(size, &value)) return std::nullopt;
    shape.push_back(value);
  }
  return shape;
}

// Every member's input shape, or the first member's error: local mistakes
// fail every member together.
absl::StatusOr<std::vector<std::vector<int64_t>>> ExchangeShapes(
    ProcessGroup& group, const absl::StatusOr<Tensor>& input) {
  ASSIGN_OR_RETURN(
      std::vector<std::string> gathered,
      AllGatherOutcomes(group, input.ok()
                                   ? absl::StatusOr<std::string>(
                                         absl::StrJoin(input->sizes(), ","))
                                   : input.status()));
  std::vector<std::vector<int64_t>> shapes;
  for (size_t r = 0; r < gathered.size(); ++r) {
    std::optional<std::vector<int64_t>> shape = ParseShape(gathered[r]);
    if (!shape.has_value()) {
      return absl::DataLossError(absl::StrCat(
          "malformed input shape from rank ", group.global_ranks()[r]));
    }
    shapes.push_back(*std::move(shape));
  }
  return shapes;
}

// Every member's input, on the host.
absl::StatusOr<std::vector<Tensor>> GatherInputs(
    ProcessGroup& group, const Tensor& input,
    const std::vector<std::vector<int64_t>>& shapes) {
  const Device device = group.device();
  std::vector<Tensor> gathered;
  for (const std::vector<int64_t>& shape : shapes) {
    ASSIGN_OR_RETURN(
        Tensor t,
        Tensor::Empty(
            shape,
            TensorOptions().WithDType(input.dtype()).WithDevice(device)));
    gathered.push_back(std::move(t));
  }
  ASSIGN_OR_RETURN(Tensor send, ToDevice(input, device));
  RETURN_IF_ERROR(group.AllGather(send, gathered));
  for (Tensor& t : gathered) {
    ASSIGN_OR_RETURN(t, ToDevice(t, Device::Cpu()));
  }
  return gathered;
}

// What one member's shards give for one input [rows, *]: the part of the
// result of width Width(shard) (kConcat) or out_width (kSum).
using PartFn = std::function<absl::StatusOr<Tensor>(
    const Tensor& input, const Tensor& shard, const ShardMetadata& metadata)>;

struct Partitioned {
  absl::string_view op;
  Combine combine;
  int64_t out_width = 0;
  PartFn part;
};

// This member's part of the result for `input`: its shards' parts joined.
absl::StatusOr<Tensor> LocalPart(const SplitWeight& split,
                                 const Partitioned& spec, const Tensor& input) {
  const int64_t rows = input.sizes()[0];
  const TensorOptions options = TensorOptions().WithDType(split.dtype);
  std::vector<Tensor> parts;
  for (size_t k = 0; k < split.local.size(); ++k) {
    ASSIGN_OR_RETURN(Tensor part, spec.part(input, split.local[k],
                                            *split.local_metadata[k]));
    parts.push_back(std::move(part));
  }
  if (spec.combine == Combine::kSum) {
    if (parts.empty()) return Tensor::Zeros({rows, spec.out_width}, options);
    return Sum(parts);
  }
  if (parts.empty()) return Tensor::Empty({rows, 0}, options);
  return Cat(parts, 1);
}

// The concatenation of received parts: each shard's columns at its offset.
absl::StatusOr<Tensor> Assemble(const SplitWeight& split,
                                const std::vector<Tensor>& received,
                                int64_t rows, int64_t out_width) {
  ASSIGN_OR_RETURN(
      Tensor out,
      Tensor::Empty({rows, out_width}, TensorOptions().WithDType(split.dtype)));
  std::vector<int64_t> cursor(received.size(), 0);
  for (size_t i = 0; i < split.shards->size(); ++i) {
    const ShardMetadata& shard = (*split.shards)[i];
    const int s = split.owner[i];
    const int64_t width = split.Width(shard);
    RETURN_IF_ERROR(CopyBox(received[s], {0, cursor[s]}, out,
                            {0, split.Offset(shard)}, {rows, width}));
    cursor[s] += width;
  }
  return out;
}

// Runs `spec` for every member's `input` (a host [rows, cols] tensor, or
// this member's argument error): each member computes its shards' parts
// for every member's input and an all-to-all returns each member the parts
// of its own result, which it combines. Returns a host [rows, out_width]
// tensor.
absl::StatusOr<Tensor> RunPartitioned(const SplitWeight& split,
                                      const Partitioned& spec,
                                      const absl::StatusOr<Tensor>& input) {
  ProcessGroup& group = *split.group;
  ASSIGN_OR_RETURN(auto shapes, ExchangeShapes(group, input));
  ASSIGN_OR_RETURN(std::vector<Tensor> inputs,
                   GatherInputs(group, *input, shapes));
  const Device device = group.device();
  const int64_t rows = input->sizes()[0];
  std::vector<Tensor> send;
  std::vector<Tensor> received;
  std::vector<int64_t> widths(group.size(), 0);
  for (size_t i = 0; i < split.shards->size(); ++i) {
    widths[split.owner[i]] += split.Width((*split.shards)[i]);
  }
  for (int r = 0; r < group.size(); ++r) {
    ASSIGN_OR_RETURN(Tensor part, LocalPart(split, spec, inputs[r]));
    ASSIGN_OR_RETURN(part, ToDevice(part, device));
    send.push_back(std::move(part));
    const int64_t width =
        spec.combine == Combine::kSum ? spec.out_width : widths[r];
    ASSIGN_OR_RETURN(
        Tensor slot,
        Tensor::Empty(
            {rows, width},
            TensorOptions().WithDType(split.dtype).WithDevice(device)));
    received.push_back(std::move(slot));
  }
  RETURN_IF_ERROR(group.AllToAll(send, received));
  if (spec.combine == Combine::kSum) {
    ASSIGN_OR_RETURN(Tensor sum, Sum(received));
    return ToDevice(sum, Device::Cpu());
  }
  return Assemble(split, received, rows, spec.out_width);
}

// `input` [*, cols] as a host [rows, cols] tensor.
absl::StatusOr<Tensor> HostMatrix(const Tensor& input) {
  ASSIGN_OR_RETURN(Tensor host, ToDevice(input, Device::Cpu()));
  const int64_t rows = *CheckedProduct(
      absl::MakeConstSpan(input.sizes()).first(input.dim() - 1));
  return host.View({rows, input.sizes().back()});
}

absl::StatusOr<OpValue> ShardedLinear(const std::vector<std::string>&,
                                      const OpArgs& args,
                                      const OpKwargs& kwargs,
                                      const std::shared_ptr<ProcessGroup>&) {
  constexpr absl::string_view op = "linear";
  ASSIGN_OR_RETURN(ShardedTensor weight,
                   Required<ShardedTensor>(op, args, kwargs, 1, "weight"));
  ASSIGN_OR_RETURN(SplitWeight split, Split(op, weight));
  Tensor input;
  Tensor bias;
  const absl::StatusOr<Tensor> matrix = [&]() -> absl::StatusOr<Tensor> {
    ASSIGN_OR_RETURN(input, Required<Tensor>(op, args, kwargs, 0, "input"));
    ASSIGN_OR_RETURN(bias,
                     Optional<Tensor>(op, args, kwargs, 2, "bias", Tensor()));
    RETURN_IF_ERROR(
        CheckLinearArgs(input, weight.size(), weight.dtype(), bias));
    if (bias.defined()) {
      ASSIGN_OR_RETURN(bias, ToDevice(bias, Device::Cpu()));
    }
    return HostMatrix(input);
  }();
  Partitioned spec{op, split.dim == 0 ? Combine::kConcat : Combine::kSum,
                   weight.size()[0], nullptr};
  const ShardMetadata& first_shard = split.shards->front();
  spec.part = [&](const Tensor& x, const Tensor& shard,
                  const ShardMetadata& md) -> absl::StatusOr<Tensor> {
    const int64_t offset = split.Offset(md);
    const int64_t width = split.Width(md);
    if (split.dim == 0) {
      // Row-wise: this shard's output features, with their bias entries.
      Tensor b;
      if (bias.defined()) {
        ASSIGN_OR_RETURN(b, bias.Narrow(0, offset, width));
      }
      return Linear(x, shard, b);
    }
    // Column-wise: this shard's input features' addend; the bias joins the
    // sum once, with the first shard's.
    ASSIGN_OR_RETURN(Tensor columns, x.Narrow(1, offset, width));
    return Linear(columns, shard, md == first_shard ? bias : Tensor());
  };
  ASSIGN_OR_RETURN(Tensor y, RunPartitioned(split, spec, matrix));
  std::vector<int64_t> sizes = input.sizes();
  sizes.back() = weight.size()[0];
  ASSIGN_OR_RETURN(y, y.View(sizes));
  return AsValue(ToDevice(y, input.device()));
}

absl::StatusOr<OpValue> ShardedEmbeddingBag(
    const std::vector<std::string>&, const OpArgs& args, const OpKwargs& kwargs,
    const std::shared_ptr<ProcessGroup>&) {
  constexpr absl::string_view op = "embedding_bag";
  ASSIGN_OR_RETURN(ShardedTensor weight,
                   Required<ShardedTensor>(op, args, kwargs, 1, "weight"));
  ASSIGN_OR_RETURN(SplitWeight split, Split(op, weight));
  Tensor input;
  const absl::StatusOr<Tensor> bags = [&]() -> absl::StatusOr<Tensor> {
    ASSIGN_OR_RETURN(input, Required<Tensor>(op, args, kwargs, 0, "input"));
    ASSIGN_OR_RETURN(std::string mode, EmbeddingBagMode(args, kwargs));
    RETURN_IF_ERROR(
        CheckEmbeddingBagArgs(input, weight.size(), weight.dtype(), mode));
    // Members may pass int32 or int64 bags; they travel as int64.
    ASSIGN_OR_RETURN(Tensor host, ToDevice(input, Device::Cpu()));
    return input.dtype() == DType::kInt64 ? host : host.ToDType(DType::kInt64);
  }();
  // Row-wise: each shard sums the rows it holds, an addend of the whole
  // result. Column-wise: each shard gives its columns of it.
  Partitioned spec{op, split.dim == 0 ? Combine::kSum : Combine::kConcat,
                   weight.size()[1], nullptr};
  spec.part = [&](const Tensor& x, const Tensor& shard,
                  const ShardMetadata& md) {
    return EmbeddingBagRows(x, shard, split.dim == 0 ? split.Offset(md) : 0,
                            "sum");
  };
  ASSIGN_OR_RETURN(Tensor y, RunPartitioned(split, spec, bags));
  return AsValue(ToDevice(y, input.device()));
}

using BuiltinFn = absl::StatusOr<OpValue> (*)(
    const std::vector<std::string>&, const OpArgs&, const OpKwargs&,
    const std::shared_ptr<ProcessGroup>&);
struct BuiltinOp {
  absl::string_view name;
  BuiltinFn fn;
};
constexpr BuiltinOp kShardedOps[] = {
    {"asin", ShardedAsin},
    {"linear", ShardedLinear},
    {"embedding_bag", ShardedEmbeddingBag},
};

}  // namespace

std::string OpValueString(const OpValue& value) {
  if (IsNone(value)) return "None";
  return std::visit(
      [](const auto& v) -> std::string {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, Tensor>) {
          return v.DebugString();
        } else if constexpr (std::is_same_v<T, ShardedTensor>) {
          return absl::StrCat("ShardedTensor(", v.tensor_id(), ", ",
                              DTypeName(v.dtype()), ", [",
                              absl::StrJoin(v.size(), ", "), "])");
        } else if constexpr (std::is_same_v<T, std::string>) {
          return absl::StrCat("'", v, "'");
        } else if constexpr (std::is_same_v<T, std::monostate>) {
          return "None";
        } else {
          return absl::StrCat(v);
        }
      },
      value);
}

absl::Status ShardedOpRegistry::SignatureError() {
  return absl::InvalidArgumentError(
      "Custom sharded op function expects signature: (types, args, kwargs, "
      "process_group), but received a callable that cannot be called with "
      "(const std::vector<std::string>&, const OpArgs&, const OpKwargs&, "
      "const std::shared_ptr<ProcessGroup>&) or whose result does not "
      "convert to absl::StatusOr<OpValue>");
}

absl::Status ShardedOpRegistry::UnknownSpecKind(absl::string_view spec_kind) {
  return absl::InvalidArgumentError(
      absl::StrCat("unknown sharding spec kind '", spec_kind,
                   "': expected \"chunk\" or \"enumerable\""));
}

std::optional<ShardedOpFn> ShardedOpRegistry::Exchange(
    absl::string_view spec_kind, absl::string_view op,
    std::optional<ShardedOpFn> fn) {
  std::pair<std::string, std::string> key(spec_kind, op);
  absl::MutexLock lock(&mu_);
  std::optional<ShardedOpFn> previous;
  auto it = ops_.find(key);
  if (it != ops_.end()) {
    previous = std::move(it->second);
    ops_.erase(it);
  }
  if (fn.has_value()) ops_.emplace(std::move(key), *std::move(fn));
  return previous;
}

std::optional<ShardedOpFn> ShardedOpRegistry::Find(absl::string_view spec_kind,
                                                   absl::string_view op) const {
  absl::MutexLock lock(&mu_);
  auto it = ops_.find({std::string(spec_kind), std::string(op)});
  if (it == ops_.end()) return std::nullopt;
  return it->second;
}

bool ShardedOpRegistry::UnregisterShardedOp(absl::string_view op) {
  return Exchange(kAnySpec, op, std::nullopt).has_value();
}

bool ShardedOpRegistry::UnregisterShardingSpecOp(absl::string_view spec_kind,
                                                 absl::string_view op) {
  if (spec_kind == kAnySpec) return false;
  return Exchange(spec_kind, op, std::nullopt).has_value();
}

absl::StatusOr<OpValue> ShardedOpRegistry::Call(absl::string_view op,
                                                const OpArgs& args,
                                                const OpKwargs& kwargs) const {
  if (args.empty() && kwargs.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("No input for '", op, "'!"));
  }
  const ShardedTensor* st = nullptr;
  ForEachSharded(args, kwargs, [&](const ShardedTensor& candidate) {
    if (st == nullptr) st = &candidate;
  });
  if (st == nullptr) return CallDense(op, args, kwargs);
  RETURN_IF_ERROR(BasicValidation(op, args, kwargs));
  const std::vector<std::string> types = {"ShardedTensor"};
  // Copies: the registration may change while the op runs.
  if (std::optional<ShardedOpFn> fn = Find(kAnySpec, op)) {
    return (*fn)(types, args, kwargs, st->process_group());
  }
  if (std::optional<ShardedOpFn> fn =
          Find(ShardingSpecKind(st->sharding_spec()), op)) {
    return (*fn)(types, args, kwargs, st->process_group());
  }
  if (const BuiltinOp* builtin = FindOp(kShardedOps, op)) {
    return builtin->fn(types, args, kwargs, st->process_group());
  }
  return absl::UnimplementedError(
      absl::StrCat("torch function '", op, "', with args: ", ArgsString(args),
                   " and kwargs: ", KwargsString(kwargs),
                   " not supported for ShardedTensor!"));
}

ShardedOpRegistry& DefaultShardedOpRegistry() {
  static ShardedOpRegistry* const registry = new ShardedOpRegistry();
  return *registry;
}

absl::StatusOr<OpValue> CallOp(absl::string_view op, const OpArgs& args,
                               const OpKwargs& kwargs) {
  return DefaultShardedOpRegistry().Call(op, args, kwargs);
}

ScopedOpRegistration::ScopedOpRegistration(
    ScopedOpRegistration&& other) noexcept
    : registry_(std::exchange(other.registry_, nullptr)),
      spec_kind_(std::move(other.spec_kind_)),
      op_(std::move(other.op_)),
      previous_(std::move(other.previous_)) {}

ScopedOpRegistration::~ScopedOpRegistration() {
  if (registry_ != nullptr) {
    registry_->Exchange(spec_kind_, op_, std::move(previous_));
  }
}

}  // namespace tessera
