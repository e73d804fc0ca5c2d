#include "client/cli/bench_command.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/cli/table.h"
#include "client/client.h"
#include "client/lanes.h"
#include "client/local_path.h"
#include "client/shard_client.h"
#include "common/byte_size.h"
#include "common/sharding_spec.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace tessera::cli {
namespace {

constexpr absl::string_view kBenchCommand = "bench";
// The scratch tensor's rows: 1024 float32 each.
constexpr int64_t kColumns = 1024;
constexpr int64_t kRowBytes = kColumns * 4;
// About this many bytes are moved per size and op.
constexpr int64_t kBytesPerPoint = int64_t{1} << 30;

// One way of reaching the daemon.
struct Transport {
  std::string name;
  int lanes = 0;  // 0: not striped ("-")
  bool data_plane = false;
  bool local_path = false;
};

struct Row {
  Transport transport;
  std::string op;
  std::vector<int64_t> bytes;
  std::vector<double> seconds;
  TwoTermFit fit;
};

struct DaemonResult {
  int rank = 0;
  std::string address;
  std::string device;
  int64_t tensor_bytes = 0;
  std::vector<Row> rows;
  // Why a transport was left out.
  std::vector<std::string> notes;
};

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

std::string Time(double seconds) {
  if (seconds < 1e-3) return absl::StrFormat("%.0f us", seconds * 1e6);
  if (seconds < 1) return absl::StrFormat("%.2f ms", seconds * 1e3);
  return absl::StrFormat("%.2f s", seconds);
}

// Reads or writes (`op`) the first `rows` rows of `view` `reps` times after
// one warm-up; the median seconds.
absl::StatusOr<double> Measure(const ShardedTensorView& view,
                               const std::string& op, int64_t rows, int reps,
                               absl::Duration timeout) {
  ASSIGN_OR_RETURN(Tensor buffer, Tensor::Empty({rows, kColumns}));
  std::memset(buffer.data_ptr(), 1, buffer.nbytes());
  TransferOptions options;
  options.timeout = timeout;
  std::vector<double> seconds;
  for (int rep = -1; rep < reps; ++rep) {
    const absl::Time start = absl::Now();
    RETURN_IF_ERROR(op == "read" ? view.ReadRegionInto({0, 0}, buffer, options)
                                 : view.Write({0, 0}, buffer, options));
    if (rep >= 0) seconds.push_back(absl::ToDoubleSeconds(absl::Now() - start));
  }
  return Median(std::move(seconds));
}

absl::StatusOr<DaemonResult> BenchDaemon(const BenchOptions& options,
                                         Client& setup, int rank,
                                         const std::vector<int64_t>& sizes) {
  DaemonResult result;
  result.rank = rank;
  const v1::WorkerAddress& worker = setup.cluster().workers(rank);
  result.address = worker.address();
  result.device = worker.device().empty() ? "cpu" : worker.device();
  const int64_t rows =
      *std::max_element(sizes.begin(), sizes.end()) / kRowBytes;
  result.tensor_bytes = rows * kRowBytes;
  ASSIGN_OR_RETURN(ChunkShardingSpec spec,
                   ChunkShardingSpec::Create(
                       0, {absl::StrCat("rank:", rank, "/", result.device)}));
  const std::string name = absl::StrCat("tessera_bench.r", rank, ".", getpid());
  CreateOptions create;
  create.init = TensorInit::kZeros;
  RETURN_IF_ERROR(setup.Create(name, {rows, kColumns}, spec, create).status());
  const absl::Cleanup remove = [&setup, &name] {
    setup.Delete(name).IgnoreError();
  };

  std::vector<Transport> transports;
  for (int lanes : options.lanes) {
    transports.push_back({"data_plane", lanes, true, false});
  }
  transports.push_back({"grpc", 0, false, false});
  // The local path when it can really be taken (a daemon of this host, in
  // this network namespace): one read that requires it tells.
  if (!worker.local_address().empty() &&
      LocalPathClient(worker.local_address()).same_host()) {
    ASSIGN_OR_RETURN(ShardedTensorView view, setup.Open(name));
    ASSIGN_OR_RETURN(Tensor probe, Tensor::Empty({1, kColumns}));
    FetchOptions required;
    required.local_path = LocalPath::kRequired;
    required.local_min_bytes = 0;
    required.timeout = Timeout(options.connection);
    const absl::Status local =
        ShardClient::Create(worker.address(), worker.data_address(),
                            worker.local_address())
            ->FetchRegionInto(view.tensor_id(), 0, {0, 0}, probe, required);
    if (local.ok()) {
      transports.push_back({"local_path", 0, true, true});
    } else {
      result.notes.push_back(
          absl::StrCat("local path not measured: ", local.message()));
    }
  }
  for (const Transport& transport : transports) {
    ClientOptions client_options;
    client_options.data_plane = transport.data_plane;
    client_options.use_local_path = transport.local_path;
    if (transport.local_path) client_options.local_min_bytes = 0;
    client_options.data_lanes = std::max(transport.lanes, 0);
    ASSIGN_OR_RETURN(std::shared_ptr<Client> client,
                     ConnectToCluster(options.connection, client_options));
    ASSIGN_OR_RETURN(ShardedTensorView view, client->Open(name));
    for (const std::string op : {"read", "write"}) {
      Row row;
      row.transport = transport;
      row.op = op;
      for (int64_t size : sizes) {
        const int64_t box_rows = size / kRowBytes;
        const int reps = static_cast<int>(std::clamp<int64_t>(
            kBytesPerPoint / size, 3, std::max(options.reps, 3)));
        absl::StatusOr<double> seconds =
            Measure(view, op, box_rows, reps, Timeout(options.connection));
        if (!seconds.ok()) {
          return Annotate(seconds.status(),
                          absl::StrCat("rank ", rank, ": ", transport.name, " ",
                                       op, " of ", FormatBytes(size)));
        }
        row.bytes.push_back(size);
        row.seconds.push_back(*seconds);
      }
      row.fit = FitTwoTerms(row.bytes, row.seconds);
      result.rows.push_back(std::move(row));
    }
  }
  return result;
}

std::string LanesText(const Transport& transport) {
  return transport.lanes > 0 ? absl::StrCat(transport.lanes) : "-";
}

std::string Table(const DaemonResult& daemon) {
  std::string out = absl::StrCat(
      "rank ", daemon.rank, " at ", daemon.address, " (", daemon.device, "), ",
      FormatBytes(daemon.tensor_bytes), " scratch tensor\n");
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> header = {"TRANSPORT", "LANES", "OP"};
  for (int64_t size : daemon.rows.front().bytes) {
    header.push_back(FormatBytes(size));
  }
  header.push_back("PER-OP");
  header.push_back("GB/s");
  rows.push_back(std::move(header));
  for (const Row& row : daemon.rows) {
    std::vector<std::string> line = {row.transport.name,
                                     LanesText(row.transport), row.op};
    for (double seconds : row.seconds) line.push_back(Time(seconds));
    line.push_back(Time(row.fit.per_op_seconds));
    line.push_back(row.fit.bytes_per_second > 0
                       ? absl::StrFormat("%.2f", row.fit.bytes_per_second / 1e9)
                       : "-");
    rows.push_back(std::move(line));
  }
  absl::StrAppend(&out, FormatColumns(rows));
  for (const std::string& note : daemon.notes) {
    absl::StrAppend(&out, note, "\n");
  }
  return out;
}

nlohmann::json Json(const DaemonResult& daemon) {
  nlohmann::json rows = nlohmann::json::array();
  for (const Row& row : daemon.rows) {
    nlohmann::json points = nlohmann::json::array();
    for (size_t i = 0; i < row.bytes.size(); ++i) {
      points.push_back({{"bytes", row.bytes[i]}, {"p50_s", row.seconds[i]}});
    }
    rows.push_back({{"transport", row.transport.name},
                    {"lanes", row.transport.lanes},
                    {"op", row.op},
                    {"points", points},
                    {"per_op_us", row.fit.per_op_seconds * 1e6},
                    {"gbs", row.fit.bytes_per_second / 1e9}});
  }
  return {{"rank", daemon.rank},
          {"address", daemon.address},
          {"device", daemon.device},
          {"tensor_bytes", daemon.tensor_bytes},
          {"rows", rows},
          {"notes", daemon.notes}};
}

}  // namespace

