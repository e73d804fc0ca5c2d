// CUDA shards served chunk by chunk through pinned staging buffers, over
// gRPC (ShardServiceImpl) and over the raw data plane (DataPlaneServer): real
// servers on 127.0.0.1, fetched by ShardClient to the CPU and to cuda:0,
// whole shards and strided regions, with every value checked; clients
// that give up mid-stream; several staging depths. Every test skips when no
// CUDA device is visible.
#include <cstring>
#include <memory>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/shard_client.h"
#include "common/region.h"
#include "gmock/gmock.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "server/serve/data_plane_server.h"
#include "server/serve/shard_registry.h"
#include "server/serve/shard_service.h"
#include "tests/testing/local_shard.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::testing::AnyOf;
using ::testing::HasSubstr;

enum class Transport { kGrpc, kDataPlane };

std::string TransportName(const ::testing::TestParamInfo<Transport>& info) {
  return info.param == Transport::kGrpc ? "Grpc" : "DataPlane";
}

void PrintTo(Transport transport, std::ostream* os) {
  *os << (transport == Transport::kGrpc ? "gRPC" : "data plane");
}

// A host tensor whose bytes differ from element to element.
Tensor Pattern(std::vector<int64_t> sizes, DType dtype, uint32_t seed = 1) {
  absl::StatusOr<Tensor> tensor =
      Tensor::Empty(sizes, TensorOptions().WithDType(dtype));
  EXPECT_OK(tensor.status());
  auto* bytes = static_cast<unsigned char*>(tensor->data_ptr());
  uint32_t state = seed * 2654435761u + 1;
  for (size_t i = 0; i < tensor->nbytes(); ++i) {
    state = state * 1664525u + 1013904223u;
    bytes[i] = static_cast<unsigned char>(state >> 24);
  }
  return *tensor;
}

// The elements of any tensor (CPU or CUDA, any strides) as row-major bytes.
std::string Bytes(const Tensor& tensor) {
  absl::StatusOr<Tensor> host =
      tensor.device().is_cpu() ? tensor.Contiguous() : tensor.To(Device::Cpu());
  EXPECT_OK(host.status());
  if (!host.ok()) return "";
  return std::string(static_cast<const char*>(host->data_ptr()),
                     host->nbytes());
}

FetchOptions Options(int64_t chunk_bytes,
                     absl::Duration timeout = absl::Seconds(60)) {
  FetchOptions options;
  options.chunk_bytes = chunk_bytes;
  options.timeout = timeout;
  return options;
}

FetchOptions ToCuda(int64_t chunk_bytes) {
  FetchOptions options = Options(chunk_bytes);
  options.device = Device::Cuda(0);
  return options;
}

