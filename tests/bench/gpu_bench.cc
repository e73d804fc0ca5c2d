// GPU benchmark: how fast bytes move between a CUDA shard and its readers,
// next to what the hardware gives. One JSON object per line:
//   {"bench":"gpu","op":"memcpy_d2h_pinned|memcpy_h2d_pinned|memcpy_d2d",
//    "bytes":N,"seconds":s,"gbps":x,"reps":R}
//        cudaMemcpyAsync timed with CUDA events, median of R reps;
//   {"bench":"gpu","op":"fetch_grpc|fetch_data_plane|fetch_local", ...}
//        FetchShardInto of a CUDA shard served by ANOTHER process (this
//        binary re-executed with --serve, a one-rank world holding one
//        shard per size on cuda:0) into a tensor on cuda:0, over the gRPC
//        stream, the raw data plane (twice: "lanes":1, one connection, and
//        striped across the client's default lanes), or the local path
//        (CUDA IPC, required: an error rather than a fallback), wall-clock
//        median;
//   {"bench":"gpu","op":"nccl_gather|nccl_allgather", ..., "d2d_gbps":y}
//        a one-rank NcclBackend Gather/AllGather of the same bytes, wall
//        clock, with a synchronous device-to-device copy of the same bytes
//        timed the same way for comparison.
// Without a CUDA device it prints {"bench":"gpu","skipped":"no CUDA device"}
// and exits 0. A step that fails prints {"bench":"gpu","op":...,"error":...}
// and makes the exit code 1, after the other steps ran.
//
//   plan_run: a read plan (client/read_plan.h) as a weight-sync reader
//        runs it: 4 real tessera-server daemons (--device cuda, sharing
//        this host's GPUs) hold a published version of a group of float32
//        tensors, row chunks over the 4; the plan reads the first column
//        half of every tensor (a tensor-parallel reader's slice: strided
//        boxes) into outs on cuda:0 and, like with like, into outs in host
//        memory, over the data plane and over the client's default choice
//        (the local path where it applies), median of R runs; one group
//        per piece size (--plan-piece-kib: the local path pays a CUDA IPC
//        open per piece, the data plane a share of its streams).
//
//   gpu_bench [--sizes-mib 64,256,1024] [--reps 5] [--plan-mib 512]
//             [--plan-piece-kib 256,1024,4096,16384] [--quick]
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "client/lanes.h"
#include "client/read_plan.h"
#include "client/remote_shard.h"
#include "client/shard_client.h"
#include "client/version_writer.h"
#include "common/device.h"
#include "common/sharding_spec.h"
#include "common/status_macros.h"
#include "common/tensor/cuda_util.h"
#include "common/tensor/tensor.h"
#include "io/subprocess.h"
#include "server/collective/process_group.h"
#include "server/rank/rank.h"
#include "server/sharded/sharded_tensor.h"
#include "server/store/hash_store.h"
#include "tests/bench/bench_util.h"
#include "tests/testing/daemon_cluster.h"

