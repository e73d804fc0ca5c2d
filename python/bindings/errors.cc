// Status -> exception (support.h): an absl::Status raises the
// tessera.errors class of its code, made by tessera.errors.from_status from
// the code's number and the message, so that Python and C++ callers see
// the same codes and words.
#include <string>

#include "absl/status/status.h"
#include "python/bindings/support.h"

namespace tessera::python {

void Raise(const absl::Status& status) {
  py::object error = py::module_::import("tessera.errors")
                         .attr("from_status")(static_cast<int>(status.code()),
                                              std::string(status.message()));
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())),
                  error.ptr());
  throw py::error_already_set();
}

}  // namespace tessera::python
