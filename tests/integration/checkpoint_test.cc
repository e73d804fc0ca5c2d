// Checkpoints of state dicts (server/checkpoint/checkpoint.h): ports of the
// reference's state-dict tests (test_sharded_tensor.py: test_state_dict,
// test_state_dict_new_group, test_state_dict_no_sharded_tensors,
// test_load_state_dict_errors), with MyShardedModel1's state dict built
// directly, and beyond them: resharding loads, corruption, missing files, newer
// formats, atomic saves and every dtype. Each test runs in 4 real rank
// processes sharing one temporary checkpoint directory.
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/sharding_spec.h"
#include "common/tensor/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/directory.h"
#include "server/checkpoint/checkpoint.h"
#include "server/sharded/sharded_tensor.h"
#include "server/sharded/state_dict.h"
#include "tests/integration/device_ranks_test.h"
#include "tests/testing/multi_process.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr char kDirKey[] = "checkpoint_test/dir";

class TestShardedTensorChunked : public DeviceRanksTest {
 protected:
  // The test's checkpoint directory, shared by the rank processes: rank 0
  // creates it and publishes its path in the test's store.
  const std::string& Dir() {
    if (dir_.empty()) {
      if (rank() == 0) {
        const char* tmp = getenv("TMPDIR");
        std::string pattern = absl::StrCat(tmp != nullptr ? tmp : "/tmp",
                                           "/tessera_checkpoint_XXXXXX");
        EXPECT_NE(nullptr, mkdtemp(pattern.data())) << pattern;
        EXPECT_OK(store()->Set(kDirKey, pattern));
        dir_ = pattern;
      } else {
        absl::StatusOr<std::string> dir = store()->Get(kDirKey);
        EXPECT_OK(dir.status());
        dir_ = dir.value_or("/nonexistent");
      }
    }
    return dir_;
  }

  // Rank 0 removes the directory once every rank is done with it.
  void TearDown() override {
    DeviceRanksTest::TearDown();
    if (dir_.empty()) return;
    EXPECT_OK(store()->Set(absl::StrCat("checkpoint_test/done/", rank()), "1"));
    if (rank() != 0) return;
    std::vector<std::string> keys;
    for (int r = 0; r < world_size(); ++r) {
      keys.push_back(absl::StrCat("checkpoint_test/done/", r));
    }
    EXPECT_OK(store()->Wait(keys));
    std::filesystem::remove_all(dir_);
  }

  absl::Status Barrier() { return rank_runtime()->Barrier(); }

  // MyShardedModel1's state dict: sharded_tensor1 and
  // submodule.sharded_tensor2 (rand 10x20 on `spec`, different on every
  // rank), random_tensor1 and submodule.random_tensor2 (2x2 parameters, the
  // same on every rank, as a module's replicated parameters are).
  absl::StatusOr<StateDict> MyShardedModel1(
      const ShardingSpec& spec, std::shared_ptr<ProcessGroup> group = nullptr,
      uint64_t seed = 0) {
    Generator replicated(seed);
    Generator own(seed * 10 + 100 + rank());
    ShardedTensorOptions options = Rrefs();
    options.process_group = std::move(group);
    ASSIGN_OR_RETURN(ShardedTensor st1,
                     ShardedTensor::Rand(spec, {10, 20}, options, &own));
    ASSIGN_OR_RETURN(ShardedTensor st2,
                     ShardedTensor::Rand(spec, {10, 20}, options, &own));
    ASSIGN_OR_RETURN(Tensor t1, Tensor::Rand({2, 2}, {}, &replicated));
    ASSIGN_OR_RETURN(Tensor t2, Tensor::Rand({2, 2}, {}, &replicated));
    return StateDict{{"random_tensor1", t1},
                     {"sharded_tensor1", st1},
                     {"submodule.random_tensor2", t2},
                     {"submodule.sharded_tensor2", st2}};
  }

