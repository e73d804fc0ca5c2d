// tessera._tessera: the C++ client library (client/client.h) for Python.
// The pure-Python package around it (python/tessera/) shapes the API;
// this module moves the bytes: reads land in numpy arrays and writes leave
// from them without a copy (their memory is wrapped as a tessera::Tensor
// for the length of the call), with the GIL released while they move.
//
// Errors raise tessera.errors classes (made by tessera.errors.from_status
// from the absl code and message). Every call has the client's deadline,
// so a dead daemon is an exception within it, never a hang.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "common/cancellation.h"
#include "common/dtype.h"
#include "common/proto_convert.h"
#include "common/region.h"
#include "common/sharding_spec.h"
#include "common/sharding_spec_text.h"
#include "common/tensor/storage.h"
#include "common/tensor/tensor.h"
#include "wire/auth.h"
#include "wire/credentials.h"
#include "wire/replicas.h"
#include "wire/request_id.h"

namespace py = pybind11;

namespace tessera {
namespace {

// A sharding spec for Python (ShardingSpec itself is a std::variant,
// which pybind11 would convert rather than wrap).
struct PySpec {
  ShardingSpec spec;
};

// Raises the tessera.errors class for `status` (needs the GIL).
[[noreturn]] void Raise(const absl::Status& status) {
  py::object error = py::module_::import("tessera.errors")
                         .attr("from_status")(static_cast<int>(status.code()),
                                              std::string(status.message()));
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())),
                  error.ptr());
  throw py::error_already_set();
}

void Check(const absl::Status& status) {
  if (!status.ok()) Raise(status);
}

template <typename T>
T Check(absl::StatusOr<T> value) {
  if (!value.ok()) Raise(value.status());
  return *std::move(value);
}

DType DTypeFromName(const std::string& name) { return Check(ParseDType(name)); }

// Python lists of a shard's offsets or sizes.
std::vector<int64_t> ToVector(absl::Span<const int64_t> dims) {
  return {dims.begin(), dims.end()};
}

// The numpy dtype of `dtype`; bfloat16 has none.
py::dtype NumpyDType(DType dtype) {
  if (dtype == DType::kBFloat16) {
    Raise(absl::InvalidArgumentError(
        "the tensor is bfloat16, which numpy lacks: read it with "
        "cast=\"float32\", or into a torch.bfloat16 tensor with "
        "tessera.torch.read"));
  }
  return py::dtype(std::string(DTypeName(dtype)));
}

// The numpy dtype that holds `dtype`'s bits: its own, or uint16 for
// bfloat16 (the package converts those bits; torch views them as its
// bfloat16).
py::dtype BitsDType(DType dtype) {
  return dtype == DType::kBFloat16 ? py::dtype("uint16") : NumpyDType(dtype);
}

// Whether `array` may carry `dtype`'s bits: its numpy dtype, or any 16-bit
// integer for bfloat16.
bool CarriesBitsOf(const py::array& array, DType dtype) {
  if (dtype == DType::kBFloat16) {
    const char kind = array.dtype().kind();
    return array.itemsize() == 2 && (kind == 'u' || kind == 'i');
  }
  return array.dtype().is(NumpyDType(dtype));
}

// A tensor sharing the memory of `array` (C-contiguous, checked by the
// caller's side too), valid while the array lives: the calls below keep it
// alive until every transfer has ended.
Tensor Wrap(const py::array& array, DType dtype) {
  if (!(array.flags() & py::array::c_style)) {
    Raise(absl::InvalidArgumentError("the array is not C-contiguous"));
  }
  std::vector<int64_t> sizes(array.shape(), array.shape() + array.ndim());
  std::vector<int64_t> strides(sizes.size(), 1);
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 2; d >= 0; --d) {
    strides[d] = strides[d + 1] * std::max<int64_t>(sizes[d + 1], 1);
  }
  const size_t nbytes = static_cast<size_t>(array.nbytes());
  std::shared_ptr<Storage> storage = Storage::Wrap(
      const_cast<void*>(array.data()), nbytes, Device::Cpu(), nullptr);
  return Check(
      Tensor::FromStorage(std::move(storage), dtype, 0, sizes, strides));
}

