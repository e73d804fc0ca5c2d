// tessera-demo: the README's tour of a running cluster, through the client
// library only (client/client.h). Start daemons first (`tessera launch
// --nproc 4 --cpu`), then:
//
//   tessera-demo [--address HOST:PORT] [--checkpoint DIR]
//
// It creates a 10x20 float32 tensor chunked over the 4 ranks, writes
// 0..199 into it, prints its shard table, fetches one remote shard whole,
// reads a region that spans three shards, gathers the tensor, and saves,
// deletes and loads it back. Every value read is checked against what was
// written; the exit code is 0 only when all of them match.
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <numeric>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/client.h"
#include "common/sharding_spec.h"
#include "common/tensor/tensor.h"

namespace {

constexpr int64_t kRows = 10;
constexpr int64_t kCols = 20;

// Value written at (r, c): its row-major index.
float Expected(int64_t r, int64_t c) {
  return static_cast<float>(r * kCols + c);
}

// Prints a float32 matrix (2-D, contiguous) and checks that it holds
// Expected at the given global offset.
bool ShowAndCheck(const tessera::Tensor& t, int64_t row0, int64_t col0) {
  bool ok = true;
  const float* values = t.data<float>();
  const int64_t rows = t.sizes()[0], cols = t.sizes()[1];
  for (int64_t r = 0; r < rows; ++r) {
    std::cout << "    ";
    for (int64_t c = 0; c < cols; ++c) {
      const float v = values[r * cols + c];
      ok = ok && v == Expected(row0 + r, col0 + c);
      std::cout << std::setw(4) << v;
    }
    std::cout << "\n";
  }
  return ok;
}

bool CheckWhole(const tessera::Tensor& t) {
  if (t.sizes() != std::vector<int64_t>{kRows, kCols}) return false;
  const float* values = t.data<float>();
  for (int64_t i = 0; i < kRows * kCols; ++i) {
    if (values[i] != static_cast<float>(i)) return false;
  }
  return true;
}

std::string Join(absl::Span<const int64_t> v) {
  return absl::StrCat("[", absl::StrJoin(v, ", "), "]");
}

int Fail(absl::string_view step, const absl::Status& status) {
  std::cerr << "tessera-demo: " << step << ": " << status << "\n";
  return 1;
}

void Verdict(bool ok, bool& all_ok) {
  std::cout << "  -> " << (ok ? "values match" : "VALUES DIFFER") << "\n";
  all_ok = all_ok && ok;
}

}  // namespace

