// tessera._tessera.Client: a connection to a cluster (client/client.h
// Client) for the package's tessera.Client. Every call releases the GIL
// while it waits on the daemons and has the client's deadline (connect's
// `timeout`), so a dead daemon is an exception within it, never a hang;
// failures raise tessera.errors with the daemons' codes. Tensors come back
// as Views (tensor.h).
//
// Thread-safety: one Client may serve several Python threads at once (the
// C++ client is thread-safe and the GIL is released while it works).
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "client/lanes.h"
#include "common/proto_convert.h"
#include "python/bindings/module.h"
#include "python/bindings/read_plan.h"
#include "python/bindings/specs.h"
#include "python/bindings/support.h"
#include "python/bindings/tensor.h"
#include "python/bindings/versions.h"
#include "wire/request_id.h"

namespace tessera::python {
namespace {

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

std::vector<PyView> Views(std::vector<ShardedTensorView> views) {
  std::vector<PyView> out;
  for (ShardedTensorView& view : views) out.emplace_back(std::move(view));
  return out;
}

class PyClient {
 public:
  static std::shared_ptr<PyClient> Connect(const std::string& address,
                                           double timeout,
                                           const std::string& request_id,
                                           int data_lanes, bool local_path) {
    ClientOptions options;
    if (timeout > 0) options.timeout = absl::Seconds(timeout);
    if (data_lanes < 0 || data_lanes > kMaxDataLanes) {
      Check(absl::InvalidArgumentError(
          absl::StrCat("data_lanes must be 0 (the default) to ", kMaxDataLanes,
                       ", not ", data_lanes)));
    }
    options.data_lanes = data_lanes;
    options.use_local_path = local_path;
    if (!request_id.empty() && (!IsValidRequestId(request_id) ||
                                request_id.size() > kMaxClientRequestIdBytes)) {
      Check(absl::InvalidArgumentError(absl::StrCat(
          "request_id ", QuotedRequestId(request_id), " is not 1 to ",
          kMaxClientRequestIdBytes, " of A-Z a-z 0-9 . _ : -")));
    }
    options.request_id = request_id;
    absl::StatusOr<std::shared_ptr<Client>> client =
        WithoutGil([&] { return Client::Connect(address, options); });
    return std::make_shared<PyClient>(Check(std::move(client)));
  }
  explicit PyClient(std::shared_ptr<Client> client)
      : client_(std::move(client)) {}

  int world_size() const { return client_->world_size(); }
  int64_t generation() const { return client_->cluster().generation(); }

  // Each daemon's device ("cpu", "cuda:0"), in rank order, as it reported
  // it when this client connected.
  std::vector<std::string> devices() const {
    std::vector<std::string> out;
    for (const v1::WorkerAddress& worker : client_->cluster().workers()) {
      out.push_back(worker.device());
    }
    return out;
  }

  std::vector<std::tuple<std::string, int, bool>> Health() const {
    const std::vector<absl::Status> health =
        WithoutGil([&] { return client_->Health(); });
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
    const std::vector<absl::StatusOr<v1::DaemonStats>> stats =
        WithoutGil([&] { return client_->Stats(); });
    std::vector<std::tuple<int, std::string, std::string>> out;
    for (size_t r = 0; r < stats.size(); ++r) {
      out.emplace_back(static_cast<int>(r),
                       stats[r].ok() ? stats[r]->metrics() : "",
                       stats[r].ok() ? "" : stats[r].status().ToString());
    }
    return out;
  }

  // Create's options from Python's arguments (unknown names raise).
  static CreateOptions OptionsOf(const std::string& dtype,
                                 const std::string& init, double fill_value,
                                 uint64_t seed, int copies, int versions) {
    CreateOptions options;
    options.dtype = DTypeFromName(dtype);
    options.init = InitFromName(init);
    options.fill_value = fill_value;
    options.seed = seed;
    options.copies = copies;
    options.versions = versions;
    return options;
  }

  // (name, sizes, spec, dtype, init, fill_value, seed, copies, versions).
  using PyCreate =
      std::tuple<std::string, std::vector<int64_t>, PySpec, std::string,
                 std::string, double, uint64_t, int, int>;
  std::vector<PyView> CreateMany(const std::vector<PyCreate>& tensors) {
    std::vector<TensorToCreate> requests;
    requests.reserve(tensors.size());
    for (const auto& [name, sizes, spec, dtype, init, fill_value, seed, copies,
                      versions] : tensors) {
      requests.push_back(
          {name, sizes, spec.spec,
           OptionsOf(dtype, init, fill_value, seed, copies, versions)});
    }
    const std::vector<ShardedTensorView> views =
        Check(WithoutGil([&] { return client_->CreateMany(requests); }));
    std::vector<PyView> out;
    out.reserve(views.size());
    for (const ShardedTensorView& view : views) out.emplace_back(view);
    return out;
  }

  PyView Create(const std::string& name, const std::vector<int64_t>& sizes,
                const PySpec& spec, const std::string& dtype,
                const std::string& init, double fill_value, uint64_t seed,
                int copies, int versions) {
    const CreateOptions options =
        OptionsOf(dtype, init, fill_value, seed, copies, versions);
    return PyView(Check(WithoutGil(
        [&] { return client_->Create(name, sizes, spec.spec, options); })));
  }

  std::vector<PyView> List() const {
    return Views(Check(WithoutGil([&] { return client_->List(); })));
  }

