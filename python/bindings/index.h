// numpy basic indexing for tessera tensors: `tensor[key]` with integers,
// slices of step 1, `...` and negative indices, as numpy reads them. Parsed
// here rather than in the package so that a 4 KiB `tensor[i, a:b]` costs
// one native call.
//
// Failures raise tessera.errors (support.h): INVALID_ARGUMENT for a second
// `...`, a step other than 1, a bool or any other index kind;
// OUT_OF_RANGE for too many indices or an integer outside its axis, in
// numpy's words. Slices are clipped to the axis, as numpy clips them.
//
// Thread-safety: needs the GIL (it reads Python objects).
#ifndef TESSERA_PYTHON_BINDINGS_INDEX_H_
#define TESSERA_PYTHON_BINDINGS_INDEX_H_

#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace tessera::python {

// The box an index selects and the shape of the result (integer-indexed
// axes dropped).
struct Box {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
  std::vector<pybind11::ssize_t> shape;
  bool empty() const {
    return std::find(sizes.begin(), sizes.end(), 0) != sizes.end();
  }
};

// The box of `key` on a tensor of shape `tensor` named `name` (for the
// messages).
Box ParseIndex(const pybind11::handle& key, const std::vector<int64_t>& tensor,
               const std::string& name);

}  // namespace tessera::python

#endif  // TESSERA_PYTHON_BINDINGS_INDEX_H_