#if defined(TESSERA_WITH_CUDA) && TESSERA_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace tessera {
namespace {

using bench::Gbps;
using bench::JsonLine;
using bench::Median;
using bench::PrintJsonLine;
using bench::Seconds;

constexpr int kDevice = 0;
// Bounds every fetch and collective; a stuck peer fails a step, never
// hangs the bench.
constexpr absl::Duration kStepTimeout = absl::Minutes(2);
constexpr char kReady[] = "gpu_bench_serve_ready";

struct Config {
  std::vector<int64_t> sizes_mib = {64, 256, 1024};
  int reps = 5;
  bool quick = false;
  // plan_run: each group's bytes (a run reads half of them); 0 skips it.
  int64_t plan_mib = 512;
  // plan_run: one group per size of the pieces a run fetches (KiB).
  std::vector<int64_t> plan_piece_kib = {256, 1024, 4096, 16384};
  // --serve: how long the server process may live at most.
  int serve_seconds = 900;
};

JsonLine Line(absl::string_view op, int64_t bytes) {
  JsonLine line;
  line["bench"] = "gpu";
  line["op"] = std::string(op);
  line["bytes"] = bytes;
  return line;
}

// Prints a measurement: median seconds of `samples` for `bytes`.
void Report(absl::string_view op, int64_t bytes,
            const std::vector<double>& samples, JsonLine extra = {}) {
  JsonLine line = Line(op, bytes);
  const double seconds = Median(samples);
  line["seconds"] = seconds;
  line["gbps"] = Gbps(static_cast<double>(bytes), seconds);
  line["reps"] = samples.size();
  if (extra.is_object()) line.update(extra);
  PrintJsonLine(line);
}

// Prints a step that could not run; false so callers can fold it into
// the exit code.
bool ReportError(absl::string_view op, int64_t bytes,
                 const absl::Status& status) {
  JsonLine line = Line(op, bytes);
  line["error"] = status.ToString();
  PrintJsonLine(line);
  return false;
}

absl::StatusOr<Tensor> DeviceBytes(int64_t bytes) {
  return Tensor::Empty({bytes}, TensorOptions()
                                    .WithDType(DType::kUInt8)
                                    .WithDevice(Device::Cuda(kDevice)));
}

// ---- cudaMemcpy throughput, timed with CUDA events.

#if defined(TESSERA_WITH_CUDA) && TESSERA_WITH_CUDA
// A CUDA event that records timestamps (CudaEvent does not). Move-only.
class TimingEvent {
 public:
  static absl::StatusOr<TimingEvent> Create() {
    cudaEvent_t event = nullptr;
    RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&event), "cudaEventCreate"));
    return TimingEvent(event);
  }
  TimingEvent(TimingEvent&& other) noexcept
      : event_(std::exchange(other.event_, nullptr)) {}
  TimingEvent& operator=(TimingEvent&& other) noexcept {
    std::swap(event_, other.event_);
    return *this;
  }
  ~TimingEvent() {
    if (event_ != nullptr) cudaEventDestroy(event_);
  }
  cudaEvent_t get() const { return event_; }

 private:
  explicit TimingEvent(cudaEvent_t event) : event_(event) {}
  cudaEvent_t event_ = nullptr;
};

// Seconds of one copy of `bytes` on `stream`, between two events.
absl::StatusOr<double> TimeCopy(void* dst, const void* src, int64_t bytes,
                                const CudaStream& stream,
                                const TimingEvent& start,
                                const TimingEvent& stop) {
  auto native = static_cast<cudaStream_t>(stream.native());
  RETURN_IF_ERROR(
      CudaStatus(cudaEventRecord(start.get(), native), "cudaEventRecord"));
  RETURN_IF_ERROR(
      CudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), stream));
  RETURN_IF_ERROR(
      CudaStatus(cudaEventRecord(stop.get(), native), "cudaEventRecord"));
  RETURN_IF_ERROR(
      CudaStatus(cudaEventSynchronize(stop.get()), "cudaEventSynchronize"));
  float ms = 0;
  RETURN_IF_ERROR(CudaStatus(cudaEventElapsedTime(&ms, start.get(), stop.get()),
                             "cudaEventElapsedTime"));
  return ms / 1e3;
}

// One warm-up copy, then `reps` timed ones.
absl::StatusOr<std::vector<double>> TimeCopies(void* dst, const void* src,
                                               int64_t bytes, int reps) {
  ASSIGN_OR_RETURN(CudaStream stream, CudaStream::Create(kDevice));
  ASSIGN_OR_RETURN(TimingEvent start, TimingEvent::Create());
  ASSIGN_OR_RETURN(TimingEvent stop, TimingEvent::Create());
  RETURN_IF_ERROR(TimeCopy(dst, src, bytes, stream, start, stop).status());
  std::vector<double> samples;
  for (int i = 0; i < reps; ++i) {
    ASSIGN_OR_RETURN(double seconds,
                     TimeCopy(dst, src, bytes, stream, start, stop));
    samples.push_back(seconds);
  }
  return samples;
}
#endif  // TESSERA_WITH_CUDA