class CudaFetchTest : public ::testing::TestWithParam<Transport> {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    StartServers({});
  }

  void TearDown() override { StopServers(); }

  void StartServers(ShardServiceOptions options) {
    service_ = std::make_unique<ShardServiceImpl>(registry_, options);
    grpc::ServerBuilder builder;
    ConfigureShardServer(&builder);
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port);
    builder.RegisterService(service_.get());
    grpc_server_ = builder.BuildAndStart();
    ASSERT_NE(grpc_server_, nullptr);
    const std::string address = absl::StrCat("127.0.0.1:", port);
    DataPlaneServerOptions data_plane_options;
    data_plane_options.chunks = options;
    ASSERT_OK_AND_ASSIGN(
        data_plane_server_,
        DataPlaneServer::Start("127.0.0.1", registry_, data_plane_options));
    client_ = GetParam() == Transport::kGrpc
                  ? ShardClient::Create(address)
                  : ShardClient::Create(address, data_plane_server_->address());
  }

  void StopServers() {
    if (data_plane_server_ != nullptr) data_plane_server_->Shutdown();
    if (grpc_server_ != nullptr) {
      grpc_server_->Shutdown(
          absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    }
    data_plane_server_.reset();
    grpc_server_.reset();
    service_.reset();
  }

  // Registers `tensor` (a CUDA tensor, any strides) as shard 1 of `id`.
  void Serve(const std::string& id, const Tensor& tensor) {
    ASSERT_OK(registry_->Register(id, testing::AsLocalShard(tensor, 1, 3)));
  }

  // A CUDA copy of `host`.
  Tensor OnDevice(const Tensor& host) {
    absl::StatusOr<Tensor> device = host.To(Device::Cuda(0));
    EXPECT_OK(device.status());
    return device.ok() ? *device : Tensor();
  }

  // Whether every gRPC stream ended (the data plane keeps no count).
  bool AllStreamsDone(absl::Duration timeout = absl::Seconds(10)) {
    const absl::Time deadline = absl::Now() + timeout;
    while (service_->active_fetches() != 0 && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    return service_->active_fetches() == 0;
  }

  std::shared_ptr<ShardRegistry> registry_ = std::make_shared<ShardRegistry>();
  std::unique_ptr<ShardServiceImpl> service_;
  std::unique_ptr<grpc::Server> grpc_server_;
  std::unique_ptr<DataPlaneServer> data_plane_server_;
  std::shared_ptr<ShardClient> client_;
};

TEST_P(CudaFetchTest, WholeShardToCpuAndToCuda) {
  // 84000 bytes: 20 chunks of 4 KiB and a short one.
  const Tensor host = Pattern({300, 70}, DType::kFloat32);
  Serve("t", OnDevice(host));
  const std::string expected = Bytes(host);

  ASSERT_OK_AND_ASSIGN(Shard to_cpu,
                       client_->FetchShard("t", 1, Options(4096)));
  EXPECT_TRUE(to_cpu.tensor.device().is_cpu());
  EXPECT_EQ(Bytes(to_cpu.tensor), expected);

  FetchOptions pinned = Options(4096);
  pinned.pin_memory = true;
  ASSERT_OK_AND_ASSIGN(Shard to_pinned, client_->FetchShard("t", 1, pinned));
  EXPECT_TRUE(to_pinned.tensor.is_pinned());
  EXPECT_EQ(Bytes(to_pinned.tensor), expected);

  ASSERT_OK_AND_ASSIGN(Shard to_cuda,
                       client_->FetchShard("t", 1, ToCuda(4096)));
  EXPECT_TRUE(to_cuda.tensor.device().is_cuda());
  EXPECT_EQ(Bytes(to_cuda.tensor), expected);

  // Into a zeroed CUDA tensor: the chunks' device copies must land after
  // the zeroing (an asynchronous memset on the legacy stream).
  ASSERT_OK_AND_ASSIGN(
      Tensor zeroed,
      Tensor::Zeros({300, 70}, TensorOptions().WithDevice(Device::Cuda(0))));
  ASSERT_OK(client_->FetchShardInto("t", 1, zeroed, Options(4096)));
  EXPECT_EQ(Bytes(zeroed), expected);

  // Into a strided CUDA view; the columns around it stay as they were.
  ASSERT_OK_AND_ASSIGN(
      Tensor wide, Tensor::Full({300, 90}, 5.0,
                                TensorOptions().WithDevice(Device::Cuda(0))));
  ASSERT_OK_AND_ASSIGN(Tensor block, wide.Narrow(1, 10, 70));
  ASSERT_OK(client_->FetchShardInto("t", 1, block, Options(4096)));
  EXPECT_EQ(Bytes(block), expected);
  ASSERT_OK_AND_ASSIGN(Tensor left, wide.Narrow(1, 0, 10));
  ASSERT_OK_AND_ASSIGN(Tensor fives, Tensor::Full({300, 10}, 5.0));
  EXPECT_EQ(Bytes(left), Bytes(fives));

  // Default chunk size: a single chunk.
  ASSERT_OK_AND_ASSIGN(Shard one_chunk, client_->FetchShard("t", 1, ToCuda(0)));
  EXPECT_EQ(Bytes(one_chunk.tensor), expected);
}

TEST_P(CudaFetchTest, StridedCudaShard) {
  // A transposed view: made contiguous on the device before staging.
  const Tensor host = Pattern({120, 50}, DType::kInt64);
  ASSERT_OK_AND_ASSIGN(Tensor transposed, OnDevice(host).Transpose(0, 1));
  ASSERT_FALSE(transposed.is_contiguous());
  Serve("t", transposed);
  ASSERT_OK_AND_ASSIGN(Tensor expected, host.Transpose(0, 1));
  ASSERT_OK_AND_ASSIGN(Shard to_cpu,
                       client_->FetchShard("t", 1, Options(4096)));
  EXPECT_EQ(Bytes(to_cpu.tensor), Bytes(expected));
  ASSERT_OK_AND_ASSIGN(Shard to_cuda,
                       client_->FetchShard("t", 1, ToCuda(4096)));
  EXPECT_EQ(Bytes(to_cuda.tensor), Bytes(expected));
}

TEST_P(CudaFetchTest, StridedRegionsToCpuAndToCuda) {
  const Tensor host = Pattern({200, 64}, DType::kFloat32, 3);
  Serve("t", OnDevice(host));
  ASSERT_OK_AND_ASSIGN(Tensor expected, RegionView(host, {17, 9}, {150, 40}));

  ASSERT_OK_AND_ASSIGN(Tensor cpu, Tensor::Zeros({150, 40}));
  ASSERT_OK(client_->FetchRegionInto("t", 1, {17, 9}, cpu, Options(4096)));
  EXPECT_EQ(Bytes(cpu), Bytes(expected));

  ASSERT_OK_AND_ASSIGN(
      Tensor cuda,
      Tensor::Zeros({150, 40}, TensorOptions().WithDevice(Device::Cuda(0))));
  ASSERT_OK(client_->FetchRegionInto("t", 1, {17, 9}, cuda, Options(4096)));
  EXPECT_EQ(Bytes(cuda), Bytes(expected));

  // Into a strided region of a larger CUDA tensor.
  ASSERT_OK_AND_ASSIGN(
      Tensor big,
      Tensor::Zeros({160, 64}, TensorOptions().WithDevice(Device::Cuda(0))));
  ASSERT_OK_AND_ASSIGN(Tensor view, RegionView(big, {5, 20}, {150, 40}));
  ASSERT_OK(client_->FetchRegionInto("t", 1, {17, 9}, view, Options(4096)));
  EXPECT_EQ(Bytes(view), Bytes(expected));
}

TEST_P(CudaFetchTest, EmptyCudaShard) {
  ASSERT_OK_AND_ASSIGN(
      Tensor empty,
      Tensor::Empty({0, 20}, TensorOptions().WithDevice(Device::Cuda(0))));
  Serve("empty", empty);
  ASSERT_OK_AND_ASSIGN(Shard to_cpu, client_->FetchShard("empty", 1));
  EXPECT_EQ(to_cpu.tensor.numel(), 0);
  ASSERT_OK_AND_ASSIGN(Shard to_cuda,
                       client_->FetchShard("empty", 1, ToCuda(4096)));
  EXPECT_TRUE(to_cuda.tensor.device().is_cuda());
  EXPECT_EQ(to_cuda.tensor.numel(), 0);
}

TEST_P(CudaFetchTest, EveryStagingDepth) {
  const Tensor host = Pattern({1 << 18}, DType::kFloat32, 9);  // 1 MiB.
  Serve("t", OnDevice(host));
  for (int depth : {1, 2, 8, 100}) {
    SCOPED_TRACE(absl::StrCat("staging depth ", depth));
    StopServers();
    ShardServiceOptions options;
    options.staging_depth = depth;
    StartServers(options);
    ASSERT_OK_AND_ASSIGN(Shard shard,
                         client_->FetchShard("t", 1, Options(4096)));
    EXPECT_EQ(Bytes(shard.tensor), Bytes(host));
    ASSERT_OK_AND_ASSIGN(shard, client_->FetchShard("t", 1, ToCuda(4096)));
    EXPECT_EQ(Bytes(shard.tensor), Bytes(host));
  }
}

TEST_P(CudaFetchTest, ClientGivingUpMidStreamLeavesTheServerServing) {
  // 256 MiB in 4 KiB chunks cannot arrive within 20 ms: that would take
  // 13 GB/s, ten times what an H200 machine's loopback moves in such chunks
  // (64 MiB in 50 ms did arrive there).
  const Tensor host = Pattern({64 << 20}, DType::kFloat32, 11);
  Serve("big", OnDevice(host));
  Serve("small", OnDevice(Pattern({10, 3}, DType::kInt32)));
  for (int i = 0; i < 3; ++i) {
    EXPECT_THAT(
        client_->FetchShard("big", 1, Options(4096, absl::Milliseconds(20))),
        StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("big")));
    FetchOptions to_cuda = ToCuda(4096);
    to_cuda.timeout = absl::Milliseconds(20);
    EXPECT_THAT(
        client_->FetchShard("big", 1, to_cuda),
        StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("big")));
  }
  EXPECT_TRUE(AllStreamsDone()) << service_->active_fetches();
  ASSERT_OK_AND_ASSIGN(Shard small, client_->FetchShard("small", 1));
  EXPECT_EQ(small.tensor.numel(), 30);
  ASSERT_OK_AND_ASSIGN(Shard big, client_->FetchShard("big", 1, ToCuda(0)));
  EXPECT_EQ(Bytes(big.tensor), Bytes(host));
}

