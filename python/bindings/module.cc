// The module definition of tessera._tessera (module.h).
#include <pybind11/pybind11.h>

#include "common/mutex_checks.h"
#include "python/bindings/module.h"

PYBIND11_MODULE(_tessera, m) {
  m.doc() = "Tessera's C++ client library (use the tessera package)";
  tessera::SkipMutexDeadlockChecks();
  tessera::python::BindSpecs(m);
  tessera::python::BindBuffers(m);
  tessera::python::BindSecurity(m);
  tessera::python::BindTensor(m);
  tessera::python::BindVersions(m);
  tessera::python::BindReadPlan(m);
  tessera::python::BindClient(m);
}
