#include "python/bindings/read_plan.h"

#include <pybind11/stl.h>

#include <utility>

#include "python/bindings/module.h"
#include "python/bindings/support.h"

namespace tessera::python {

PyReadPlan::PyReadPlan(const std::shared_ptr<Client>& client,
                       const std::vector<PyItem>& items) {
  std::vector<ReadItem> planned;
  planned.reserve(items.size());
  for (const auto& [sources, out, dtype] : items) {
    if (!out.writeable())
      Raise(absl::InvalidArgumentError("out is not writeable"));
    ReadItem item;
    item.out = Wrap(out, DTypeFromName(dtype));
    for (const auto& [name, offsets, sizes, out_offsets] : sources) {
      item.sources.push_back({name, offsets, sizes, out_offsets});
    }
    planned.push_back(std::move(item));
    outs_.append(out);
  }
  plan_ =
      Check(WithoutGil([&] { return client->PlanReads(std::move(planned)); }));
}

py::tuple PyReadPlan::Run(int64_t version, double timeout) const {
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
      .def("sources", &PyReadPlan::sources);
}

}  // namespace tessera::python
