// Remote-shard fetch benchmark: 4 rank processes on loopback; rank 0 pulls
// every remote shard of a float32 tensor and reports JSON lines:
//   {"bench":"tcp_stream", ...}       one plain TCP stream between two ranks
//                                     (the ceiling a fetch is compared with)
//   {"bench":"fetch", "shard_mib":N, "mode":"sequential|parallel|to_here"}
//   {"bench":"gather", "shard_mib":N}  st.gather(0, out), GB/s of `out`
//   {"bench":"fetch_latency", "shard_bytes":4096, "busy_threads":B,
//       "p50_us":..., "p99_us":...}  quiet (B 0), then with B threads
//       spinning in rank 0
//   {"bench":"create", "op":"empty|init_from_local_shards", "p50_us":...}
//   {"bench":"init_from_local_shards_scale", "shards":N, "seconds":...,
//    "metadata_bytes_per_shard":B}   (heap kept by the tensor on rank 0)
//
// Run without arguments it launches the ranks itself
// (tests/testing/rank_launcher.h) with a fresh StoreServer; --quick shrinks
// everything for the ctest smoke run.
#include <malloc.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <future>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/sharding_spec.h"
#include "common/status_macros.h"
#include "io/socket.h"
#include "server/metrics/metrics.h"
#include "server/rank/rank.h"
#include "server/sharded/sharded_tensor.h"
#include "server/store/grpc_store.h"
#include "tests/bench/bench_util.h"
#include "tests/testing/rank_launcher.h"

