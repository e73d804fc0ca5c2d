// Same-host fetch benchmark: a shard owner in another process (this binary
// with --serve) holds one float32 CPU shard of --mib MiB in shared memory
// and serves it over the raw-TCP data plane and the local path; this
// process fetches it whole into one preallocated host tensor, --reps times
// per path, and prints one JSON line per path:
//   {"bench":"local_path",
//    "path":"data_plane|local|local_to_here|memcpy|memcpy_threads|
//            memcpy_fresh",
//    "mib":N,
//    "p50_ms":...,"best_ms":...,"gbps":...}   (gbps from the median)
// The data plane runs with LocalPath::kOff, the local path with kRequired
// (an error, never a silent fallback); local_to_here allocates its result
// (ShardClient::FetchShard), memcpy copies between two touched buffers
// of this process on one thread, memcpy_threads the same split between as
// many threads as the local path copies a shard of this size with (its
// like with like), and memcpy_fresh into a tensor allocated for each copy
// (the ceiling of a copy that allocates its result, as to_here does).
// --quick shrinks it for ctest.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/shard_client.h"
#include "common/status_macros.h"
#include "common/tensor/tensor.h"
#include "io/subprocess.h"
#include "server/serve/data_plane_server.h"
#include "server/serve/local_path_server.h"
#include "server/serve/shard_registry.h"

