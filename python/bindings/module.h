// tessera._tessera, the native half of the Python package: what each file
// of python/bindings/ adds to the module. The pure-Python package
// (python/tessera/) shapes the API; these move the bytes. module.cc calls
// them once, in this order (a class is bound before the signatures that
// name it), when Python imports the module.
//
// The shared helpers they stand on (errors, the GIL, buffers, transfers)
// are support.h; the module's Python signatures are written out in
// python/tessera/_tessera.pyi, which tests/python/test_package.py keeps in
// step with what is bound here.
#ifndef TESSERA_PYTHON_BINDINGS_MODULE_H_
#define TESSERA_PYTHON_BINDINGS_MODULE_H_

#include <pybind11/pybind11.h>

namespace tessera::python {

// ShardingSpec, parse_spec, spec_from_json, chunk (specs.cc).
void BindSpecs(pybind11::module_& m);
// dtype_names, canonical_dtype, dlpack_array (buffers.cc).
void BindBuffers(pybind11::module_& m);
// set_tls, set_token (security.cc).
void BindSecurity(pybind11::module_& m);
// View, a tensor's reads, writes and shards (tensor.cc).
void BindTensor(pybind11::module_& m);
// Client: connect, cluster, tensors' lifecycle, checkpoints (client.cc).
void BindClient(pybind11::module_& m);
void BindVersions(pybind11::module_& m);
// ReadPlan, Client.plan_reads' plans (read_plan.cc).
void BindReadPlan(pybind11::module_& m);

}  // namespace tessera::python

#endif  // TESSERA_PYTHON_BINDINGS_MODULE_H_