  // Every rank: MyShardedModel1 in rows over the 4 ranks, saved to Dir(),
  // once every rank is done saving.
  absl::StatusOr<StateDict> SavedModel() {
    RETURN_IF_ERROR(InitComms());
    ASSIGN_OR_RETURN(ShardingSpec spec, Chunk(0, {0, 1, 2, 3}));
    ASSIGN_OR_RETURN(StateDict m, MyShardedModel1(spec));
    RETURN_IF_ERROR(SaveStateDict(m, Dir()));
    RETURN_IF_ERROR(Barrier());
    return m;
  }

  // Where group rank `owner`'s shard of `name` was saved.
  absl::StatusOr<v1::DataExtent> ShardExtent(const std::string& name,
                                             int owner) {
    ASSIGN_OR_RETURN(v1::CheckpointManifest manifest,
                     ReadCheckpointManifest(Dir()));
    for (const v1::CheckpointEntry& entry : manifest.entries()) {
      if (entry.name() != name) continue;
      for (const v1::SavedShard& shard : entry.sharded().shards()) {
        if (shard.owner_rank() == owner) return shard.data();
      }
    }
    return absl::NotFoundError(
        absl::StrCat("no shard of ", name, " on rank ", owner));
  }

 private:
  std::string dir_;
};

std::vector<std::string> Names(const StateDict& state_dict) {
  std::vector<std::string> names;
  for (const auto& [name, value] : state_dict) names.push_back(name);
  return names;
}

Tensor OnCpu(const Tensor& tensor) {
  absl::StatusOr<Tensor> host = tensor.To(Device::Cpu());
  EXPECT_OK(host.status());
  return host.value_or(Tensor());
}

// torch.equal on sharded tensors: the same metadata and local shards; and,
// on members of the group, the same whole tensor.
void ExpectSameShardedTensor(const ShardedTensor& expected,
                             const ShardedTensor& actual) {
  EXPECT_EQ(expected.metadata(), actual.metadata());
  ASSERT_EQ(expected.local_shards().size(), actual.local_shards().size());
  for (size_t i = 0; i < expected.local_shards().size(); ++i) {
    const Shard& want = expected.local_shards()[i];
    const Shard& got = actual.local_shards()[i];
    EXPECT_EQ(want.metadata, got.metadata);
    EXPECT_EQ(want.tensor.device(), got.tensor.device());
    EXPECT_TRUE(Equal(OnCpu(want.tensor), OnCpu(got.tensor)));
  }
  if (!expected.process_group()->is_member()) return;
  ASSERT_OK_AND_ASSIGN(Tensor want, expected.GatherAll());
  ASSERT_OK_AND_ASSIGN(Tensor got, actual.GatherAll());
  EXPECT_TRUE(Equal(want, got));
}

void ExpectSameStateDict(const StateDict& expected, const StateDict& actual) {
  ASSERT_EQ(Names(expected), Names(actual));
  for (size_t i = 0; i < expected.size(); ++i) {
    SCOPED_TRACE(expected[i].first);
    const StateValue& want = expected[i].second;
    const StateValue& got = actual[i].second;
    ASSERT_EQ(want.index(), got.index());
    if (const Tensor* tensor = std::get_if<Tensor>(&want)) {
      EXPECT_TRUE(Equal(OnCpu(*tensor), std::get<Tensor>(got)));
    } else {
      ExpectSameShardedTensor(std::get<ShardedTensor>(want),
                              std::get<ShardedTensor>(got));
    }
  }
}

absl::StatusOr<ShardedTensor> Sharded(const StateDict& state_dict,
                                      const std::string& name) {
  for (const auto& [key, value] : state_dict) {
    const ShardedTensor* st = std::get_if<ShardedTensor>(&value);
    if (key == name && st != nullptr) return *st;
  }
  return absl::NotFoundError(absl::StrCat("no sharded tensor ", name));
}

