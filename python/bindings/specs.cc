// Sharding specs (specs.h): the ShardingSpec class and the functions that
// make one.
#include "python/bindings/specs.h"

#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/sharding_spec_text.h"
#include "python/bindings/module.h"
#include "python/bindings/support.h"

namespace tessera::python {

void BindSpecs(py::module_& m) {
  py::class_<PySpec>(m, "ShardingSpec")
      .def("to_text",
           [](const PySpec& spec) { return ShardingSpecToText(spec.spec); })
      .def("to_json",
           [](const PySpec& spec) { return ShardingSpecToJson(spec.spec); })
      .def("__repr__",
           [](const PySpec& spec) {
             return absl::StrCat("tessera.parse_spec(\"",
                                 ShardingSpecToText(spec.spec), "\")");
           })
      .def("__eq__", [](const PySpec& a, const PySpec& b) {
        return ShardingSpecToText(a.spec) == ShardingSpecToText(b.spec);
      });
  m.def("parse_spec", [](const std::string& text) {
    return PySpec{Check(ParseShardingSpec(text))};
  });
  m.def("spec_from_json", [](const std::string& json) {
    return PySpec{Check(ShardingSpecFromJson(json))};
  });
  m.def("chunk", [](int64_t dim, const std::vector<std::string>& placements) {
    return PySpec{
        ShardingSpec(Check(ChunkShardingSpec::Create(dim, placements)))};
  });
}

}  // namespace tessera::python
