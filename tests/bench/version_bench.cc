// Versions (docs/versions.md) against 4 real daemons on this host, through
// the client library; one JSON object per line:
//
//  - version_publish: publish latency of a group of 1, 100 and 1,000
//    tensors, and of one tensor of many shards, next to the same for a
//    tensor 4,096 times larger: publishing copies no data, so its time does
//    not grow with the bytes (bytes_per_tensor in each line).
//  - version_begin: begin of a 256 MiB tensor, copying the latest version
//    and with empty=true (nothing copied).
//  - version_read / version_read_latency: whole-tensor reads (GB/s) and
//    4 KiB reads (p50, p99) of a versioned tensor next to an unversioned
//    one of the same layout, over the same transport (each line says
//    which), with the ratio versioned / unversioned.
#include <algorithm>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "client/version_writer.h"
#include "common/sharding_spec.h"
#include "common/status_macros.h"
#include "common/tensor/tensor.h"
#include "tests/bench/bench_util.h"
#include "tests/testing/daemon_cluster.h"

namespace tessera {
namespace {

using bench::Gbps;
using bench::JsonLine;
using bench::Median;
using bench::Percentile;
using bench::PrintJsonLine;
using bench::Seconds;

constexpr int kWorld = 4;

struct Config {
  std::string server = TESSERA_SERVER_PATH;
  std::vector<int> groups = {1, 100, 1000};
  int64_t many_shards = 100000;
  int64_t begin_mib = 256;
  int64_t read_mib = 64;
  int reps = 5;
  int latency_iterations = 2000;
};

// `shards` row chunks over the 4 daemons, round robin.
ShardingSpec Chunks(int64_t shards) {
  std::vector<std::string> placements;
  placements.reserve(static_cast<size_t>(shards));
  for (int64_t i = 0; i < shards; ++i) {
    placements.push_back(absl::StrCat("rank:", i % kWorld, "/cpu"));
  }
  return *ChunkShardingSpec::Create(0, placements);
}

absl::StatusOr<ShardedTensorView> Make(Client& client, const std::string& name,
                                       std::vector<int64_t> sizes,
                                       int64_t shards, int versions) {
  CreateOptions options;
  options.init = TensorInit::kOnes;
  options.versions = versions;
  return client.Create(name, std::move(sizes), Chunks(shards), options);
}

// Median seconds of `reps` publishes of a group of `names` (begun empty
// just before, not timed).
absl::StatusOr<double> PublishSeconds(Client& client,
                                      const std::vector<std::string>& names,
                                      int reps) {
  std::vector<double> seconds;
  BeginOptions empty;
  empty.empty = true;
  for (int rep = 0; rep < reps; ++rep) {
    ASSIGN_OR_RETURN(VersionWriter writer, client.Begin(names, empty));
    const absl::Time start = absl::Now();
    RETURN_IF_ERROR(writer.Publish().status());
    seconds.push_back(Seconds(absl::Now() - start));
  }
  return Median(seconds);
}

absl::Status MeasurePublish(Client& client, const Config& config) {
  // Groups of small tensors (4 x 256 float32: 4 KiB each) and, for the
  // single tensor, one 4,096 times larger (16 MiB).
  for (const int group : config.groups) {
    for (const int64_t rows : {int64_t{4}, int64_t{4} * 4096}) {
      if (group > 1 && rows > 4) continue;
      std::vector<std::string> names;
      for (int i = 0; i < group; ++i) {
        names.push_back(absl::StrCat("pub_", group, "_", rows, "_", i));
        RETURN_IF_ERROR(
            Make(client, names.back(), {rows, 256}, kWorld, 2).status());
      }
      ASSIGN_OR_RETURN(const double seconds,
                       PublishSeconds(client, names, config.reps));
      PrintJsonLine(JsonLine{{"bench", "version_publish"},
                             {"tensors", group},
                             {"shards_per_tensor", kWorld},
                             {"bytes_per_tensor", rows * 256 * 4},
                             {"p50_ms", seconds * 1e3}});
      for (const std::string& name : names) {
        RETURN_IF_ERROR(client.Delete(name));
      }
    }
  }
  // One tensor of many shards (one row of 16 float32 each).
  if (config.many_shards > 0) {
    const absl::Time start = absl::Now();
    RETURN_IF_ERROR(Make(client, "pub_shards", {config.many_shards, 16},
                         config.many_shards, 2)
                        .status());
    const double create = Seconds(absl::Now() - start);
    ASSIGN_OR_RETURN(const double seconds,
                     PublishSeconds(client, {"pub_shards"}, config.reps));
    PrintJsonLine(JsonLine{{"bench", "version_publish"},
                           {"tensors", 1},
                           {"shards_per_tensor", config.many_shards},
                           {"bytes_per_tensor", config.many_shards * 16 * 4},
                           {"create_s", create},
                           {"p50_ms", seconds * 1e3}});
    RETURN_IF_ERROR(client.Delete("pub_shards"));
  }
  return absl::OkStatus();
}

absl::Status MeasureBegin(Client& client, const Config& config) {
  const int64_t rows = config.begin_mib * 1024;  // 1 KiB per row
  RETURN_IF_ERROR(Make(client, "begin", {rows, 256}, kWorld, 2).status());
  for (const bool empty : {false, true}) {
    std::vector<double> seconds;
    for (int rep = 0; rep < config.reps; ++rep) {
      BeginOptions options;
      options.empty = empty;
      const absl::Time start = absl::Now();
      ASSIGN_OR_RETURN(VersionWriter writer, client.Begin({"begin"}, options));
      seconds.push_back(Seconds(absl::Now() - start));
      RETURN_IF_ERROR(writer.Abort());
    }
    const double median = Median(seconds);
    PrintJsonLine(JsonLine{
        {"bench", "version_begin"},
        {"mib", config.begin_mib},
        {"empty", empty},
        {"p50_ms", median * 1e3},
        {"copy_gbps",
         empty ? 0.0 : Gbps(static_cast<double>(rows * 1024), median)}});
  }
  return client.Delete("begin");
}

struct Transport {
  const char* name;
  ClientOptions options;
};

std::vector<Transport> Transports() {
  std::vector<Transport> transports(3);
  transports[0].name = "local path";
  transports[0].options.local_min_bytes = 0;
  transports[1].name = "data plane";
  transports[1].options.use_local_path = false;
  transports[2].name = "grpc";
  transports[2].options.use_local_path = false;
  transports[2].options.data_plane = false;
  return transports;
}

absl::Status MeasureReads(const std::string& address, const Config& config) {
  ASSIGN_OR_RETURN(std::shared_ptr<Client> setup, Client::Connect(address));
  const int64_t rows = config.read_mib * 1024;
  RETURN_IF_ERROR(Make(*setup, "plain", {rows, 256}, kWorld, 0).status());
  RETURN_IF_ERROR(Make(*setup, "versioned", {rows, 256}, kWorld, 2).status());
  {
    // The versioned one at version 2, so that reads resolve a publish.
    ASSIGN_OR_RETURN(VersionWriter writer, setup->Begin({"versioned"}));
    RETURN_IF_ERROR(writer.Publish().status());
  }
  ASSIGN_OR_RETURN(Tensor whole, Tensor::Empty({rows, 256}));
  ASSIGN_OR_RETURN(Tensor small, Tensor::Empty({4, 256}));
  for (const Transport& transport : Transports()) {
    ASSIGN_OR_RETURN(std::shared_ptr<Client> client,
                     Client::Connect(address, transport.options));
    // Interleaved (plain, versioned, plain, ...), so that neither gets the
    // quieter moments of this shared machine.
    std::vector<ShardedTensorView> views;
    for (const char* name : {"plain", "versioned"}) {
      ASSIGN_OR_RETURN(ShardedTensorView view, client->Open(name));
      views.push_back(view);
    }
    std::vector<double> seconds[2];
    for (int rep = -1; rep < config.reps; ++rep) {
      for (int kind = 0; kind < 2; ++kind) {
        const absl::Time start = absl::Now();
        RETURN_IF_ERROR(views[kind].ReadRegionInto({0, 0}, whole));
        if (rep >= 0) seconds[kind].push_back(Seconds(absl::Now() - start));
      }
    }
    std::vector<double> micros[2];
    for (int i = -1; i < config.latency_iterations; ++i) {
      const int64_t row = (int64_t{37} * (i + 1)) % (rows / kWorld - 4);
      for (int kind = 0; kind < 2; ++kind) {
        const absl::Time start = absl::Now();
        RETURN_IF_ERROR(views[kind].ReadRegionInto({row, 0}, small));
        if (i >= 0) {
          micros[kind].push_back(
              absl::ToDoubleMicroseconds(absl::Now() - start));
        }
      }
    }
    double gbps[2];
    double p50[2];
    double p99[2];
    for (int kind = 0; kind < 2; ++kind) {
      gbps[kind] =
          Gbps(static_cast<double>(whole.nbytes()), Median(seconds[kind]));
      p50[kind] = Percentile(micros[kind], 0.5);
      p99[kind] = Percentile(micros[kind], 0.99);
    }
    PrintJsonLine(JsonLine{{"bench", "version_read"},
                           {"transport", transport.name},
                           {"mib", config.read_mib},
                           {"unversioned_gbps", gbps[0]},
                           {"versioned_gbps", gbps[1]},
                           {"ratio", gbps[1] / gbps[0]}});
    PrintJsonLine(JsonLine{{"bench", "version_read_latency"},
                           {"transport", transport.name},
                           {"bytes", 4096},
                           {"unversioned_p50_us", p50[0]},
                           {"versioned_p50_us", p50[1]},
                           {"unversioned_p99_us", p99[0]},
                           {"versioned_p99_us", p99[1]},
                           {"p50_ratio", p50[0] / p50[1]}});
  }
  RETURN_IF_ERROR(setup->Delete("plain"));
  return setup->Delete("versioned");
}

absl::Status Run(const Config& config) {
  testing::DaemonClusterOptions options =
      testing::QuietClusterOptions(kWorld, config.server);
  options.extra_args = {"--timeout", "60", "--log-level", "warn"};
  ASSIGN_OR_RETURN(std::unique_ptr<testing::DaemonCluster> cluster,
                   testing::DaemonCluster::Start(options));
  const std::string address = cluster->address(0);
  ASSIGN_OR_RETURN(std::shared_ptr<Client> client, Client::Connect(address));
  RETURN_IF_ERROR(MeasurePublish(*client, config));
  RETURN_IF_ERROR(MeasureBegin(*client, config));
  return MeasureReads(address, config);
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  CLI::App app(
      "Versions against 4 real daemons on this host: publish latency by "
      "group size and shard count, begin with and without its copy, reads "
      "of a versioned tensor next to an unversioned one per transport");
  tessera::Config config;
  bool quick = false;
  app.add_flag("--quick", quick, "small run for ctest");
  app.add_option("--server", config.server, "the tessera-server executable")
      ->capture_default_str();
  app.add_option("--groups", config.groups, "tensors per published group")
      ->capture_default_str();
  app.add_option("--many-shards", config.many_shards,
                 "shards of the one-tensor publish (0: skip)")
      ->capture_default_str();
  app.add_option("--begin-mib", config.begin_mib, "size of the begin tensor")
      ->capture_default_str();
  app.add_option("--read-mib", config.read_mib, "size of the read tensors")
      ->capture_default_str();
  app.add_option("--reps", config.reps, "repetitions of each measurement")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (quick) {
    config.groups = {1, 10};
    config.many_shards = 1000;
    config.begin_mib = 4;
    config.read_mib = 4;
    config.reps = 2;
    config.latency_iterations = 50;
  }
  const absl::Status status = tessera::Run(config);
  if (!status.ok()) {
    std::cerr << "version_bench: " << status << std::endl;
    return 1;
  }
  return 0;
}