// The whole of every sharded tensor of `state_dict` (collective).
std::map<std::string, Tensor> GatherSharded(const StateDict& state_dict) {
  std::map<std::string, Tensor> full;
  for (const auto& [name, value] : state_dict) {
    if (const ShardedTensor* st = std::get_if<ShardedTensor>(&value)) {
      absl::StatusOr<Tensor> gathered = st->GatherAll();
      EXPECT_OK(gathered.status());
      full[name] = gathered.value_or(Tensor());
    }
  }
  return full;
}

// `st`'s single local shard holds `full`'s box [start, start + length)
// along `dim`.
void ExpectLocalSlice(const ShardedTensor& st, const Tensor& full, int64_t dim,
                      int64_t start, int64_t length) {
  ASSERT_EQ(1u, st.local_shards().size());
  ASSERT_OK_AND_ASSIGN(Tensor want, full.Narrow(dim, start, length));
  EXPECT_TRUE(Equal(want, OnCpu(st.local_shards()[0].tensor)));
}

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::set<std::string> ListDir(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& item : std::filesystem::directory_iterator(dir)) {
    names.insert(item.path().filename().string());
  }
  return names;
}

TEST_P(TestShardedTensorChunked, StateDict) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {0, 1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(StateDict m, MyShardedModel1(spec));
  std::vector<std::string> keys = Names(m);
  EXPECT_THAT(keys, ::testing::Contains("sharded_tensor1"));
  EXPECT_THAT(keys, ::testing::Contains("submodule.sharded_tensor2"));
  ASSERT_OK(SaveStateDict(m, Dir()));

  ASSERT_OK_AND_ASSIGN(StateDict loaded, LoadStateDict(Dir()));
  ExpectSameStateDict(m, loaded);
  ASSERT_OK_AND_ASSIGN(ShardedTensor st1, Sharded(loaded, "sharded_tensor1"));
  EXPECT_TRUE(st1.sharding_spec() == spec);
}

TEST_P(TestShardedTensorChunked, StateDictNewGroup) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  ASSERT_OK_AND_ASSIGN(
      ChunkShardingSpec chunk,
      ChunkShardingSpec::Create(
          0, std::vector<std::string>{absl::StrCat("rank:2/", DeviceText(0)),
                                      absl::StrCat("rank:3/", DeviceText(1)),
                                      absl::StrCat("rank:2/", DeviceText(2)),
                                      absl::StrCat("rank:3/", DeviceText(3))}));
  ASSERT_OK_AND_ASSIGN(auto pg, rank_runtime()->NewGroup({2, 3}));
  ASSERT_OK_AND_ASSIGN(StateDict m, MyShardedModel1(chunk, pg));
  ASSERT_OK(SaveStateDict(m, Dir()));
  // Ranks outside the group return from the save at once.
  ASSERT_OK(Barrier());

  LoadOptions options;
  options.process_group = pg;
  ASSERT_OK_AND_ASSIGN(StateDict loaded, LoadStateDict(Dir(), options));
  ExpectSameStateDict(m, loaded);
  ASSERT_OK_AND_ASSIGN(ShardedTensor st2,
                       Sharded(loaded, "submodule.sharded_tensor2"));
  EXPECT_EQ(pg, st2.process_group());
  EXPECT_EQ(rank() >= 2 ? 2u : 0u, st2.local_shards().size());
}

TEST_P(TestShardedTensorChunked, StateDictNoShardedTensors) {
  RANKS_TEST_BEGIN();
  // No process group at all: every process saves on its own.
  ASSERT_EQ(nullptr, DefaultRank());
  const std::string dir = absl::StrCat(Dir(), "/rank", rank());
  Generator generator(rank());
  ASSERT_OK_AND_ASSIGN(Tensor weight, Tensor::Rand({10, 10}, {}, &generator));
  ASSERT_OK_AND_ASSIGN(Tensor bias, Tensor::Rand({10}, {}, &generator));
  StateDict m = {{"weight", weight}, {"bias", bias}};
  ASSERT_OK_AND_ASSIGN(Tensor weight_before, weight.Clone());
  ASSERT_OK_AND_ASSIGN(Tensor bias_before, bias.Clone());
  ASSERT_OK(SaveStateDict(m, dir));
  EXPECT_TRUE(Equal(weight_before, std::get<Tensor>(m[0].second)));
  EXPECT_TRUE(Equal(bias_before, std::get<Tensor>(m[1].second)));

  ASSERT_OK_AND_ASSIGN(StateDict module_load, LoadStateDict(dir));
  ExpectSameStateDict(m, module_load);
}

