// Region reads and writes of named tensors (server/daemon/region_io.h) with two
// ranks as threads of this process, each serving a ControlService that
// holds only ReadRegion and WriteRegion, on its real shard server (gRPC and
// the data plane) on 127.0.0.1. A 2 x 2 grid of shards, two on each rank,
// so that every region mixes local copies and remote transfers.
#include "server/daemon/region_io.h"

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "client/region_transfer.h"
#include "client/shard_client.h"
#include "common/proto_convert.h"
#include "common/region.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server.h"
#include "gtest/gtest.h"
#include "server/rank/rank.h"
#include "server/store/hash_store.h"
#include "tessera/v1/control.grpc.pb.h"
#include "tests/testing/status_matchers.h"
#include "wire/grpc_status.h"
#include "xxhash.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int kWorldSize = 2;
constexpr char kName[] = "w";
constexpr char kTensorId[] = "w/0";
// 40 x 300 float32 (48000 bytes); shards of 20 x 150.
const std::vector<int64_t> kSizes = {40, 300};
// Below the whole tensor, above every box the tests move.
constexpr int64_t kMaxRegionBytes = 32 << 10;

// Bytes that differ from element to element and from seed to seed.
Tensor Pattern(const std::vector<int64_t>& sizes, uint32_t seed) {
  Tensor tensor = *Tensor::Empty(sizes);
  float* values = tensor.data<float>();
  for (int64_t i = 0; i < tensor.numel(); ++i) {
    values[i] = static_cast<float>(seed * 100000 + i);
  }
  return tensor;
}

ShardMetadata Box(std::vector<int64_t> offsets, std::vector<int64_t> sizes,
                  int rank = -1) {
  std::optional<RemoteDevice> placement;
  if (rank >= 0) placement = RemoteDevice::ForRank(rank, Device::Cpu());
  return *ShardMetadata::Create(std::move(offsets), std::move(sizes),
                                placement);
}

// The 2 x 2 grid: shards 0 and 3 on rank 0, shards 1 and 2 on rank 1.
v1::TensorInfo GridInfo() {
  ShardedTensorMetadata metadata;
  metadata.size = kSizes;
  const int ranks[] = {0, 1, 1, 0};
  v1::TensorInfo info;
  info.set_name(kName);
  info.set_tensor_id(kTensorId);
  for (int i = 0; i < 4; ++i) {
    metadata.shards_metadata.push_back(
        Box({20 * (i / 2), 150 * (i % 2)}, {20, 150}, ranks[i]));
    info.add_shard_ranks(ranks[i]);
  }
  *info.mutable_metadata() = ToProto(metadata);
  return info;
}

