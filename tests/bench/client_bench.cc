// The service end to end, as a user's process sees it: 4 real
// tessera-server daemons on this host (tests/testing/daemon_cluster.h) and
// the client library in this process. JSON lines:
//   {"bench":"client_read", "transport":T, "mib":N, ...}   whole tensor
//       read into a preallocated host tensor, every owner at once; T is
//       "local" (same-host path, whatever the size), "data_plane" or "grpc"
//   {"bench":"client_write", "mib":N, "replicas":R, ...}   whole tensor
//   {"bench":"client_region_latency", "transport":T, "bytes":B, "p50_us",
//       "p99_us"}  a box of 4 KiB, 64 KiB or 1 MiB inside one shard
//   {"bench":"client_region_write_latency", ...}  the same boxes written
//   {"bench":"client_open_latency", "p50_us", "p99_us"}    Open (metadata)
// Every line says "security": "plaintext", or "mtls+tokens" with --secure
// (daemons as `tessera launch --secure` starts them: gRPC and the data
// plane over TLS, a token on every call and connection).
// Every read is checked against the bytes written first.
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/algorithm/container.h"
#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cli/launch/secure_setup.h"
#include "client/client.h"
#include "common/sharding_spec.h"
#include "common/status_macros.h"
#include "common/tensor/tensor.h"
#include "io/file.h"
#include "tests/bench/bench_util.h"
#include "tests/testing/daemon_cluster.h"
#include "wire/auth.h"
#include "wire/credentials.h"