TEST_P(TestShardedTensorChunked, LoadStateDictErrors) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {0, 1, 2, 3}));
  {
    ASSERT_OK_AND_ASSIGN(StateDict m, MyShardedModel1(spec));
    ASSERT_OK(SaveStateDict(m, Dir()));
  }
  ASSERT_OK_AND_ASSIGN(auto pg, rank_runtime()->NewGroup({0, 2, 3}));
  LoadOptions options;
  options.process_group = pg;
  if (rank() != 0) {
    const int load_rank = rank() == 1 ? -1 : rank() - 1;
    EXPECT_THAT(LoadStateDict(Dir(), options),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         HasSubstr(absl::StrCat(
                             "Local rank at save time was ", rank(),
                             ", but at load time was ", load_rank))));
  } else {
    EXPECT_THAT(LoadStateDict(Dir(), options),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         HasSubstr("Local world size at save time was 4, but "
                                   "at load time was 3")));
  }

  ASSERT_OK(DestroyComms());
  EXPECT_THAT(LoadStateDict(Dir()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("Need to initialize default process group")));
}

TEST_P(TestShardedTensorChunked, ReshardingLoadOntoTwoRanks) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {0, 1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(StateDict m, MyShardedModel1(spec));
  std::map<std::string, Tensor> full = GatherSharded(m);
  SaveOptions save;
  save.block_bytes = 48;  // Blocks that straddle rows.
  ASSERT_OK(SaveStateDict(m, Dir(), save));

  ASSERT_OK_AND_ASSIGN(auto pair, rank_runtime()->NewGroup({0, 1}));
  ASSERT_OK_AND_ASSIGN(ShardingSpec two, Chunk(0, {0, 1}));
  LoadOptions options;
  for (const auto& [name, tensor] : full) {
    options.reshard[name] = LoadTarget::Spec(two, pair);
  }
  ASSERT_OK_AND_ASSIGN(StateDict loaded, LoadStateDict(Dir(), options));
  ASSERT_EQ(Names(m), Names(loaded));
  for (const auto& [name, tensor] : full) {
    SCOPED_TRACE(name);
    ASSERT_OK_AND_ASSIGN(ShardedTensor st, Sharded(loaded, name));
    EXPECT_TRUE(st.sharding_spec() == two);
    EXPECT_EQ(pair, st.process_group());
    if (!pair->is_member()) {
      EXPECT_TRUE(st.local_shards().empty());
      continue;
    }
    ExpectLocalSlice(st, tensor, 0, 5 * rank(), 5);
    ASSERT_OK_AND_ASSIGN(Tensor whole, st.GatherAll());
    EXPECT_TRUE(Equal(tensor, whole));
  }
  EXPECT_TRUE(
      Equal(std::get<Tensor>(m[0].second), std::get<Tensor>(loaded[0].second)));
}

