// Tensor views (tensor.h): PyView's reads, writes and shard fetches, and
// the View class.
#include "python/bindings/tensor.h"

#include <pybind11/stl.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/region.h"
#include "python/bindings/index.h"
#include "python/bindings/module.h"
#include "python/bindings/support.h"
#include "wire/replicas.h"

namespace tessera::python {

std::string PyView::dtype() const {
  return std::string(DTypeName(view_.dtype()));
}

int PyView::copies() const { return CopiesOf(view_.info()); }

std::vector<ShardTuple> PyView::shards() const {
  std::vector<ShardTuple> shards;
  const auto& all = view_.metadata().shards_metadata;
  for (size_t i = 0; i < all.size(); ++i) {
    shards.emplace_back(
        ToVector(all[i].shard_offsets()), ToVector(all[i].shard_sizes()),
        all[i].placement().has_value() ? all[i].placement()->ToString() : "",
        view_.owner_rank(i));
  }
  return shards;
}

py::array PyView::ReadRegion(const std::vector<int64_t>& offsets,
                             const std::vector<int64_t>& sizes,
                             std::optional<py::array> out, double timeout,
                             const py::object& progress) const {
  // The box is checked before its array is allocated: a huge box outside
  // the tensor is OUT_OF_RANGE, not a MemoryError.
  Check(ValidateRegion(offsets, sizes, view_.sizes(),
                       absl::StrCat("tensor ", view_.name()), "tensor"));
  if (!bits_dtype_) bits_dtype_ = BitsDType(view_.dtype());
  const py::dtype dtype = py::reinterpret_borrow<py::dtype>(bits_dtype_);
  py::array target = out.has_value()
                         ? *out
                         : py::array(dtype, std::vector<py::ssize_t>(
                                                sizes.begin(), sizes.end()));
  if (!(target.dtype().is(dtype) || CarriesBitsOf(target, view_.dtype()))) {
    Raise(absl::InvalidArgumentError(absl::StrCat(
        "out has dtype ", std::string(py::str(target.dtype())), " but tensor ",
        view_.name(), " is ", DTypeName(view_.dtype()))));
  }
  if (!target.writeable()) {
    Raise(absl::InvalidArgumentError("out is not writeable"));
  }
  std::vector<int64_t> shape(target.shape(), target.shape() + target.ndim());
  if (shape != sizes) {
    Raise(absl::InvalidArgumentError(
        absl::StrCat("out has shape (", absl::StrJoin(shape, ", "),
                     ") but the box is (", absl::StrJoin(sizes, ", "), ")")));
  }
  ReadInto(offsets, Wrap(target, view_.dtype()), timeout, progress);
  return target;
}

std::tuple<std::vector<int64_t>, std::vector<int64_t>, py::tuple>
PyView::IndexBox(const py::handle& key) const {
  Box box = ParseIndex(key, view_.sizes(), view_.name());
  return {std::move(box.offsets), std::move(box.sizes),
          py::tuple(py::cast(box.shape))};
}

py::array PyView::GetItem(const py::handle& key, double timeout) const {
  const Box box = ParseIndex(key, view_.sizes(), view_.name());
  if (!numpy_dtype_) numpy_dtype_ = NumpyDType(view_.dtype());
  const py::dtype dtype = py::reinterpret_borrow<py::dtype>(numpy_dtype_);
  py::array target(dtype, box.shape);
  if (box.empty()) return target;
  ReadInto(box.offsets, Check(Wrap(target, view_.dtype()).View(box.sizes)),
           timeout, py::none());
  return target;
}

Tensor PyView::Source(const py::array& data) const {
  const DType dtype =
      view_.dtype() == DType::kBFloat16 && CarriesBitsOf(data, view_.dtype())
          ? DType::kBFloat16
          : DTypeFromName(std::string(py::str(data.dtype().attr("name"))));
  return Wrap(data, dtype);
}

void PyView::Write(const std::vector<int64_t>& offsets, const py::array& data,
                   double timeout, const py::object& progress) const {
  const Tensor source = Source(data);
  PyTransfer transfer(timeout, static_cast<int64_t>(data.nbytes()), progress);
  Check(transfer.Run(
      [&](const TransferOptions& options) {
        return view_.Write(offsets, source, options);
      },
      /*idempotent=*/false));
}

std::tuple<std::vector<int64_t>, std::vector<int64_t>, py::array>
PyView::ToHere(size_t index, double timeout) const {
  const std::vector<RemoteShard> remote = view_.remote_shards();
  if (index >= remote.size()) {
    Raise(absl::OutOfRangeError(absl::StrCat(
        "shard ", index, " of a tensor with ", remote.size(), " shards")));
  }
  const int64_t bytes = view_.metadata().shards_metadata[index].numel() *
                        static_cast<int64_t>(ElementSize(view_.dtype()));
  absl::StatusOr<Shard> shard;
  PyTransfer transfer(timeout, bytes, py::none());
  Check(transfer.Run(
      [&](const TransferOptions& transfer_options) {
        FetchOptions options;
        options.timeout = transfer_options.timeout;
        options.cancel = transfer_options.cancel;
        shard = remote[index].to_here(options);
        return shard.status();
      },
      /*idempotent=*/true));
  Shard fetched = *std::move(shard);
  return {ToVector(fetched.metadata.shard_offsets()),
          ToVector(fetched.metadata.shard_sizes()),
          ToNumpy(std::move(fetched.tensor), /*bits=*/true)};
}

void PyView::ReadInto(const std::vector<int64_t>& offsets,
                      const Tensor& destination, double timeout,
                      const py::object& progress) const {
  PyTransfer transfer(timeout, static_cast<int64_t>(destination.nbytes()),
                      progress);
  int64_t version = 0;
  Check(transfer.Run(
      [&](const TransferOptions& options) {
        TransferOptions with_version = options;
        with_version.version = &version;
        return view_.ReadRegionInto(offsets, destination, with_version);
      },
      /*idempotent=*/true));
  last_version_->store(version);
}

PyView PyView::At(int64_t number) const {
  return PyView(Check(view_.AtVersion(number)));
}

void WriteMany(const std::vector<std::tuple<const PyView*, std::vector<int64_t>,
                                            py::array>>& items,
               double timeout) {
  std::vector<BoxWrite> writes;
  writes.reserve(items.size());
  int64_t bytes = 0;
  for (const auto& [view, offsets, data] : items) {
    if (view == nullptr) Raise(absl::InvalidArgumentError("no view"));
    writes.push_back(BoxWrite{view->view(), offsets, view->Source(data)});
    bytes += static_cast<int64_t>(data.nbytes());
  }
  PyTransfer transfer(timeout, bytes, py::none());
  Check(transfer.Run(
      [&](const TransferOptions& options) {
        return tessera::WriteMany(writes, options);
      },
      /*idempotent=*/false));
}

void BindTensor(py::module_& m) {
  m.def("write_many", &WriteMany, py::arg("items"), py::arg("timeout") = 0.0);
  py::class_<PyView>(m, "View")
      .def_property_readonly("name", &PyView::name)
      .def_property_readonly("tensor_id", &PyView::tensor_id)
      .def_property_readonly("shape", &PyView::shape)
      .def_property_readonly("dtype", &PyView::dtype)
      .def_property_readonly("degraded", &PyView::degraded)
      .def_property_readonly("copies", &PyView::copies)
      .def("shards", &PyView::shards)
      .def("read_region", &PyView::ReadRegion, py::arg("offsets"),
           py::arg("sizes"), py::arg("out") = py::none(),
           py::arg("timeout") = 0.0, py::arg("progress") = py::none())
      .def("box", &PyView::IndexBox, py::arg("key"))
      .def("getitem", &PyView::GetItem, py::arg("key"),
           py::arg("timeout") = 0.0)
      .def("write", &PyView::Write, py::arg("offsets"), py::arg("data"),
           py::arg("timeout") = 0.0, py::arg("progress") = py::none())
      .def("to_here", &PyView::ToHere, py::arg("index"),
           py::arg("timeout") = 0.0)
      .def_property_readonly("versioned", &PyView::versioned)
      .def_property_readonly("version", &PyView::version)
      .def_property_readonly("at_version", &PyView::at_version)
      .def_property_readonly("open_version", &PyView::open_version)
      .def_property_readonly("versions_kept", &PyView::versions_kept)
      .def_property_readonly("last_version", &PyView::last_version)
      .def("kept_versions", &PyView::kept_versions)
      .def("pinned_versions", &PyView::pinned_versions)
      .def("open_versions", &PyView::open_versions)
      .def("at", &PyView::At, py::arg("number"));
}

}  // namespace tessera::python