TwoTermFit FitTwoTerms(const std::vector<int64_t>& bytes,
                       const std::vector<double>& seconds) {
  double s = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < bytes.size() && i < seconds.size(); ++i) {
    if (!(seconds[i] > 0)) continue;
    const double w = 1 / (seconds[i] * seconds[i]);
    const double x = static_cast<double>(bytes[i]);
    s += w;
    sx += w * x;
    sy += w * seconds[i];
    sxx += w * x * x;
    sxy += w * x * seconds[i];
  }
  TwoTermFit fit;
  const double det = s * sxx - sx * sx;
  if (s == 0) return fit;
  if (det <= 0) {
    fit.per_op_seconds = sy / s;
    return fit;
  }
  const double slope = (s * sxy - sx * sy) / det;
  fit.per_op_seconds = std::max(0.0, (sy - slope * sx) / s);
  fit.bytes_per_second = slope > 0 ? 1 / slope : 0;
  return fit;
}

int RunBench(const BenchOptions& options, const CommandContext& context) {
  std::vector<int64_t> sizes;
  for (const std::string& text : options.sizes) {
    absl::StatusOr<int64_t> size = ParseByteSize("--sizes", text);
    if (!size.ok())
      return context.ReportUserError(kBenchCommand, size.status());
    if (*size <= 0) {
      return context.ReportUserError(
          kBenchCommand, absl::InvalidArgumentError(absl::StrCat(
                             "--sizes: ", text, " is not a positive size")));
    }
    sizes.push_back((*size + kRowBytes - 1) / kRowBytes * kRowBytes);
  }
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  for (int lanes : options.lanes) {
    if (lanes < 1 || lanes > kMaxDataLanes) {
      return context.ReportUserError(
          kBenchCommand,
          absl::InvalidArgumentError(absl::StrCat(
              "--lanes: ", lanes, " is not in [1, ", kMaxDataLanes, "]")));
    }
  }
  absl::StatusOr<std::shared_ptr<Client>> setup =
      ConnectToCluster(options.connection);
  if (!setup.ok())
    return context.ReportUserError(kBenchCommand, setup.status());
  const int world = (*setup)->world_size();
  std::vector<int> ranks = options.ranks;
  if (ranks.empty()) {
    for (int r = 0; r < world; ++r) ranks.push_back(r);
  }
  for (int rank : ranks) {
    if (rank < 0 || rank >= world) {
      return context.ReportUserError(
          kBenchCommand,
          absl::InvalidArgumentError(absl::StrCat(
              "--rank: ", rank, " is not a daemon of this cluster (ranks 0 to ",
              world - 1, ")")));
    }
  }
  nlohmann::json daemons = nlohmann::json::array();
  bool failed = false;
  for (int rank : ranks) {
    absl::StatusOr<DaemonResult> result =
        BenchDaemon(options, **setup, rank, sizes);
    if (!result.ok()) {
      context.PrintError(kBenchCommand, result.status().message());
      failed = true;
      continue;
    }
    if (options.json) {
      daemons.push_back(Json(*result));
    } else {
      context.out() << Table(*result) << "\n";
      context.out().flush();
    }
  }
  if (options.json) {
    context.out() << nlohmann::json{{"daemons", daemons}}.dump(2) << "\n";
  }
  context.out().flush();
  if (!context.out().good()) return kExitFailure;
  return failed ? kExitFailure : kExitOk;
}