TEST_P(TestShardedTensorChunked, ReshardingLoadOntoColumnSpec) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {0, 1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(StateDict m, MyShardedModel1(spec));
  std::map<std::string, Tensor> full = GatherSharded(m);
  SaveOptions save;
  save.block_bytes = 48;
  ASSERT_OK(SaveStateDict(m, Dir(), save));

  // sharded_tensor1 onto a new dim-1 layout; submodule.sharded_tensor2 into
  // an existing tensor laid out by dim-1 chunks in reverse rank order.
  ASSERT_OK_AND_ASSIGN(ShardingSpec columns, Chunk(1, {0, 1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(ShardingSpec reversed, Chunk(1, {3, 2, 1, 0}));
  ASSERT_OK_AND_ASSIGN(ShardedTensor into,
                       ShardedTensor::Zeros(reversed, {10, 20}));
  LoadOptions options;
  options.reshard["sharded_tensor1"] = LoadTarget::Spec(columns);
  options.reshard["submodule.sharded_tensor2"] = LoadTarget::Into(into);
  ASSERT_OK_AND_ASSIGN(StateDict loaded, LoadStateDict(Dir(), options));

  ASSERT_OK_AND_ASSIGN(ShardedTensor st1, Sharded(loaded, "sharded_tensor1"));
  EXPECT_TRUE(st1.sharding_spec() == columns);
  ExpectLocalSlice(st1, full["sharded_tensor1"], 1, 5 * rank(), 5);
  ASSERT_OK_AND_ASSIGN(ShardedTensor st2,
                       Sharded(loaded, "submodule.sharded_tensor2"));
  EXPECT_EQ(into.tensor_id(), st2.tensor_id());
  ExpectLocalSlice(into, full["submodule.sharded_tensor2"], 1, 5 * (3 - rank()),
                   5);
  for (const auto& [name, tensor] : full) {
    ASSERT_OK_AND_ASSIGN(ShardedTensor st, Sharded(loaded, name));
    ASSERT_OK_AND_ASSIGN(Tensor whole, st.GatherAll());
    EXPECT_TRUE(Equal(tensor, whole)) << name;
  }
}

TEST_P(TestShardedTensorChunked, CorruptShardIsDataLossNamingTheFile) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {0, 1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(StateDict m, MyShardedModel1(spec));
  SaveOptions save;
  save.block_bytes = 48;
  ASSERT_OK(SaveStateDict(m, Dir(), save));
  ASSERT_OK_AND_ASSIGN(v1::DataExtent extent,
                       ShardExtent("sharded_tensor1", 1));
  const std::string file = extent.file();
  if (rank() == 0) {
    std::fstream io(absl::StrCat(Dir(), "/", file),
                    std::ios::in | std::ios::out | std::ios::binary);
    const int64_t at = extent.offset() + 7;
    io.seekg(at);
    const char byte = static_cast<char>(io.get() ^ 0x40);
    io.seekp(at);
    io.put(byte);
    ASSERT_TRUE(io.good());
  }
  ASSERT_OK(Barrier());

  // With the saved layout only rank 1 reads rank 1's file.
  const auto corrupt =
      StatusIs(absl::StatusCode::kDataLoss,
               AllOf(HasSubstr(file), HasSubstr("corrupt"),
                     HasSubstr("shard 1 of \"sharded_tensor1\"")));
  if (rank() == 1) {
    EXPECT_THAT(LoadStateDict(Dir()), corrupt);
  } else {
    EXPECT_OK(LoadStateDict(Dir()).status());
  }
  // Every column shard needs rows of shard 1.
  ASSERT_OK_AND_ASSIGN(ShardingSpec columns, Chunk(1, {0, 1, 2, 3}));
  LoadOptions options;
  options.reshard["sharded_tensor1"] = LoadTarget::Spec(columns);
  EXPECT_THAT(LoadStateDict(Dir(), options), corrupt);
}

TEST_P(TestShardedTensorChunked, MissingShardFileIsNotFound) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {0, 1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(StateDict m, MyShardedModel1(spec));
  ASSERT_OK(SaveStateDict(m, Dir()));
  ASSERT_OK_AND_ASSIGN(v1::DataExtent extent,
                       ShardExtent("sharded_tensor1", 2));
  const std::string file = extent.file();
  ASSERT_OK(Barrier());
  if (rank() == 0) {
    ASSERT_TRUE(std::filesystem::remove(absl::StrCat(Dir(), "/", file)));
  }
  ASSERT_OK(Barrier());

  const auto missing = StatusIs(absl::StatusCode::kNotFound, HasSubstr(file));
  if (rank() == 2) {
    EXPECT_THAT(LoadStateDict(Dir()), missing);
  } else {
    EXPECT_OK(LoadStateDict(Dir()).status());
  }
  ASSERT_OK_AND_ASSIGN(ShardingSpec columns, Chunk(1, {0, 1, 2, 3}));
  LoadOptions options;
  options.reshard["sharded_tensor1"] = LoadTarget::Spec(columns);
  EXPECT_THAT(LoadStateDict(Dir(), options), missing);
  EXPECT_THAT(LoadStateDict(absl::StrCat(Dir(), "/absent")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("absent")));
}

TEST_P(TestShardedTensorChunked, NewerFormatVersionIsInvalidArgument) {
  RANKS_TEST_BEGIN();
  ASSERT_OK_AND_ASSIGN(StateDict m, SavedModel());
  if (rank() == 0) {
    ASSERT_OK_AND_ASSIGN(v1::CheckpointManifest manifest,
                         ReadCheckpointManifest(Dir()));
    manifest.set_format_version(kCheckpointFormatVersion + 1);
    std::ofstream out(absl::StrCat(Dir(), "/manifest.pb"), std::ios::binary);
    ASSERT_TRUE(manifest.SerializeToOstream(&out));
  }
  ASSERT_OK(Barrier());
  EXPECT_THAT(LoadStateDict(Dir()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(absl::StrCat("format version ",
                                              kCheckpointFormatVersion + 1))));
}

// The manifest checks itself: every single-bit flip of it is refused
// (DATA_LOSS, or INVALID_ARGUMENT for a flip into a newer format version),
// never a checkpoint that loads with shards moved.
TEST_P(TestShardedTensorChunked, EveryBitFlipOfTheManifestIsRefused) {
  RANKS_TEST_BEGIN();
  ASSERT_OK_AND_ASSIGN(StateDict m, SavedModel());
  if (rank() == 0) {
    const std::string path = Dir() + "/manifest.pb";
    const std::string good = ReadWholeFile(path);
    ASSERT_GT(good.size(), 100u);
    ASSERT_OK_AND_ASSIGN(v1::CheckpointManifest manifest,
                         ReadCheckpointManifest(Dir()));
    EXPECT_EQ(manifest.format_version(), kCheckpointFormatVersion);
    int refused = 0;
    for (size_t bit = 0; bit < good.size() * 8; ++bit) {
      std::string bad = good;
      bad[bit / 8] = static_cast<char>(bad[bit / 8] ^ (1 << (bit % 8)));
      {
        std::ofstream out(path, std::ios::binary | std::ios::trunc);
        out << bad;
      }
      absl::StatusOr<v1::CheckpointManifest> read =
          ReadCheckpointManifest(Dir());
      EXPECT_TRUE(absl::IsDataLoss(read.status()) ||
                  absl::IsInvalidArgument(read.status()))
          << "bit " << bit << ": " << read.status();
      refused += read.ok() ? 0 : 1;
    }
    EXPECT_EQ(refused, static_cast<int>(good.size() * 8));
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << good;
  }
  ASSERT_OK(Barrier());
  ASSERT_OK_AND_ASSIGN(StateDict loaded, LoadStateDict(Dir()));
  ExpectSameStateDict(m, loaded);
}

// A manifest's sizes are not trusted with memory: a dense entry of 4 TiB
// whose file holds a few bytes is DATA_LOSS before anything is allocated,
// and absurd sizes are refused outright.
TEST_P(TestShardedTensorChunked, ManifestSizesAreNotTrustedWithMemory) {
  RANKS_TEST_BEGIN();
  ASSERT_OK_AND_ASSIGN(StateDict m, SavedModel());
  if (rank() == 0) {
    ASSERT_OK_AND_ASSIGN(Directory dir, Directory::Open(Dir()));
    ASSERT_OK_AND_ASSIGN(v1::CheckpointManifest manifest,
                         ReadCheckpointManifest(dir));
    for (v1::CheckpointEntry& entry : *manifest.mutable_entries()) {
      if (!entry.has_dense()) continue;
      v1::DenseTensorEntry& dense = *entry.mutable_dense();
      dense.clear_sizes();
      dense.add_sizes(int64_t{1} << 40);
      v1::DataExtent& data = *dense.mutable_data();
      data.set_length(int64_t{4} << 40);
      data.set_block_bytes(int64_t{1} << 40);
      data.clear_block_xxh3();
      for (int i = 0; i < 4; ++i) data.add_block_xxh3(i);
    }
    ASSERT_OK(WriteCheckpointManifest(dir, manifest));
    EXPECT_THAT(LoadStateDict(Dir()),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr("truncated")));
    // A block size near int64's limit (one block, then) is arithmetic on
    // the manifest's numbers, never an overflow.
    for (v1::CheckpointEntry& entry : *manifest.mutable_entries()) {
      if (!entry.has_dense()) continue;
      v1::DataExtent& data = *entry.mutable_dense()->mutable_data();
      data.set_block_bytes(std::numeric_limits<int64_t>::max() - 15);
      data.clear_block_xxh3();
      data.add_block_xxh3(0);
    }
    ASSERT_OK(WriteCheckpointManifest(dir, manifest));
    EXPECT_THAT(LoadStateDict(Dir()),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr("truncated")));
    for (v1::CheckpointEntry& entry : *manifest.mutable_entries()) {
      if (entry.has_dense())
        entry.mutable_dense()->set_sizes(0, int64_t{1} << 62);
    }
    ASSERT_OK(WriteCheckpointManifest(dir, manifest));
    EXPECT_THAT(
        LoadStateDict(Dir()),
        StatusIs(absl::StatusCode::kDataLoss, HasSubstr("bad dtype or sizes")));
  }
  ASSERT_OK(Barrier());
}

TEST_P(TestShardedTensorChunked, SaveIsAtomic) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  ASSERT_OK_AND_ASSIGN(ShardingSpec spec, Chunk(0, {0, 1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(StateDict a, MyShardedModel1(spec, nullptr, 1));
  ASSERT_OK(SaveStateDict(a, Dir()));
  // A save is complete on every rank once it returns on one.
  const std::set<std::string> files_a = ListDir(Dir());
  const std::string manifest_a = ReadWholeFile(Dir() + "/manifest.pb");
  ASSERT_FALSE(manifest_a.empty());

  // Without overwrite, a save refuses to replace it, on every member.
  SaveOptions once;
  once.overwrite = false;
  ASSERT_OK_AND_ASSIGN(StateDict b, MyShardedModel1(spec, nullptr, 2));
  EXPECT_THAT(
      SaveStateDict(b, Dir(), once),
      StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("overwrite")));

  // Failing saves: one rank's own mistake (after the others wrote their
  // shards), and a rank whose state dict differs from the others'.
  StateDict bad_name = b;
  if (rank() == 3) bad_name.emplace_back("", std::get<Tensor>(b[0].second));
  EXPECT_THAT(SaveStateDict(bad_name, Dir()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("group rank 3"),
                             HasSubstr("names must be non-empty"))));
  StateDict renamed = b;
  if (rank() == 2) renamed[0].first = "other_tensor";
  EXPECT_THAT(SaveStateDict(renamed, Dir()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("state dict of group rank 2 differs")));
  ASSERT_OK(Barrier());
  EXPECT_EQ(files_a, ListDir(Dir()));
  EXPECT_EQ(manifest_a, ReadWholeFile(Dir() + "/manifest.pb"));
  ASSERT_OK_AND_ASSIGN(StateDict loaded_a, LoadStateDict(Dir()));
  ExpectSameStateDict(a, loaded_a);
  ASSERT_OK(Barrier());

  // A successful save replaces the checkpoint and leaves only its files.
  ASSERT_OK(SaveStateDict(b, Dir()));
  ASSERT_OK_AND_ASSIGN(StateDict loaded_b, LoadStateDict(Dir()));
  ExpectSameStateDict(b, loaded_b);
  ASSERT_OK_AND_ASSIGN(v1::CheckpointManifest manifest,
                       ReadCheckpointManifest(Dir()));
  std::set<std::string> named = {"manifest.pb"};
  for (const v1::CheckpointEntry& entry : manifest.entries()) {
    if (entry.has_dense()) named.insert(entry.dense().data().file());
    for (const v1::SavedShard& shard : entry.sharded().shards()) {
      named.insert(shard.data().file());
    }
  }
  EXPECT_EQ(named, ListDir(Dir()));
  for (const std::string& name : files_a) {
    if (name == "manifest.pb") continue;
    EXPECT_EQ(0u, named.count(name)) << name;
  }
}

TEST_P(TestShardedTensorChunked, DenseTensorsRoundTripEveryDType) {
  RANKS_TEST_BEGIN();
  ASSERT_OK(InitComms());
  // The same bytes on every rank; rank 0's are the ones saved.
  std::mt19937_64 bits(42);
  StateDict state_dict;
  std::vector<Tensor> expected;
  for (DType dtype : kAllDTypes) {
    ASSERT_OK_AND_ASSIGN(
        Tensor tensor, Tensor::Empty({3, 5}, TensorOptions().WithDType(dtype)));
    auto* bytes = static_cast<unsigned char*>(tensor.data_ptr());
    for (size_t i = 0; i < tensor.nbytes(); ++i) {
      bytes[i] = static_cast<unsigned char>(bits() & 0xff);
      if (dtype == DType::kBool) bytes[i] &= 1;
    }
    state_dict.emplace_back(std::string(DTypeName(dtype)), tensor);
    expected.push_back(tensor);
  }
  // Shapes and layouts: a scalar, an empty tensor, a transposed view, and a
  // tensor on the rank's device.
  ASSERT_OK_AND_ASSIGN(Tensor scalar, Tensor::Full({}, 7.5));
  ASSERT_OK_AND_ASSIGN(Tensor empty, Tensor::Empty({0, 4}));
  ASSERT_OK_AND_ASSIGN(Tensor transposed, expected[0].T());
  ASSERT_OK_AND_ASSIGN(Tensor on_device, expected[1].To(DeviceOf(rank())));
  for (const auto& [name, tensor] :
       std::vector<std::pair<std::string, Tensor>>{{"scalar", scalar},
                                                   {"empty", empty},
                                                   {"transposed", transposed},
                                                   {"on_device", on_device}}) {
    state_dict.emplace_back(name, tensor);
    ASSERT_OK_AND_ASSIGN(expected.emplace_back(), tensor.To(Device::Cpu()));
  }
  SaveOptions save;
  save.block_bytes = 16;
  ASSERT_OK(SaveStateDict(state_dict, Dir(), save));

  ASSERT_OK_AND_ASSIGN(StateDict loaded, LoadStateDict(Dir()));
  ASSERT_EQ(Names(state_dict), Names(loaded));
  for (size_t i = 0; i < expected.size(); ++i) {
    SCOPED_TRACE(loaded[i].first);
    const Tensor& got = std::get<Tensor>(loaded[i].second);
    EXPECT_EQ(expected[i].dtype(), got.dtype());
    EXPECT_EQ(expected[i].sizes(), got.sizes());
    EXPECT_TRUE(got.device().is_cpu());
    ASSERT_EQ(expected[i].nbytes(), got.nbytes());
    if (got.nbytes() == 0) continue;
    EXPECT_EQ(
        0, std::memcmp(expected[i].data_ptr(), got.data_ptr(), got.nbytes()));
  }
}

TESSERA_INSTANTIATE_FOR_DEVICES(TestShardedTensorChunked);

}  // namespace
}  // namespace tessera