// A ControlService with the region calls as the daemon wires them, plus
// GetCluster and DescribeTensor answered from the test's table, enough for
// the client library's reads and writes.
class RegionService final
    : public v1::ControlService::WithRawCallbackMethod_ReadRegion<
          v1::ControlService::CallbackService> {
 public:
  explicit RegionService(RegionEnv env) : env_(std::move(env)) {}

  // Set once every rank listens, before any client connects.
  void set_cluster(v1::ClusterInfo cluster) { cluster_ = std::move(cluster); }

  grpc::ServerUnaryReactor* GetCluster(grpc::CallbackServerContext* context,
                                       const v1::GetClusterRequest* request,
                                       v1::ClusterInfo* response) override {
    *response = cluster_;
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  grpc::ServerUnaryReactor* DescribeTensor(
      grpc::CallbackServerContext* context,
      const v1::DescribeNamedTensorRequest* request,
      v1::TensorInfo* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    absl::StatusOr<v1::TensorInfo> info = env_.resolve(request->name());
    if (info.ok()) *response = *info;
    reactor->Finish(ToGrpcStatus(info.status()));
    return reactor;
  }

  grpc::ServerWriteReactor<grpc::ByteBuffer>* ReadRegion(
      grpc::CallbackServerContext* context,
      const grpc::ByteBuffer* request) override {
    ShardServiceOptions chunks;
    chunks.default_chunk_bytes = 4096;
    return StartReadRegion(context, request, env_, chunks);
  }

  grpc::ServerReadReactor<v1::WriteRegionChunk>* WriteRegion(
      grpc::CallbackServerContext* context,
      v1::WriteRegionResponse* response) override {
    return StartWriteRegion(context, response, env_);
  }

 private:
  const RegionEnv env_;
  v1::ClusterInfo cluster_;
};

class RegionIoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    global_ = Pattern(kSizes, 1);
    info_ = GridInfo();
    ranks_.resize(kWorldSize);
    services_.resize(kWorldSize);
    auto store = std::make_shared<HashStore>();
    store->set_timeout(absl::Seconds(30));
    OnEveryRank([&](int r) {
      RankOptions options;
      options.rank = r;
      options.world_size = kWorldSize;
      options.store = store;
      options.timeout = absl::Seconds(30);
      ASSERT_OK_AND_ASSIGN(ranks_[r], Rank::Init(options));
      RegionEnv env;
      env.rank = ranks_[r];
      env.resolve =
          [this](const std::string& name) -> absl::StatusOr<v1::TensorInfo> {
        if (name != kName) {
          return absl::NotFoundError(absl::StrCat("no tensor named ", name));
        }
        return info_;
      };
      env.max_region_bytes = kMaxRegionBytes;
      services_[r] = std::make_unique<RegionService>(std::move(env));
      RpcOptions rpc;
      rpc.services = {services_[r].get()};
      rpc.health_and_reflection = true;
      ASSERT_OK(ranks_[r]->InitRpc(rpc));
      ASSERT_OK(ranks_[r]->registry().Register(kTensorId, LocalShards(r)));
    });
    for (int r = 0; r < kWorldSize; ++r) ASSERT_NE(ranks_[r], nullptr);
    v1::ClusterInfo cluster;
    cluster.set_world_size(kWorldSize);
    for (int r = 0; r < kWorldSize; ++r) {
      ASSERT_OK_AND_ASSIGN(WorkerInfo worker, ranks_[r]->Worker(r));
      v1::WorkerAddress* address = cluster.add_workers();
      address->set_rank(r);
      address->set_name(worker.name);
      address->set_address(worker.address);
      address->set_data_address(worker.data_plane_address);
      address->set_device("cpu");
    }
    for (int r = 0; r < kWorldSize; ++r) {
      cluster.set_rank(r);
      services_[r]->set_cluster(cluster);
    }
  }

  void TearDown() override {
    OnEveryRank([&](int r) {
      if (ranks_[r] != nullptr) {
        EXPECT_OK(ranks_[r]->Shutdown());
      }
    });
  }

  void OnEveryRank(const std::function<void(int)>& body) {
    std::vector<std::thread> threads;
    for (int r = 0; r < kWorldSize; ++r) threads.emplace_back(body, r);
    for (std::thread& thread : threads) thread.join();
  }

  // Rank r's shards of the grid, cut from global_.
  std::shared_ptr<RegisteredTensor> LocalShards(int r) {
    auto registered = std::make_shared<RegisteredTensor>();
    registered->metadata = std::make_shared<const ShardedTensorMetadata>(
        *FromProto(info_.metadata()));
    for (int i = 0; i < info_.shard_ranks_size(); ++i) {
      if (info_.shard_ranks(i) != r) continue;
      const ShardMetadata& shard = registered->metadata->shards_metadata[i];
      Tensor bytes =
          *RegionView(global_, shard.shard_offsets(), shard.shard_sizes())
               ->Clone();
      registered->local_shards.push_back(LocalShard{i, bytes});
    }
    return registered;
  }

  // The tensor as the ranks hold it now, assembled from their registries.
  Tensor Held() {
    Tensor held = *Tensor::Zeros(kSizes);
    for (const auto& rank : ranks_) {
      const auto registered = rank->registry().Find(kTensorId);
      for (const LocalShard& local : registered->local_shards) {
        const ShardMetadata& shard =
            registered->metadata->shards_metadata[local.index];
        EXPECT_OK(CopyBox(local.tensor, std::vector<int64_t>(kSizes.size(), 0),
                          held, shard.shard_offsets(), shard.shard_sizes()));
      }
    }
    return held;
  }

  std::unique_ptr<v1::ControlService::Stub> Stub(int r) {
    return v1::ControlService::NewStub(grpc::CreateChannel(
        ranks_[r]->rpc_address(), grpc::InsecureChannelCredentials()));
  }

  // ReadRegion on rank r, as a client receives it.
  absl::StatusOr<Tensor> Read(int r, std::vector<int64_t> offsets,
                              std::vector<int64_t> sizes,
                              const std::string& tensor_id = "",
                              const std::string& name = kName,
                              std::optional<ShardMetadata>* header = nullptr) {
    v1::ReadRegionRequest request;
    request.set_name(name);
    request.set_tensor_id(tensor_id);
    request.mutable_offsets()->Add(offsets.begin(), offsets.end());
    request.mutable_sizes()->Add(sizes.begin(), sizes.end());
    ShardAssembler assembler(name, 0, Device::Cpu(), false);
    RETURN_IF_ERROR(ReceiveChunkStream(
        NewShardChannel(ranks_[r]->rpc_address()),
        "/tessera.v1.ControlService/ReadRegion", request,
        absl::Now() + absl::Seconds(20), "ReadRegion", &assembler));
    if (header != nullptr) *header = assembler.metadata();
    return assembler.destination();
  }

  absl::Status Write(int r, std::vector<int64_t> offsets, const Tensor& data,
                     const std::string& tensor_id = kTensorId) {
    RegionWriteOptions options;
    options.chunk_bytes = 4096;
    options.deadline = absl::Now() + absl::Seconds(20);
    ASSIGN_OR_RETURN(int64_t written, WriteRegion(*Stub(r), kName, tensor_id,
                                                  offsets, data, options));
    if (written != static_cast<int64_t>(data.nbytes())) {
      return absl::InternalError(absl::StrCat("wrote ", written));
    }
    return absl::OkStatus();
  }

  // Sends hand-made WriteRegion messages to rank 0.
  absl::Status SendRaw(const std::vector<v1::WriteRegionChunk>& chunks) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
    v1::WriteRegionResponse response;
    auto stub = Stub(0);
    auto writer = stub->WriteRegion(&context, &response);
    for (const v1::WriteRegionChunk& chunk : chunks) {
      if (!writer->Write(chunk)) break;
    }
    writer->WritesDone();
    return FromGrpcStatus(writer->Finish());
  }

  // A correct stream writing `data` at `offsets`, in chunks of `chunk`.
  static std::vector<v1::WriteRegionChunk> Stream(std::vector<int64_t> offsets,
                                                  const Tensor& data,
                                                  size_t chunk = 4096) {
    const std::string bytes(static_cast<const char*>(data.data_ptr()),
                            data.nbytes());
    std::vector<v1::WriteRegionChunk> chunks;
    size_t at = 0;
    do {
      v1::WriteRegionChunk message;
      if (chunks.empty()) {
        v1::WriteRegionHeader* header = message.mutable_header();
        header->set_name(kName);
        header->mutable_offsets()->Add(offsets.begin(), offsets.end());
        header->mutable_sizes()->Add(data.sizes().begin(), data.sizes().end());
        header->set_dtype(ToProto(data.dtype()));
        header->set_total_bytes(static_cast<int64_t>(bytes.size()));
      }
      message.set_offset(static_cast<int64_t>(at));
      message.set_data(bytes.substr(at, chunk));
      message.set_checksum(
          XXH3_64bits(message.data().data(), message.data().size()));
      at += message.data().size();
      chunks.push_back(std::move(message));
    } while (at < bytes.size());
    return chunks;
  }

  Tensor global_;
  v1::TensorInfo info_;
  std::vector<std::shared_ptr<Rank>> ranks_;
  std::vector<std::unique_ptr<RegionService>> services_;
};

