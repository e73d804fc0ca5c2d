// DeviceRanksTest: the fixture of the multi-rank ShardedTensor ports. A
// test runs in 4 real rank processes on loopback (real gRPC store, real
// Gloo, real shard servers) and is instantiated for "cpu" placements and
// for "cuda:N" placements, which need one visible GPU. Rank r's shards go
// on cuda:(r % device count), the device Rank::Init gives rank r, so on a
// one-GPU machine the 4 ranks share cuda:0: collectives still run over Gloo
// with host staging and remote shards still cross the shard servers, only
// the device ordinals coincide. A test must therefore compare devices with
// DeviceOf(r), never assume device index == rank.
//
//   class TestShardTensor : public DeviceRanksTest {};
//   TEST_P(TestShardTensor, ShardTensor) {
//     RANKS_TEST_BEGIN();
//     ASSERT_OK(InitComms());
//     ...
//   }
//   TESSERA_INSTANTIATE_FOR_DEVICES(TestShardTensor);
//
// Thread-safety: a fixture is used by one test thread.
#ifndef TESSERA_TESTS_INTEGRATION_DEVICE_RANKS_TEST_H_
#define TESSERA_TESTS_INTEGRATION_DEVICE_RANKS_TEST_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/device.h"
#include "common/shard_metadata.h"
#include "common/sharding_spec.h"
#include "common/status_macros.h"
#include "common/tensor/tensor.h"
#include "gtest/gtest.h"
#include "server/sharded/sharded_tensor.h"
#include "tests/testing/multi_process.h"

namespace tessera {

using Sizes = std::vector<int64_t>;

// A multi-rank test for one device kind: "cpu" or "cuda".
class DeviceRanksTest : public testing::MultiProcessTest,
                        public ::testing::WithParamInterface<std::string> {
 public:
  bool cuda() const { return GetParam() == "cuda"; }
  // The CUDA ordinal of rank r's shards: r % the visible device count (r
  // when none is visible, for a variant that is about to skip).
  static int CudaIndexOf(int r) {
    const int count = CudaDeviceCount();
    return count > 0 ? r % count : r;
  }
  // The device of rank r's shards: "cpu" or "cuda:<CudaIndexOf(r)>".
  std::string DeviceText(int r) const {
    return cuda() ? absl::StrCat("cuda:", CudaIndexOf(r)) : "cpu";
  }
  std::string Placement(int r) const {
    return absl::StrCat("rank:", r, "/", DeviceText(r));
  }
  Device DeviceOf(int r) const {
    return cuda() ? Device::Cuda(CudaIndexOf(r)) : Device::Cpu();
  }
  std::vector<std::string> Placements(std::vector<int> ranks) const {
    std::vector<std::string> out;
    for (int r : ranks) out.push_back(Placement(r));
    return out;
  }
  ShardMetadata Md(Sizes offsets, Sizes sizes, const std::string& placement) {
    auto md = ShardMetadata::Create(std::move(offsets), std::move(sizes),
                                    absl::string_view(placement));
    EXPECT_TRUE(md.ok()) << md.status();
    return *md;
  }
  // The 2x2 grid of 5x5 shards over a 10x10 tensor, shard r on rank r.
  absl::StatusOr<ShardingSpec> GridSpec(bool worker_names = false) {
    std::vector<ShardMetadata> shards;
    for (int r = 0; r < 4; ++r) {
      std::string owner =
          worker_names ? absl::StrCat("worker", r) : absl::StrCat("rank:", r);
      shards.push_back(Md({r / 2 * 5, r % 2 * 5}, {5, 5},
                          absl::StrCat(owner, "/", DeviceText(r))));
    }
    ASSIGN_OR_RETURN(EnumerableShardingSpec spec,
                     EnumerableShardingSpec::Create(std::move(shards)));
    return ShardingSpec(spec);
  }
  absl::StatusOr<ShardingSpec> Chunk(int64_t dim, std::vector<int> ranks) {
    ASSIGN_OR_RETURN(ChunkShardingSpec spec,
                     ChunkShardingSpec::Create(dim, Placements(ranks)));
    return ShardingSpec(spec);
  }
};

// The first statement of every test: skip the CUDA variant without a
// device (in the launcher, before any process starts), then start the rank
// processes. Ranks are spawned executables, not forks, so probing CUDA in
// the launcher leaves them a clean CUDA state.
#define RANKS_TEST_BEGIN()                                                \
  do {                                                                    \
    if (cuda() && CudaDeviceCount() < 1) {                                \
      GTEST_SKIP() << "needs a CUDA device, found " << CudaDeviceCount(); \
    }                                                                     \
    TESSERA_RUN_IN_RANKS();                                               \
  } while (false)

// Every remote shard's owner and fetched shard, checked by `check`.
template <typename Check>
void ForEachFetched(const RemoteShardMap& remote, Check check) {
  for (const auto& [owner, shards] : remote) {
    for (const RemoteShard& remote_shard : shards) {
      EXPECT_EQ(owner, remote_shard.owner().id);
      auto shard = remote_shard.to_here();
      ASSERT_TRUE(shard.ok()) << shard.status();
      check(owner, *shard);
    }
  }
}

inline ShardedTensorOptions Rrefs() {
  return ShardedTensorOptions().WithInitRrefs(true);
}

inline std::string DeviceName(
    const ::testing::TestParamInfo<std::string>& info) {
  return info.param;
}

#define TESSERA_INSTANTIATE_FOR_DEVICES(suite)                               \
  INSTANTIATE_TEST_SUITE_P(Devices, suite, ::testing::Values("cpu", "cuda"), \
                           DeviceName)

}  // namespace tessera

#endif  // TESSERA_TESTS_INTEGRATION_DEVICE_RANKS_TEST_H_