// memcpy_d2h_pinned, memcpy_h2d_pinned and memcpy_d2d for `bytes`.
bool MemcpyThroughput(int64_t bytes, int reps) {
#if defined(TESSERA_WITH_CUDA) && TESSERA_WITH_CUDA
  absl::StatusOr<Tensor> device = DeviceBytes(bytes);
  absl::StatusOr<Tensor> other = DeviceBytes(bytes);
  absl::StatusOr<Tensor> pinned = Tensor::Empty(
      {bytes}, TensorOptions().WithDType(DType::kUInt8).WithPinMemory(true));
  for (const absl::StatusOr<Tensor>* t : {&device, &other, &pinned}) {
    if (!t->ok()) return ReportError("memcpy", bytes, t->status());
  }
  bool ok = true;
  const struct {
    const char* op;
    void* dst;
    const void* src;
  } copies[] = {
      {"memcpy_d2h_pinned", pinned->data_ptr(), device->data_ptr()},
      {"memcpy_h2d_pinned", device->data_ptr(), pinned->data_ptr()},
      {"memcpy_d2d", other->data_ptr(), device->data_ptr()},
  };
  for (const auto& copy : copies) {
    absl::StatusOr<std::vector<double>> samples =
        TimeCopies(copy.dst, copy.src, bytes, reps);
    if (!samples.ok()) {
      ok = ReportError(copy.op, bytes, samples.status());
      continue;
    }
    Report(copy.op, bytes, *samples);
  }
  return ok;
#else
  return ReportError("memcpy", bytes,
                     absl::FailedPreconditionError("built without CUDA"));
#endif
}

// ---- NCCL with one rank against a device-to-device copy.

// Wall-clock seconds of `body` (which returns once its work is done):
// one warm-up, then `reps` timed calls.
template <typename Body>
absl::StatusOr<std::vector<double>> TimeWall(int reps, Body body) {
  RETURN_IF_ERROR(body());
  std::vector<double> samples;
  for (int i = 0; i < reps; ++i) {
    const absl::Time start = absl::Now();
    RETURN_IF_ERROR(body());
    samples.push_back(Seconds(absl::Now() - start));
  }
  return samples;
}

bool NcclThroughput(int64_t bytes, int reps) {
  ProcessGroupOptions options;
  options.store = std::make_shared<HashStore>();
  options.rank = 0;
  options.global_ranks = {0};
  options.name = "gpu_bench";
  options.timeout = kStepTimeout;
  options.device_index = kDevice;
  absl::StatusOr<std::shared_ptr<ProcessGroup>> group =
      CreateProcessGroup("nccl", options);
  if (!group.ok()) return ReportError("nccl", bytes, group.status());
  absl::StatusOr<Tensor> input = DeviceBytes(bytes);
  absl::StatusOr<Tensor> output = DeviceBytes(bytes);
  if (!input.ok()) return ReportError("nccl", bytes, input.status());
  if (!output.ok()) return ReportError("nccl", bytes, output.status());

  // The same bytes through one synchronous device-to-device copy.
  absl::StatusOr<CudaStream> stream = CudaStream::Create(kDevice);
  if (!stream.ok()) return ReportError("nccl", bytes, stream.status());
  absl::StatusOr<std::vector<double>> d2d = TimeWall(reps, [&] {
    RETURN_IF_ERROR(CudaMemcpyAsync(output->data_ptr(), input->data_ptr(),
                                    static_cast<size_t>(bytes), *stream));
    return stream->Synchronize();
  });
  if (!d2d.ok()) return ReportError("nccl", bytes, d2d.status());
  JsonLine compare;
  compare["d2d_gbps"] = Gbps(static_cast<double>(bytes), Median(*d2d));
  compare["ranks"] = 1;

  bool ok = true;
  std::vector<Tensor> outputs = {*output};
  absl::StatusOr<std::vector<double>> gather = TimeWall(
      reps, [&] { return (*group)->Gather(*input, outputs, /*root=*/0); });
  if (gather.ok()) {
    Report("nccl_gather", bytes, *gather, compare);
  } else {
    ok = ReportError("nccl_gather", bytes, gather.status());
  }
  absl::StatusOr<std::vector<double>> all_gather =
      TimeWall(reps, [&] { return (*group)->AllGather(*input, outputs); });
  if (all_gather.ok()) {
    Report("nccl_allgather", bytes, *all_gather, compare);
  } else {
    ok = ReportError("nccl_allgather", bytes, all_gather.status());
  }
  (*group)->Shutdown();
  return ok;
}

// ---- Fetches of a CUDA shard served by another process.

// What the --serve process publishes: its worker and one tensor per size.
struct Served {
  std::string address;
  std::string data_plane_address;
  std::string local_address;
  std::vector<std::pair<int64_t, std::string>> tensors;  // bytes, id
};

// (a) and (b): never the local path, whatever the client would
// pick.
FetchOptions SocketOptions(FetchOptions options) {
  options.local_path = LocalPath::kOff;
  return options;
}