// A numpy array owning a copy of nothing: it shares `tensor`'s storage and
// keeps it alive (a capsule holds a reference). With `bits`, a bfloat16
// tensor comes as its bits (BitsDType).
py::array ToNumpy(Tensor tensor, bool bits = false) {
  absl::StatusOr<Tensor> host =
      tensor.device().is_cpu() ? tensor.Contiguous() : tensor.To(Device::Cpu());
  Tensor dense = Check(std::move(host));
  if (!dense.is_contiguous()) dense = Check(dense.Contiguous());
  const py::dtype dtype =
      bits ? BitsDType(dense.dtype()) : NumpyDType(dense.dtype());
  std::vector<py::ssize_t> shape(dense.sizes().begin(), dense.sizes().end());
  auto* owner = new Tensor(dense);
  py::capsule base(owner, [](void* p) { delete static_cast<Tensor*>(p); });
  return py::array(dtype, shape, {}, dense.data_ptr(), base);
}

TensorInit InitFromName(const std::string& init) {
  if (init == "empty") return TensorInit::kEmpty;
  if (init == "zeros") return TensorInit::kZeros;
  if (init == "ones") return TensorInit::kOnes;
  if (init == "full") return TensorInit::kFull;
  if (init == "rand") return TensorInit::kRand;
  if (init == "randn") return TensorInit::kRandn;
  Raise(absl::InvalidArgumentError(absl::StrCat(
      "init must be empty, zeros, ones, full, rand or randn, not \"", init,
      "\"")));
}

TransferOptions Transfer(double timeout_seconds) {
  TransferOptions options;
  if (timeout_seconds > 0) options.timeout = absl::Seconds(timeout_seconds);
  return options;
}

// Transfers at least this large, or watched by a progress bar, run on a
// thread of their own (Interruptible); smaller ones end sooner than a
// thread starts.
constexpr int64_t kThreadedBytes = int64_t{1} << 20;
// How long a small read runs on the caller's thread before it is started
// again interruptibly (a read is idempotent): the most a Ctrl-C waits for.
constexpr absl::Duration kInlineSlice = absl::Milliseconds(200);

// Runs `work` (which must not touch Python) on a thread of its own while
// this thread, the GIL released, waits for it in slices of 50 ms; between
// them it runs Python's signal handlers (Ctrl-C raises KeyboardInterrupt
// there) and calls `progress(done, total)` when given. When a handler
// raises, `cancel` is cancelled, which interrupts the work even where it
// waits on a stalled daemon; it is waited for and the Python exception
// propagates.
absl::Status Interruptible(const std::function<absl::Status()>& work,
                           const std::shared_ptr<Cancellation>& cancel,
                           const std::shared_ptr<std::atomic<int64_t>>& done,
                           int64_t total, const py::object& progress) {
  std::promise<absl::Status> promise;
  std::future<absl::Status> future = promise.get_future();
  std::thread worker([&] { promise.set_value(work()); });
  const auto join = [&] {
    py::gil_scoped_release release;
    future.wait();
    worker.join();
  };
  try {
    while (true) {
      bool ready;
      {
        py::gil_scoped_release release;
        ready = future.wait_for(std::chrono::milliseconds(50)) ==
                std::future_status::ready;
      }
      if (!progress.is_none()) progress(done->load(), total);
      if (ready) break;
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    }
  } catch (...) {
    cancel->Cancel();
    join();
    throw;
  }
  join();
  return future.get();
}

// A transfer of `bytes` from Python: its deadline, a cancellation and,
// when watched, a progress counter.
class PyTransfer {
 public:
  PyTransfer(double timeout_seconds, int64_t bytes, py::object progress)
      : bytes_(bytes),
        progress_(std::move(progress)),
        options_(Transfer(timeout_seconds)) {
    options_.cancel = cancel_;
    if (threaded()) {
      // Counting costs a lock per chunk: only watched transfers count.
      options_.progress = [done = done_](int64_t moved, int64_t) {
        done->store(moved);
      };
    }
  }

  // Runs `work` with the transfer's options so that Ctrl-C stops it
  // promptly: large or watched transfers on a thread (Interruptible);
  // small ones with the GIL released on this thread, which for a read
  // (`idempotent`) first gets kInlineSlice and then, if the deadline
  // allows more, is started again interruptibly with what is left. A small
  // write runs on a thread: it cannot be repeated safely.
  absl::Status Run(
      const std::function<absl::Status(const TransferOptions&)>& work,
      bool idempotent) {
    if (!threaded() && idempotent) {
      const absl::Time deadline = absl::Now() + options_.timeout;
      TransferOptions first = options_;
      first.timeout = std::min(options_.timeout, kInlineSlice);
      absl::Status status;
      {
        py::gil_scoped_release release;
        status = work(first);
      }
      if (!absl::IsDeadlineExceeded(status) ||
          first.timeout == options_.timeout) {
        return status;
      }
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
      options_.timeout = std::max(deadline - absl::Now(), absl::ZeroDuration());
    }
    return Interruptible([&] { return work(options_); }, cancel_, done_, bytes_,
                         progress_);
  }

