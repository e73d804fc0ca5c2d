// dtypes and buffers (support.h): numpy and DLPack memory as tessera
// Tensors and back, without copies; the dtype names the package checks
// against. Bound as tessera._tessera.dtype_names, canonical_dtype and
// dlpack_array.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/tensor/storage.h"
#include "python/bindings/module.h"
#include "python/bindings/support.h"

namespace tessera::python {
namespace {

// DLPack's C ABI (dlpack.h 0.x, which torch, numpy and jax export), written
// out here: Debian ships no dlpack header. Only what a CPU consumer reads.
struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // In elements; null: dense, row-major.
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};
constexpr int32_t kDLCPU = 1;
constexpr int32_t kDLCUDAHost = 3;  // Pinned host memory.
constexpr uint8_t kDLInt = 0;
constexpr uint8_t kDLUInt = 1;
constexpr uint8_t kDLFloat = 2;
constexpr uint8_t kDLBfloat = 4;
constexpr uint8_t kDLComplex = 5;
constexpr uint8_t kDLBool = 6;

// The numpy dtype name of a DLPack dtype (bfloat16: its bits), or "".
std::string NumpyNameOf(const DLDataType& dtype) {
  const std::string bits = std::to_string(dtype.bits);
  switch (dtype.code) {
    case kDLInt:
      return "int" + bits;
    case kDLUInt:
      return "uint" + bits;
    case kDLFloat:
      return "float" + bits;
    case kDLBfloat:
      return dtype.bits == 16 ? "uint16" : "";
    case kDLComplex:
      return "complex" + bits;
    case kDLBool:
      return dtype.bits == 8 ? "bool" : "";
    default:
      return "";
  }
}

}  // namespace

DType DTypeFromName(const std::string& name) { return Check(ParseDType(name)); }

py::dtype NumpyDType(DType dtype) {
  if (dtype == DType::kBFloat16) {
    Raise(absl::InvalidArgumentError(
        "the tensor is bfloat16, which numpy lacks: read it with "
        "cast=\"float32\", or into a torch.bfloat16 tensor with "
        "tessera.torch.read"));
  }
  return py::dtype(std::string(DTypeName(dtype)));
}

py::dtype BitsDType(DType dtype) {
  return dtype == DType::kBFloat16 ? py::dtype("uint16") : NumpyDType(dtype);
}

bool CarriesBitsOf(const py::array& array, DType dtype) {
  if (dtype == DType::kBFloat16) {
    const char kind = array.dtype().kind();
    return array.itemsize() == 2 && (kind == 'u' || kind == 'i');
  }
  return array.dtype().is(NumpyDType(dtype));
}

Tensor Wrap(const py::array& array, DType dtype) {
  if (!(array.flags() & py::array::c_style)) {
    Raise(absl::InvalidArgumentError("the array is not C-contiguous"));
  }
  std::vector<int64_t> sizes(array.shape(), array.shape() + array.ndim());
  std::vector<int64_t> strides(sizes.size(), 1);
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 2; d >= 0; --d) {
    strides[d] = strides[d + 1] * std::max<int64_t>(sizes[d + 1], 1);
  }
  const size_t nbytes = static_cast<size_t>(array.nbytes());
  std::shared_ptr<Storage> storage = Storage::Wrap(
      const_cast<void*>(array.data()), nbytes, Device::Cpu(), nullptr);
  return Check(
      Tensor::FromStorage(std::move(storage), dtype, 0, sizes, strides));
}

py::array ToNumpy(Tensor tensor, bool bits) {
  absl::StatusOr<Tensor> host =
      tensor.device().is_cpu() ? tensor.Contiguous() : tensor.To(Device::Cpu());
  Tensor dense = Check(std::move(host));
  if (!dense.is_contiguous()) dense = Check(dense.Contiguous());
  const py::dtype dtype =
      bits ? BitsDType(dense.dtype()) : NumpyDType(dense.dtype());
  std::vector<py::ssize_t> shape(dense.sizes().begin(), dense.sizes().end());
  auto* owner = new Tensor(dense);
  py::capsule base(owner, [](void* p) { delete static_cast<Tensor*>(p); });
  return py::array(dtype, shape, {}, dense.data_ptr(), base);
}