// (c): the local path (CUDA IPC for a CUDA shard) or an error,
// never a silent fallback to a socket.
absl::StatusOr<std::pair<std::shared_ptr<ShardClient>, FetchOptions>>
SameHostClient(const Served& served, FetchOptions options) {
  if (served.local_address.empty()) {
    return absl::FailedPreconditionError(
        "the serving rank published no same-host address");
  }
  options.local_path = LocalPath::kRequired;
  return std::make_pair(
      ShardClient::Create(served.address, served.data_plane_address,
                          served.local_address),
      options);
}

// Every element of `tensor` (float32, any device) is `value`.
absl::Status CheckFilled(const Tensor& tensor, float value) {
  ASSIGN_OR_RETURN(Tensor host, tensor.To(Device::Cpu()));
  const float* data = host.data<float>();
  for (int64_t i = 0; i < host.numel(); ++i) {
    if (data[i] != value) {
      return absl::DataLossError(absl::StrCat("fetched element ", i, " is ",
                                              data[i], ", not ", value));
    }
  }
  return absl::OkStatus();
}

bool FetchThroughput(const Served& served, int reps) {
  FetchOptions options;
  options.timeout = kStepTimeout;
  bool ok = true;
  for (const auto& [bytes, id] : served.tensors) {
    // The shard's dtype and sizes (float32, 1-d), on this process's GPU.
    absl::StatusOr<Tensor> destination =
        Tensor::Empty({bytes / 4}, TensorOptions()
                                       .WithDType(DType::kFloat32)
                                       .WithDevice(Device::Cuda(kDevice)));
    absl::StatusOr<Tensor> zeros =
        Tensor::Zeros({bytes / 4}, TensorOptions()
                                       .WithDType(DType::kFloat32)
                                       .WithDevice(Device::Cuda(kDevice)));
    if (!destination.ok() || !zeros.ok()) {
      ok =
          ReportError("fetch", bytes,
                      destination.ok() ? zeros.status() : destination.status());
      continue;
    }
    JsonLine where;
    where["dest"] = destination->device().ToString();
    where["src"] = "cuda:0, another process";
    struct Path {
      const char* op;
      absl::StatusOr<std::pair<std::shared_ptr<ShardClient>, FetchOptions>>
          client;
      bool reports_lanes = false;  // The data plane: its lane count.
    };
    // The data plane twice: one connection (like with fetch_bench's one
    // TCP stream) and striped across the client's default lanes.
    FetchOptions one_lane = SocketOptions(options);
    one_lane.lanes = 1;
    const auto data_plane =
        ShardClient::Create(served.address, served.data_plane_address);
    Path paths[] = {
        {"fetch_grpc", std::make_pair(ShardClient::Create(served.address),
                                      SocketOptions(options))},
        {"fetch_data_plane", std::make_pair(data_plane, one_lane), true},
        {"fetch_data_plane", std::make_pair(data_plane, SocketOptions(options)),
         true},
        {"fetch_local", SameHostClient(served, options)},
    };
    for (const Path& path : paths) {
      if (!path.client.ok()) {
        ok = ReportError(path.op, bytes, path.client.status());
        continue;
      }
      const auto& [client, fetch_options] = *path.client;
      // Cleared first, so that the check after the runs sees this path's
      // bytes (the server's shards are full of 1.5).
      absl::StatusOr<std::vector<double>> samples =
          [&]() -> absl::StatusOr<std::vector<double>> {
        RETURN_IF_ERROR(CopyInto(*zeros, *destination));
        ASSIGN_OR_RETURN(std::vector<double> runs, TimeWall(reps, [&] {
                           return client->FetchShardInto(id, 0, *destination,
                                                         fetch_options);
                         }));
        RETURN_IF_ERROR(CheckFilled(*destination, 1.5f));
        return runs;
      }();
      if (!samples.ok()) {
        ok = ReportError(path.op, bytes, samples.status());
        continue;
      }
      JsonLine row = where;
      if (path.reports_lanes) {
        row["lanes"] = LaneCount(bytes, fetch_options.lanes);
      }
      Report(path.op, bytes, *samples, row);
    }
  }
  return ok;
}

// ---- A read plan into CUDA outs, from daemons that hold CUDA shards.

constexpr int kPlanWorld = 4;
// The plan's tensors are [rows, kPlanColumns] float32; a run reads the
// first column half of each, in one piece per daemon.
constexpr int64_t kPlanColumns = 1024;

