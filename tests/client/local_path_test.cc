// ShardClient's local path (client/local_path.h) against a shard owner in
// another process (local_path_peer): whole shards and regions into any
// destination, its fallbacks to the stream and the errors it keeps. The
// server side (LocalPathServer spoken to raw) is
// tests/server/serve/local_path_server_test.cc.
//
// Without a GPU the shared-memory path is what runs; the CUDA IPC case
// skips with a reason.
#include "client/local_path.h"

#include <signal.h>
#include <stdlib.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/shard_client.h"
#include "common/region.h"
#include "common/tensor/storage.h"
#include "common/tensor/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/subprocess.h"
#include "io/unix_socket.h"
#include "tests/client/local_path_peer.h"
#include "tests/testing/iota.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::IotaInt64;
using ::tessera::testing::kCudaId;
using ::tessera::testing::kHeapId;
using ::tessera::testing::kHeapKey;
using ::tessera::testing::kHeapSizes;
using ::tessera::testing::kLargeId;
using ::tessera::testing::kLargeKey;
using ::tessera::testing::kLargeSizes;
using ::tessera::testing::kSharedId;
using ::tessera::testing::kSharedKey;
using ::tessera::testing::kSharedSizes;
using ::tessera::testing::kStridedId;
using ::tessera::testing::kStridedKey;
using ::tessera::testing::kStridedSizes;
using ::tessera::testing::kTinyId;
using ::tessera::testing::kTinyKey;
using ::tessera::testing::kTinySizes;
using ::tessera::testing::PeerValue;
using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

// Bound on every wait of the test itself.
constexpr absl::Duration kWait = absl::Seconds(10);
// The local path's fetches never use the gRPC channel (connecting is
// lazy), and a fallback to it fails fast: nothing listens there.
constexpr char kNoGrpc[] = "127.0.0.1:1";

// `tensor` of the peer as the test expects it.
Tensor PeerExpected(const std::string& id) {
  if (id == kStridedId) {
    Tensor backing = IotaInt64({kStridedSizes[1], kStridedSizes[0]});
    for (int64_t i = 0; i < backing.numel(); ++i) {
      backing.data<int64_t>()[i] = PeerValue(kStridedKey, i);
    }
    absl::StatusOr<Tensor> t = backing.T();
    EXPECT_OK(t.status());
    absl::StatusOr<Tensor> c = t->Contiguous();
    EXPECT_OK(c.status());
    return *c;
  }
  int key = kSharedKey;
  std::vector<int64_t> sizes = kSharedSizes;
  if (id == kHeapId) {
    key = kHeapKey;
    sizes = kHeapSizes;
  } else if (id == kTinyId) {
    key = kTinyKey;
    sizes = kTinySizes;
  } else if (id == kLargeId) {
    key = kLargeKey;
    sizes = kLargeSizes;
  }
  Tensor tensor = IotaInt64(sizes);
  for (int64_t i = 0; i < tensor.numel(); ++i) {
    tensor.data<int64_t>()[i] = PeerValue(key, i);
  }
  return tensor;
}

Tensor RegionOf(const Tensor& tensor, const std::vector<int64_t>& offsets,
                const std::vector<int64_t>& sizes) {
  absl::StatusOr<Tensor> view = RegionView(tensor, offsets, sizes);
  EXPECT_OK(view.status());
  absl::StatusOr<Tensor> copy = view->Contiguous();
  EXPECT_OK(copy.status());
  return *copy;
}

FetchOptions Local(LocalPath path) {
  FetchOptions options;
  options.local_path = path;
  options.local_min_bytes = 0;  // The test shards are small.
  options.timeout = kWait;
  return options;
}

class LocalPeerTest : public ::testing::Test {
 protected:
  void SetUp() override { StartPeer(/*cuda=*/false); }

