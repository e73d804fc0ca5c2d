// Status -> exception (support.h): an absl::Status raises the
// tessera.errors class of its code, made by tessera.errors.from_status from
// the code's number and the message, so that Python and C++ callers see
// the same codes and words (a message cut in its middle past
// kMaxGrpcMessageBytes, as the daemons' are).
#include <string>

#include "absl/status/status.h"
#include "python/bindings/support.h"
#include "wire/grpc_status.h"

namespace tessera::python {

void Raise(const absl::Status& status) {
  // As a daemon's error reaches a client: at most 2 KiB, so that input of
  // megabytes quoted by a parser does not make an error of megabytes.
  const std::string message = CapGrpcMessage(status.message());
  py::object error =
      py::module_::import("tessera.errors")
          .attr("from_status")(static_cast<int>(status.code()), message);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())),
                  error.ptr());
  throw py::error_already_set();
}

}  // namespace tessera::python
