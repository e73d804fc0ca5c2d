// tessera._tessera.View: one named tensor's view (client/client.h
// ShardedTensorView) for the package's tessera.Tensor, which shapes the
// API around it. Reads land in numpy arrays and writes leave from them in
// place (support.h Wrap), with the GIL released and Ctrl-C honoured
// (PyTransfer); `tensor[key]` is one call (GetItem: index.h, then one
// read).
//
// Failures raise tessera.errors: a box outside the tensor is OUT_OF_RANGE
// before any array is allocated; an `out` of the wrong dtype, shape or
// layout, or read-only, is INVALID_ARGUMENT with nothing read; the client
// library's errors (a reshard or delete since the view was taken, a dead
// owner, a deadline) keep their codes. A failed write may have reached
// some owners (the message names which).
//
// Thread-safety: a view may be used from several Python threads; the
// cached numpy dtypes are only touched with the GIL held.
#ifndef TESSERA_PYTHON_BINDINGS_TENSOR_H_
#define TESSERA_PYTHON_BINDINGS_TENSOR_H_

#include <atomic>
#include <memory>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "client/client.h"

namespace tessera::python {

namespace py = pybind11;

// One shard's place: (offsets, sizes, placement text, rank).
using ShardTuple =
    std::tuple<std::vector<int64_t>, std::vector<int64_t>, std::string, int>;

class PyView {
 public:
  explicit PyView(ShardedTensorView view) : view_(std::move(view)) {}

  const std::string& name() const { return view_.name(); }
  const std::string& tensor_id() const { return view_.tensor_id(); }
  std::vector<int64_t> shape() const { return view_.sizes(); }
  std::string dtype() const;
  bool degraded() const { return view_.degraded(); }
  int copies() const;
  std::vector<ShardTuple> shards() const;

  // Reads the box into `out` (a C-contiguous array of the tensor's dtype
  // and the box's shape), or a new array. A bfloat16 tensor's box is read
  // as its bits (BitsDType).
  py::array ReadRegion(const std::vector<int64_t>& offsets,
                       const std::vector<int64_t>& sizes,
                       std::optional<py::array> out, double timeout,
                       const py::object& progress) const;

  // (offsets, sizes, shape) of a numpy basic index.
  std::tuple<std::vector<int64_t>, std::vector<int64_t>, py::tuple> IndexBox(
      const py::handle& key) const;

  // tensor[key]: the box read into a new array of the result's shape.
  py::array GetItem(const py::handle& key, double timeout) const;

  // Writes `data` as the box at `offsets`; a bfloat16 tensor takes its
  // bits from a 16-bit integer array.
  void Write(const std::vector<int64_t>& offsets, const py::array& data,
             double timeout, const py::object& progress) const;

  // Shard `index` fetched whole from its owner: (offsets, sizes, array; a
  // bfloat16 shard as its bits).
  std::tuple<std::vector<int64_t>, std::vector<int64_t>, py::array> ToHere(
      size_t index, double timeout) const;

  // Versions (docs/versions.md; client/client.h ShardedTensorView).
  bool versioned() const { return view_.versioned(); }
  int64_t version() const { return view_.version(); }
  int64_t at_version() const { return view_.at_version(); }
  bool open_version() const { return view_.open_version(); }
  std::vector<int64_t> kept_versions() const {
    return {view_.info().kept_versions().begin(),
            view_.info().kept_versions().end()};
  }
  std::vector<int64_t> pinned_versions() const {
    return {view_.info().pinned_versions().begin(),
            view_.info().pinned_versions().end()};
  }
  std::vector<int64_t> open_versions() const {
    return {view_.info().open_versions().begin(),
            view_.info().open_versions().end()};
  }
  int versions_kept() const { return view_.info().versions_kept(); }
  // This tensor at published version `number` (ShardedTensorView::AtVersion).
  PyView At(int64_t number) const;
  // The published version the last read through this view returned (0
  // before one; with reads from several threads, one of theirs).
  int64_t last_version() const { return last_version_->load(); }

  const ShardedTensorView& view() const { return view_; }

  // `data` as the bytes Write sends: a tensor of its dtype over its
  // memory (a bfloat16 tensor's bits from a 16-bit integer array).
  Tensor Source(const py::array& data) const;

 private:
  // Reads the box at `offsets` into `destination` (memory of a numpy
  // array), interruptibly (PyTransfer).
  void ReadInto(const std::vector<int64_t>& offsets, const Tensor& destination,
                double timeout, const py::object& progress) const;

  ShardedTensorView view_;
  std::shared_ptr<std::atomic<int64_t>> last_version_ =
      std::make_shared<std::atomic<int64_t>>(0);
  // Null until the first read (building a numpy dtype costs microseconds,
  // which a 4 KiB read notices).
  mutable py::object numpy_dtype_;
  mutable py::object bits_dtype_;
};

// write_many(items, timeout): each item a (View, offsets, array) written
// as View.write would, all in one interruptible call (client/client.h
// WriteMany).
void WriteMany(const std::vector<std::tuple<const PyView*, std::vector<int64_t>,
                                            py::array>>& items,
               double timeout);

}  // namespace tessera::python

#endif  // TESSERA_PYTHON_BINDINGS_TENSOR_H_