TEST_F(RegionIoTest, ReadsRegionsAcrossLocalAndRemoteShards) {
  struct Case {
    std::vector<int64_t> offsets, sizes;
  };
  for (const Case& c : std::vector<Case>{{{12, 100}, {20, 120}},  // 4 shards
                                         {{0, 0}, {20, 150}},     // 1 shard
                                         {{25, 140}, {15, 20}},   // 2 shards
                                         {{39, 299}, {1, 1}},
                                         {{40, 0}, {0, 300}}}) {
    ASSERT_OK_AND_ASSIGN(Tensor expected,
                         RegionView(global_, c.offsets, c.sizes));
    for (int r = 0; r < kWorldSize; ++r) {
      SCOPED_TRACE(absl::StrCat("rank ", r, " offsets ", c.offsets[0], ",",
                                c.offsets[1]));
      std::optional<ShardMetadata> header;
      ASSERT_OK_AND_ASSIGN(
          Tensor read, Read(r, c.offsets, c.sizes, kTensorId, kName, &header));
      EXPECT_TRUE(Equal(read, *expected.Contiguous()));
      ASSERT_TRUE(header.has_value());
      EXPECT_EQ(*header, Box(c.offsets, c.sizes, r));
    }
  }
}

TEST_F(RegionIoTest, WritesRegionsIntoLocalAndForwardedShards) {
  const Tensor data = Pattern({25, 150}, 7);
  // Rank 1 receives it: shards 1 and 2 are its own, 0 and 3 go to rank 0.
  ASSERT_OK(Write(1, {10, 100}, data));
  Tensor expected = *global_.Clone();
  ASSERT_OK(CopyBox(data, {0, 0}, expected, {10, 100}, {25, 150}));
  EXPECT_TRUE(Equal(Held(), expected));
  // A strided source, written through rank 0.
  const Tensor wide = Pattern({150, 25}, 9);
  ASSERT_OK_AND_ASSIGN(Tensor transposed, wide.T());
  ASSERT_OK(Write(0, {5, 0}, transposed));
  ASSERT_OK(CopyBox(transposed, {0, 0}, expected, {5, 0}, {25, 150}));
  EXPECT_TRUE(Equal(Held(), expected));
  // What was written reads back through either rank.
  ASSERT_OK_AND_ASSIGN(Tensor read, Read(1, {0, 0}, {40, 150}));
  ASSERT_OK_AND_ASSIGN(Tensor left, RegionView(expected, {0, 0}, {40, 150}));
  EXPECT_TRUE(Equal(read, *left.Contiguous()));
}