  void StartPeer(bool cuda) {
    char pattern[] = "/tmp/tessera_local_peer_XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    const std::string address_file = dir_ + "/addresses";
    SpawnOptions options;
    options.program = TESSERA_LOCAL_PATH_PEER_PATH;
    options.args = {"--address-file", address_file, "--lifetime", "300"};
    if (cuda) options.args.push_back("--cuda");
    options.log_path = dir_ + "/peer.log";
    ASSERT_OK_AND_ASSIGN(Subprocess peer, Subprocess::Spawn(options));
    peer_.emplace(std::move(peer));
    const absl::Time end = absl::Now() + absl::Seconds(30);
    while (!std::filesystem::exists(address_file)) {
      ASSERT_TRUE(peer_->running()) << peer_->LogTail();
      ASSERT_FALSE(peer_->WaitFor(absl::ZeroDuration()).has_value())
          << "peer exited: " << peer_->LogTail();
      ASSERT_LT(absl::Now(), end)
          << "peer never listened: " << peer_->LogTail();
      absl::SleepFor(absl::Milliseconds(10));
    }
    std::ifstream in(address_file);
    ASSERT_TRUE(std::getline(in, local_address_));
    ASSERT_TRUE(std::getline(in, data_plane_address_));
    client_ = ShardClient::Create(kNoGrpc, data_plane_address_, local_address_);
  }

