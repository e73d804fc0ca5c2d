// Open and pinned versions (versions.h) and their Python classes.
#include "python/bindings/versions.h"

#include <pybind11/stl.h>

#include <algorithm>

#include "absl/time/time.h"

#include "python/bindings/module.h"
#include "python/bindings/support.h"

namespace tessera::python {
namespace {

std::vector<VersionTuple> TuplesOf(
    const v1::VersionGroup& group,
    const std::function<absl::StatusOr<ShardedTensorView>(const std::string&)>&
        view_of) {
  std::vector<VersionTuple> out;
  for (const v1::VersionHandle& handle : group.versions()) {
    out.emplace_back(handle.name(), handle.number(),
                     PyView(Check(view_of(handle.name()))));
  }
  return out;
}

}  // namespace

std::vector<VersionTuple> PyVersionGroup::versions() const {
  return TuplesOf(writer_.group(),
                  [&](const std::string& name) { return writer_.view(name); });
}

std::vector<std::pair<std::string, int64_t>> PyVersionGroup::Publish() const {
  const v1::VersionGroup published =
      Check(WithoutGil([&] { return writer_.Publish(); }));
  std::vector<std::pair<std::string, int64_t>> out;
  for (const v1::VersionHandle& handle : published.versions()) {
    out.emplace_back(handle.name(), handle.number());
  }
  return out;
}

void PyVersionGroup::Abort() const {
  Check(WithoutGil([&] { return writer_.Abort(); }));
}

std::vector<VersionTuple> PySnapshot::versions() const {
  return TuplesOf(snapshot_.group(), [&](const std::string& name) {
    return snapshot_.view(name);
  });
}

void PySnapshot::Release() const {
  Check(WithoutGil([&] { return snapshot_.Release(); }));
}

std::optional<int64_t> PyWatcher::Next(double timeout) const {
  absl::StatusOr<int64_t> next = WithoutGil(
      [&] { return watcher_->Next(absl::Seconds(std::max(timeout, 0.0))); });
  if (absl::IsDeadlineExceeded(next.status())) return std::nullopt;
  return Check(std::move(next));
}

void BindVersions(py::module_& m) {
  py::class_<PyWatcher>(m, "Watcher")
      .def("next", &PyWatcher::Next, py::arg("timeout"));
  py::class_<PyVersionGroup>(m, "VersionGroup")
      .def_property_readonly("id", &PyVersionGroup::id)
      .def("versions", &PyVersionGroup::versions)
      .def("publish", &PyVersionGroup::Publish)
      .def("abort", &PyVersionGroup::Abort);
  py::class_<PySnapshot>(m, "Snapshot")
      .def_property_readonly("id", &PySnapshot::id)
      .def("versions", &PySnapshot::versions)
      .def("release", &PySnapshot::Release);
}

}  // namespace tessera::python
