#include "python/bindings/read_plan.h"

#include <pybind11/stl.h>

#include <utility>

#include "absl/strings/str_cat.h"

#include "common/tensor/storage.h"
#include "python/bindings/module.h"
#include "python/bindings/support.h"

namespace tessera::python {
namespace {

// The tensor an item's `out` names (see PyItem), sharing its memory.
Tensor Out(const py::object& out, DType dtype) {
  if (py::isinstance<py::array>(out)) {
    const py::array array = py::reinterpret_borrow<py::array>(out);
    if (!array.writeable()) {
      Raise(absl::InvalidArgumentError("out is not writeable"));
    }
    return Wrap(array, dtype);
  }
  const auto [data, shape, device, owner] =
      out.cast<std::tuple<uintptr_t, std::vector<int64_t>, int, py::object>>();
  int64_t count = 1;
  for (const int64_t size : shape) {
    if (size < 0) Raise(absl::InvalidArgumentError("out: a negative size"));
    count *= size;
  }
  std::vector<int64_t> strides(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) {
    strides[d - 1] = strides[d] * shape[d];
  }
  // The owner (kept in the plan's outs) holds the memory.
  std::shared_ptr<Storage> storage =
      Storage::Wrap(reinterpret_cast<void*>(data),
                    static_cast<size_t>(count) * ElementSize(dtype),
                    Device::Cuda(device), [] {});
  return Check(
      Tensor::FromStorage(std::move(storage), dtype, 0, shape, strides));
}

}  // namespace

PyReadPlan::PyReadPlan(const std::shared_ptr<Client>& client,
                       const std::vector<PyItem>& items) {
  std::vector<ReadItem> planned;
  planned.reserve(items.size());
  for (const auto& [sources, out, dtype, owner] : items) {
    ReadItem item;
    item.out = Out(out, DTypeFromName(dtype));
    held_.push_back({owner, reinterpret_cast<uintptr_t>(item.out.data_ptr()),
                     static_cast<int64_t>(item.out.nbytes())});
    for (const auto& [name, offsets, sizes, out_offsets] : sources) {
      item.sources.push_back({name, offsets, sizes, out_offsets});
    }
    planned.push_back(std::move(item));
    outs_.append(out);
  }
  plan_ =
      Check(WithoutGil([&] { return client->PlanReads(std::move(planned)); }));
}

absl::Status PyReadPlan::CheckOutsStayed() const {
  for (size_t k = 0; k < held_.size(); ++k) {
    const HeldOut& held = held_[k];
    uintptr_t data = 0;
    int64_t nbytes = 0;
    if (py::isinstance<py::array>(held.owner)) {
      const auto array = py::reinterpret_borrow<py::array>(held.owner);
      data = reinterpret_cast<uintptr_t>(array.data());
      nbytes = static_cast<int64_t>(array.nbytes());
    } else if (py::hasattr(held.owner, "data_ptr") &&
               py::hasattr(held.owner, "numel")) {  // A torch tensor.
      data = held.owner.attr("data_ptr")().cast<uintptr_t>();
      nbytes = held.owner.attr("numel")().cast<int64_t>() *
               held.owner.attr("element_size")().cast<int64_t>();
    } else {
      continue;
    }
    // An empty out is written nothing (torch gives one a null pointer).
    if (nbytes == 0 && held.nbytes == 0) continue;
    if (data != held.data || nbytes != held.nbytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "running a read plan: the out of item ", k,
          " is no longer the memory it was planned with (", held.nbytes,
          " bytes at 0x", absl::Hex(held.data), ", now ", nbytes,
          " bytes at 0x", absl::Hex(data),
          "): it was resized or given other storage; plan again with it"));
    }
  }
  return absl::OkStatus();
}

py::tuple PyReadPlan::Run(int64_t version, double timeout) const {
  Check(CheckOutsStayed());
  PyTransfer transfer(timeout, plan_->bytes(), py::none());
  absl::StatusOr<ReadPlanRun> run;
  Check(transfer.Run(
      [&](const TransferOptions& options) {
        run = plan_->Run(options, version);
        return run.status();
      },
      /*idempotent=*/true));
  py::dict versions;
  for (const auto& [name, number] : run->versions)
    versions[py::str(name)] = number;
  return py::make_tuple(run->version, versions, run->replanned, run->pinned,
                        run->bytes);
}

void BindReadPlan(py::module_& m) {
  py::class_<PyReadPlan>(m, "ReadPlan")
      .def("run", &PyReadPlan::Run, py::arg("version") = 0,
           py::arg("timeout") = 0.0)
      .def_property_readonly("bytes", &PyReadPlan::bytes)
      .def_property_readonly("pieces", &PyReadPlan::pieces)
      .def_property_readonly("plans", &PyReadPlan::plans)
      .def_property_readonly("names", &PyReadPlan::names)
      .def_property_readonly("shapes", &PyReadPlan::shapes)
      .def("sources", &PyReadPlan::sources);
}

}  // namespace tessera::python