TEST_F(RegionIoTest, BadReadsAreClearErrors) {
  EXPECT_THAT(Read(0, {0, 0}, {1, 1}, "", "nope"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("nope")));
  EXPECT_THAT(Read(0, {0, 0}, {1, 1}, "w/7"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("is now w/0, not w/7")));
  EXPECT_THAT(Read(1, {30, 0}, {11, 10}),
              StatusIs(absl::StatusCode::kOutOfRange,
                       HasSubstr("leaves the tensor (sizes [40, 300])")));
  EXPECT_THAT(Read(0, {0}, {1}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("for a tensor of 2 dimensions")));
  EXPECT_THAT(
      Read(0, {0, -1}, {1, 1}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("negative")));
  EXPECT_THAT(Read(0, {0, 0}, {int64_t{1} << 40, int64_t{1} << 40}),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("leaves")));
  EXPECT_THAT(Read(0, {0, 0}, kSizes),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("exceeds this daemon's limit")));
  // The daemon still serves.
  EXPECT_OK(Read(0, {0, 0}, {2, 2}).status());
}

TEST_F(RegionIoTest, BadWritesAreClearErrorsAndWriteNothing) {
  // 16000 bytes: chunks of 4096 at 0, 4096, 8192 and 12288.
  const Tensor data = Pattern({20, 200}, 3);
  EXPECT_THAT(Write(0, {0, 0}, data, "w/9"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("resharded or re-created")));
  EXPECT_THAT(Write(0, {30, 0}, data),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("leaves")));
  EXPECT_THAT(Write(0, {0, 0, 0}, *data.View({20, 200, 1})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("3 offsets and 3 sizes")));
  const Tensor doubles =
      *Tensor::Zeros({2, 2}, TensorOptions().WithDType(DType::kFloat64));
  EXPECT_THAT(Write(0, {0, 0}, doubles),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("the data is float64 but the tensor is "
                                 "float32")));

  const std::vector<v1::WriteRegionChunk> chunks = Stream({0, 0}, data);
  ASSERT_EQ(chunks.size(), 4u);
  const auto with =
      [&](const std::function<void(std::vector<v1::WriteRegionChunk>&)>&
              change) {
        std::vector<v1::WriteRegionChunk> changed = chunks;
        change(changed);
        return SendRaw(changed);
      };
  EXPECT_THAT(with([](auto& c) { c[1].set_checksum(c[1].checksum() ^ 1); }),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("chunk at offset 4096: checksum mismatch")));
  EXPECT_THAT(with([](auto& c) { c.erase(c.begin() + 1); }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("expected offset 4096")));
  EXPECT_THAT(with([](auto& c) { c.pop_back(); }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("ended after 12288 of 16000 bytes")));
  EXPECT_THAT(with([](auto& c) { c[0].clear_header(); }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("first message carries no header")));
  EXPECT_THAT(with([](auto& c) { *c[2].mutable_header() = c[0].header(); }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("header repeated at offset 8192")));
  EXPECT_THAT(
      with([](auto& c) { c[0].mutable_header()->set_total_bytes(16004); }),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("total_bytes 16004 is not the 16000 bytes")));
  EXPECT_THAT(
      with([](auto& c) {
        c[3].mutable_data()->append("abcd");
        c[3].set_checksum(XXH3_64bits(c[3].data().data(), c[3].data().size()));
      }),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("overrun the region's 16000 bytes")));
  EXPECT_THAT(with([](auto& c) {
                c[0].mutable_header()->set_sizes(1, int64_t{1} << 50);
              }),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("leaves")));
  EXPECT_THAT(with([](auto& c) { c[0].mutable_header()->set_name("nope"); }),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("nope")));
  EXPECT_THAT(SendRaw({}), StatusIs(absl::StatusCode::kInvalidArgument,
                                    HasSubstr("without a header")));
  // Nothing was written, and the daemons still serve.
  EXPECT_TRUE(Equal(Held(), global_));
  ASSERT_OK(Write(0, {0, 0}, data));
  Tensor expected = *global_.Clone();
  ASSERT_OK(CopyBox(data, {0, 0}, expected, {0, 0}, {20, 200}));
  EXPECT_TRUE(Equal(Held(), expected));
}