  void TearDown() override {
    if (peer_.has_value()) {
      peer_->Signal(SIGTERM);
      if (!peer_->WaitFor(absl::Seconds(10)).has_value()) peer_->Kill();
    }
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // Fetches each box {offsets, sizes} of shard 0 of tensor `id` over the
  // local path (required) into a fresh contiguous destination and checks
  // its elements against the peer's (or `expected`).
  void ExpectBoxesOverTheLocalPath(
      const std::string& id,
      absl::Span<const std::vector<std::vector<int64_t>>> boxes,
      std::optional<Tensor> expected_values = std::nullopt) {
    const Tensor expected =
        expected_values.has_value() ? *expected_values : PeerExpected(id);
    for (const auto& box : boxes) {
      ASSERT_OK_AND_ASSIGN(
          Tensor destination,
          Tensor::Zeros(box[1], TensorOptions().WithDType(DType::kInt64)));
      ASSERT_OK(client_->FetchRegionInto(id, 0, box[0], destination,
                                         Local(LocalPath::kRequired)));
      EXPECT_TRUE(Equal(destination, RegionOf(expected, box[0], box[1])))
          << id << ", offsets " << box[0][0] << "," << box[0][1];
    }
  }

  std::string dir_;
  std::optional<Subprocess> peer_;
  std::string local_address_;
  std::string data_plane_address_;
  std::shared_ptr<ShardClient> client_;
};

TEST_F(LocalPeerTest, WholeShardOverTheLocalPath) {
  const Tensor expected = PeerExpected(kSharedId);
  ASSERT_OK_AND_ASSIGN(
      Tensor destination,
      Tensor::Zeros(kSharedSizes, TensorOptions().WithDType(DType::kInt64)));
  ASSERT_OK(client_->FetchShardInto(kSharedId, 0, destination,
                                    Local(LocalPath::kRequired)));
  EXPECT_TRUE(Equal(destination, expected));
  // Allocating, with progress reported once for all bytes.
  FetchOptions options = Local(LocalPath::kRequired);
  std::vector<int64_t> progress;
  options.on_chunk = [&](int64_t bytes) { progress.push_back(bytes); };
  ASSERT_OK_AND_ASSIGN(Shard shard, client_->FetchShard(kSharedId, 0, options));
  EXPECT_TRUE(Equal(shard.tensor, expected));
  EXPECT_EQ(shard.metadata.shard_sizes(), kSharedSizes);
  EXPECT_EQ(progress, std::vector<int64_t>({expected.numel() * 8}));
}

TEST_F(LocalPeerTest, RowRangesIntoContiguousDestinations) {
  // Whole rows of a row-major shard are one run of bytes of the memory
  // file, read straight into a contiguous host destination; a column range
  // is not, and is mapped and copied instead. Both give the same bytes.
  const std::vector<std::vector<int64_t>> boxes[] = {
      {{0, 0}, {1, 160}},    // the first row
      {{37, 0}, {29, 160}},  // rows from the middle of a page
      {{95, 0}, {1, 160}},   // the last row, ending at the file's end
      {{3, 1}, {50, 159}},   // not whole rows
  };
  ExpectBoxesOverTheLocalPath(kSharedId, boxes);
}

TEST_F(LocalPeerTest, LargeDenseRunsAreCopiedWhole) {
  // Over 16 MiB: the run is split between threads, each faulting in and
  // copying its own part of the mapping; every element lands.
  const std::vector<std::vector<int64_t>> boxes[] = {
      {{0, 0}, kLargeSizes},   // the whole shard
      {{3, 0}, {2098, 1000}},  // from the middle of a page to the file's end
      {{1, 0}, {2099, 1000}},  // ending mid-page
  };
  ExpectBoxesOverTheLocalPath(kLargeId, boxes);
  ASSERT_OK_AND_ASSIGN(
      Shard shard,
      client_->FetchShard(kLargeId, 0, Local(LocalPath::kRequired)));
  EXPECT_TRUE(Equal(shard.tensor, PeerExpected(kLargeId)));
}

TEST_F(LocalPeerTest, LargeWritesLandWholeAndNowhereElse) {
  // Over 16 MiB, from the middle of a page: the box is copied into the
  // lent file's mapping by several threads; the rows before it keep their
  // bytes.
  const std::vector<int64_t> offsets = {3, 0};
  const std::vector<int64_t> sizes = {kLargeSizes[0] - 3, kLargeSizes[1]};
  Tensor data = IotaInt64(sizes);
  for (int64_t i = 0; i < data.numel(); ++i) data.data<int64_t>()[i] = -i;
  RegionWriteOptions options;
  options.deadline = absl::Now() + kWait;
  options.local_min_bytes = 0;
  ASSERT_OK_AND_ASSIGN(
      const bool written,
      client_->WriteRegion(kLargeId, 0, offsets, data, options));
  ASSERT_TRUE(written) << "the local path did not take the write";
  ASSERT_OK_AND_ASSIGN(
      Shard shard, client_->FetchShard(kLargeId, 0, Local(LocalPath::kOff)));
  const Tensor expected = PeerExpected(kLargeId);
  EXPECT_TRUE(Equal(RegionOf(shard.tensor, {0, 0}, {3, kLargeSizes[1]}),
                    RegionOf(expected, {0, 0}, {3, kLargeSizes[1]})));
  EXPECT_TRUE(Equal(RegionOf(shard.tensor, offsets, sizes), data));
}

// Kilobytes of shared memory this process has mapped with filled page
// tables ("RssShmem" of /proc/self/status), or -1.
int64_t MappedSharedKiB() {
  std::ifstream status("/proc/self/status");
  std::string key;
  int64_t kib;
  while (status >> key) {
    if (key == "RssShmem:" && status >> kib) return kib;
  }
  return -1;
}

TEST_F(LocalPeerTest, WritesGoAroundANewMappingUntilFillingItPays) {
  // The first writes into the lent file go by pwrite: no page table of
  // this process fills; once they wrote 16 times the file's size, a write
  // fills the kept mapping's (client/local_path.cc, WriteIntoMappedRun).
  // Every write lands whole either way.
  const int64_t shard_kib = kLargeSizes[0] * kLargeSizes[1] * 8 / 1024;
  const int64_t before = MappedSharedKiB();
  ASSERT_GE(before, 0) << "no RssShmem in /proc/self/status";
  Tensor data = IotaInt64(kLargeSizes);
  RegionWriteOptions options;
  options.local_min_bytes = 0;
  for (int write = 0; write < 20; ++write) {
    for (int64_t i = 0; i < data.numel(); ++i) {
      data.data<int64_t>()[i] = write * 1000 - i;
    }
    options.deadline = absl::Now() + kWait;
    ASSERT_OK_AND_ASSIGN(
        const bool written,
        client_->WriteRegion(kLargeId, 0, {0, 0}, data, options));
    ASSERT_TRUE(written) << "the local path did not take write " << write;
    if (write == 0) {
      EXPECT_LT(MappedSharedKiB() - before, shard_kib / 4)
          << "the first write filled page tables";
    }
  }
  EXPECT_GT(MappedSharedKiB() - before, shard_kib * 9 / 10)
      << "twenty writes of the whole file never filled its mapping";
  ASSERT_OK_AND_ASSIGN(
      Shard shard, client_->FetchShard(kLargeId, 0, Local(LocalPath::kOff)));
  EXPECT_TRUE(Equal(shard.tensor, data));
}

TEST_F(LocalPeerTest, ReadsGoAroundANewMappingUntilFillingItPays) {
  // The same for reads of a dense run: the first go by pread; once they
  // read twice the file's size, a read fills the kept mapping's page
  // tables. Every read returns the shard's bytes either way.
  const int64_t shard_kib = kLargeSizes[0] * kLargeSizes[1] * 8 / 1024;
  const int64_t before = MappedSharedKiB();
  ASSERT_GE(before, 0) << "no RssShmem in /proc/self/status";
  const Tensor expected = PeerExpected(kLargeId);
  for (int read = 0; read < 6; ++read) {
    ASSERT_OK_AND_ASSIGN(
        Shard shard,
        client_->FetchShard(kLargeId, 0, Local(LocalPath::kRequired)));
    EXPECT_TRUE(Equal(shard.tensor, expected)) << "read " << read;
    if (read == 0) {
      EXPECT_LT(MappedSharedKiB() - before, shard_kib / 4)
          << "the first read filled page tables";
    }
  }
  EXPECT_GT(MappedSharedKiB() - before, shard_kib * 9 / 10)
      << "six reads of the whole file never filled its mapping";
}

TEST_F(LocalPeerTest, ReadsThroughAKeptMappingSeeLaterWrites) {
  // The first read keeps its mapping of the lent file for the next lease
  // (io/mapping_cache.h); a write in between (through a mapping of its
  // own) shows in the next reads, dense and strided.
  ASSERT_OK_AND_ASSIGN(
      Shard before,
      client_->FetchShard(kLargeId, 0, Local(LocalPath::kRequired)));
  ASSERT_TRUE(Equal(before.tensor, PeerExpected(kLargeId)));
  Tensor data = IotaInt64(kLargeSizes);
  for (int64_t i = 0; i < data.numel(); ++i) data.data<int64_t>()[i] = 7 - i;
  RegionWriteOptions options;
  options.deadline = absl::Now() + kWait;
  options.local_min_bytes = 0;
  ASSERT_OK_AND_ASSIGN(
      const bool written,
      client_->WriteRegion(kLargeId, 0, {0, 0}, data, options));
  ASSERT_TRUE(written) << "the local path did not take the write";
  const std::vector<std::vector<int64_t>> boxes[] = {
      {{0, 0}, kLargeSizes},           // dense: the whole shard
      {{0, 7}, {kLargeSizes[0], 3}}};  // strided: three columns
  ExpectBoxesOverTheLocalPath(kLargeId, boxes, data);
}

TEST_F(LocalPeerTest, RegionIntoAStridedDestination) {
  const Tensor expected = PeerExpected(kSharedId);
  const std::vector<int64_t> offsets = {5, 17}, sizes = {40, 70};
  // The destination is a transposed window of a larger zeroed tensor.
  ASSERT_OK_AND_ASSIGN(
      Tensor outer,
      Tensor::Zeros({80, 50}, TensorOptions().WithDType(DType::kInt64)));
  ASSERT_OK_AND_ASSIGN(Tensor window, outer.Narrow(1, 3, 40));
  ASSERT_OK_AND_ASSIGN(Tensor destination, window.Narrow(0, 2, 70));
  ASSERT_OK_AND_ASSIGN(destination, destination.T());
  ASSERT_EQ(destination.sizes(), sizes);
  ASSERT_FALSE(destination.is_contiguous());
  ASSERT_OK(client_->FetchRegionInto(kSharedId, 0, offsets, destination,
                                     Local(LocalPath::kRequired)));
  EXPECT_TRUE(
      Equal(*destination.Contiguous(), RegionOf(expected, offsets, sizes)));
  // Nothing outside the window was written.
  int64_t nonzero = 0;
  for (int64_t i = 0; i < outer.numel(); ++i) {
    nonzero += outer.data<int64_t>()[i] != 0;
  }
  EXPECT_EQ(nonzero, 40 * 70);
}

TEST_F(LocalPeerTest, StridedShardWholeAndRegion) {
  const Tensor expected = PeerExpected(kStridedId);
  ASSERT_OK_AND_ASSIGN(
      Shard shard,
      client_->FetchShard(kStridedId, 0, Local(LocalPath::kRequired)));
  EXPECT_TRUE(Equal(shard.tensor, expected));
  ASSERT_OK_AND_ASSIGN(
      Tensor box,
      Tensor::Zeros({10, 3}, TensorOptions().WithDType(DType::kInt64)));
  ASSERT_OK(client_->FetchRegionInto(kStridedId, 0, {60, 117}, box,
                                     Local(LocalPath::kRequired)));
  EXPECT_TRUE(Equal(box, RegionOf(expected, {60, 117}, {10, 3})));
}

TEST_F(LocalPeerTest, UnshareableMemoryFallsBackToTheStream) {
  for (const char* id : {kHeapId, kTinyId}) {
    SCOPED_TRACE(id);
    ASSERT_OK_AND_ASSIGN(Shard shard,
                         client_->FetchShard(id, 0, Local(LocalPath::kAuto)));
    EXPECT_TRUE(Equal(shard.tensor, PeerExpected(id)));
    EXPECT_THAT(
        client_->FetchShard(id, 0, Local(LocalPath::kRequired)).status(),
        StatusIs(absl::StatusCode::kFailedPrecondition,
                 HasSubstr("cannot be shared")));
  }
  // kOff takes the stream even for shareable memory.
  ASSERT_OK_AND_ASSIGN(
      Shard shard, client_->FetchShard(kSharedId, 0, Local(LocalPath::kOff)));
  EXPECT_TRUE(Equal(shard.tensor, PeerExpected(kSharedId)));
}

TEST_F(LocalPeerTest, UnreachableOrForeignAddressesFallBack) {
  const std::vector<std::string> addresses = {
      LocalAddress(HostId(), "tessera-no-such-socket"),
      LocalAddress("00000000-0000-0000-0000-000000000000",
                   ParseLocalAddress(local_address_)->second),
      "malformed",
  };
  const std::vector<std::string> reasons = {"cannot be taken", "another host",
                                            "malformed local address"};
  for (size_t i = 0; i < addresses.size(); ++i) {
    SCOPED_TRACE(addresses[i]);
    const auto client =
        ShardClient::Create(kNoGrpc, data_plane_address_, addresses[i]);
    EXPECT_THAT(
        client->FetchShard(kSharedId, 0, Local(LocalPath::kRequired)).status(),
        StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr(reasons[i])));
    for (int repeat = 0; repeat < 2; ++repeat) {
      ASSERT_OK_AND_ASSIGN(
          Shard shard,
          client->FetchShard(kSharedId, 0, Local(LocalPath::kAuto)));
      EXPECT_TRUE(Equal(shard.tensor, PeerExpected(kSharedId)));
    }
  }
  // No local address at all.
  const auto plain = ShardClient::Create(kNoGrpc, data_plane_address_);
  EXPECT_THAT(
      plain->FetchShard(kSharedId, 0, Local(LocalPath::kRequired)).status(),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               HasSubstr("no local address")));
}

