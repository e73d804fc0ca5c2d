// numpy basic indexing (index.h).
#include "python/bindings/index.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "python/bindings/support.h"

namespace tessera::python {

Box ParseIndex(const py::handle& key, const std::vector<int64_t>& tensor,
               const std::string& name) {
  std::vector<py::handle> items;
  if (PyTuple_Check(key.ptr())) {
    for (const py::handle item : py::reinterpret_borrow<py::tuple>(key)) {
      items.push_back(item);
    }
  } else {
    items.push_back(key);
  }
  const auto ellipsis = [](const py::handle& item) {
    return item.ptr() == Py_Ellipsis;
  };
  const auto count = std::count_if(items.begin(), items.end(), ellipsis);
  if (count > 1) {
    Raise(absl::InvalidArgumentError(
        "an index can only have a single ellipsis ('...')"));
  }
  const size_t ndim = tensor.size();
  const size_t indexed = items.size() - static_cast<size_t>(count);
  if (indexed > ndim) {
    Raise(absl::OutOfRangeError(
        absl::StrCat("too many indices for tensor ", name, ": it has ", ndim,
                     " dimensions but ", indexed, " were indexed")));
  }
  // `...` (or the end of the index) stands for every axis not indexed.
  const py::object full_slice =
      py::reinterpret_steal<py::object>(PySlice_New(nullptr, nullptr, nullptr));
  std::vector<py::handle> axes;
  for (const py::handle& item : items) {
    if (ellipsis(item)) {
      axes.insert(axes.end(), ndim - indexed, full_slice);
    } else {
      axes.push_back(item);
    }
  }
  axes.resize(ndim, full_slice);
  Box box;
  for (size_t axis = 0; axis < ndim; ++axis) {
    const py::handle k = axes[axis];
    const Py_ssize_t n = static_cast<Py_ssize_t>(tensor[axis]);
    if (PySlice_Check(k.ptr())) {
      Py_ssize_t start, stop, step;
      if (PySlice_Unpack(k.ptr(), &start, &stop, &step) < 0) {
        throw py::error_already_set();
      }
      const Py_ssize_t size = PySlice_AdjustIndices(n, &start, &stop, step);
      if (step != 1) {
        // The step as written: PySlice_Unpack clamps one beyond ssize_t.
        const std::string written = py::str(k.attr("step"));
        Raise(absl::InvalidArgumentError(absl::StrCat(
            "slices with a step other than 1 are not supported (axis ", axis,
            " has step ", written, "): read the range and step it in numpy")));
      }
      box.offsets.push_back(size > 0 ? start : 0);
      box.sizes.push_back(size);
      box.shape.push_back(size);
      continue;
    }
    // A bool is an int to Python but a mask to numpy: refused, not read as
    // row 0 or 1.
    PyObject* index = PyBool_Check(k.ptr()) ? nullptr : PyNumber_Index(k.ptr());
    if (index == nullptr) {
      PyErr_Clear();
      Raise(absl::InvalidArgumentError(
          absl::StrCat("index ", std::string(py::repr(k)), " on axis ", axis,
                       ": only integers, slices and '...' are supported")));
    }
    int overflow = 0;
    const long long i = PyLong_AsLongLongAndOverflow(index, &overflow);
    Py_DECREF(index);
    if (overflow != 0 || i < -n || i >= n) {
      Raise(absl::OutOfRangeError(
          absl::StrCat("index ", std::string(py::str(k)),
                       " is out of bounds for axis ", axis, " with size ", n)));
    }
    box.offsets.push_back(i < 0 ? i + n : i);
    box.sizes.push_back(1);
  }
  return box;
}

}  // namespace tessera::python