TEST_F(RegionIoTest, ProgressOfAWriteCountsEveryByte) {
  const Tensor data = Pattern({30, 100}, 5);
  RegionWriteOptions options;
  options.chunk_bytes = 4096;
  options.deadline = absl::Now() + absl::Seconds(20);
  int64_t sent = 0;
  options.on_chunk = [&sent](int64_t bytes) { sent += bytes; };
  ASSERT_OK_AND_ASSIGN(
      const int64_t written,
      WriteRegion(*Stub(0), kName, "", {5, 100}, data, options));
  EXPECT_EQ(written, 12000);
  EXPECT_EQ(sent, 12000);
}

// ---- The client library against the same ranks ------------------------------

class ClientRegionTest : public RegionIoTest,
                         public ::testing::WithParamInterface<bool> {
 protected:
  std::shared_ptr<Client> Connect(int r) {
    ClientOptions options;
    options.data_plane = GetParam();
    options.timeout = absl::Seconds(20);
    absl::StatusOr<std::shared_ptr<Client>> client =
        Client::Connect(ranks_[r]->rpc_address(), options);
    EXPECT_OK(client.status());
    return client.ok() ? *client : nullptr;
  }
};

// Progress reports as client/client.h promises them: serialized, growing,
// ending at the total.
struct ProgressLog {
  absl::Mutex mu;
  bool concurrent = false;
  bool inside = false;
  std::vector<std::pair<int64_t, int64_t>> calls;

  ProgressFn Fn() {
    return [this](int64_t done, int64_t total) {
      {
        absl::MutexLock lock(&mu);
        concurrent |= inside;
        inside = true;
        calls.emplace_back(done, total);
      }
      absl::SleepFor(absl::Microseconds(50));
      absl::MutexLock lock(&mu);
      inside = false;
    };
  }

  void ExpectComplete(int64_t total) {
    absl::MutexLock lock(&mu);
    EXPECT_FALSE(concurrent);
    ASSERT_FALSE(calls.empty());
    for (size_t i = 1; i < calls.size(); ++i) {
      EXPECT_GE(calls[i].first, calls[i - 1].first);
    }
    EXPECT_EQ(calls.back(), std::make_pair(total, total));
  }
};