// kAuto judges by the shard (owners lend none below kLocalPathMinBytes):
// any box of a larger shard, however small, takes the local path.
TEST_F(LocalPeerTest, SmallShardsTakeTheStreamUnderAuto) {
  // The stream reaches nothing here, so which path a fetch took shows.
  const auto client =
      ShardClient::Create(kNoGrpc, "127.0.0.1:1", local_address_);
  ASSERT_OK_AND_ASSIGN(
      Tensor box,
      Tensor::Zeros({10, 10}, TensorOptions().WithDType(DType::kInt64)));
  FetchOptions options = Local(LocalPath::kAuto);
  options.local_min_bytes = kLocalPathMinBytes;  // The default.
  // The shard's size unknown: judged by the 800-byte destination.
  EXPECT_THAT(client->FetchRegionInto(kSharedId, 0, {3, 4}, box, options),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("")));
  // Known (120 KiB): the local path, for the same small box.
  const int64_t shared_bytes = kSharedSizes[0] * kSharedSizes[1] * 8;
  ASSERT_GE(shared_bytes, kLocalPathMinBytes);
  options.shard_bytes = shared_bytes;
  EXPECT_OK(client->FetchRegionInto(kSharedId, 0, {3, 4}, box, options));
  EXPECT_TRUE(Equal(box, RegionOf(PeerExpected(kSharedId), {3, 4}, {10, 10})));
  // A shard known to be small: the stream, whatever the box.
  options.shard_bytes = kTinySizes[0] * kTinySizes[1] * 8;
  ASSERT_OK_AND_ASSIGN(
      Tensor tiny_box,
      Tensor::Zeros({2, 2}, TensorOptions().WithDType(DType::kInt64)));
  EXPECT_THAT(client->FetchRegionInto(kTinyId, 0, {1, 1}, tiny_box, options),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("")));
  // An allocating fetch (size unknown) takes the local path.
  options.shard_bytes = -1;
  EXPECT_OK(client->FetchShard(kSharedId, 0, options).status());
}