 private:
  bool threaded() const {
    return bytes_ >= kThreadedBytes || !progress_.is_none();
  }

  const int64_t bytes_;
  const py::object progress_;
  TransferOptions options_;
  const std::shared_ptr<Cancellation> cancel_ =
      std::make_shared<Cancellation>();
  const std::shared_ptr<std::atomic<int64_t>> done_ =
      std::make_shared<std::atomic<int64_t>>(0);
};

// A numpy basic index (an int, a slice of step 1, `...`, or a tuple of
// them) on a tensor of `shape`: the box it selects and the shape of the
// result (integer-indexed axes dropped). Parsed here rather than in the
// package so that a 4 KiB `tensor[i, a:b]` costs one call.
struct Box {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
  std::vector<py::ssize_t> shape;
  bool empty() const {
    return std::find(sizes.begin(), sizes.end(), 0) != sizes.end();
  }
};
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
        Raise(absl::InvalidArgumentError(absl::StrCat(
            "slices with a step other than 1 are not supported (axis ", axis,
            " has step ", step, "): read the range and step it in numpy")));
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

// One shard's place: (offsets, sizes, placement text, rank).
using ShardTuple =
    std::tuple<std::vector<int64_t>, std::vector<int64_t>, std::string, int>;

class PyView {
 public:
  explicit PyView(ShardedTensorView view) : view_(std::move(view)) {}

  const std::string& name() const { return view_.name(); }
  const std::string& tensor_id() const { return view_.tensor_id(); }
  std::vector<int64_t> shape() const { return view_.sizes(); }
  std::string dtype() const { return std::string(DTypeName(view_.dtype())); }
  bool degraded() const { return view_.degraded(); }
  int copies() const { return CopiesOf(view_.info()); }
  std::vector<ShardTuple> shards() const {
    std::vector<ShardTuple> shards;
    const auto& all = view_.metadata().shards_metadata;
    for (size_t i = 0; i < all.size(); ++i) {
      shards.emplace_back(
          ToVector(all[i].shard_offsets()), ToVector(all[i].shard_sizes()),
          all[i].placement().has_value() ? all[i].placement()->ToString() : "",
          view_.owner_rank(i));
    }
    return shards;
  }

  // Reads the box into `out` (a C-contiguous array of the tensor's dtype
  // and the box's shape), or a new array. A bfloat16 tensor's box is read
  // as its bits (BitsDType).
  py::array ReadRegion(const std::vector<int64_t>& offsets,
                       const std::vector<int64_t>& sizes,
                       std::optional<py::array> out, double timeout,
                       const py::object& progress) const {
    // The box is checked before its array is allocated: a huge box outside
    // the tensor is OUT_OF_RANGE, not a MemoryError.
    Check(ValidateRegion(offsets, sizes, view_.sizes(),
                         absl::StrCat("tensor ", view_.name()), "tensor"));
    if (!bits_dtype_) bits_dtype_ = BitsDType(view_.dtype());
    const py::dtype dtype = py::reinterpret_borrow<py::dtype>(bits_dtype_);
    py::array target = out.has_value()
                           ? *out
                           : py::array(dtype, std::vector<py::ssize_t>(
                                                  sizes.begin(), sizes.end()));
    if (!(target.dtype().is(dtype) || CarriesBitsOf(target, view_.dtype()))) {
      Raise(absl::InvalidArgumentError(
          absl::StrCat("out has dtype ", std::string(py::str(target.dtype())),
                       " but tensor ", view_.name(), " is ", dtype_name())));
    }
    if (!target.writeable()) {
      Raise(absl::InvalidArgumentError("out is not writeable"));
    }
    std::vector<int64_t> shape(target.shape(), target.shape() + target.ndim());
    if (shape != sizes) {
      Raise(absl::InvalidArgumentError(
          absl::StrCat("out has shape (", absl::StrJoin(shape, ", "),
                       ") but the box is (", absl::StrJoin(sizes, ", "), ")")));
    }
    ReadInto(offsets, Wrap(target, view_.dtype()), timeout, progress);
    return target;
  }

