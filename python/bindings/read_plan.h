// Read plans from Python (client/read_plan.h): Client.plan_reads gives a
// ReadPlan whose run() reads every destination, the GIL released.
//
// Memory: the plan keeps the numpy arrays it writes (its items' outs), and
// the objects they came from, alive as long as it lives; no byte is copied
// between Python and the client library (support.h, Wrap). An out whose
// owner moved its memory since planning (numpy's resize(refcheck=False), a
// torch tensor's set_() or resize_()) fails the next run before any byte is
// written, instead of writing memory the owner no longer has.
#ifndef TESSERA_PYTHON_BINDINGS_READ_PLAN_H_
#define TESSERA_PYTHON_BINDINGS_READ_PLAN_H_

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "client/client.h"
#include "client/read_plan.h"

namespace tessera::python {

namespace py = pybind11;

// (name, offsets, sizes, out_offsets).
using PySource = std::tuple<std::string, std::vector<int64_t>,
                            std::vector<int64_t>, std::vector<int64_t>>;
// (sources, out, out's dtype name: "bfloat16" for uint16 bits, owner). `out`
// is a numpy array, or for GPU memory a tuple (data pointer, shape, CUDA
// device index, the object owning the memory: a torch tensor), C-contiguous.
// `owner`: the object the caller gave as out (a numpy array, a torch tensor,
// a buffer), whose memory `out` is.
using PyItem =
    std::tuple<std::vector<PySource>, py::object, std::string, py::object>;

class PyReadPlan {
 public:
  // Plans `items` through `client` (errors raised as tessera.errors).
  PyReadPlan(const std::shared_ptr<Client>& client,
             const std::vector<PyItem>& items);

  // (version, {name: version}, replanned, pinned, bytes). INVALID_ARGUMENT
  // (raised) when an out's owner no longer holds the memory it was planned
  // with, before anything is read.
  py::tuple Run(int64_t version, double timeout) const;
  int64_t bytes() const { return plan_->bytes(); }
  size_t pieces() const { return plan_->pieces(); }
  int plans() const { return plan_->plans(); }
  std::vector<std::string> names() const { return plan_->names(); }
  std::vector<std::vector<int64_t>> shapes() const { return plan_->shapes(); }
  std::vector<std::tuple<int, size_t, int64_t>> sources() const {
    return plan_->sources();
  }

 private:
  // An out as planned: its owner, and where its memory was then.
  struct HeldOut {
    py::object owner;
    uintptr_t data = 0;
    int64_t nbytes = 0;
  };
  // OK when every owner's memory is where it was planned (owners that
  // cannot move it, as buffers exported to numpy, are not asked).
  absl::Status CheckOutsStayed() const;

  std::shared_ptr<ReadPlan> plan_;
  py::list outs_;  // Kept alive: the plan writes into them.
  std::vector<HeldOut> held_;
};

// ReadPlan (read_plan.cc).
void BindReadPlan(py::module_& m);

}  // namespace tessera::python

#endif  // TESSERA_PYTHON_BINDINGS_READ_PLAN_H_