int main(int argc, char** argv) {
  const char* env_address = std::getenv("TESSERA_ADDRESS");
  std::string address =
      env_address != nullptr ? env_address : "127.0.0.1:29600";
  // Relative to the daemons' --checkpoint-root.
  std::string checkpoint = "tessera-demo-checkpoint";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--address") {
      address = argv[i + 1];
    } else if (flag == "--checkpoint") {
      checkpoint = argv[i + 1];
    } else {
      std::cerr << "usage: tessera-demo [--address HOST:PORT] "
                   "[--checkpoint DIR]\n";
      return 2;
    }
  }

  auto client = tessera::Client::Connect(address);
  if (!client.ok()) return Fail("connect", client.status());
  const tessera::v1::ClusterInfo& cluster = (*client)->cluster();
  std::cout << "Connected to " << address << ": " << cluster.world_size()
            << " daemons\n";
  for (const auto& worker : cluster.workers()) {
    std::cout << "  rank " << worker.rank() << "  " << worker.address() << "  "
              << worker.device() << "\n";
  }

  // A demo run replaces the previous one's tensor.
  absl::Status removed = (*client)->Delete("demo");
  if (!removed.ok() && !absl::IsNotFound(removed)) {
    return Fail("delete old demo tensor", removed);
  }

  std::vector<std::string> placements;
  for (int r = 0; r < cluster.world_size(); ++r) {
    placements.push_back(absl::StrCat("rank:", r, "/cpu"));
  }
  auto spec = tessera::ChunkShardingSpec::Create(0, placements);
  if (!spec.ok()) return Fail("spec", spec.status());
  tessera::CreateOptions create;
  create.init = tessera::TensorInit::kZeros;
  std::cout << "\n1. create 'demo': 10x20 float32, chunked on dim 0 over "
            << cluster.world_size() << " ranks\n";
  auto view = (*client)->Create("demo", {kRows, kCols}, *spec, create);
  if (!view.ok()) return Fail("create", view.status());

  std::vector<float> values(kRows * kCols);
  std::iota(values.begin(), values.end(), 0.0f);
  auto data = tessera::Tensor::FromVector<float>(values, {kRows, kCols});
  if (!data.ok()) return Fail("make data", data.status());
  if (absl::Status s = view->Write({0, 0}, *data); !s.ok()) {
    return Fail("write", s);
  }
  std::cout << "   wrote 0..199 (each owner got only its rows)\n";

  std::cout << "\n2. shard table of '" << view->name() << "' (tensor id "
            << view->tensor_id() << ")\n";
  std::cout << "   shard  offsets   sizes     placement    owner\n";
  const auto& shards = view->metadata().shards_metadata;
  for (size_t i = 0; i < shards.size(); ++i) {
    const int owner = view->owner_rank(i);
    std::cout << "   " << std::left << std::setw(7) << i << std::setw(10)
              << Join(shards[i].shard_offsets()) << std::setw(10)
              << Join(shards[i].shard_sizes()) << std::setw(13)
              << shards[i].placement()->ToString()
              << cluster.workers(owner).address() << std::right << "\n";
  }

  bool all_ok = true;
  const size_t remote = shards.size() > 2 ? 2 : shards.size() - 1;
  std::cout << "\n3. fetch shard " << remote << " whole from its owner (rank "
            << view->owner_rank(remote) << ") with to_here()\n";
  auto fetched = view->remote_shards()[remote].to_here();
  if (!fetched.ok()) return Fail("to_here", fetched.status());
  Verdict(ShowAndCheck(fetched->tensor, shards[remote].shard_offsets()[0], 0),
          all_ok);

  std::cout << "\n4. read the region offsets [2, 5], sizes [6, 10]: rows 2-7 "
               "span shards 0, 1 and 2\n";
  auto region = view->ReadRegion({2, 5}, {6, 10});
  if (!region.ok()) return Fail("read region", region.status());
  Verdict(ShowAndCheck(*region, 2, 5), all_ok);

  std::cout << "\n5. gather the whole tensor on the connected daemon\n";
  auto gathered = (*client)->Gather("demo");
  if (!gathered.ok()) return Fail("gather", gathered.status());
  std::cout << "   " << Join(gathered->sizes()) << " float32, first row:";
  for (int64_t c = 0; c < 5; ++c)
    std::cout << " " << gathered->data<float>()[c];
  std::cout << " ...\n";
  Verdict(CheckWhole(*gathered), all_ok);

  std::cout << "\n6. save to " << checkpoint << ", delete, load back\n";
  auto saved = (*client)->Save(checkpoint, {"demo"}, /*overwrite=*/true);
  if (!saved.ok()) return Fail("save", saved.status());
  if (absl::Status s = (*client)->Delete("demo"); !s.ok()) {
    return Fail("delete", s);
  }
  auto listed = (*client)->List();
  if (!listed.ok()) return Fail("list", listed.status());
  std::cout << "   after delete: " << listed->size() << " tensors\n";
  tessera::v1::LoadCheckpointRequest load;
  load.set_path(checkpoint);
  auto loaded = (*client)->Load(load);
  if (!loaded.ok()) return Fail("load", loaded.status());
  for (const auto& t : *loaded) {
    std::cout << "   loaded '" << t.name() << "' " << Join(t.sizes()) << " in "
              << t.metadata().shards_metadata.size() << " shards\n";
  }
  auto reopened = (*client)->Open("demo");
  if (!reopened.ok()) return Fail("open", reopened.status());
  auto all = reopened->Read();
  if (!all.ok()) return Fail("read", all.status());
  Verdict(CheckWhole(*all), all_ok);

  std::cout << "\n" << (all_ok ? "demo OK" : "demo FAILED") << "\n";
  return all_ok ? 0 : 1;
}