  // (offsets, sizes, shape) of a numpy basic index.
  std::tuple<std::vector<int64_t>, std::vector<int64_t>, py::tuple> IndexBox(
      const py::handle& key) const {
    Box box = ParseIndex(key, view_.sizes(), view_.name());
    return {std::move(box.offsets), std::move(box.sizes),
            py::tuple(py::cast(box.shape))};
  }

  // tensor[key]: the box read into a new array of the result's shape.
  py::array GetItem(const py::handle& key, double timeout) const {
    const Box box = ParseIndex(key, view_.sizes(), view_.name());
    if (!numpy_dtype_) numpy_dtype_ = NumpyDType(view_.dtype());
    const py::dtype dtype = py::reinterpret_borrow<py::dtype>(numpy_dtype_);
    py::array target(dtype, box.shape);
    if (box.empty()) return target;
    ReadInto(box.offsets, Check(Wrap(target, view_.dtype()).View(box.sizes)),
             timeout, py::none());
    return target;
  }

  // Writes `data` as the box at `offsets`; a bfloat16 tensor takes its
  // bits from a 16-bit integer array.
  void Write(const std::vector<int64_t>& offsets, const py::array& data,
             double timeout, const py::object& progress) const {
    const DType dtype =
        view_.dtype() == DType::kBFloat16 && CarriesBitsOf(data, view_.dtype())
            ? DType::kBFloat16
            : DTypeFromName(std::string(py::str(data.dtype().attr("name"))));
    const Tensor source = Wrap(data, dtype);
    PyTransfer transfer(timeout, static_cast<int64_t>(data.nbytes()), progress);
    Check(transfer.Run(
        [&](const TransferOptions& options) {
          return view_.Write(offsets, source, options);
        },
        /*idempotent=*/false));
  }

  // Each shard fetched whole from its owner: (offsets, sizes, array).
  std::tuple<std::vector<int64_t>, std::vector<int64_t>, py::array> ToHere(
      size_t index, double timeout) const {
    const std::vector<RemoteShard> remote = view_.remote_shards();
    if (index >= remote.size()) {
      Raise(absl::OutOfRangeError(absl::StrCat(
          "shard ", index, " of a tensor with ", remote.size(), " shards")));
    }
    const int64_t bytes = view_.metadata().shards_metadata[index].numel() *
                          static_cast<int64_t>(ElementSize(view_.dtype()));
    absl::StatusOr<Shard> shard;
    PyTransfer transfer(timeout, bytes, py::none());
    Check(transfer.Run(
        [&](const TransferOptions& transfer_options) {
          FetchOptions options;
          options.timeout = transfer_options.timeout;
          options.cancel = transfer_options.cancel;
          shard = remote[index].to_here(options);
          return shard.status();
        },
        /*idempotent=*/true));
    Shard fetched = *std::move(shard);
    return {ToVector(fetched.metadata.shard_offsets()),
            ToVector(fetched.metadata.shard_sizes()),
            ToNumpy(std::move(fetched.tensor), /*bits=*/true)};
  }

  const ShardedTensorView& view() const { return view_; }

 private:
  // Reads the box at `offsets` into `destination` (memory of a numpy
  // array), interruptibly (PyTransfer).
  void ReadInto(const std::vector<int64_t>& offsets, const Tensor& destination,
                double timeout, const py::object& progress) const {
    PyTransfer transfer(timeout, static_cast<int64_t>(destination.nbytes()),
                        progress);
    Check(transfer.Run(
        [&](const TransferOptions& options) {
          return view_.ReadRegionInto(offsets, destination, options);
        },
        /*idempotent=*/true));
  }

  std::string dtype_name() const {
    return std::string(DTypeName(view_.dtype()));
  }

  ShardedTensorView view_;
  // Null until the first read (building a numpy dtype costs microseconds,
  // which a 4 KiB read notices).
  mutable py::object numpy_dtype_;
  mutable py::object bits_dtype_;
};

