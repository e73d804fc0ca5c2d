// The helper layer every binding of tessera._tessera stands on: how a
// status becomes a Python exception, how a call leaves the GIL, how numpy
// (and DLPack) memory becomes a tessera::Tensor and back, and how a
// transfer honours Ctrl-C and a progress bar.
//
// Errors: Raise/Check turn an absl::Status into the tessera.errors class of
// its code (tessera.errors.from_status), so Python sees the daemons' gRPC
// codes and messages unchanged. They need the GIL.
//
// Memory: no byte is copied between Python and the client library. Wrap
// lends a C-contiguous numpy array's memory to a Tensor for the length of
// one call (the caller keeps the array alive until every transfer has
// ended); ToNumpy hands a Tensor's storage to numpy, kept alive by a
// capsule. bfloat16, which numpy lacks, travels as its bits in a 16-bit
// integer array (BitsDType); the package converts those bits, torch views
// them as its bfloat16. DLPackArray views another library's memory (a
// __dlpack__ object) as a writable numpy array, so every `out=` the package
// takes ends up as numpy before it reaches this layer.
//
// Transfers: PyTransfer runs a read or write with the GIL released; a
// large, watched or non-repeatable one on a thread of its own while this
// thread wakes every 50 ms to run Python's signal handlers (Ctrl-C raises
// KeyboardInterrupt, which cancels the transfer even where it waits on a
// stalled daemon) and the progress callback. Every call has the client's
// deadline, so a dead daemon is an exception within it, never a hang.
//
// Thread-safety: everything here is called with the GIL held, except the
// work a WithoutGil or PyTransfer runs, which must not touch Python.
#ifndef TESSERA_PYTHON_BINDINGS_SUPPORT_H_
#define TESSERA_PYTHON_BINDINGS_SUPPORT_H_

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/client.h"
#include "common/cancellation.h"
#include "common/dtype.h"
#include "common/tensor/tensor.h"

namespace tessera::python {

namespace py = pybind11;

// ---- Status -> exception (errors.cc).

// Raises the tessera.errors class for `status` (needs the GIL).
[[noreturn]] void Raise(const absl::Status& status);

inline void Check(const absl::Status& status) {
  if (!status.ok()) Raise(status);
}

template <typename T>
T Check(absl::StatusOr<T> value) {
  if (!value.ok()) Raise(value.status());
  return *std::move(value);
}

// ---- The GIL.

// Runs `work`, which must not touch Python, with the GIL released, and
// returns what it returns (a status is checked by the caller, with the GIL
// back).
template <typename Work>
auto WithoutGil(Work&& work) -> decltype(work()) {
  py::gil_scoped_release release;
  return work();
}

// ---- dtypes and buffers (buffers.cc).

// The DType named `name` ("float32", "f4", "bool"...): INVALID_ARGUMENT
// raised for an unknown one.
DType DTypeFromName(const std::string& name);

// The numpy dtype of `dtype`; raises INVALID_ARGUMENT for bfloat16, which
// numpy lacks, saying how to read one.
py::dtype NumpyDType(DType dtype);

// The numpy dtype that holds `dtype`'s bits: its own, or uint16 for
// bfloat16.
py::dtype BitsDType(DType dtype);

// Whether `array` may carry `dtype`'s bits: its numpy dtype, or any 16-bit
// integer for bfloat16.
bool CarriesBitsOf(const py::array& array, DType dtype);

// A tensor of `dtype` sharing the memory of `array` (C-contiguous, else
// INVALID_ARGUMENT is raised), valid while the array lives.
Tensor Wrap(const py::array& array, DType dtype);

// A numpy array sharing `tensor`'s storage (made dense on the CPU first
// when it is not), which a capsule keeps alive. With `bits`, a bfloat16
// tensor comes as its bits (BitsDType); without, bfloat16 raises.
py::array ToNumpy(Tensor tensor, bool bits = false);

// A writable numpy array over the memory of `object`'s DLPack export
// (object.__dlpack__()), in place: its shape, strides and dtype, a
// bfloat16 one as uint16 bits (`*bfloat16` says which). The export is
// released when the array dies. Raises INVALID_ARGUMENT for memory off the
// CPU, vector lanes or a dtype numpy cannot hold, and TypeError when
// `object` exports no DLPack capsule.
py::array DLPackArray(const py::object& object, bool* bfloat16);

// Python lists of a shard's offsets or sizes.
inline std::vector<int64_t> ToVector(absl::Span<const int64_t> dims) {
  return {dims.begin(), dims.end()};
}

// ---- Transfers (transfer.cc).

// Options with the deadline `timeout_seconds` (0 or less: the client
// library's default).
TransferOptions Transfer(double timeout_seconds);

// A transfer of `bytes` from Python: its deadline, a cancellation and,
// when watched (`progress` is callable), a counter that `progress(done,
// total)` reads every 50 ms.
class PyTransfer {
 public:
  PyTransfer(double timeout_seconds, int64_t bytes, py::object progress);

  // Runs `work` with the transfer's options so that Ctrl-C stops it
  // promptly: large or watched transfers on a thread (kThreadedBytes);
  // small ones with the GIL released on this thread, which for a read
  // (`idempotent`) first gets a short slice (kInlineSlice) and then, if
  // the deadline allows more, is started again interruptibly with what is
  // left. A small write runs on a thread: it cannot be repeated safely.
  // A Python exception (KeyboardInterrupt) propagates once the work has
  // stopped.
  absl::Status Run(
      const std::function<absl::Status(const TransferOptions&)>& work,
      bool idempotent);

 private:
  bool threaded() const;

  const int64_t bytes_;
  const py::object progress_;
  TransferOptions options_;
  const std::shared_ptr<Cancellation> cancel_ =
      std::make_shared<Cancellation>();
  const std::shared_ptr<std::atomic<int64_t>> done_ =
      std::make_shared<std::atomic<int64_t>>(0);
};

}  // namespace tessera::python

#endif  // TESSERA_PYTHON_BINDINGS_SUPPORT_H_