namespace tessera {
namespace {

using bench::Gbps;
using bench::JsonLine;
using bench::Median;
using bench::Percentile;
using bench::PrintJsonLine;
using bench::Seconds;

struct Config {
  std::string server = TESSERA_SERVER_PATH;
  // Mutual TLS and tokens (cli::MakeSecureSetup), as `launch --secure`.
  bool secure = false;
  std::vector<int64_t> mib = {64, 256};
  int reps = 5;
  int latency_iterations = 2000;  // 0: no latency lines
  // Rows (4 KiB each) of the latency lines' boxes: 4 KiB, 64 KiB, 1 MiB.
  std::vector<int64_t> latency_rows = {1, 16, 256};
  // Transports measured (kTransports' names); empty: all of them.
  std::vector<std::string> transports;
  // Copies of each shard for the write measurement (CreateOptions.copies)
  // besides the plain one; e.g. {2}: also a tensor with two copies.
  std::vector<int> replicas;
};

struct Transport {
  const char* name;
  bool data_plane;
  bool use_local_path;
};
constexpr Transport kTransports[] = {
    {"local", true, true}, {"data_plane", true, false}, {"grpc", false, false}};

// What the cluster runs with, on every line.
const char* Security(const Config& config) {
  return config.secure ? "mtls+tokens" : "plaintext";
}

// Every transport is served either way (with TLS, the data plane is TLS).
std::vector<Transport> TransportsFor(const Config& config) {
  std::vector<Transport> chosen;
  for (const Transport& transport : kTransports) {
    if (config.transports.empty() ||
        absl::c_linear_search(config.transports, transport.name)) {
      chosen.push_back(transport);
    }
  }
  return chosen;
}

constexpr int64_t kColumns = 1024;  // float32: 4 KiB rows

absl::StatusOr<std::shared_ptr<Client>> ConnectWith(
    const std::string& address, const Transport& transport) {
  ClientOptions options;
  options.data_plane = transport.data_plane;
  options.use_local_path = transport.use_local_path;
  // "local" means the local path for every size, small boxes included.
  if (transport.use_local_path) options.local_min_bytes = 0;
  return Client::Connect(address, options);
}

// A float32 [rows, 1024] tensor cut by rows over every rank, written from
// a host tensor of distinct values (returned, to check reads against).
absl::StatusOr<Tensor> CreateAndWrite(Client& client, const std::string& name,
                                      int64_t mib, const Config& config,
                                      int replicas = 1) {
  std::vector<std::string> placements;
  for (int rank = 0; rank < client.world_size(); ++rank) {
    placements.push_back(absl::StrCat("rank:", rank, "/cpu"));
  }
  ASSIGN_OR_RETURN(ChunkShardingSpec spec,
                   ChunkShardingSpec::Create(0, placements));
  const int64_t rows = mib * (int64_t{1} << 20) / (kColumns * 4);
  CreateOptions create;
  create.copies = replicas;
  ASSIGN_OR_RETURN(ShardedTensorView view,
                   client.Create(name, {rows, kColumns}, spec, create));
  ASSIGN_OR_RETURN(Tensor data, Tensor::Empty({rows, kColumns}));
  float* values = data.data<float>();
  for (int64_t i = 0; i < data.numel(); ++i) {
    values[i] = static_cast<float>(i % 1000003);
  }
  std::vector<double> seconds;
  for (int rep = 0; rep < 3; ++rep) {
    const absl::Time start = absl::Now();
    RETURN_IF_ERROR(view.Write({0, 0}, data));
    seconds.push_back(Seconds(absl::Now() - start));
  }
  const double median = Median(seconds);
  PrintJsonLine(
      JsonLine{{"bench", "client_write"},
               {"security", Security(config)},
               {"mib", mib},
               {"replicas", replicas},
               {"p50_ms", median * 1e3},
               {"gbps", Gbps(static_cast<double>(data.nbytes()), median)}});
  return data;
}

absl::Status MeasureReads(const std::string& address, const std::string& name,
                          const Tensor& expected, int64_t mib,
                          const Config& config) {
  for (const Transport& transport : TransportsFor(config)) {
    ASSIGN_OR_RETURN(std::shared_ptr<Client> client,
                     ConnectWith(address, transport));
    ASSIGN_OR_RETURN(ShardedTensorView view, client->Open(name));
    ASSIGN_OR_RETURN(Tensor destination, Tensor::Empty(expected.sizes()));
    std::vector<double> seconds;
    for (int rep = -1; rep < config.reps; ++rep) {  // rep -1 warms up.
      std::memset(destination.data_ptr(), 0, destination.nbytes());
      const absl::Time start = absl::Now();
      RETURN_IF_ERROR(view.ReadRegionInto({0, 0}, destination));
      if (rep >= 0) seconds.push_back(Seconds(absl::Now() - start));
      if (std::memcmp(destination.data_ptr(), expected.data_ptr(),
                      expected.nbytes()) != 0) {
        return absl::DataLossError(
            absl::StrCat(transport.name, ": read bytes differ"));
      }
    }
    const double median = Median(seconds);
    PrintJsonLine(JsonLine{
        {"bench", "client_read"},
        {"security", Security(config)},
        {"transport", transport.name},
        {"mib", mib},
        {"p50_ms", median * 1e3},
        {"best_ms", Percentile(seconds, 0) * 1e3},
        {"gbps", Gbps(static_cast<double>(expected.nbytes()), median)}});
  }
  return absl::OkStatus();
}

// Boxes of `rows` whole rows inside shard 0 of a 16 MiB tensor (1024 rows
// per shard), at offsets that move from one read to the next.
absl::Status MeasureLatency(const std::string& address, const Config& config) {
  ASSIGN_OR_RETURN(std::shared_ptr<Client> setup,
                   ConnectWith(address, kTransports[0]));
  ASSIGN_OR_RETURN(Tensor expected,
                   CreateAndWrite(*setup, "bench_small", 16, config));
  const int64_t shard_rows = expected.sizes()[0] / setup->world_size();
  for (const int64_t rows : config.latency_rows) {
    for (const Transport& transport : TransportsFor(config)) {
      ASSIGN_OR_RETURN(std::shared_ptr<Client> client,
                       ConnectWith(address, transport));
      ASSIGN_OR_RETURN(ShardedTensorView view, client->Open("bench_small"));
      ASSIGN_OR_RETURN(Tensor box, Tensor::Empty({rows, kColumns}));
      const auto print = [&](const char* bench,
                             const std::vector<double>& micros) {
        PrintJsonLine(JsonLine{{"bench", bench},
                               {"security", Security(config)},
                               {"transport", transport.name},
                               {"bytes", rows * kColumns * 4},
                               {"p50_us", Percentile(micros, 0.5)},
                               {"p99_us", Percentile(micros, 0.99)}});
      };
      std::vector<double> micros;
      for (int i = -1; i < config.latency_iterations; ++i) {
        const int64_t r = (int64_t{37} * (i + 1)) % (shard_rows - rows + 1);
        const absl::Time start = absl::Now();
        RETURN_IF_ERROR(view.ReadRegionInto({r, 0}, box));
        if (i >= 0) {
          micros.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
        }
        if (std::memcmp(box.data_ptr(), expected.data<float>() + r * kColumns,
                        box.nbytes()) != 0) {
          return absl::DataLossError("read bytes differ");
        }
      }
      print("client_region_latency", micros);
      // The same boxes written, with the bytes they hold (the reads above
      // and later stay checkable).
      micros.clear();
      for (int i = -1; i < config.latency_iterations; ++i) {
        const int64_t r = (int64_t{37} * (i + 1)) % (shard_rows - rows + 1);
        ASSIGN_OR_RETURN(Tensor same, expected.Narrow(0, r, rows));
        const absl::Time start = absl::Now();
        RETURN_IF_ERROR(view.Write({r, 0}, same));
        if (i >= 0) {
          micros.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
        }
      }
      print("client_region_write_latency", micros);
    }
  }
  std::vector<double> micros;
  for (int i = 0; i < config.latency_iterations; ++i) {
    const absl::Time start = absl::Now();
    ASSIGN_OR_RETURN(ShardedTensorView view, setup->Open("bench_small"));
    micros.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
  }
  PrintJsonLine(JsonLine{{"bench", "client_open_latency"},
                         {"security", Security(config)},
                         {"p50_us", Percentile(micros, 0.5)},
                         {"p99_us", Percentile(micros, 0.99)}});
  return setup->Delete("bench_small");
}

absl::Status Run(const Config& config) {
  testing::DaemonClusterOptions options;
  options.server_path = config.server;
  std::string secrets;
  if (config.secure) {
    char dir[] = "/tmp/tessera-bench-secure-XXXXXX";
    if (mkdtemp(dir) == nullptr) return absl::InternalError("mkdtemp failed");
    secrets = dir;
    ASSIGN_OR_RETURN(cli::SecureSetup setup,
                     cli::MakeSecureSetup(secrets, "127.0.0.1"));
    options.extra_args = setup.DaemonFlags();
    TlsConfig tls;
    tls.ca_file = setup.ca;
    tls.cert_file = setup.client_cert;
    tls.key_file = setup.client_key;
    SetProcessTls(tls);
    ASSIGN_OR_RETURN(std::string token,
                     ReadFileToString(setup.client_token_file));
    SetProcessToken(std::string(absl::StripAsciiWhitespace(token)));
  }
  absl::Cleanup remove_secrets = [&secrets] {
    if (!secrets.empty()) std::filesystem::remove_all(secrets);
  };
  ASSIGN_OR_RETURN(std::unique_ptr<testing::DaemonCluster> cluster,
                   testing::DaemonCluster::Start(options));
  const std::string address = cluster->address(0);
  if (config.latency_iterations > 0) {
    RETURN_IF_ERROR(MeasureLatency(address, config));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<Client> client, Client::Connect(address));
  for (int64_t mib : config.mib) {
    const std::string name = absl::StrCat("bench_", mib, "mib");
    ASSIGN_OR_RETURN(Tensor expected,
                     CreateAndWrite(*client, name, mib, config));
    RETURN_IF_ERROR(MeasureReads(address, name, expected, mib, config));
    RETURN_IF_ERROR(client->Delete(name));
    for (const int replicas : config.replicas) {
      const std::string replicated = absl::StrCat(name, "_r", replicas);
      RETURN_IF_ERROR(
          CreateAndWrite(*client, replicated, mib, config, replicas).status());
      RETURN_IF_ERROR(client->Delete(replicated));
    }
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  CLI::App app(
      "The client library against 4 real daemons on this host: reads over "
      "each transport, writes, small-region and metadata latency");
  tessera::Config config;
  bool quick = false;
  app.add_flag("--quick", quick, "small run for ctest");
  app.add_flag("--secure", config.secure,
               "daemons with mutual TLS and tokens (a throwaway CA)");
  app.add_option("--server", config.server, "the tessera-server executable")
      ->capture_default_str();
  app.add_option("--mib", config.mib, "tensor sizes in MiB")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  app.add_option("--reps", config.reps, "reads per size and transport")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--replicas", config.replicas,
                 "also write tensors with this many copies of each shard")
      ->check(CLI::Range(2, 4));
  app.add_option("--transport", config.transports,
                 "measure only these transports (default: all)")
      ->check(CLI::IsMember({"local", "data_plane", "grpc"}));
  app.add_option("--latency-iterations", config.latency_iterations,
                 "small reads per latency line (0: no latency lines)")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  app.add_option("--latency-rows", config.latency_rows,
                 "rows (4 KiB each) of the latency lines' boxes")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (quick) {
    config.mib = {4};
    config.reps = 2;
    config.latency_iterations = 50;
  }
  const absl::Status status = tessera::Run(config);
  if (!status.ok()) {
    std::cerr << "client_bench: " << status << std::endl;
    return 1;
  }
  return 0;
}
