// Sharding specs for Python: tessera._tessera.ShardingSpec wraps a
// ShardingSpec (a std::variant, which pybind11 would convert rather than
// wrap), made by parse_spec (the CLI's text form), spec_from_json and
// chunk. Two specs are equal when their text forms are. Invalid specs
// raise INVALID_ARGUMENT with the C++ parser's words.
//
// Thread-safety: immutable once made.
#ifndef TESSERA_PYTHON_BINDINGS_SPECS_H_
#define TESSERA_PYTHON_BINDINGS_SPECS_H_

#include "common/sharding_spec.h"

namespace tessera::python {

struct PySpec {
  ShardingSpec spec;
};

}  // namespace tessera::python

#endif  // TESSERA_PYTHON_BINDINGS_SPECS_H_