namespace tessera {
namespace {

constexpr char kTensorId[] = "bench";

volatile sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }

int64_t Elements(int64_t mib) { return mib * (int64_t{1} << 20) / 4; }

// The owner: one shard of `mib` MiB, 1.5 everywhere, in shared memory.
absl::Status Serve(int64_t mib, const std::string& address_file) {
  SetHostMemorySharing();
  ASSIGN_OR_RETURN(Tensor shard, Tensor::Full({Elements(mib)}, 1.5));
  if (shard.storage()->shared_memory_fd() < 0) {
    return absl::InternalError("the shard is not in shared memory");
  }
  auto registered = std::make_shared<RegisteredTensor>();
  auto metadata = std::make_shared<ShardedTensorMetadata>();
  metadata->tensor_properties.dtype = shard.dtype();
  metadata->size = shard.sizes();
  ASSIGN_OR_RETURN(
      ShardMetadata placement,
      ShardMetadata::Create({0}, shard.sizes(),
                            RemoteDevice::ForRank(0, Device::Cpu())));
  metadata->shards_metadata.push_back(placement);
  registered->metadata = std::move(metadata);
  registered->local_shards.push_back(LocalShard{0, shard});
  auto registry = std::make_shared<ShardRegistry>();
  RETURN_IF_ERROR(registry->Register(kTensorId, std::move(registered)));
  ASSIGN_OR_RETURN(auto local, LocalPathServer::Start(registry));
  ASSIGN_OR_RETURN(auto data_plane,
                   DataPlaneServer::Start("127.0.0.1", registry));
  {
    std::ofstream out(address_file + ".tmp");
    out << local->address() << "\n" << data_plane->address() << "\n";
  }
  std::filesystem::rename(address_file + ".tmp", address_file);
  const pid_t parent = getppid();
  const absl::Time end = absl::Now() + absl::Minutes(10);
  while (!g_stop && getppid() == parent && absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::OkStatus();
}

absl::Status Measure(int64_t mib, int reps) {
  char pattern[] = "/tmp/tessera_local_bench_XXXXXX";
  if (mkdtemp(pattern) == nullptr) return absl::InternalError("mkdtemp");
  const std::string dir = pattern;
  const std::string address_file = dir + "/addresses";
  SpawnOptions spawn;
  spawn.program = std::filesystem::read_symlink("/proc/self/exe").string();
  spawn.args = {"--serve", "--mib", absl::StrCat(mib), "--address-file",
                address_file};
  spawn.log_path = dir + "/owner.log";
  ASSIGN_OR_RETURN(Subprocess owner, Subprocess::Spawn(spawn));
  const absl::Time ready_by = absl::Now() + absl::Minutes(2);
  while (!std::filesystem::exists(address_file)) {
    if (owner.WaitFor(absl::ZeroDuration()).has_value() ||
        absl::Now() > ready_by) {
      return absl::UnavailableError("owner did not start: " + owner.LogTail());
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  std::string local_address, data_plane_address;
  {
    std::ifstream in(address_file);
    std::getline(in, local_address);
    std::getline(in, data_plane_address);
  }
  const auto client =
      ShardClient::Create("127.0.0.1:1", data_plane_address, local_address);
  ASSIGN_OR_RETURN(Tensor destination, Tensor::Empty({Elements(mib)}));
  // Times `body` (after one warm-up run) and prints its line.
  const auto measure = [&](const char* name,
                           const std::function<absl::Status()>& body) {
    std::vector<double> seconds;
    for (int rep = -1; rep < reps; ++rep) {  // rep -1 warms up.
      std::memset(destination.data_ptr(), 0, destination.nbytes());
      const absl::Time start = absl::Now();
      RETURN_IF_ERROR(body());
      if (rep >= 0) {
        seconds.push_back(absl::ToDoubleSeconds(absl::Now() - start));
      }
    }
    std::sort(seconds.begin(), seconds.end());
    const double median = seconds[seconds.size() / 2];
    std::cout << absl::StrFormat(
                     "{\"bench\":\"local_path\",\"path\":\"%s\",\"mib\":%d,"
                     "\"p50_ms\":%.2f,\"best_ms\":%.2f,\"gbps\":%.2f}",
                     name, mib, median * 1e3, seconds.front() * 1e3,
                     mib * double{1 << 20} / median / 1e9)
              << std::endl;
    return absl::OkStatus();
  };
  const auto check = [&](const Tensor& fetched) -> absl::Status {
    if (fetched.data<float>()[Elements(mib) - 1] != 1.5f) {
      return absl::DataLossError("fetched bytes differ");
    }
    return absl::OkStatus();
  };
  struct Path {
    const char* name;
    LocalPath local_path;
  };
  for (const Path& path : {Path{"data_plane", LocalPath::kOff},
                           Path{"local", LocalPath::kRequired}}) {
    FetchOptions options;
    options.local_path = path.local_path;
    options.timeout = absl::Minutes(2);
    RETURN_IF_ERROR(measure(path.name, [&]() -> absl::Status {
      RETURN_IF_ERROR(
          client->FetchShardInto(kTensorId, 0, destination, options));
      return check(destination);
    }));
  }
  // An allocating fetch (to_here) over the local path, and memcpy between
  // two buffers of this process, both already touched, on one thread.
  FetchOptions local;
  local.local_path = LocalPath::kRequired;
  local.timeout = absl::Minutes(2);
  RETURN_IF_ERROR(measure("local_to_here", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(Shard shard, client->FetchShard(kTensorId, 0, local));
    return check(shard.tensor);
  }));
  ASSIGN_OR_RETURN(Tensor source, Tensor::Full({Elements(mib)}, 1.5));
  RETURN_IF_ERROR(measure("memcpy", [&]() -> absl::Status {
    std::memcpy(destination.data_ptr(), source.data_ptr(), source.nbytes());
    return check(destination);
  }));
  // The same copy split as the local path splits a large one (pieces of at
  // least 8 MiB, up to 4 threads and no more than the cores): its like
  // with like.
  const int64_t total = static_cast<int64_t>(source.nbytes());
  const int64_t threads = std::clamp<int64_t>(
      total / (int64_t{8} << 20), 1,
      std::min<int64_t>(4, std::max(1u, std::thread::hardware_concurrency())));
  RETURN_IF_ERROR(measure("memcpy_threads", [&]() -> absl::Status {
    const int64_t piece = (total + threads - 1) / threads;
    std::vector<std::thread> copies;
    for (int64_t k = 0; k < threads; ++k) {
      copies.emplace_back([&, k] {
        const int64_t begin = k * piece;
        const int64_t length = std::min(piece, total - begin);
        if (length <= 0) return;
        std::memcpy(static_cast<char*>(destination.data_ptr()) + begin,
                    static_cast<const char*>(source.data_ptr()) + begin,
                    static_cast<size_t>(length));
      });
    }
    for (std::thread& copy : copies) copy.join();
    return check(destination);
  }));
  // The ceiling of any allocating copy, to_here's like with like: a tensor
  // allocated as to_here allocates its result, then memcpy into it.
  RETURN_IF_ERROR(measure("memcpy_fresh", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(Tensor fresh, Tensor::Empty({Elements(mib)}));
    std::memcpy(fresh.data_ptr(), source.data_ptr(), source.nbytes());
    return check(fresh);
  }));
  owner.Signal(SIGTERM);
  owner.WaitFor(absl::Seconds(10));
  std::filesystem::remove_all(dir);
  return absl::OkStatus();
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  CLI::App app("Same-host shard fetch: data plane vs local path");
  bool serve = false, quick = false;
  int64_t mib = 256;
  int reps = 10;
  std::string address_file;
  app.add_flag("--serve", serve, "run as the shard owner");
  app.add_flag("--quick", quick, "small run for ctest");
  app.add_option("--mib", mib, "shard size in MiB")
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--reps", reps, "fetches per path")
      ->check(CLI::Range(1, 1000));
  app.add_option("--address-file", address_file, "(--serve) where to write");
  CLI11_PARSE(app, argc, argv);
  absl::Status status;
  if (serve) {
    signal(SIGTERM, tessera::OnSignal);
    status = tessera::Serve(mib, address_file);
  } else {
    if (quick) {
      mib = 4;
      reps = 3;
    }
    status = tessera::Measure(mib, reps);
  }
  if (!status.ok()) {
    std::cerr << "local_path_bench: " << status << std::endl;
    return 1;
  }
  return 0;
}
