// Benchmarks shard-layout work at scale: building chunk metadata,
// validating layouts (overlap + bounds + coverage, O(n log n)) for row,
// 2-d grid and 3-d grid layouts, and the protobuf round trip of the
// resulting metadata. Prints one JSON object per measurement on stdout:
//   {"bench":"validate_layout","layout":"grid2d","shards":1000000,
//    "seconds":0.41,"shards_per_second":2.4e6}
// Each figure is the best of --repeat runs.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "common/proto_convert.h"
#include "common/shard_layout.h"
#include "common/sharding_spec.h"

namespace tessera {
namespace {

double BestSeconds(int repeat, const std::function<void()>& fn) {
  double best = 1e300;
  for (int i = 0; i < repeat; ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    const std::chrono::duration<double> elapsed =
        std::chrono::steady_clock::now() - start;
    best = std::min(best, elapsed.count());
  }
  return best;
}

void Report(const std::string& bench, const std::string& layout, size_t shards,
            double seconds) {
  std::printf(
      "{\"bench\":\"%s\",\"layout\":\"%s\",\"shards\":%zu,\"seconds\":%.6f,"
      "\"shards_per_second\":%.1f}\n",
      bench.c_str(), layout.c_str(), shards, seconds,
      seconds > 0 ? shards / seconds : 0.0);
  std::fflush(stdout);
}

// A grid of `per_dim`^rank shards of `cell` elements per side, placed
// round-robin over 8 ranks, in a shuffled order so sorting is real work.
std::vector<ShardMetadata> Grid(int rank, int64_t per_dim, int64_t cell,
                                std::vector<int64_t>* tensor) {
  tensor->assign(rank, per_dim * cell);
  int64_t count = 1;
  for (int d = 0; d < rank; ++d) count *= per_dim;
  std::vector<ShardMetadata> shards;
  shards.reserve(count);
  for (int64_t i = 0; i < count; ++i) {
    std::vector<int64_t> offsets(rank), sizes(rank, cell);
    int64_t rest = i;
    for (int d = rank - 1; d >= 0; --d) {
      offsets[d] = (rest % per_dim) * cell;
      rest /= per_dim;
    }
    shards.push_back(*ShardMetadata::Create(
        std::move(offsets), std::move(sizes),
        RemoteDevice::ForRank(static_cast<int>(i % 8), Device::Cpu())));
  }
  // Deterministic shuffle (LCG) so the input is not pre-sorted.
  uint64_t state = 88172645463325252ull;
  for (size_t i = shards.size(); i > 1; --i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    std::swap(shards[i - 1], shards[(state >> 33) % i]);
  }
  return shards;
}

int Run(size_t target, int repeat) {
  // Row chunks: one chunk spec over `target` placements.
  std::vector<RemoteDevice> placements;
  placements.reserve(target);
  for (size_t i = 0; i < target; ++i) {
    placements.push_back(
        RemoteDevice::ForRank(static_cast<int>(i % 8), Device::Cpu()));
  }
  const ChunkShardingSpec spec = *ChunkShardingSpec::Create(0, placements);
  const std::vector<int64_t> rows = {static_cast<int64_t>(target) * 4, 64};
  ShardedTensorMetadata chunked;
  Report("chunk_build_metadata", "rows", target,
         BestSeconds(repeat, [&] { chunked = *spec.BuildMetadata(rows); }));
  Report("validate_layout", "rows", target, BestSeconds(repeat, [&] {
           if (!ValidateShardLayout(chunked.shards_metadata, rows).ok()) {
             std::abort();
           }
         }));

  const int64_t per2 = std::max<int64_t>(
      1, static_cast<int64_t>(std::llround(std::sqrt(double(target)))));
  std::vector<int64_t> tensor2;
  const std::vector<ShardMetadata> grid2 = Grid(2, per2, 8, &tensor2);
  Report("validate_layout", "grid2d", grid2.size(), BestSeconds(repeat, [&] {
           if (!ValidateShardLayout(grid2, tensor2).ok()) std::abort();
         }));

  const int64_t per3 = std::max<int64_t>(
      1, static_cast<int64_t>(std::llround(std::cbrt(double(target)))));
  std::vector<int64_t> tensor3;
  const std::vector<ShardMetadata> grid3 = Grid(3, per3, 4, &tensor3);
  Report("validate_layout", "grid3d", grid3.size(), BestSeconds(repeat, [&] {
           if (!ValidateShardLayout(grid3, tensor3).ok()) std::abort();
         }));

  std::string bytes;
  Report("metadata_serialize", "rows", target,
         BestSeconds(repeat, [&] { bytes = SerializeMetadata(chunked); }));
  Report("metadata_deserialize", "rows", target, BestSeconds(repeat, [&] {
           if (!DeserializeMetadata(bytes).ok()) std::abort();
         }));
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  CLI::App app{"Shard layout benchmark (JSON lines on stdout)"};
  size_t shards = 1000000;
  int repeat = 3;
  app.add_option("--shards", shards, "Approximate number of shards")
      ->check(CLI::Range(size_t{1}, size_t{100000000}));
  app.add_option("--repeat", repeat, "Runs per figure; the best is printed")
      ->check(CLI::Range(1, 100));
  CLI11_PARSE(app, argc, argv);
  return tessera::Run(shards, repeat);
}
