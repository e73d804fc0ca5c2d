// The read planner (client/read_plan.h, PlanPieces) at the scale users run,
// on metadata alone: a 1-trillion-parameter mixture-of-experts state dict
// (61 layers, 384 experts of three [2048, 7168] matrices each, plus four
// dense [7168, 7168] attention matrices per layer) held by 256 trainer
// ranks (each expert's matrices in row chunks over the 16 ranks of its
// expert-parallel group; dense matrices in row chunks over all 256), read
// by 128 reader ranks laid out as 16 expert-parallel groups of
// tensor-parallel 8 (column eighths of their experts' matrices and of q, k
// and v; row eighths of o).
//
// Prints one JSON object per line: the model (tensors, shards,
// parameters), the plan of one reader (seconds, pieces, bytes), every
// reader's plan one after the other (seconds in all, the slowest), and the
// peak resident memory of the process (metadata and one plan at a time).
//   plan_bench [--layers 61] [--experts 384] [--readers 128]
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "client/read_plan.h"
#include "common/shard_metadata.h"

namespace tessera {
namespace {

constexpr int kTrainers = 256;
constexpr int kEpGroups = 16;  // Trainers: 16 groups of 16.
constexpr int kTp = 8;         // Readers: TP 8 within an EP group.
constexpr int64_t kHidden = 7168;
constexpr int64_t kExpertRows = 2048;

double Since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

double PeakRssMiB() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss / 1024.0;  // KiB on Linux.
}

// Row chunks of `sizes` over `ranks` consecutive ranks from `first`.
std::vector<ShardMetadata> RowChunks(const std::vector<int64_t>& sizes,
                                     int first, int ranks) {
  std::vector<ShardMetadata> shards;
  shards.reserve(ranks);
  const int64_t step = (sizes[0] + ranks - 1) / ranks;
  for (int r = 0; r < ranks; ++r) {
    const int64_t begin = std::min<int64_t>(sizes[0], r * step);
    const int64_t rows = std::min<int64_t>(step, sizes[0] - begin);
    if (rows <= 0) break;
    shards.push_back(*ShardMetadata::Create(
        {begin, 0}, {rows, sizes[1]},
        RemoteDevice::ForRank(first + r, Device::Cpu())));
  }
  return shards;
}

struct Model {
  std::vector<PlannedTensor> tensors;
  // Per tensor: the expert-parallel group of an expert matrix, -1 for a
  // dense one; which of q, k, v, o (3) a dense one is.
  std::vector<int> group;
  std::vector<int> dense_kind;
  int64_t parameters = 0;
  size_t shards = 0;
};

Model Build(int layers, int experts) {
  Model model;
  const auto add = [&](std::string name, std::vector<int64_t> sizes,
                       std::vector<ShardMetadata> shards, int group, int kind) {
    model.parameters += sizes[0] * sizes[1];
    model.shards += shards.size();
    PlannedTensor tensor;
    tensor.name = std::move(name);
    tensor.dtype = DType::kBFloat16;
    tensor.sizes = std::move(sizes);
    tensor.shards = std::move(shards);
    model.tensors.push_back(std::move(tensor));
    model.group.push_back(group);
    model.dense_kind.push_back(kind);
  };
  const int per_group = kTrainers / kEpGroups;
  for (int layer = 0; layer < layers; ++layer) {
    const char* dense[] = {"q", "k", "v", "o"};
    for (int kind = 0; kind < 4; ++kind) {
      const std::vector<int64_t> sizes = {kHidden, kHidden};
      add(absl::StrCat("layers.", layer, ".attn.", dense[kind]), sizes,
          RowChunks(sizes, 0, kTrainers), -1, kind);
    }
    for (int e = 0; e < experts; ++e) {
      const int group = e % kEpGroups;
      for (const char* m : {"gate", "up", "down"}) {
        const std::vector<int64_t> sizes = {kExpertRows, kHidden};
        add(absl::StrCat("layers.", layer, ".experts.", e, ".", m), sizes,
            RowChunks(sizes, group * per_group, per_group), group, -1);
      }
    }
  }
  return model;
}

// Reader `reader`'s destinations: its column (or, for o, row) eighth of
// every dense matrix and of its group's experts' matrices.
std::vector<PlanTarget> ReaderTargets(const Model& model, int reader) {
  const int group = reader / kTp;
  const int tp = reader % kTp;
  std::vector<PlanTarget> targets;
  for (size_t t = 0; t < model.tensors.size(); ++t) {
    const PlannedTensor& tensor = model.tensors[t];
    if (model.group[t] >= 0 && model.group[t] != group % kEpGroups) continue;
    const bool rows = model.dense_kind[t] == 3;
    const int64_t part = (rows ? tensor.sizes[0] : tensor.sizes[1]) / kTp;
    PlanSource source;
    source.tensor = static_cast<uint32_t>(t);
    source.offsets = rows ? std::vector<int64_t>{tp * part, 0}
                          : std::vector<int64_t>{0, tp * part};
    source.sizes = rows ? std::vector<int64_t>{part, tensor.sizes[1]}
                        : std::vector<int64_t>{tensor.sizes[0], part};
    PlanTarget target;
    target.out_sizes = source.sizes;
    target.out_dtype = DType::kBFloat16;
    target.sources.push_back(std::move(source));
    targets.push_back(std::move(target));
  }
  return targets;
}

int Main(int argc, char** argv) {
  CLI::App app("read planner at scale");
  int layers = 61;
  int experts = 384;
  int readers = 128;
  app.add_option("--layers", layers);
  app.add_option("--experts", experts);
  app.add_option("--readers", readers)->check(CLI::Range(1, 128));
  bool quick = false;
  app.add_flag("--quick", quick, "a small model (smoke test)");
  CLI11_PARSE(app, argc, argv);
  if (quick) {
    layers = 2;
    experts = 32;
    readers = 4;
  }
  auto start = std::chrono::steady_clock::now();
  const Model model = Build(layers, experts);
  std::printf(
      "{\"bench\":\"plan_model\",\"layers\":%d,\"experts\":%d,"
      "\"tensors\":%zu,\"shards\":%zu,\"parameters\":%lld,"
      "\"trainer_ranks\":%d,\"metadata_seconds\":%.3f,"
      "\"peak_rss_mib\":%.1f}\n",
      layers, experts, model.tensors.size(), model.shards,
      static_cast<long long>(model.parameters), kTrainers, Since(start),
      PeakRssMiB());
  std::fflush(stdout);
  double all_seconds = 0;
  double slowest = 0;
  size_t all_pieces = 0;
  int64_t all_bytes = 0;
  for (int reader = 0; reader < readers; ++reader) {
    start = std::chrono::steady_clock::now();
    const std::vector<PlanTarget> targets = ReaderTargets(model, reader);
    const absl::StatusOr<std::vector<PlanPiece>> pieces =
        PlanPieces(model.tensors, targets);
    const double seconds = Since(start);
    if (!pieces.ok()) {
      std::fprintf(stderr, "plan of reader %d: %s\n", reader,
                   pieces.status().ToString().c_str());
      return 1;
    }
    int64_t bytes = 0;
    for (const PlanPiece& piece : *pieces) bytes += piece.bytes;
    if (reader == 0) {
      std::printf(
          "{\"bench\":\"plan_one_reader\",\"reader\":0,\"items\":%zu,"
          "\"pieces\":%zu,\"bytes\":%lld,\"seconds\":%.3f,"
          "\"peak_rss_mib\":%.1f}\n",
          targets.size(), pieces->size(), static_cast<long long>(bytes),
          seconds, PeakRssMiB());
      std::fflush(stdout);
    }
    all_seconds += seconds;
    slowest = std::max(slowest, seconds);
    all_pieces += pieces->size();
    all_bytes += bytes;
  }
  std::printf(
      "{\"bench\":\"plan_every_reader\",\"readers\":%d,\"pieces\":%zu,"
      "\"bytes\":%lld,\"seconds\":%.3f,\"slowest_reader_seconds\":%.3f,"
      "\"peak_rss_mib\":%.1f,\"goal_seconds\":2,\"goal_rss_mib\":1024}\n",
      readers, all_pieces, static_cast<long long>(all_bytes), all_seconds,
      slowest, PeakRssMiB());
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) { return tessera::Main(argc, argv); }