class PyClient {
 public:
  static std::shared_ptr<PyClient> Connect(const std::string& address,
                                           double timeout,
                                           const std::string& request_id) {
    ClientOptions options;
    if (timeout > 0) options.timeout = absl::Seconds(timeout);
    if (!request_id.empty() && !IsValidRequestId(request_id)) {
      Check(absl::InvalidArgumentError(
          absl::StrCat("request_id '", request_id,
                       "' is not 1 to 64 of A-Z a-z 0-9 . _ : -")));
    }
    options.request_id = request_id;
    absl::StatusOr<std::shared_ptr<Client>> client;
    {
      py::gil_scoped_release release;
      client = Client::Connect(address, options);
    }
    return std::make_shared<PyClient>(Check(std::move(client)));
  }
  explicit PyClient(std::shared_ptr<Client> client)
      : client_(std::move(client)) {}

  int world_size() const { return client_->world_size(); }
  int64_t generation() const { return client_->cluster().generation(); }

  std::vector<std::tuple<std::string, int, bool>> Health() const {
    std::vector<absl::Status> health;
    {
      py::gil_scoped_release release;
      health = client_->Health();
    }
    std::vector<std::tuple<std::string, int, bool>> out;
    for (size_t r = 0; r < health.size(); ++r) {
      out.emplace_back(
          client_->cluster().workers(static_cast<int>(r)).address(),
          static_cast<int>(r), health[r].ok());
    }
    return out;
  }

  // (rank, metrics text, error): one of the last two is empty.
  std::vector<std::tuple<int, std::string, std::string>> Stats() const {
    std::vector<absl::StatusOr<v1::DaemonStats>> stats;
    {
      py::gil_scoped_release release;
      stats = client_->Stats();
    }
    std::vector<std::tuple<int, std::string, std::string>> out;
    for (size_t r = 0; r < stats.size(); ++r) {
      out.emplace_back(static_cast<int>(r),
                       stats[r].ok() ? stats[r]->metrics() : "",
                       stats[r].ok() ? "" : stats[r].status().ToString());
    }
    return out;
  }

  PyView Create(const std::string& name, const std::vector<int64_t>& sizes,
                const PySpec& spec, const std::string& dtype,
                const std::string& init, double fill_value, uint64_t seed,
                int replicas) {
    CreateOptions options;
    options.dtype = DTypeFromName(dtype);
    options.init = InitFromName(init);
    options.fill_value = fill_value;
    options.seed = seed;
    options.copies = replicas;
    absl::StatusOr<ShardedTensorView> view;
    {
      py::gil_scoped_release release;
      view = client_->Create(name, sizes, spec.spec, options);
    }
    return PyView(Check(std::move(view)));
  }

  std::vector<PyView> List() const {
    absl::StatusOr<std::vector<ShardedTensorView>> views;
    {
      py::gil_scoped_release release;
      views = client_->List();
    }
    std::vector<PyView> out;
    for (ShardedTensorView& view : Check(std::move(views))) {
      out.emplace_back(std::move(view));
    }
    return out;
  }

  PyView Open(const std::string& name) const {
    absl::StatusOr<ShardedTensorView> view;
    {
      py::gil_scoped_release release;
      view = client_->Open(name);
    }
    return PyView(Check(std::move(view)));
  }

  void Delete(const std::string& name) {
    absl::Status status;
    {
      py::gil_scoped_release release;
      status = client_->Delete(name);
    }
    Check(status);
  }

  PyView Reshard(const std::string& name, const PySpec& spec) {
    absl::StatusOr<ShardedTensorView> view;
    {
      py::gil_scoped_release release;
      view = client_->Reshard(name, spec.spec);
    }
    return PyView(Check(std::move(view)));
  }

  py::array Gather(const std::string& name, double timeout) const {
    absl::StatusOr<Tensor> gathered;
    {
      py::gil_scoped_release release;
      gathered = client_->Gather(name, Transfer(timeout));
    }
    return ToNumpy(Check(std::move(gathered)));
  }

  std::vector<std::string> Save(const std::string& path,
                                const std::vector<std::string>& names,
                                bool overwrite) {
    absl::StatusOr<std::vector<std::string>> saved;
    {
      py::gil_scoped_release release;
      saved = client_->Save(path, names, overwrite);
    }
    return Check(std::move(saved));
  }

  std::vector<PyView> Load(const std::string& path,
                           const std::vector<std::string>& names,
                           const std::vector<std::string>& as_names,
                           std::optional<PySpec> spec, bool replace) {
    v1::LoadCheckpointRequest request;
    request.set_path(path);
    for (const std::string& name : names) request.add_names(name);
    for (const std::string& name : as_names) request.add_as_names(name);
    if (spec.has_value()) *request.mutable_spec() = ToProto(spec->spec);
    request.set_replace(replace);
    absl::StatusOr<std::vector<ShardedTensorView>> views;
    {
      py::gil_scoped_release release;
      views = client_->Load(request);
    }
    std::vector<PyView> out;
    for (ShardedTensorView& view : Check(std::move(views))) {
      out.emplace_back(std::move(view));
    }
    return out;
  }