// Writes are judged as reads are: a small box of a shard the owner lends
// goes over the local path (through a writable mapping kept from one write
// to the next), a box of a shard too small to be lent over the stream.
TEST_F(LocalPeerTest, SmallWritesOfLentShardsTakeTheLocalPath) {
  // The stream reaches nothing here, so which path a write took shows.
  const auto client =
      ShardClient::Create(kNoGrpc, "127.0.0.1:1", local_address_);
  RegionWriteOptions options;
  options.deadline = absl::Now() + kWait;
  ASSERT_EQ(options.local_min_bytes, kLocalPathMinBytes);  // The default.
  const std::vector<int64_t> offsets = {5, 0};
  const std::vector<int64_t> sizes = {2, kSharedSizes[1]};  // 2560 bytes.
  Tensor data = IotaInt64(sizes);
  // The shard's size unknown: judged by the box, the stream.
  EXPECT_THAT(client->WriteRegion(kSharedId, 0, offsets, data, options),
              StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
  // Known (120 KiB): the local path, the same mapping write after write,
  // every write seen by the next read.
  options.shard_bytes = kSharedSizes[0] * kSharedSizes[1] * 8;
  for (int round = 0; round < 3; ++round) {
    for (int64_t i = 0; i < data.numel(); ++i) {
      data.data<int64_t>()[i] = 1000 * round - i;
    }
    ASSERT_OK_AND_ASSIGN(
        const bool written,
        client->WriteRegion(kSharedId, 0, offsets, data, options));
    ASSERT_TRUE(written);
    ASSERT_OK_AND_ASSIGN(
        Shard shard,
        client->FetchShard(kSharedId, 0, Local(LocalPath::kRequired)));
    EXPECT_TRUE(Equal(RegionOf(shard.tensor, offsets, sizes), data));
    EXPECT_TRUE(
        Equal(RegionOf(shard.tensor, {0, 0}, {5, kSharedSizes[1]}),
              RegionOf(PeerExpected(kSharedId), {0, 0}, {5, kSharedSizes[1]})));
  }
  // A shard known to be small: the stream, whatever the box.
  options.shard_bytes = kTinySizes[0] * kTinySizes[1] * 8;
  ASSERT_OK_AND_ASSIGN(Tensor tiny,
                       Tensor::Zeros({1, kTinySizes[1]},
                                     TensorOptions().WithDType(DType::kInt64)));
  EXPECT_THAT(client->WriteRegion(kTinyId, 0, {1, 0}, tiny, options),
              StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
}

TEST(HostShardBytesTest, ElementsTimesWidthOfHostShardsOnly) {
  v1::ShardedTensorMetadata metadata;
  metadata.mutable_tensor_properties()->set_dtype(v1::DTYPE_FLOAT64);
  v1::ShardMetadata* shard = metadata.add_shards_metadata();
  shard->add_shard_sizes(96);
  shard->add_shard_sizes(160);
  shard->mutable_placement()->mutable_device()->set_type(v1::DEVICE_TYPE_CPU);
  v1::ShardMetadata* empty = metadata.add_shards_metadata();
  empty->add_shard_sizes(0);
  empty->mutable_placement()->mutable_device()->set_type(v1::DEVICE_TYPE_CPU);
  v1::ShardMetadata* gpu = metadata.add_shards_metadata();
  gpu->add_shard_sizes(1 << 20);
  gpu->mutable_placement()->mutable_device()->set_type(v1::DEVICE_TYPE_CUDA);
  metadata.add_shards_metadata()->add_shard_sizes(1 << 20);  // Unplaced.
  EXPECT_EQ(HostShardBytes(metadata, 0), 96 * 160 * 8);
  EXPECT_EQ(HostShardBytes(metadata, 1), 0);
  EXPECT_EQ(HostShardBytes(metadata, 2), -1);  // On a GPU.
  EXPECT_EQ(HostShardBytes(metadata, 3), -1);  // Nowhere said.
  EXPECT_EQ(HostShardBytes(metadata, 4), -1);  // No such shard.
  shard->add_shard_sizes(int64_t{1} << 62);    // More than an int64_t.
  EXPECT_EQ(HostShardBytes(metadata, 0), -1);
  metadata.mutable_tensor_properties()->set_dtype(v1::DTYPE_UNSPECIFIED);
  EXPECT_EQ(HostShardBytes(metadata, 1), -1);
}

TEST_F(LocalPeerTest, TheOwnersVerdictIsNotMaskedByAFallback) {
  // A fallback would reach nothing (UNAVAILABLE): these errors can only be
  // the local server's.
  const auto client =
      ShardClient::Create(kNoGrpc, "127.0.0.1:1", local_address_);
  EXPECT_THAT(
      client->FetchShard("nope", 0, Local(LocalPath::kAuto)).status(),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("unknown tensor nope")));
  EXPECT_THAT(
      client->FetchShard(kSharedId, 3, Local(LocalPath::kAuto)).status(),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("not served")));
  ASSERT_OK_AND_ASSIGN(
      Tensor box,
      Tensor::Zeros({10, 10}, TensorOptions().WithDType(DType::kInt64)));
  EXPECT_THAT(client->FetchRegionInto(kSharedId, 0, {90, 0}, box,
                                      Local(LocalPath::kAuto)),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("")));
  // A destination that does not match is the caller's error.
  ASSERT_OK_AND_ASSIGN(Tensor wrong, Tensor::Zeros({3, 3}));
  EXPECT_THAT(
      client->FetchShardInto(kSharedId, 0, wrong, Local(LocalPath::kAuto)),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("does not match")));
  // And the stream really is unreachable.
  EXPECT_THAT(client->FetchShard(kSharedId, 0, Local(LocalPath::kOff)).status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("")));
}