// Rows chunked over the daemons, each shard on its daemon's GPU.
ShardingSpec PlanSpec() {
  std::vector<std::string> placements;
  for (int r = 0; r < kPlanWorld; ++r) {
    placements.push_back(
        absl::StrCat("rank:", r, "/cuda:", r % CudaDeviceCount()));
  }
  return *ChunkShardingSpec::Create(0, placements);
}

// Creates `tensors` tensors "<prefix><i>" of `rows` rows at 1.0, then
// publishes a version of them at 1.5 (what a run reads).
absl::Status MakePlanGroup(Client& client, const std::string& prefix,
                           int64_t tensors, int64_t rows) {
  std::vector<std::string> names;
  CreateOptions create;
  create.init = TensorInit::kOnes;
  create.versions = 2;
  for (int64_t i = 0; i < tensors; ++i) {
    names.push_back(absl::StrCat(prefix, i));
    RETURN_IF_ERROR(
        client.Create(names.back(), {rows, kPlanColumns}, PlanSpec(), create)
            .status());
  }
  ASSIGN_OR_RETURN(VersionWriter writer, client.Begin(names));
  ASSIGN_OR_RETURN(Tensor value, Tensor::Full({rows, kPlanColumns}, 1.5));
  for (const std::string& name : names) {
    ASSIGN_OR_RETURN(ShardedTensorView view, writer.view(name));
    RETURN_IF_ERROR(view.Write({0, 0}, value));
  }
  return writer.Publish().status();
}

// Median seconds of `reps` runs of a plan reading the first column half of
// every tensor of the group into outs on `device`, after one untimed run
// (connections, lanes, staging buffers); every out checked after.
absl::StatusOr<std::vector<double>> PlanRuns(const std::string& address,
                                             const ClientOptions& options,
                                             const Device& device,
                                             const std::string& prefix,
                                             int64_t tensors, int64_t rows,
                                             int reps) {
  ASSIGN_OR_RETURN(std::shared_ptr<Client> client,
                   Client::Connect(address, options));
  std::vector<Tensor> outs;
  std::vector<ReadItem> items;
  for (int64_t i = 0; i < tensors; ++i) {
    ASSIGN_OR_RETURN(Tensor out,
                     Tensor::Zeros({rows, kPlanColumns / 2},
                                   TensorOptions().WithDevice(device)));
    outs.push_back(out);
    items.push_back(ReadItem::Box(absl::StrCat(prefix, i), {0, 0}, out));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<ReadPlan> plan,
                   client->PlanReads(std::move(items)));
  RETURN_IF_ERROR(plan->Run().status());
  ASSIGN_OR_RETURN(std::vector<double> runs,
                   TimeWall(reps, [&] { return plan->Run().status(); }));
  for (const Tensor& out : outs) RETURN_IF_ERROR(CheckFilled(out, 1.5f));
  return runs;
}

bool PlanThroughput(const Config& config) {
  testing::DaemonClusterOptions cluster_options;
  cluster_options.world_size = kPlanWorld;
  cluster_options.server_path = TESSERA_SERVER_PATH;
  cluster_options.device = "cuda";
  absl::StatusOr<std::unique_ptr<testing::DaemonCluster>> cluster =
      testing::DaemonCluster::Start(cluster_options);
  if (!cluster.ok()) return ReportError("plan_run", 0, cluster.status());
  const std::string address = (*cluster)->address(0);
  absl::StatusOr<std::shared_ptr<Client>> setup = Client::Connect(address);
  if (!setup.ok()) return ReportError("plan_run", 0, setup.status());

  struct Transport {
    const char* name;
    ClientOptions options;
  };
  Transport transports[2];
  transports[0].name = "data plane";
  transports[0].options.use_local_path = false;
  transports[1].name = "default (local path where it applies)";
  bool ok = true;
  for (const int64_t piece_kib : config.plan_piece_kib) {
    // A piece: rows / 4 rows of kPlanColumns / 2 float32.
    const int64_t rows = std::max<int64_t>(
        kPlanWorld, piece_kib * 1024 * kPlanWorld / (kPlanColumns / 2 * 4));
    const int64_t tensor_bytes = rows * kPlanColumns * 4;
    const int64_t tensors =
        std::max<int64_t>(1, (config.plan_mib << 20) / tensor_bytes);
    const int64_t bytes = tensors * tensor_bytes / 2;  // What a run reads.
    const std::string prefix = absl::StrCat("w", piece_kib, "_");
    if (absl::Status made = MakePlanGroup(**setup, prefix, tensors, rows);
        !made.ok()) {
      ok = ReportError("plan_run", bytes, made);
      continue;
    }
    for (const Transport& transport : transports) {
      for (const Device& device : {Device::Cuda(kDevice), Device::Cpu()}) {
        absl::StatusOr<std::vector<double>> samples =
            PlanRuns(address, transport.options, device, prefix, tensors, rows,
                     config.reps);
        if (!samples.ok()) {
          ok = ReportError("plan_run", bytes, samples.status());
          continue;
        }
        Report("plan_run", bytes, *samples,
               JsonLine{{"transport", transport.name},
                        {"dest", device.ToString()},
                        {"src", "4 daemons, CUDA shards"},
                        {"tensors", tensors},
                        {"piece_bytes", bytes / tensors / kPlanWorld},
                        {"box", "first column half of each (strided)"}});
      }
    }
    for (int64_t i = 0; i < tensors; ++i) {
      (*setup)->Delete(absl::StrCat(prefix, i)).IgnoreError();
    }
  }
  return ok;
}