TEST_P(ClientRegionTest, ReadsRegionsStraightFromTheOwners) {
  std::shared_ptr<Client> client = Connect(1);
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(client->world_size(), kWorldSize);
  ASSERT_OK_AND_ASSIGN(ShardedTensorView view, client->Open(kName));
  EXPECT_EQ(view.tensor_id(), kTensorId);
  EXPECT_EQ(view.owner_rank(2), 1);
  TransferOptions options;
  options.chunk_bytes = 4096;
  ProgressLog log;
  options.progress = log.Fn();
  ASSERT_OK_AND_ASSIGN(Tensor read,
                       view.ReadRegion({12, 100}, {20, 120}, options));
  ASSERT_OK_AND_ASSIGN(Tensor box, RegionView(global_, {12, 100}, {20, 120}));
  EXPECT_TRUE(Equal(read, *box.Contiguous()));
  log.ExpectComplete(20 * 120 * 4);
  // The whole tensor, beyond what one daemon call may carry.
  ASSERT_OK_AND_ASSIGN(Tensor all, view.Read());
  EXPECT_TRUE(Equal(all, global_));
  // Into a strided destination.
  ASSERT_OK_AND_ASSIGN(Tensor tall, Tensor::Zeros({300, 40}));
  ASSERT_OK_AND_ASSIGN(Tensor transposed, tall.T());
  ASSERT_OK(view.ReadRegionInto({0, 0}, transposed));
  EXPECT_TRUE(Equal(*transposed.Contiguous(), global_));
  // A whole remote shard.
  ASSERT_OK_AND_ASSIGN(Shard shard, view.remote_shards()[3].to_here());
  ASSERT_OK_AND_ASSIGN(Tensor fourth,
                       RegionView(global_, {20, 150}, {20, 150}));
  EXPECT_TRUE(Equal(shard.tensor, *fourth.Contiguous()));
  EXPECT_EQ(view.remote_shards()[3].owner().id, 0);

  EXPECT_THAT(view.ReadRegion({0, 290}, {1, 11}),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("leaves")));
  EXPECT_THAT(
      view.ReadRegion({0}, {1}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("2 dimensions")));
  ASSERT_OK_AND_ASSIGN(
      Tensor wrong,
      Tensor::Zeros({2, 2}, TensorOptions().WithDType(DType::kInt32)));
  EXPECT_THAT(
      view.ReadRegionInto({0, 0}, wrong),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dtype float32")));
  EXPECT_THAT(client->Open("nope"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("nope")));
}

TEST_P(ClientRegionTest, WritesEachOwnerItsPart) {
  std::shared_ptr<Client> client = Connect(0);
  ASSERT_NE(client, nullptr);
  ASSERT_OK_AND_ASSIGN(ShardedTensorView view, client->Open(kName));
  const Tensor data = Pattern({30, 200}, 11);
  TransferOptions options;
  options.chunk_bytes = 4096;
  options.parallelism = 2;
  ProgressLog log;
  options.progress = log.Fn();
  ASSERT_OK(view.Write({5, 50}, data, options));
  log.ExpectComplete(30 * 200 * 4);
  Tensor expected = *global_.Clone();
  ASSERT_OK(CopyBox(data, {0, 0}, expected, {5, 50}, {30, 200}));
  EXPECT_TRUE(Equal(Held(), expected));
  ASSERT_OK_AND_ASSIGN(Tensor all, view.Read());
  EXPECT_TRUE(Equal(all, expected));

  EXPECT_THAT(view.Write({20, 0}, data),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("leaves")));
  const Tensor doubles =
      *Tensor::Zeros({2, 2}, TensorOptions().WithDType(DType::kFloat64));
  EXPECT_THAT(
      view.Write({0, 0}, doubles),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dtype float32")));
  EXPECT_TRUE(Equal(Held(), expected));
}

TEST_P(ClientRegionTest, HealthOfEveryDaemon) {
  std::shared_ptr<Client> client = Connect(0);
  ASSERT_NE(client, nullptr);
  // A rank's health service starts NOT_SERVING until its owner is ready.
  ranks_[0]->rpc_server()->GetHealthCheckService()->SetServingStatus(true);
  std::vector<absl::Status> health = client->Health();
  ASSERT_EQ(health.size(), 2u);
  EXPECT_OK(health[0]);
  EXPECT_THAT(
      health[1],
      StatusIs(absl::StatusCode::kUnavailable,
               HasSubstr(absl::StrCat("rank 1) at ", ranks_[1]->rpc_address(),
                                      ": NOT_SERVING"))));
  ranks_[1]->rpc_server()->GetHealthCheckService()->SetServingStatus(true);
  EXPECT_THAT(client->Health(), ElementsAre(IsOk(), IsOk()));
}

INSTANTIATE_TEST_SUITE_P(Planes, ClientRegionTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "DataPlane" : "Grpc";
                         });

}  // namespace
}  // namespace tessera