TEST_F(LocalPeerTest, ConcurrentFetches) {
  const Tensor expected = PeerExpected(kSharedId);
  constexpr int kThreads = 8;
  constexpr int kFetches = 25;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kFetches; ++i) {
        const int64_t row = (t * 13 + i * 7) % 90;
        const int64_t col = (t * 29 + i * 11) % 150;
        const std::vector<int64_t> offsets = {row, col};
        const std::vector<int64_t> sizes = {96 - row, 160 - col};
        absl::StatusOr<Tensor> box =
            Tensor::Zeros(sizes, TensorOptions().WithDType(DType::kInt64));
        absl::Status status =
            box.ok() ? client_->FetchRegionInto(kSharedId, 0, offsets, *box,
                                                Local(LocalPath::kRequired))
                     : box.status();
        if (!status.ok() || !Equal(*box, RegionOf(expected, offsets, sizes))) {
          ADD_FAILURE() << "thread " << t << " fetch " << i << ": " << status;
          ++failures;
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST_F(LocalPeerTest, ADeadOwnerFailsFastInsteadOfHanging) {
  ASSERT_OK(client_->FetchShard(kSharedId, 0, Local(LocalPath::kRequired))
                .status());  // Pools a connection.
  peer_->Kill();
  peer_.reset();
  const absl::Time start = absl::Now();
  EXPECT_THAT(
      client_->FetchShard(kSharedId, 0, Local(LocalPath::kAuto)).status(),
      StatusIs(absl::StatusCode::kUnavailable, HasSubstr("")));
  EXPECT_THAT(
      client_->FetchShard(kSharedId, 0, Local(LocalPath::kRequired)).status(),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("")));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

class LocalPeerCudaTest : public LocalPeerTest {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) {
      GTEST_SKIP() << "no CUDA device visible: the CUDA IPC path needs a GPU";
    }
    StartPeer(/*cuda=*/true);
  }
};