// The server side: a one-rank world (Gloo over an in-process store) whose
// shard server holds one CUDA shard per size, each full of 1.5. Prints
// the ready line with its addresses, then serves until SIGTERM/SIGINT, its
// parent's death, or serve_seconds.
int Serve(const Config& config) {
  // Before any thread starts, so that every thread inherits the mask and
  // sigtimedwait below receives the signals.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  const pid_t parent = getppid();

  auto fail = [](const absl::Status& status) {
    std::cerr << "gpu_bench --serve: " << status << std::endl;
    return 1;
  };
  RankOptions options;
  options.store = std::make_shared<HashStore>();
  options.device_index = kDevice;
  options.timeout = kStepTimeout;
  absl::StatusOr<std::shared_ptr<Rank>> rank = Rank::Init(options);
  if (!rank.ok()) return fail(rank.status());
  SetDefaultRank(*rank);
  if (absl::Status status = (*rank)->InitRpc(); !status.ok()) {
    return fail(status);
  }
  absl::StatusOr<WorkerInfo> worker = (*rank)->Worker(0);
  if (!worker.ok()) return fail(worker.status());
  absl::StatusOr<ChunkShardingSpec> spec = ChunkShardingSpec::Create(
      0, std::vector<std::string>{absl::StrCat("rank:0/cuda:", kDevice)});
  if (!spec.ok()) return fail(spec.status());

  JsonLine ready;
  ready["serve"] = kReady;
  ready["address"] = worker->address;
  ready["data_plane"] = worker->data_plane_address;
  ready["local"] = worker->local_address;
  ready["tensors"] = JsonLine::array();
  std::vector<ShardedTensor> held;
  for (int64_t mib : config.sizes_mib) {
    const int64_t bytes = mib << 20;
    absl::StatusOr<ShardedTensor> st =
        ShardedTensor::Full(ShardingSpec(*spec), {bytes / 4}, 1.5);
    if (!st.ok()) return fail(st.status());
    ready["tensors"].push_back({{"bytes", bytes}, {"id", st->tensor_id()}});
    held.push_back(*std::move(st));
  }
  PrintJsonLine(ready);

  const absl::Time end = absl::Now() + absl::Seconds(config.serve_seconds);
  while (absl::Now() < end && getppid() == parent) {
    timespec wait = {1, 0};
    if (sigtimedwait(&signals, nullptr, &wait) > 0) break;
  }
  held.clear();
  SetDefaultRank(nullptr);
  RankShutdownOptions shutdown;
  shutdown.barrier = false;  // A world of one.
  (*rank)->Shutdown(shutdown).IgnoreError();
  return 0;
}

// The --serve process (killed and reaped when this goes away) and what it
// serves.
struct ServerProcess {
  Subprocess process;
  Served served;
};