TEST_P(CudaFetchTest, UnregisteringMidStreamIsSafe) {
  // The stream holds the registration (and the device memory) to its end.
  std::string expected;
  {
    const Tensor host = Pattern({2 << 20}, DType::kFloat32, 13);
    expected = Bytes(host);
    Serve("t", OnDevice(host));
  }
  absl::StatusOr<Shard> fetched;
  std::thread fetcher(
      [&] { fetched = client_->FetchShard("t", 1, Options(4096)); });
  absl::SleepFor(absl::Milliseconds(20));
  ASSERT_TRUE(registry_->Unregister("t"));
  fetcher.join();
  if (fetched.ok()) {
    EXPECT_EQ(Bytes(fetched->tensor), expected);
  } else {
    EXPECT_THAT(fetched, StatusIs(absl::StatusCode::kNotFound,
                                  HasSubstr("unknown tensor t")));
  }
  EXPECT_TRUE(AllStreamsDone());
}

TEST_P(CudaFetchTest, ConcurrentFetchesToCpuAndCuda) {
  std::vector<Tensor> hosts;
  for (int i = 0; i < 4; ++i) {
    hosts.push_back(Pattern({1000 + 37 * i, 9}, DType::kFloat32, 20 + i));
    Serve(absl::StrCat("t", i), OnDevice(hosts.back()));
  }
  std::vector<std::thread> threads;
  std::vector<int> good(8, 0);
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      for (int round = 0; round < 6; ++round) {
        const int which = (i + round) % 4;
        FetchOptions options =
            (i + round) % 2 == 0 ? Options(8192) : ToCuda(8192);
        absl::StatusOr<Shard> shard =
            client_->FetchShard(absl::StrCat("t", which), 1, options);
        if (shard.ok() && Bytes(shard->tensor) == Bytes(hosts[which])) {
          ++good[i];
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_THAT(good, ::testing::Each(6));
  EXPECT_TRUE(AllStreamsDone());
}

INSTANTIATE_TEST_SUITE_P(Transports, CudaFetchTest,
                         ::testing::Values(Transport::kGrpc,
                                           Transport::kDataPlane),
                         TransportName);

}  // namespace
}  // namespace tessera