py::array DLPackArray(const py::object& object, bool* bfloat16) {
  if (!py::hasattr(object, "__dlpack__")) {
    throw py::type_error(absl::StrCat(
        "a ", std::string(py::str(py::type::of(object).attr("__name__"))),
        " has no __dlpack__"));
  }
  py::object capsule = object.attr("__dlpack__")();
  if (!PyCapsule_IsValid(capsule.ptr(), "dltensor")) {
    throw py::type_error(
        "__dlpack__() returned no unused DLPack capsule (\"dltensor\")");
  }
  auto* managed = static_cast<DLManagedTensor*>(
      PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  // From here the export is this module's: the producer's capsule is marked
  // used (its destructor then leaves the tensor alone) and `owner` releases
  // it, when the array dies or when a check below raises.
  if (PyCapsule_SetName(capsule.ptr(), "used_dltensor") != 0) {
    throw py::error_already_set();
  }
  py::capsule owner(managed, [](void* p) {
    auto* tensor = static_cast<DLManagedTensor*>(p);
    if (tensor->deleter != nullptr) tensor->deleter(tensor);
  });
  const DLTensor& t = managed->dl_tensor;
  if (t.device.device_type != kDLCPU && t.device.device_type != kDLCUDAHost) {
    Raise(absl::InvalidArgumentError(absl::StrCat(
        "out is not in CPU memory (DLPack device type ", t.device.device_type,
        "): read into CPU memory, then copy it to the device")));
  }
  const std::string name = NumpyNameOf(t.dtype);
  *bfloat16 = t.dtype.code == kDLBfloat;
  if (t.dtype.lanes != 1 || name.empty()) {
    Raise(absl::InvalidArgumentError(absl::StrCat(
        "out has a DLPack dtype numpy cannot hold (code ", t.dtype.code, ", ",
        t.dtype.bits, " bits, ", t.dtype.lanes, " lanes)")));
  }
  py::dtype dtype;
  try {
    dtype = py::dtype(name);
  } catch (const py::error_already_set&) {
    Raise(absl::InvalidArgumentError(
        absl::StrCat("out has a dtype numpy lacks (", name, ")")));
  }
  const auto ndim = static_cast<size_t>(std::max(t.ndim, 0));
  std::vector<py::ssize_t> shape(ndim);
  std::vector<py::ssize_t> strides(ndim);
  py::ssize_t dense = dtype.itemsize();
  for (size_t d = ndim; d-- > 0;) {
    shape[d] = static_cast<py::ssize_t>(t.shape[d]);
    strides[d] = t.strides != nullptr
                     ? static_cast<py::ssize_t>(t.strides[d]) * dtype.itemsize()
                     : dense;
    dense *= std::max<py::ssize_t>(shape[d], 1);
  }
  void* data =
      t.data == nullptr ? nullptr : static_cast<char*>(t.data) + t.byte_offset;
  return py::array(dtype, shape, strides, data, owner);
}

void BindBuffers(py::module_& m) {
  m.def("dtype_names", [] {
    std::vector<std::string> names;
    for (DType dtype : kAllDTypes) names.emplace_back(DTypeName(dtype));
    return names;
  });
  m.def("canonical_dtype", [](const std::string& name) {
    return std::string(DTypeName(DTypeFromName(name)));
  });
  m.def(
      "dlpack_array",
      [](const py::object& object) {
        bool bfloat16 = false;
        py::array array = DLPackArray(object, &bfloat16);
        return py::make_tuple(std::move(array), bfloat16);
      },
      py::arg("object"));
}

}  // namespace tessera::python