  PyView Open(const std::string& name) const {
    return PyView(Check(WithoutGil([&] { return client_->Open(name); })));
  }

  // (state, method, tensor, log entry, code, message) of a request id;
  // state is "committed", "failed", "pending" or "unknown".
  std::tuple<std::string, std::string, std::string, int64_t, int, std::string>
  Operation(const std::string& request_id) const {
    const v1::OperationStatus status =
        Check(WithoutGil([&] { return client_->Operation(request_id); }));
    return {std::string(OperationStateName(status.state())),
            status.method(),
            status.tensor(),
            status.log_entry(),
            status.code(),
            status.message()};
  }

  // Versions (docs/versions.md).
  // A zero lease: renewed while the group lives (BeginOptions::lease).
  PyVersionGroup Begin(const std::vector<std::string>& names, bool empty,
                       double lease, bool skip_zeroing, bool renew) {
    BeginOptions options;
    options.empty = empty;
    options.skip_zeroing = skip_zeroing;
    if (lease > 0) options.lease = absl::Seconds(lease);
    options.renew = renew;
    return PyVersionGroup(
        Check(WithoutGil([&] { return client_->Begin(names, options); })));
  }

  PyVersionGroup Join(const std::string& id) {
    return PyVersionGroup(Check(WithoutGil([&] { return client_->Join(id); })));
  }

  PyReadPlan PlanReads(const std::vector<PyItem>& items) const {
    return PyReadPlan(client_, items);
  }

  PySnapshot Pin(const std::vector<std::string>& names, double lease,
                 const std::vector<int64_t>& numbers, bool renew) {
    const absl::Duration duration =
        lease > 0 ? absl::Seconds(lease) : absl::ZeroDuration();
    return PySnapshot(Check(WithoutGil(
        [&] { return client_->Pin(names, duration, numbers, renew); })));
  }

  PyWatcher Watch(const std::string& name, int64_t after) const {
    return PyWatcher(
        Check(WithoutGil([&] { return client_->Watch(name, after); })));
  }

  void DeleteMany(const std::vector<std::string>& names) {
    Check(WithoutGil([&] { return client_->DeleteMany(names); }));
  }
  void Delete(const std::string& name) {
    Check(WithoutGil([&] { return client_->Delete(name); }));
  }

  PyView Reshard(const std::string& name, const PySpec& spec) {
    return PyView(
        Check(WithoutGil([&] { return client_->Reshard(name, spec.spec); })));
  }

  py::array Gather(const std::string& name, double timeout) const {
    return ToNumpy(Check(
        WithoutGil([&] { return client_->Gather(name, Transfer(timeout)); })));
  }

  std::vector<std::string> Save(
      const std::string& path, const std::vector<std::string>& names,
      bool overwrite, const std::map<std::string, int64_t>& versions) {
    return Check(WithoutGil(
        [&] { return client_->Save(path, names, overwrite, versions); }));
  }

  std::vector<PyView> Load(const std::string& path,
                           const std::vector<std::string>& names,
                           const std::vector<std::string>& as_names,
                           std::optional<PySpec> spec, bool replace,
                           int versions) {
    v1::LoadCheckpointRequest request;
    request.set_versions(versions);
    request.set_path(path);
    for (const std::string& name : names) request.add_names(name);
    for (const std::string& name : as_names) request.add_as_names(name);
    if (spec.has_value()) *request.mutable_spec() = ToProto(spec->spec);
    request.set_replace(replace);
    return Views(Check(WithoutGil([&] { return client_->Load(request); })));
  }

 private:
  std::shared_ptr<Client> client_;
};

}  // namespace

void BindClient(py::module_& m) {
  py::class_<PyClient, std::shared_ptr<PyClient>>(m, "Client")
      .def_static("connect", &PyClient::Connect, py::arg("address"),
                  py::arg("timeout") = 0.0, py::arg("request_id") = "",
                  py::arg("data_lanes") = 0, py::arg("local_path") = true)
      .def_property_readonly("world_size", &PyClient::world_size)
      .def_property_readonly("generation", &PyClient::generation)
      .def_property_readonly("devices", &PyClient::devices)
      .def("health", &PyClient::Health)
      .def("stats", &PyClient::Stats)
      .def("create", &PyClient::Create)
      .def("list", &PyClient::List)
      .def("open", &PyClient::Open)
      .def("delete", &PyClient::Delete)
      .def("delete_many", &PyClient::DeleteMany)
      .def("begin", &PyClient::Begin, py::arg("names"),
           py::arg("empty") = false, py::arg("lease") = 0.0,
           py::arg("skip_zeroing") = false, py::arg("renew") = false)
      .def("join", &PyClient::Join, py::arg("id"))
      .def("watch", &PyClient::Watch, py::arg("name"), py::arg("after") = 0)
      .def("plan_reads", &PyClient::PlanReads, py::arg("items"))
      .def("create_many", &PyClient::CreateMany, py::arg("tensors"))
      .def("pin", &PyClient::Pin, py::arg("names"), py::arg("lease") = 0.0,
           py::arg("numbers") = std::vector<int64_t>(),
           py::arg("renew") = false)
      .def("operation", &PyClient::Operation)
      .def("reshard", &PyClient::Reshard)
      .def("gather", &PyClient::Gather, py::arg("name"),
           py::arg("timeout") = 0.0)
      .def("save", &PyClient::Save)
      .def("load", &PyClient::Load);
}

}  // namespace tessera::python