// Reads the ready line from `log`, if it is there yet.
std::optional<Served> ParseReady(const std::string& log) {
  for (absl::string_view text : absl::StrSplit(log, '\n')) {
    if (text.find(kReady) == absl::string_view::npos) continue;
    const JsonLine line = JsonLine::parse(text, nullptr, false);
    if (line.is_discarded() || !line.is_object()) return std::nullopt;
    Served served;
    served.address = line.value("address", "");
    served.data_plane_address = line.value("data_plane", "");
    served.local_address = line.value("local", "");
    if (line.contains("tensors") && line["tensors"].is_array()) {
      for (const JsonLine& tensor : line["tensors"]) {
        served.tensors.emplace_back(tensor.value("bytes", int64_t{0}),
                                    tensor.value("id", ""));
      }
    }
    return served;
  }
  return std::nullopt;
}

// Starts this binary with --serve and waits for its ready line.
absl::StatusOr<ServerProcess> StartServer(const Config& config) {
  char self[PATH_MAX];
  const ssize_t length = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (length <= 0) {
    return absl::InternalError(
        absl::StrCat("readlink /proc/self/exe: ", std::strerror(errno)));
  }
  SpawnOptions spawn;
  spawn.program = std::string(self, length);
  spawn.args = {"--serve", "--serve-seconds",
                absl::StrCat(config.serve_seconds), "--sizes-mib"};
  for (int64_t mib : config.sizes_mib) spawn.args.push_back(absl::StrCat(mib));
  spawn.log_path =
      absl::StrCat("/tmp/tessera_gpu_bench_serve_", getpid(), ".log");
  ASSIGN_OR_RETURN(Subprocess process, Subprocess::Spawn(std::move(spawn)));

  // Allocating and filling the largest shards takes a moment.
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  while (absl::Now() < deadline) {
    if (process.WaitFor(absl::Milliseconds(100)).has_value()) {
      return absl::UnavailableError(absl::StrCat(
          "the --serve process exited early:\n", process.LogTail()));
    }
    // A line still being written fails to parse: try again.
    if (std::optional<Served> served = ParseReady(process.LogTail(1 << 16))) {
      return ServerProcess{std::move(process), *std::move(served)};
    }
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "the --serve process was not ready in 120s:\n", process.LogTail()));
}

int Run(const Config& config) {
  if (CudaDeviceCount() == 0) {
    PrintJsonLine({{"bench", "gpu"}, {"skipped", "no CUDA device"}});
    return 0;
  }
  CudaDeviceGuard guard(kDevice);
  if (!guard.status().ok()) {
    ReportError("set_device", 0, guard.status());
    return 1;
  }
  bool ok = true;
  for (int64_t mib : config.sizes_mib) {
    ok &= MemcpyThroughput(mib << 20, config.reps);
    ok &= NcclThroughput(mib << 20, config.reps);
  }
  absl::StatusOr<ServerProcess> server = StartServer(config);
  if (!server.ok()) {
    ok = ReportError("fetch", 0, server.status());
  } else {
    ok &= FetchThroughput(server->served, config.reps);
    server->process.Signal(SIGTERM);
    if (!server->process.WaitFor(absl::Seconds(30)).has_value()) {
      server->process.Kill();
    }
    std::remove(server->process.log_path().c_str());
  }
  if (config.plan_mib > 0) ok &= PlanThroughput(config);
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  tessera::Config config;
  bool serve = false;
  CLI::App app{"GPU copy, fetch and NCCL benchmark (JSON lines on stdout)"};
  app.add_option("--sizes-mib", config.sizes_mib, "Sizes in MiB")
      ->delimiter(',');
  app.add_option("--reps", config.reps, "Timed repetitions per measurement")
      ->check(CLI::Range(1, 1000));
  app.add_option("--plan-mib", config.plan_mib,
                 "plan_run: the group's MiB (a run reads half); 0 skips it")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  app.add_option("--plan-piece-kib", config.plan_piece_kib,
                 "plan_run: KiB of each piece, one group per size")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_flag("--quick", config.quick, "8 MiB, 2 reps: a smoke run");
  app.add_flag("--serve", serve, "Internal: serve CUDA shards for the fetches");
  app.add_option("--serve-seconds", config.serve_seconds,
                 "Internal: the --serve process's longest life")
      ->check(CLI::Range(1, 86400));
  CLI11_PARSE(app, argc, argv);
  if (config.quick) {
    config.sizes_mib = {8};
    config.plan_mib = std::min<int64_t>(config.plan_mib, 16);
    config.plan_piece_kib = {256};
    config.reps = 2;
  }
  if (serve) return tessera::Serve(config);
  return tessera::Run(config);
}