void AddBenchCommand(CLI::App& app, CommandContext& context) {
  CLI::App* bench = app.add_subcommand(
      std::string(kBenchCommand),
      "Measure the wire to each daemon: per-op cost and GB/s of reads and "
      "writes per transport and lane count (time = ops x per-op + bytes / "
      "GB/s)");
  auto options = std::make_shared<BenchOptions>();
  AddConnectionFlags(app, bench, &options->connection, /*transfers=*/false);
  bench
      ->add_option("--rank", options->ranks,
                   "daemons to measure (repeatable); default: every one")
      ->check(Whole(0, std::numeric_limits<int>::max()));
  bench
      ->add_option("--sizes", options->sizes,
                   "box sizes, rounded up to 4 KiB rows")
      ->delimiter(',')
      ->capture_default_str();
  bench
      ->add_option("--lanes", options->lanes,
                   "data-plane lane counts to measure")
      ->delimiter(',')
      ->check(Whole(1, kMaxDataLanes))
      ->capture_default_str();
  bench
      ->add_option("--reps", options->reps,
                   "transfers per size (large sizes: about 1 GiB's worth, at "
                   "least 3)")
      ->check(Whole(1, 100000))
      ->capture_default_str();
  bench->add_flag("--json", options->json, "one JSON document");
  bench->footer(
      "Examples:\n"
      "  tessera bench\n"
      "  tessera bench --rank 1 --lanes 1,2,4,8 --sizes 4KiB,1MiB,256MiB\n\n"
      "Creates, writes and deletes one scratch tensor per daemon (the write "
      "role). Exit status: 0 when every daemon was measured, 1 when one "
      "could not be, 2 for a usage error.");
  RunWhenParsed(bench, context, kBenchCommand, options, RunBench);
}

}  // namespace tessera::cli