TEST_F(LocalPeerCudaTest, CudaShardOverIpcIntoHostAndDevice) {
  const Tensor expected = PeerExpected(kSharedId);
  ASSERT_OK_AND_ASSIGN(
      Shard on_host,
      client_->FetchShard(kCudaId, 0, Local(LocalPath::kRequired)));
  EXPECT_TRUE(Equal(on_host.tensor, expected));
  FetchOptions to_device = Local(LocalPath::kRequired);
  to_device.device = Device::Cuda(0);
  ASSERT_OK_AND_ASSIGN(Shard on_device,
                       client_->FetchShard(kCudaId, 0, to_device));
  EXPECT_TRUE(on_device.tensor.device().is_cuda());
  EXPECT_TRUE(Equal(on_device.tensor, expected));
  // A region into a strided device destination.
  ASSERT_OK_AND_ASSIGN(
      Tensor outer, Tensor::Zeros({40, 30}, TensorOptions()
                                                .WithDType(DType::kInt64)
                                                .WithDevice(Device::Cuda(0))));
  ASSERT_OK_AND_ASSIGN(Tensor destination, outer.T());
  ASSERT_OK(client_->FetchRegionInto(kCudaId, 0, {1, 2}, destination,
                                     Local(LocalPath::kRequired)));
  EXPECT_TRUE(Equal(destination, RegionOf(expected, {1, 2}, {30, 40})));
}

}  // namespace
}  // namespace tessera