 private:
  std::shared_ptr<Client> client_;
};

}  // namespace
}  // namespace tessera

PYBIND11_MODULE(_tessera, m) {
  using namespace tessera;
  m.doc() = "Tessera's C++ client library (use the tessera package)";

  py::class_<PySpec>(m, "ShardingSpec")
      .def("to_text",
           [](const PySpec& spec) { return ShardingSpecToText(spec.spec); })
      .def("to_json",
           [](const PySpec& spec) { return ShardingSpecToJson(spec.spec); })
      .def("__repr__",
           [](const PySpec& spec) {
             return absl::StrCat("tessera.parse_spec(\"",
                                 ShardingSpecToText(spec.spec), "\")");
           })
      .def("__eq__", [](const PySpec& a, const PySpec& b) {
        return ShardingSpecToText(a.spec) == ShardingSpecToText(b.spec);
      });
  m.def("parse_spec", [](const std::string& text) {
    return PySpec{Check(ParseShardingSpec(text))};
  });
  m.def("spec_from_json", [](const std::string& json) {
    return PySpec{Check(ShardingSpecFromJson(json))};
  });
  m.def("chunk", [](int64_t dim, const std::vector<std::string>& placements) {
    return PySpec{
        ShardingSpec(Check(ChunkShardingSpec::Create(dim, placements)))};
  });
  m.def("dtype_names", [] {
    std::vector<std::string> names;
    for (DType dtype : kAllDTypes) names.emplace_back(DTypeName(dtype));
    return names;
  });
  m.def("canonical_dtype", [](const std::string& name) {
    return std::string(DTypeName(DTypeFromName(name)));
  });
  m.def("set_tls", [](const std::string& ca, const std::string& cert,
                      const std::string& key) {
    TlsConfig config;
    config.ca_file = ca;
    config.cert_file = cert;
    config.key_file = key;
    Check(ValidateTlsConfig(config, /*server=*/false, "tls_cert", "tls_key",
                            "tls_ca"));
    SetProcessTls(std::move(config));
  });
  m.def("set_token", [](const std::string& token) { SetProcessToken(token); });

  py::class_<PyView>(m, "View")
      .def_property_readonly("name", &PyView::name)
      .def_property_readonly("tensor_id", &PyView::tensor_id)
      .def_property_readonly("shape", &PyView::shape)
      .def_property_readonly("dtype", &PyView::dtype)
      .def_property_readonly("degraded", &PyView::degraded)
      .def_property_readonly("copies", &PyView::copies)
      .def("shards", &PyView::shards)
      .def("read_region", &PyView::ReadRegion, py::arg("offsets"),
           py::arg("sizes"), py::arg("out") = py::none(),
           py::arg("timeout") = 0.0, py::arg("progress") = py::none())
      .def("box", &PyView::IndexBox, py::arg("key"))
      .def("getitem", &PyView::GetItem, py::arg("key"),
           py::arg("timeout") = 0.0)
      .def("write", &PyView::Write, py::arg("offsets"), py::arg("data"),
           py::arg("timeout") = 0.0, py::arg("progress") = py::none())
      .def("to_here", &PyView::ToHere, py::arg("index"),
           py::arg("timeout") = 0.0);

  py::class_<PyClient, std::shared_ptr<PyClient>>(m, "Client")
      .def_static("connect", &PyClient::Connect, py::arg("address"),
                  py::arg("timeout") = 0.0, py::arg("request_id") = "")
      .def_property_readonly("world_size", &PyClient::world_size)
      .def_property_readonly("generation", &PyClient::generation)
      .def("health", &PyClient::Health)
      .def("stats", &PyClient::Stats)
      .def("create", &PyClient::Create)
      .def("list", &PyClient::List)
      .def("open", &PyClient::Open)
      .def("delete", &PyClient::Delete)
      .def("reshard", &PyClient::Reshard)
      .def("gather", &PyClient::Gather, py::arg("name"),
           py::arg("timeout") = 0.0)
      .def("save", &PyClient::Save)
      .def("load", &PyClient::Load);
}