namespace tessera {
namespace {

struct Config {
  bool quick = false;
  std::vector<int64_t> shard_mib = {1, 16, 64};
  int64_t min_bytes = int64_t{2} << 30;  // Per throughput measurement.
  int latency_iterations = 5000;
  std::vector<int64_t> scale_shards = {10000, 100000, 1000000};
  // Latency is measured again with this many threads spinning in rank 0
  // (more runnable threads than cores: a loaded box).
  int busy_threads = 8;
};

using bench::Percentile;
using bench::Seconds;

// Plain TCP: rank 1 sends `bytes` to rank 0 in 4 MiB writes; rank 0 reads
// into one reused buffer (iperf3's method), with the data plane's socket
// calls. Returns GB/s on rank 0.
absl::StatusOr<double> TcpStream(Rank& rank, int64_t bytes) {
  constexpr int64_t kBuffer = 4 << 20;
  std::vector<char> buffer(kBuffer, 1);
  const absl::Time deadline = absl::Now() + absl::Minutes(5);
  if (rank.rank() == 0) {
    ASSIGN_OR_RETURN(auto listening, ListenTcp("127.0.0.1"));
    RETURN_IF_ERROR(
        rank.store()->Set("bench/tcp_port", absl::StrCat(listening.second)));
    UniqueFd peer(accept(listening.first.get(), nullptr, nullptr));
    if (!peer.valid()) return absl::UnavailableError("tcp_stream: accept");
    // The clock starts at the first byte, as a transfer's would.
    RETURN_IF_ERROR(ReadFull(peer.get(), buffer.data(), 1, deadline));
    const absl::Time start = absl::Now();
    for (int64_t received = 1; received < bytes;) {
      const int64_t n = std::min(kBuffer, bytes - received);
      RETURN_IF_ERROR(ReadFull(peer.get(), buffer.data(), n, deadline));
      received += n;
    }
    return (bytes - 1) / Seconds(absl::Now() - start) / 1e9;
  }
  if (rank.rank() == 1) {
    ASSIGN_OR_RETURN(std::string port, rank.store()->Get("bench/tcp_port"));
    ASSIGN_OR_RETURN(UniqueFd socket,
                     ConnectTcp(absl::StrCat("127.0.0.1:", port), deadline));
    for (int64_t sent = 0; sent < bytes;) {
      const int64_t n = std::min(kBuffer, bytes - sent);
      RETURN_IF_ERROR(WriteFull(socket.get(), buffer.data(), n, deadline));
      sent += n;
    }
  }
  return 0.0;
}

absl::StatusOr<ShardingSpec> RowChunks(int world_size) {
  std::vector<std::string> placements;
  for (int r = 0; r < world_size; ++r) {
    placements.push_back(absl::StrCat("rank:", r, "/cpu"));
  }
  ASSIGN_OR_RETURN(ChunkShardingSpec spec,
                   ChunkShardingSpec::Create(0, placements));
  return ShardingSpec(spec);
}

constexpr int64_t kColumns = 1024;

absl::Status GatherThroughput(Rank& rank, const ShardedTensor& st,
                              int64_t shard_mib);

// Rank 0 pulls every remote shard of a tensor with `shard_mib` MiB shards.
absl::Status FetchThroughput(Rank& rank, const Config& config,
                             int64_t shard_mib) {
  ASSIGN_OR_RETURN(ShardingSpec spec, RowChunks(rank.world_size()));
  int64_t rows = shard_mib * (1 << 20) / (4 * kColumns);
  ASSIGN_OR_RETURN(
      ShardedTensor st,
      ShardedTensor::Full(spec, {rows * rank.world_size(), kColumns}, 1.5,
                          ShardedTensorOptions().WithInitRrefs(true)));
  if (rank.rank() == 0) {
    ASSIGN_OR_RETURN(RemoteShardMap remote, st.remote_shards());
    std::vector<const RemoteShard*> shards;
    std::vector<Tensor> destinations;
    for (const auto& [owner, list] : remote) {
      for (const RemoteShard& shard : list) {
        shards.push_back(&shard);
        ASSIGN_OR_RETURN(Tensor dst,
                         Tensor::Empty(shard.metadata().shard_sizes()));
        destinations.push_back(dst);
      }
    }
    const int64_t round_bytes = static_cast<int64_t>(shards.size()) * shard_mib
                                << 20;
    const int rounds = static_cast<int>(std::max<int64_t>(
        2, config.min_bytes / std::max<int64_t>(round_bytes, 1)));
    auto fetch_into = [&](size_t i) -> absl::Status {
      ASSIGN_OR_RETURN(auto client, rank.ClientFor(shards[i]->owner().id));
      return client->FetchShardInto(st.tensor_id(), shards[i]->shard_index(),
                                    destinations[i]);
    };
    auto report = [&](const char* mode, absl::Duration elapsed) {
      std::printf(
          "{\"bench\":\"fetch\",\"shard_mib\":%lld,\"mode\":\"%s\",\"shards\":%"
          "zu,"
          "\"rounds\":%d,\"gbps\":%.3f}\n",
          static_cast<long long>(shard_mib), mode, shards.size(), rounds,
          static_cast<double>(round_bytes) * rounds / Seconds(elapsed) / 1e9);
      std::fflush(stdout);
    };
    for (size_t i = 0; i < shards.size(); ++i) RETURN_IF_ERROR(fetch_into(i));

    absl::Time start = absl::Now();
    for (int round = 0; round < rounds; ++round) {
      for (size_t i = 0; i < shards.size(); ++i) RETURN_IF_ERROR(fetch_into(i));
    }
    report("sequential", absl::Now() - start);

    start = absl::Now();
    for (int round = 0; round < rounds; ++round) {
      std::vector<std::future<absl::Status>> inflight;
      for (size_t i = 0; i < shards.size(); ++i) {
        inflight.push_back(std::async(std::launch::async, fetch_into, i));
      }
      for (auto& f : inflight) RETURN_IF_ERROR(f.get());
    }
    report("parallel", absl::Now() - start);

    start = absl::Now();
    for (int round = 0; round < rounds; ++round) {
      for (const RemoteShard* shard : shards) {
        RETURN_IF_ERROR(shard->to_here().status());
      }
    }
    report("to_here", absl::Now() - start);
  }
  RETURN_IF_ERROR(rank.default_group()->Barrier());
  return GatherThroughput(rank, st, shard_mib);
}

// st.gather(0, out): every rank's shard through one Gloo gather to rank 0.
absl::Status GatherThroughput(Rank& rank, const ShardedTensor& st,
                              int64_t shard_mib) {
  Tensor out;
  if (rank.rank() == 0) {
    ASSIGN_OR_RETURN(out, Tensor::Empty(st.size()));
  }
  RETURN_IF_ERROR(st.Gather(0, out));  // Warm-up.
  const int rounds = 5;
  absl::Time start = absl::Now();
  for (int round = 0; round < rounds; ++round) {
    RETURN_IF_ERROR(st.Gather(0, out));
  }
  if (rank.rank() == 0) {
    const double bytes = static_cast<double>(out.nbytes()) * rounds;
    std::printf(
        "{\"bench\":\"gather\",\"shard_mib\":%lld,\"ranks\":%d,"
        "\"gbps\":%.3f}\n",
        static_cast<long long>(shard_mib), rank.world_size(),
        bytes / Seconds(absl::Now() - start) / 1e9);
    std::fflush(stdout);
  }
  return rank.default_group()->Barrier();
}

absl::Status FetchLatency(Rank& rank, const Config& config) {
  ASSIGN_OR_RETURN(ShardingSpec spec, RowChunks(rank.world_size()));
  // One 4 KiB shard per rank.
  ASSIGN_OR_RETURN(
      ShardedTensor st,
      ShardedTensor::Full(spec, {rank.world_size(), kColumns}, 2.0,
                          ShardedTensorOptions().WithInitRrefs(true)));
  if (rank.rank() == 0) {
    ASSIGN_OR_RETURN(RemoteShardMap remote, st.remote_shards());
    const RemoteShard& shard = remote.at(1).front();
    ASSIGN_OR_RETURN(Tensor dst, Tensor::Empty(shard.metadata().shard_sizes()));
    ASSIGN_OR_RETURN(auto client, rank.ClientFor(1));
    for (const int busy : {0, config.busy_threads}) {
      std::atomic<bool> stop{false};
      std::vector<std::thread> spinners;
      for (int t = 0; t < busy; ++t) {
        spinners.emplace_back([&stop] {
          uint64_t x = 1;
          while (!stop.load(std::memory_order_relaxed)) {
            x = x * 6364136223846793005u + 1;
          }
          volatile uint64_t sink = x;
          (void)sink;
        });
      }
      absl::Cleanup stop_spinners = [&] {
        stop = true;
        for (std::thread& spinner : spinners) spinner.join();
      };
      for (const bool allocate : {false, true}) {
        std::vector<double> micros;
        for (int i = 0; i < config.latency_iterations + 100; ++i) {
          absl::Time start = absl::Now();
          absl::Status status =
              allocate ? shard.to_here().status()
                       : client->FetchShardInto(st.tensor_id(),
                                                shard.shard_index(), dst);
          RETURN_IF_ERROR(status);
          if (i >= 100)
            micros.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
        }
        std::printf(
            "{\"bench\":\"fetch_latency\",\"shard_bytes\":%d,\"mode\":\"%s\","
            "\"busy_threads\":%d,\"iterations\":%zu,\"p50_us\":%.1f,"
            "\"p99_us\":%.1f}\n",
            static_cast<int>(kColumns * 4), allocate ? "to_here" : "fetch_into",
            busy, micros.size(), Percentile(micros, 0.5),
            Percentile(micros, 0.99));
        std::fflush(stdout);
      }
    }
  }
  return rank.default_group()->Barrier();
}

// What metrics cost (issue 18): rank 0 reads 16 MiB shards from the other
// ranks over the data plane and 4 KiB shards from rank 1, with every
// rank's metrics off
// (EnableMetrics(false): no count at all, no endpoint) and on (counting,
// the endpoint serving, and a scrape's serialization every 100 ms: a
// heavier load than Prometheus' usual 15 s), alternating, `rounds` times;
// prints the median of each and the difference.
absl::Status MetricsOverhead(Rank& rank, const Config& config) {
  ASSIGN_OR_RETURN(ShardingSpec spec, RowChunks(rank.world_size()));
  const int64_t big_rows = (config.quick ? 1 : 16) * (1 << 20) / (4 * kColumns);
  ASSIGN_OR_RETURN(
      ShardedTensor big,
      ShardedTensor::Full(spec, {big_rows * rank.world_size(), kColumns}, 1.0,
                          ShardedTensorOptions().WithInitRrefs(true)));
  ASSIGN_OR_RETURN(
      ShardedTensor small,
      ShardedTensor::Full(spec, {rank.world_size(), kColumns}, 2.0,
                          ShardedTensorOptions().WithInitRrefs(true)));
  const int rounds = config.quick ? 2 : 9;
  const int reads = config.quick ? 2 : 32;
  const int fetches = config.quick ? 100 : 2000;
  std::vector<double> gbps[2];
  std::vector<double> p50_us[2];
  for (int round = 0; round < rounds; ++round) {
    for (const bool on : {false, true}) {
      EnableMetrics(on);
      std::unique_ptr<MetricsEndpoint> endpoint;
      std::atomic<bool> stop{false};
      std::thread scraper;
      if (on) {
        ASSIGN_OR_RETURN(endpoint, MetricsEndpoint::Start("127.0.0.1", 0));
        scraper = std::thread([&stop] {
          while (!stop.load()) {
            const std::string text = MetricsText();
            absl::SleepFor(absl::Milliseconds(100));
          }
        });
      }
      absl::Cleanup stop_scraper = [&] {
        stop = true;
        if (scraper.joinable()) scraper.join();
      };
      RETURN_IF_ERROR(rank.default_group()->Barrier());
      if (rank.rank() == 0) {
        // Over the data plane (the local path would take these on one
        // host), into buffers allocated once.
        ASSIGN_OR_RETURN(RemoteShardMap remote, big.remote_shards());
        FetchOptions over_data_plane;
        over_data_plane.local_path = LocalPath::kOff;
        std::vector<std::pair<const RemoteShard*, Tensor>> targets;
        for (const auto& [owner, list] : remote) {
          for (const RemoteShard& shard : list) {
            ASSIGN_OR_RETURN(Tensor dst,
                             Tensor::Empty(shard.metadata().shard_sizes()));
            targets.emplace_back(&shard, dst);
          }
        }
        int64_t bytes = 0;
        const absl::Time start = absl::Now();
        for (int i = 0; i < reads; ++i) {
          for (const auto& [shard, dst] : targets) {
            ASSIGN_OR_RETURN(auto owner, rank.ClientFor(shard->owner().id));
            RETURN_IF_ERROR(owner->FetchShardInto(
                big.tensor_id(), shard->shard_index(), dst, over_data_plane));
            bytes += static_cast<int64_t>(dst.nbytes());
          }
        }
        gbps[on].push_back(static_cast<double>(bytes) /
                           Seconds(absl::Now() - start) / 1e9);
        ASSIGN_OR_RETURN(RemoteShardMap tiny, small.remote_shards());
        const RemoteShard& shard = tiny.at(1).front();
        ASSIGN_OR_RETURN(Tensor dst,
                         Tensor::Empty(shard.metadata().shard_sizes()));
        ASSIGN_OR_RETURN(auto client, rank.ClientFor(1));
        std::vector<double> micros;
        for (int i = 0; i < fetches; ++i) {
          const absl::Time began = absl::Now();
          RETURN_IF_ERROR(client->FetchShardInto(small.tensor_id(),
                                                 shard.shard_index(), dst));
          micros.push_back(absl::ToDoubleMicroseconds(absl::Now() - began));
        }
        p50_us[on].push_back(Percentile(micros, 0.5));
      }
      RETURN_IF_ERROR(rank.default_group()->Barrier());
    }
  }
  EnableMetrics(true);
  if (rank.rank() == 0) {
    const double off_gbps = Percentile(gbps[0], 0.5);
    const double on_gbps = Percentile(gbps[1], 0.5);
    const double off_us = Percentile(p50_us[0], 0.5);
    const double on_us = Percentile(p50_us[1], 0.5);
    std::printf(
        "{\"bench\":\"metrics_overhead\",\"rounds\":%d,\"read_mib\":%lld,"
        "\"read_gbps_off\":%.3f,\"read_gbps_on\":%.3f,"
        "\"read_cost_pct\":%.2f,\"fetch_4k_p50_us_off\":%.2f,"
        "\"fetch_4k_p50_us_on\":%.2f,\"fetch_4k_cost_us\":%.2f}\n",
        rounds, static_cast<long long>(big_rows * kColumns * 4 >> 20), off_gbps,
        on_gbps, (off_gbps - on_gbps) / off_gbps * 100, off_us, on_us,
        on_us - off_us);
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

// Collective creation: empty() sends nothing; init_from_local_shards
// all-gathers every rank's shard metadata once.
absl::Status CreationTime(Rank& rank, const Config& config) {
  ASSIGN_OR_RETURN(ShardingSpec spec, RowChunks(rank.world_size()));
  const int iterations = config.quick ? 20 : 200;
  std::vector<double> empty_us;
  std::vector<double> local_us;
  for (int i = 0; i < iterations; ++i) {
    absl::Time start = absl::Now();
    ASSIGN_OR_RETURN(
        ShardedTensor st,
        ShardedTensor::Empty(spec, {4096, 16},
                             ShardedTensorOptions().WithInitRrefs(true)));
    empty_us.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));

    std::vector<Shard> mine = st.local_shards();
    start = absl::Now();
    ASSIGN_OR_RETURN(ShardedTensor rebuilt,
                     ShardedTensor::InitFromLocalShards(mine, {4096, 16}));
    local_us.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
  }
  if (rank.rank() == 0) {
    for (const auto& [op, samples] :
         {std::pair{"empty", &empty_us},
          std::pair{"init_from_local_shards", &local_us}}) {
      std::printf(
          "{\"bench\":\"create\",\"op\":\"%s\",\"world_size\":%d,"
          "\"iterations\":%d,\"p50_us\":%.1f,\"p99_us\":%.1f}\n",
          op, rank.world_size(), iterations, Percentile(*samples, 0.5),
          Percentile(*samples, 0.99));
    }
    std::fflush(stdout);
  }
  return rank.default_group()->Barrier();
}

// Bytes the process's allocator has handed out and not had back (glibc:
// the arenas' chunks in use plus the mmapped ones).
int64_t HeapBytesInUse() {
  const struct mallinfo2 info = mallinfo2();
  return static_cast<int64_t>(info.uordblks + info.hblkhd);
}

// init_from_local_shards at scale: `shards` one-row shards of an
// [shards, 4] tensor, dealt round-robin to the ranks (PyTorch's pairwise
// checks need ~56 s for 10,000).
absl::Status LocalShardsScale(Rank& rank, int64_t shards) {
  std::vector<Shard> mine;
  for (int64_t row = rank.rank(); row < shards; row += rank.world_size()) {
    ASSIGN_OR_RETURN(Tensor tensor, Tensor::Empty({1, 4}));
    ASSIGN_OR_RETURN(Shard shard, Shard::FromTensorAndOffsets(tensor, {row, 0},
                                                              rank.rank()));
    mine.push_back(std::move(shard));
  }
  RETURN_IF_ERROR(rank.default_group()->Barrier());
  const int64_t heap_before = HeapBytesInUse();
  const absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(ShardedTensor st,
                   ShardedTensor::InitFromLocalShards(mine, {shards, 4}));
  const double seconds = Seconds(absl::Now() - start);
  // What the tensor keeps on this rank beyond its shards' own bytes (which
  // were allocated before): its metadata, the registry's entry, indices.
  const int64_t kept = HeapBytesInUse() - heap_before;
  if (rank.rank() == 0) {
    std::printf(
        "{\"bench\":\"init_from_local_shards_scale\",\"shards\":%lld,"
        "\"ranks\":%d,\"seconds\":%.3f,\"metadata_bytes_per_shard\":%.1f}\n",
        static_cast<long long>(shards), rank.world_size(), seconds,
        static_cast<double>(kept) / static_cast<double>(shards));
    std::fflush(stdout);
  }
  return rank.default_group()->Barrier();
}

absl::Status RunRank(const Config& config) {
  ASSIGN_OR_RETURN(auto store, GrpcStore::Connect(testing::StoreFromEnv(),
                                                  absl::Seconds(60)));
  RankOptions options;
  options.rank = *testing::RankFromEnv();
  options.world_size = testing::WorldSizeFromEnv();
  options.store = store;
  options.timeout = absl::Seconds(120);
  ASSIGN_OR_RETURN(std::shared_ptr<Rank> rank, Rank::Init(options));
  SetDefaultRank(rank);
  RETURN_IF_ERROR(rank->InitRpc());

  ASSIGN_OR_RETURN(double tcp, TcpStream(*rank, config.min_bytes));
  if (rank->rank() == 0) {
    std::printf("{\"bench\":\"tcp_stream\",\"bytes\":%lld,\"gbps\":%.3f}\n",
                static_cast<long long>(config.min_bytes), tcp);
    std::fflush(stdout);
  }
  RETURN_IF_ERROR(rank->default_group()->Barrier());
  for (int64_t mib : config.shard_mib) {
    RETURN_IF_ERROR(FetchThroughput(*rank, config, mib));
  }
  RETURN_IF_ERROR(FetchLatency(*rank, config));
  RETURN_IF_ERROR(MetricsOverhead(*rank, config));
  RETURN_IF_ERROR(CreationTime(*rank, config));
  for (int64_t shards : config.scale_shards) {
    RETURN_IF_ERROR(LocalShardsScale(*rank, shards));
  }
  SetDefaultRank(nullptr);
  return rank->Shutdown();
}

int Launch(int world_size, const std::vector<std::string>& args) {
  auto server = StoreServer::Start("127.0.0.1:0");
  if (!server.ok()) {
    std::cerr << "fetch_bench: " << server.status() << "\n";
    return 1;
  }
  testing::LaunchOptions launch;
  launch.world_size = world_size;
  launch.args = args;
  launch.store_address = (*server)->address();
  launch.log_prefix = absl::StrCat("/tmp/tessera_fetch_bench_", getpid(), "_");
  launch.deadline = absl::Minutes(10);
  auto results = testing::LaunchRanks(launch);
  (*server)->Shutdown();
  if (!results.ok()) {
    std::cerr << "fetch_bench: " << results.status() << "\n";
    return 1;
  }
  int exit_code = 0;
  for (const testing::RankResult& result : *results) {
    std::string log = ReadTail(result.log_path, 1 << 20);
    if (result.rank == 0) {
      for (absl::string_view line : absl::StrSplit(log, '\n')) {
        if (absl::StartsWith(line, "{")) std::cout << line << "\n";
      }
    }
    if (!result.ok()) {
      std::cerr << "rank " << result.rank << " failed (" << result.Describe()
                << "):\n"
                << log.substr(log.size() > 4000 ? log.size() - 4000 : 0);
      exit_code = 1;
    }
    std::remove(result.log_path.c_str());
  }
  return exit_code;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  tessera::Config config;
  int world_size = 4;
  CLI::App app{"Remote-shard fetch benchmark (4 ranks on loopback)"};
  app.add_flag("--quick", config.quick, "Tiny sizes: a smoke run for ctest");
  app.add_option("--world-size", world_size, "Rank processes to launch")
      ->check(CLI::Range(2, 64));
  app.add_option("--shard-mib", config.shard_mib, "Shard sizes in MiB");
  app.add_option("--scale-shards", config.scale_shards,
                 "Shard counts for the init_from_local_shards scale run");
  app.add_option("--busy-threads", config.busy_threads,
                 "Threads spinning in rank 0 for the loaded latency run")
      ->check(CLI::Range(0, 256));
  CLI11_PARSE(app, argc, argv);
  if (config.quick) {
    config.shard_mib = {1};
    config.min_bytes = 8 << 20;
    config.latency_iterations = 200;
    config.scale_shards = {1000};
    config.busy_threads = 2;
  }
  if (!tessera::testing::RankFromEnv().has_value()) {
    std::vector<std::string> args(argv + 1, argv + argc);
    return tessera::Launch(world_size, args);
  }
  absl::Status status = tessera::RunRank(config);
  if (!status.ok()) {
    std::cerr << "rank " << *tessera::testing::RankFromEnv() << ": " << status
              << "\n";
    return 1;
  }
  return 0;
}
