// ShardRegistry, ShardServiceImpl and ShardClient / ShardAssembler /
// RemoteShard: unit tests of the registry and the chunk assembler, and the
// service on a real in-process gRPC server on 127.0.0.1:0.
#include "server/serve/shard_service.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <ostream>

#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/remote_shard.h"
#include "client/shard_client.h"
#include "common/proto_convert.h"
#include "common/region.h"
#include "gmock/gmock.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "gtest/gtest.h"
#include "server/serve/shard_registry.h"
#include "tests/testing/status_matchers.h"
#include "wire/version_id.h"
#include "xxhash.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// ---- helpers ----------------------------------------------------------------

// A tensor whose bytes differ from element to element (and from seed to
// seed); bool tensors hold 0/1 only.
Tensor Pattern(std::vector<int64_t> sizes, DType dtype, uint32_t seed = 1) {
  absl::StatusOr<Tensor> tensor =
      Tensor::Empty(sizes, TensorOptions().WithDType(dtype));
  EXPECT_OK(tensor.status());
  auto* bytes = static_cast<unsigned char*>(tensor->data_ptr());
  uint32_t state = seed * 2654435761u + 1;
  for (size_t i = 0; i < tensor->nbytes(); ++i) {
    state = state * 1664525u + 1013904223u;
    bytes[i] = dtype == DType::kBool ? (state >> 31) : (state >> 24);
  }
  return *tensor;
}

// The tensor's elements as row-major bytes.
std::string Bytes(const Tensor& tensor) {
  absl::StatusOr<Tensor> host =
      tensor.device().is_cpu() ? tensor.Contiguous() : tensor.To(Device::Cpu());
  EXPECT_OK(host.status());
  return std::string(static_cast<const char*>(host->data_ptr()),
                     host->nbytes());
}

ShardMetadata Meta(std::vector<int64_t> offsets, std::vector<int64_t> sizes,
                   int rank) {
  absl::StatusOr<ShardMetadata> metadata =
      ShardMetadata::Create(std::move(offsets), std::move(sizes),
                            RemoteDevice::ForRank(rank, Device::Cpu()));
  EXPECT_OK(metadata.status());
  return *metadata;
}

// A tensor split along dim 0 into `num_shards` shards of `shard_sizes`
// each, shard i placed on rank i.
ShardedTensorMetadata RowSharded(const std::vector<int64_t>& shard_sizes,
                                 int num_shards, DType dtype) {
  ShardedTensorMetadata metadata;
  metadata.tensor_properties.dtype = dtype;
  metadata.size = shard_sizes;
  metadata.size[0] *= num_shards;
  for (int i = 0; i < num_shards; ++i) {
    std::vector<int64_t> offsets(shard_sizes.size(), 0);
    offsets[0] = i * shard_sizes[0];
    metadata.shards_metadata.push_back(Meta(offsets, shard_sizes, i));
  }
  return metadata;
}

// A registration of `num_shards` row shards of which only `local_index`
// is local, holding `tensor`.
std::shared_ptr<RegisteredTensor> OneLocalShard(const Tensor& tensor,
                                                int64_t local_index,
                                                int num_shards = 3) {
  auto registered = std::make_shared<RegisteredTensor>();
  registered->metadata = std::make_shared<const ShardedTensorMetadata>(
      RowSharded(tensor.sizes(), num_shards, tensor.dtype()));
  registered->local_shards.push_back(LocalShard{local_index, tensor});
  return registered;
}

FetchOptions WithChunks(int64_t chunk_bytes,
                        absl::Duration timeout = absl::Seconds(60)) {
  FetchOptions options;
  options.chunk_bytes = chunk_bytes;
  options.timeout = timeout;
  return options;
}

// What a call to a server that is not there may fail with.
MATCHER_P(UnreachableError, substring, "is UNAVAILABLE or DEADLINE_EXCEEDED") {
  *result_listener << "status is " << arg;
  return (arg.code() == absl::StatusCode::kUnavailable ||
          arg.code() == absl::StatusCode::kDeadlineExceeded) &&
         absl::StrContains(arg.message(), substring);
}

// A port on 127.0.0.1 where nothing listens (bound, then released).
int UnusedPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(addr);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), length), 0);
  EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length), 0);
  close(fd);
  return ntohs(addr.sin_port);
}

// ---- ShardRegistry ----------------------------------------------------------

TEST(ShardRegistryTest, RegisterFindUnregister) {
  ShardRegistry registry;
  ASSERT_OK(
      registry.Register("b", OneLocalShard(Pattern({4}, DType::kInt32), 1)));
  ASSERT_OK(
      registry.Register("a", OneLocalShard(Pattern({4}, DType::kInt32), 0)));
  EXPECT_EQ(registry.size(), 2u);
  EXPECT_THAT(registry.TensorIds(), ElementsAre("a", "b"));
  std::shared_ptr<const RegisteredTensor> found = registry.Find("b");
  ASSERT_NE(found, nullptr);
  EXPECT_NE(found->FindShard(1), nullptr);
  EXPECT_EQ(found->FindShard(0), nullptr);
  EXPECT_EQ(registry.Find("c"), nullptr);
  EXPECT_TRUE(registry.Unregister("b"));
  EXPECT_FALSE(registry.Unregister("b"));
  EXPECT_EQ(registry.Find("b"), nullptr);
  // A reference taken before unregistering stays usable.
  EXPECT_EQ(found->local_shards[0].tensor.numel(), 4);
  EXPECT_EQ(registry.size(), 1u);
}

// A fence refuses new writes at once, waits for the passes held (up to
// its deadline), and ends when lifted or when the id is unregistered.
TEST(ShardRegistryTest, AFenceRefusesNewWritesAndWaitsForThoseInFlight) {
  ShardRegistry registry;
  ASSERT_OK(
      registry.Register("w", OneLocalShard(Pattern({4}, DType::kInt32), 0)));
  ASSERT_OK_AND_ASSIGN(ShardRegistry::WritePass held, registry.EnterWrite("w"));
  // A pass held past the deadline: DEADLINE_EXCEEDED, still fenced.
  EXPECT_THAT(
      registry.Fence("w", "tensor w is being resharded",
                     absl::Now() + absl::Milliseconds(50)),
      StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("in flight")));
  EXPECT_THAT(
      registry.EnterWrite("w").status(),
      StatusIs(absl::StatusCode::kAborted,
               AllOf(HasSubstr("being resharded"), HasSubstr("not applied"))));
  // Another id is not fenced.
  EXPECT_OK(registry.EnterWrite("other").status());
  // The fence waits for the pass in flight, returned from another thread.
  std::thread writer([&held] {
    absl::SleepFor(absl::Milliseconds(100));
    held = ShardRegistry::WritePass();
  });
  const absl::Time start = absl::Now();
  EXPECT_OK(registry.Fence("w", "tensor w is being resharded",
                           absl::Now() + absl::Seconds(10)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(90));
  writer.join();
  EXPECT_THAT(registry.EnterWrite("w").status(),
              StatusIs(absl::StatusCode::kAborted, ::testing::_));
  registry.Lift("w");
  ASSERT_OK_AND_ASSIGN(ShardRegistry::WritePass again,
                       registry.EnterWrite("w"));
  again = ShardRegistry::WritePass();
  // Unregistered, a fenced id's state goes (a new registration under the
  // same id would take writes).
  ASSERT_OK(registry.Fence("w", "x", absl::Now() + absl::Seconds(1)));
  EXPECT_TRUE(registry.Unregister("w"));
  ASSERT_OK(
      registry.Register("w", OneLocalShard(Pattern({4}, DType::kInt32), 0)));
  EXPECT_OK(registry.EnterWrite("w").status());
}

TEST(ShardRegistryTest, DuplicateIdIsAlreadyExists) {
  ShardRegistry registry;
  const Tensor tensor = Pattern({4}, DType::kFloat32);
  ASSERT_OK(registry.Register("t", OneLocalShard(tensor, 0)));
  EXPECT_THAT(registry.Register("t", OneLocalShard(tensor, 1)),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("t")));
}

TEST(ShardRegistryTest, InvalidRegistrationsAreInvalidArgument) {
  ShardRegistry registry;
  const Tensor tensor = Pattern({4, 2}, DType::kFloat32);
  auto out_of_range = OneLocalShard(tensor, 0);
  out_of_range->local_shards[0].index = 3;
  EXPECT_THAT(
      registry.Register("t", out_of_range),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("out of range")));
  auto negative = OneLocalShard(tensor, 0);
  negative->local_shards[0].index = -1;
  EXPECT_THAT(
      registry.Register("t", negative),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("out of range")));
  auto wrong_sizes = OneLocalShard(tensor, 0);
  wrong_sizes->local_shards[0].tensor = Pattern({4, 3}, DType::kFloat32);
  EXPECT_THAT(
      registry.Register("t", wrong_sizes),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("sizes [4, 3]")));
  auto twice = OneLocalShard(tensor, 0);
  twice->local_shards.push_back(twice->local_shards[0]);
  EXPECT_THAT(registry.Register("t", twice),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("twice")));
  EXPECT_THAT(registry.Register("", OneLocalShard(tensor, 0)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty")));
  EXPECT_EQ(registry.size(), 0u);
}

// ---- ShardAssembler ---------------------------------------------------------

// Chunks of `bytes` as a correct server would send them.
std::vector<v1::ShardChunk> Chunks(const ShardMetadata& metadata, DType dtype,
                                   const std::string& bytes,
                                   size_t chunk_bytes) {
  std::vector<v1::ShardChunk> chunks;
  size_t offset = 0;
  do {
    v1::ShardChunk chunk;
    if (chunks.empty()) {
      v1::ShardHeader* header = chunk.mutable_header();
      *header->mutable_metadata() = ToProto(metadata);
      header->set_dtype(ToProto(dtype));
      for (int64_t size : metadata.shard_sizes()) header->add_sizes(size);
      header->set_total_bytes(static_cast<int64_t>(bytes.size()));
    }
    chunk.set_offset(static_cast<int64_t>(offset));
    chunk.set_data(bytes.substr(offset, chunk_bytes));
    chunk.set_checksum(XXH3_64bits(chunk.data().data(), chunk.data().size()));
    offset += chunk.data().size();
    chunks.push_back(std::move(chunk));
  } while (offset < bytes.size());
  return chunks;
}

class ShardAssemblerTest : public ::testing::Test {
 protected:
  // Feeds all chunks, stopping at the first error; then Finish().
  absl::Status Assemble(const std::vector<v1::ShardChunk>& chunks,
                        ShardAssembler& assembler) {
    for (const v1::ShardChunk& chunk : chunks) {
      RETURN_IF_ERROR(assembler.Consume(chunk));
    }
    return assembler.Finish();
  }
  absl::Status AssembleInto(const std::vector<v1::ShardChunk>& chunks) {
    ShardAssembler assembler("t", 1, destination_);
    return Assemble(chunks, assembler);
  }
  // Feeds chunks_ as received messages made from their wire bytes.
  absl::Status AssembleWire(
      const std::function<grpc::ByteBuffer(const std::string&)>& message) {
    ShardAssembler assembler("t", 1, destination_);
    for (const v1::ShardChunk& chunk : chunks_) {
      RETURN_IF_ERROR(assembler.Consume(message(chunk.SerializeAsString())));
    }
    return assembler.Finish();
  }

  const ShardMetadata metadata_ = Meta({6, 0}, {6, 10}, 1);
  const Tensor source_ = Pattern({6, 10}, DType::kFloat32);
  const std::string bytes_ = Bytes(source_);
  Tensor destination_ = *Tensor::Zeros({6, 10});
  std::vector<v1::ShardChunk> chunks_ =
      Chunks(metadata_, DType::kFloat32, bytes_, 64);
};

TEST_F(ShardAssemblerTest, AssemblesIntoContiguousDestination) {
  ASSERT_OK(AssembleInto(chunks_));
  EXPECT_EQ(Bytes(destination_), bytes_);
}

TEST_F(ShardAssemblerTest, AssemblesIntoStridedDestination) {
  ASSERT_OK_AND_ASSIGN(Tensor big, Tensor::Zeros({10, 6}));
  ASSERT_OK_AND_ASSIGN(destination_, big.T());
  ASSERT_OK(AssembleInto(chunks_));
  EXPECT_EQ(Bytes(destination_), bytes_);
}

TEST_F(ShardAssemblerTest, AllocatesFromHeader) {
  ShardAssembler assembler("t", 1, Device::Cpu(), /*pin_memory=*/false);
  ASSERT_OK(Assemble(chunks_, assembler));
  EXPECT_EQ(assembler.destination().dtype(), DType::kFloat32);
  EXPECT_EQ(Bytes(assembler.destination()), bytes_);
  EXPECT_EQ(assembler.metadata(), metadata_);
}

TEST_F(ShardAssemblerTest, BadChecksumIsDataLoss) {
  chunks_[2].set_checksum(chunks_[2].checksum() ^ 1);
  EXPECT_THAT(AssembleInto(chunks_),
              StatusIs(absl::StatusCode::kDataLoss,
                       "chunk at offset 128 of shard 1 of tensor t: "
                       "checksum mismatch"));
}

TEST_F(ShardAssemblerTest, CorruptDataIsDataLoss) {
  (*chunks_[1].mutable_data())[0] ^= 0x40;
  EXPECT_THAT(AssembleInto(chunks_),
              StatusIs(absl::StatusCode::kDataLoss,
                       "chunk at offset 64 of shard 1 of tensor t: "
                       "checksum mismatch"));
}

// Received messages arrive in many slices; fields may straddle them.
TEST_F(ShardAssemblerTest, ParsesMessagesSplitAcrossSlices) {
  for (size_t piece : {1, 3, 7, 100}) {
    ASSERT_OK_AND_ASSIGN(destination_, Tensor::Zeros({6, 10}));
    ASSERT_OK(AssembleWire([piece](const std::string& wire) {
      std::vector<grpc::Slice> slices;
      for (size_t at = 0; at < wire.size(); at += piece) {
        slices.emplace_back(wire.substr(at, piece));
      }
      return grpc::ByteBuffer(slices.data(), slices.size());
    }));
    EXPECT_EQ(Bytes(destination_), bytes_) << "piece " << piece;
  }
}

TEST_F(ShardAssemblerTest, SkipsUnknownFields) {
  // Fields 9 (varint), 10 (fixed64), 11 (bytes) and 12 (fixed32), as a
  // newer server might send them.
  const std::string unknown = {'\x48', 5, '\x51', 1,   1,      1, 1, 1, 1, 1, 1,
                               '\x5a', 2, 'a',    'b', '\x65', 2, 2, 2, 2};
  ASSERT_OK(AssembleWire([&unknown](const std::string& wire) {
    const grpc::Slice slice(unknown + wire);
    return grpc::ByteBuffer(&slice, 1);
  }));
  EXPECT_EQ(Bytes(destination_), bytes_);
}

TEST_F(ShardAssemblerTest, MalformedMessageIsDataLoss) {
  const std::string wire = chunks_[0].SerializeAsString();
  for (const std::string& bad : {wire.substr(0, wire.size() - 1),
                                 std::string("\x0f", 1),  // Wire type 7.
                                 std::string("\xff", 1)}) {
    ShardAssembler assembler("t", 1, destination_);
    const grpc::Slice slice(bad);
    EXPECT_THAT(assembler.Consume(grpc::ByteBuffer(&slice, 1)),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr("malformed")));
  }
}

TEST_F(ShardAssemblerTest, GapInOffsetsIsDataLoss) {
  chunks_.erase(chunks_.begin() + 1);
  EXPECT_THAT(AssembleInto(chunks_),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("chunk at offset 128 of shard 1 of tensor t: "
                                 "expected offset 64")));
}

TEST_F(ShardAssemblerTest, OverlongDataIsDataLoss) {
  v1::ShardChunk& last = chunks_.back();
  last.mutable_data()->append("xyz");
  last.set_checksum(XXH3_64bits(last.data().data(), last.data().size()));
  EXPECT_THAT(AssembleInto(chunks_),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("overrun")));
}

TEST_F(ShardAssemblerTest, MissingHeaderIsDataLoss) {
  chunks_[0].clear_header();
  EXPECT_THAT(AssembleInto(chunks_),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("no header")));
  ShardAssembler nothing_received("t", 1, destination_);
  EXPECT_THAT(nothing_received.Finish(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("header")));
}

TEST_F(ShardAssemblerTest, RepeatedHeaderIsDataLoss) {
  *chunks_[1].mutable_header() = chunks_[0].header();
  EXPECT_THAT(AssembleInto(chunks_),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("repeated")));
}

TEST_F(ShardAssemblerTest, TruncatedStreamIsDataLoss) {
  chunks_.pop_back();
  EXPECT_THAT(AssembleInto(chunks_),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("after 192 of 240 bytes")));
}

TEST_F(ShardAssemblerTest, MalformedHeaderIsDataLoss) {
  v1::ShardChunk unspecified_dtype = chunks_[0];
  unspecified_dtype.mutable_header()->set_dtype(v1::DTYPE_UNSPECIFIED);
  EXPECT_THAT(AssembleInto({unspecified_dtype}),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("malformed")));
  v1::ShardChunk wrong_total = chunks_[0];
  wrong_total.mutable_header()->set_total_bytes(241);
  EXPECT_THAT(AssembleInto({wrong_total}),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("total_bytes")));
  v1::ShardChunk wrong_sizes = chunks_[0];
  wrong_sizes.mutable_header()->set_sizes(0, 5);
  EXPECT_THAT(AssembleInto({wrong_sizes}),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("differ")));
}

TEST_F(ShardAssemblerTest, MismatchedDestinationIsInvalidArgument) {
  destination_ =
      *Tensor::Zeros({6, 10}, TensorOptions().WithDType(DType::kInt32));
  EXPECT_THAT(AssembleInto(chunks_),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("does not match shard 1 of tensor t")));
  destination_ = *Tensor::Zeros({10, 6});
  EXPECT_THAT(AssembleInto(chunks_),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("float32 [6, 10]")));
}

// ---- ShardServiceImpl over gRPC ---------------------------------------------

class ShardServiceTest : public ::testing::Test {
 protected:
  void SetUp() override { StartServer(); }

  void TearDown() override {
    if (server_ != nullptr) {
      server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    }
  }

  void StartServer(ShardServiceOptions options = {}) {
    service_ = std::make_unique<ShardServiceImpl>(registry_, options);
    grpc::ServerBuilder builder;
    ConfigureShardServer(&builder);
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_NE(port, 0);
    address_ = absl::StrCat("127.0.0.1:", port);
    client_ = ShardClient::Create(address_);
  }

  // Registers `tensor` as shard `index` (of 3) of `id`; returns the
  // registration.
  std::shared_ptr<RegisteredTensor> Serve(const std::string& id,
                                          const Tensor& tensor,
                                          int64_t index = 1) {
    std::shared_ptr<RegisteredTensor> registered = OneLocalShard(tensor, index);
    EXPECT_OK(registry_->Register(id, registered));
    return registered;
  }

  // Waits for every stream of the service to be done.
  bool AllFetchesDone(absl::Duration timeout = absl::Seconds(10)) {
    const absl::Time deadline = absl::Now() + timeout;
    while (service_->active_fetches() != 0 && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    return service_->active_fetches() == 0;
  }

  std::shared_ptr<ShardRegistry> registry_ = std::make_shared<ShardRegistry>();
  std::unique_ptr<ShardServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::shared_ptr<ShardClient> client_;
};

struct FetchCase {
  DType dtype;
  std::vector<int64_t> sizes;
};

void PrintTo(const FetchCase& c, std::ostream* os) {
  *os << c.dtype << " [" << absl::StrJoin(c.sizes, ", ") << "]";
}

class ShardFetchTest : public ShardServiceTest,
                       public ::testing::WithParamInterface<FetchCase> {};

TEST_P(ShardFetchTest, FetchesShardBytesAndMetadata) {
  const Tensor tensor = Pattern(GetParam().sizes, GetParam().dtype);
  auto registered = Serve("t", tensor);
  ASSERT_OK_AND_ASSIGN(Shard shard, client_->FetchShard("t", 1));
  EXPECT_EQ(shard.metadata, registered->metadata->shards_metadata[1]);
  EXPECT_EQ(shard.tensor.dtype(), GetParam().dtype);
  EXPECT_EQ(shard.tensor.sizes(), GetParam().sizes);
  EXPECT_EQ(Bytes(shard.tensor), Bytes(tensor));
  EXPECT_TRUE(Equal(shard.tensor, tensor) ||
              IsFloatingPoint(GetParam().dtype));  // NaN patterns.

  ASSERT_OK_AND_ASSIGN(
      Tensor into, Tensor::Zeros(GetParam().sizes,
                                 TensorOptions().WithDType(GetParam().dtype)));
  ASSERT_OK(client_->FetchShardInto("t", 1, into, WithChunks(4096)));
  EXPECT_EQ(Bytes(into), Bytes(tensor));
}

INSTANTIATE_TEST_SUITE_P(
    DTypesAndRanks, ShardFetchTest,
    ::testing::Values(FetchCase{DType::kFloat32, {1000}},
                      FetchCase{DType::kFloat32, {3, 50, 7}},
                      FetchCase{DType::kInt64, {5000}},
                      FetchCase{DType::kInt64, {2, 3, 4}},
                      FetchCase{DType::kBool, {7777}},
                      FetchCase{DType::kBool, {4, 9, 11}},
                      FetchCase{DType::kFloat16, {4097}},
                      FetchCase{DType::kFloat16, {6, 33, 17}}));

TEST_F(ShardServiceTest, FetchCrossesManyChunks) {
  // 1 MiB + 12 bytes: 257 chunks of 4 KiB, the last one partial.
  const Tensor tensor = Pattern({262147}, DType::kFloat32);
  Serve("big", tensor);
  ASSERT_OK_AND_ASSIGN(Shard shard,
                       client_->FetchShard("big", 1, WithChunks(4096)));
  EXPECT_EQ(Bytes(shard.tensor), Bytes(tensor));
  // Chunk sizes below the minimum are raised to it, not rejected.
  ASSERT_OK_AND_ASSIGN(shard, client_->FetchShard("big", 1, WithChunks(1)));
  EXPECT_EQ(Bytes(shard.tensor), Bytes(tensor));
}

TEST_F(ShardServiceTest, FetchesIntoStridedDestinations) {
  const Tensor tensor = Pattern({8, 20}, DType::kFloat32);
  Serve("t", tensor);
  // A column block of a wider tensor; the columns around it stay intact.
  ASSERT_OK_AND_ASSIGN(Tensor wide, Tensor::Full({8, 30}, 7.0));
  ASSERT_OK_AND_ASSIGN(Tensor block, wide.Narrow(1, 5, 20));
  ASSERT_FALSE(block.is_contiguous());
  ASSERT_OK(client_->FetchShardInto("t", 1, block, WithChunks(4096)));
  EXPECT_EQ(Bytes(block), Bytes(tensor));
  ASSERT_OK_AND_ASSIGN(Tensor left, wide.Narrow(1, 0, 5));
  ASSERT_OK_AND_ASSIGN(Tensor right, wide.Narrow(1, 25, 5));
  EXPECT_TRUE(Equal(left, *Tensor::Full({8, 5}, 7.0)));
  EXPECT_TRUE(Equal(right, *Tensor::Full({8, 5}, 7.0)));
  // A transposed view.
  ASSERT_OK_AND_ASSIGN(Tensor tall, Tensor::Zeros({20, 8}));
  ASSERT_OK_AND_ASSIGN(Tensor transposed, tall.Transpose(0, 1));
  ASSERT_OK(client_->FetchShardInto("t", 1, transposed));
  EXPECT_EQ(Bytes(transposed), Bytes(tensor));
}

TEST_F(ShardServiceTest, EmptyShardSendsOnlyTheHeader) {
  ASSERT_OK_AND_ASSIGN(Tensor empty, Tensor::Empty({0, 20}));
  Serve("empty", empty);
  ASSERT_OK_AND_ASSIGN(Shard shard, client_->FetchShard("empty", 1));
  EXPECT_THAT(shard.tensor.sizes(), ElementsAre(0, 20));
  EXPECT_EQ(shard.metadata.shard_sizes(), (std::vector<int64_t>{0, 20}));
  ASSERT_OK_AND_ASSIGN(Tensor into, Tensor::Empty({0, 20}));
  EXPECT_OK(client_->FetchShardInto("empty", 1, into));
}

TEST_F(ShardServiceTest, UnknownTensorIsNotFound) {
  EXPECT_THAT(
      client_->FetchShard("nope", 0),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("unknown tensor nope")));
}

TEST_F(ShardServiceTest, AtLeastFetchesWaitOffTheCallbackThreads) {
  // A fetch of at least version 2 from a daemon that has not yet applied
  // that publish waits for it (on a thread of its own call, as a gated
  // fetch does) and gets version 2, never the open registration before.
  ASSERT_OK_AND_ASSIGN(const Tensor one, Tensor::Full({4, 8}, 1.0));
  ASSERT_OK_AND_ASSIGN(const Tensor two, Tensor::Full({4, 8}, 2.0));
  Serve("v", one);
  registry_->PublishVersion("v", 1, "v");
  Serve(VersionId("v", 2), two);
  std::thread publisher([&] {
    absl::SleepFor(absl::Milliseconds(100));
    registry_->PublishVersion("v", 2, VersionId("v", 2));
  });
  ASSERT_OK_AND_ASSIGN(Tensor out, Tensor::Zeros({4, 8}, TensorOptions()));
  FetchOptions options;
  int64_t version = -1;
  options.served_version = &version;
  ASSERT_OK(
      client_->FetchRegionInto(AtLeastId("v", 2), 1, {0, 0}, out, options));
  publisher.join();
  EXPECT_EQ(version, 2);
  EXPECT_TRUE(Equal(out, two));
  // Whole shards report the version served too.
  int64_t whole = -1;
  options.served_version = &whole;
  ASSERT_OK(client_->FetchShardInto(AtLeastId("v", 2), 1, out, options));
  EXPECT_EQ(whole, 2);
  whole = -1;
  ASSERT_OK_AND_ASSIGN(const Shard shard, client_->FetchShard("v", 1, options));
  EXPECT_EQ(whole, 2);
  EXPECT_TRUE(Equal(shard.tensor, two));
  EXPECT_TRUE(AllFetchesDone());
}

TEST_F(ShardServiceTest, ShardNotOwnedIsNotFound) {
  Serve("t", Pattern({4}, DType::kFloat32), /*index=*/1);
  EXPECT_THAT(
      client_->FetchShard("t", 0),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("shard 0 of tensor t")));
  EXPECT_THAT(
      client_->FetchShard("t", 99),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("shard 99 of tensor t")));
}

TEST_F(ShardServiceTest, MalformedRequestsAreInvalidArgument) {
  Serve("t", Pattern({4}, DType::kFloat32));
  EXPECT_THAT(client_->FetchShard("t", -1),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("negative shard_index")));
  EXPECT_THAT(client_->FetchShard("", 1),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("empty tensor_id")));
  EXPECT_THAT(client_->FetchShard("t", 1, WithChunks(-5)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("negative chunk_bytes")));
}

TEST_F(ShardServiceTest, MismatchedDestinationIsInvalidArgument) {
  const Tensor tensor = Pattern({40, 3}, DType::kFloat32);
  Serve("t", tensor);
  ASSERT_OK_AND_ASSIGN(Tensor wrong_sizes, Tensor::Zeros({3, 40}));
  EXPECT_THAT(client_->FetchShardInto("t", 1, wrong_sizes),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("does not match")));
  ASSERT_OK_AND_ASSIGN(
      Tensor wrong_dtype,
      Tensor::Zeros({40, 3}, TensorOptions().WithDType(DType::kFloat64)));
  EXPECT_THAT(client_->FetchShardInto("t", 1, wrong_dtype),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("does not match")));
  EXPECT_THAT(
      client_->FetchShardInto("t", 1, Tensor()),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("undefined")));
  // The server is unaffected by the abandoned streams.
  ASSERT_OK_AND_ASSIGN(Shard shard, client_->FetchShard("t", 1));
  EXPECT_EQ(Bytes(shard.tensor), Bytes(tensor));
  EXPECT_TRUE(AllFetchesDone());
}

TEST_F(ShardServiceTest, UnregisteredTensorIsNotFound) {
  Serve("t", Pattern({4}, DType::kFloat32));
  ASSERT_OK(client_->FetchShard("t", 1).status());
  ASSERT_TRUE(registry_->Unregister("t"));
  EXPECT_THAT(
      client_->FetchShard("t", 1),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("unknown tensor t")));
}

TEST_F(ShardServiceTest, RetiredTensorIsServedUntilReleased) {
  const Tensor tensor = Pattern({64}, DType::kInt64);
  Serve("old", tensor);
  ASSERT_TRUE(registry_->Retire("old"));
  const uint64_t mark = registry_->RetirementMark();
  Serve("new", tensor);
  ASSERT_TRUE(registry_->Retire("new"));
  EXPECT_EQ(registry_->size(), 0u);
  EXPECT_EQ(registry_->retired_size(), 2u);
  EXPECT_THAT(registry_->Register("old", OneLocalShard(tensor, 1)),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("old")));
  ASSERT_OK_AND_ASSIGN(Shard shard, client_->FetchShard("old", 1));
  EXPECT_EQ(Bytes(shard.tensor), Bytes(tensor));
  EXPECT_EQ(registry_->ReleaseRetired(mark), 1u);
  EXPECT_THAT(
      client_->FetchShard("old", 1),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("unknown tensor old")));
  EXPECT_OK(client_->FetchShard("new", 1).status());
}

TEST_F(ShardServiceTest, UnregisterDuringFetchIsSafe) {
  // 8 MiB in 4 KiB chunks: 2048 writes, long enough to unregister mid-way.
  // The registration holds the only reference to the tensor, so a stream
  // that did not keep it alive would read freed memory.
  std::string expected;
  {
    const Tensor tensor = Pattern({2 << 20}, DType::kFloat32);
    expected = Bytes(tensor);
    Serve("t", tensor);
  }
  absl::StatusOr<Shard> fetched;
  std::thread fetcher(
      [&] { fetched = client_->FetchShard("t", 1, WithChunks(4096)); });
  absl::SleepFor(absl::Milliseconds(20));
  ASSERT_TRUE(registry_->Unregister("t"));
  fetcher.join();
  if (fetched.ok()) {
    EXPECT_EQ(Bytes(fetched->tensor), expected);
  } else {
    EXPECT_THAT(fetched, StatusIs(absl::StatusCode::kNotFound,
                                  HasSubstr("unknown tensor t")));
  }
  EXPECT_TRUE(AllFetchesDone());
}

TEST_F(ShardServiceTest, NothingListeningFailsWithinTheTimeout) {
  std::shared_ptr<ShardClient> client =
      ShardClient::Create(absl::StrCat("127.0.0.1:", UnusedPort()));
  const absl::Duration timeout = absl::Seconds(2);
  const absl::Time start = absl::Now();
  EXPECT_THAT(client->FetchShard("t", 0, WithChunks(0, timeout)).status(),
              UnreachableError("shard 0 of tensor t"));
  EXPECT_THAT(client->DescribeTensor("t", timeout).status(),
              UnreachableError("describing tensor t"));
  EXPECT_LT(absl::Now() - start, 2 * timeout + absl::Seconds(1));
}

TEST_F(ShardServiceTest, ServerSurvivesClientsGivingUpMidStream) {
  // 64 MiB in 4 KiB chunks cannot arrive within 50 ms.
  const Tensor tensor = Pattern({16 << 20}, DType::kFloat32);
  Serve("big", tensor);
  Serve("small", Pattern({10}, DType::kInt64));
  for (int i = 0; i < 3; ++i) {
    EXPECT_THAT(
        client_->FetchShard("big", 1, WithChunks(4096, absl::Milliseconds(50))),
        StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("big")));
  }
  EXPECT_TRUE(AllFetchesDone()) << service_->active_fetches();
  ASSERT_OK_AND_ASSIGN(Shard small, client_->FetchShard("small", 1));
  EXPECT_EQ(small.tensor.numel(), 10);
  ASSERT_OK_AND_ASSIGN(Shard big, client_->FetchShard("big", 1));
  EXPECT_EQ(Bytes(big.tensor), Bytes(tensor));
}

TEST_F(ShardServiceTest, ServerShutdownEndsStreams) {
  Serve("big", Pattern({16 << 20}, DType::kFloat32));
  absl::StatusOr<Shard> fetched;
  std::thread fetcher(
      [&] { fetched = client_->FetchShard("big", 1, WithChunks(4096)); });
  absl::SleepFor(absl::Milliseconds(50));
  server_->Shutdown(absl::ToChronoTime(absl::Now()));
  fetcher.join();
  EXPECT_THAT(fetched.status().code(), AnyOf(absl::StatusCode::kUnavailable,
                                             absl::StatusCode::kCancelled));
  server_->Wait();
  EXPECT_TRUE(AllFetchesDone());
}

TEST_F(ShardServiceTest, ConcurrentFetchesFromEightThreads) {
  std::vector<Tensor> tensors;
  for (int i = 0; i < 8; ++i) {
    tensors.push_back(Pattern({3000 + 17 * i, 5}, DType::kFloat32, i));
    Serve(absl::StrCat("t", i), tensors.back());
  }
  std::vector<std::thread> threads;
  std::vector<int> good(8, 0);
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      for (int round = 0; round < 10; ++round) {
        const int which = (i + round) % 8;
        absl::StatusOr<Shard> shard =
            client_->FetchShard(absl::StrCat("t", which), 1, WithChunks(8192));
        if (shard.ok() && Bytes(shard->tensor) == Bytes(tensors[which])) {
          ++good[i];
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_THAT(good, ::testing::Each(10));
}

TEST_F(ShardServiceTest, DescribeTensor) {
  auto registered = std::make_shared<RegisteredTensor>();
  registered->metadata = std::make_shared<const ShardedTensorMetadata>(
      RowSharded({4, 6}, 4, DType::kInt64));
  for (int64_t index : {3, 1}) {
    registered->local_shards.push_back(
        LocalShard{index, Pattern({4, 6}, DType::kInt64)});
  }
  ASSERT_OK(registry_->Register("d", registered));
  ASSERT_OK_AND_ASSIGN(TensorDescription description,
                       client_->DescribeTensor("d"));
  EXPECT_EQ(description.metadata, *registered->metadata);
  // Registered out of order; served (and described) in index order.
  EXPECT_THAT(description.local_shard_indices, ElementsAre(1, 3));
  EXPECT_THAT(
      client_->DescribeTensor("nope"),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("unknown tensor nope")));
}

TEST_F(ShardServiceTest, RemoteShardToHere) {
  const Tensor tensor = Pattern({5, 5}, DType::kFloat64);
  auto registered = Serve("t", tensor);
  const WorkerInfo owner{"worker1", 1, address_, "", ""};
  RemoteShard remote(owner, "t", 1, registered->metadata->shards_metadata[1],
                     client_);
  EXPECT_EQ(remote.owner().name, "worker1");
  ASSERT_OK_AND_ASSIGN(Shard shard, remote.to_here());
  EXPECT_EQ(Bytes(shard.tensor), Bytes(tensor));
  EXPECT_EQ(shard.metadata, remote.metadata());

  RemoteShard disagreeing(owner, "t", 1, Meta({0, 0}, {5, 5}, 1), client_);
  EXPECT_THAT(disagreeing.to_here(),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("expected")));
  ASSERT_TRUE(registry_->Unregister("t"));
  EXPECT_THAT(remote.to_here(), StatusIs(absl::StatusCode::kNotFound,
                                         HasSubstr("unknown tensor t")));
}

// ---- Region fetches ---------------------------------------------------------

v1::FetchShardRequest RegionRequest(const std::string& id, int64_t index,
                                    std::vector<int64_t> offsets,
                                    std::vector<int64_t> sizes) {
  v1::FetchShardRequest request;
  request.set_tensor_id(id);
  request.set_shard_index(index);
  request.mutable_region_offsets()->Add(offsets.begin(), offsets.end());
  request.mutable_region_sizes()->Add(sizes.begin(), sizes.end());
  return request;
}

TEST_F(ShardServiceTest, RegionHeaderHasTheBoxSizesAndTheShardMetadata) {
  const Tensor tensor = Pattern({8, 20}, DType::kInt32);
  auto registered = Serve("t", tensor);
  ASSERT_OK_AND_ASSIGN(
      PreparedFetch prepared,
      PrepareFetch(*registry_, RegionRequest("t", 1, {2, 3}, {4, 12})));
  EXPECT_THAT(prepared.header.sizes(), ElementsAre(4, 12));
  EXPECT_EQ(prepared.header.total_bytes(), 4 * 12 * 4);
  ASSERT_OK_AND_ASSIGN(ShardMetadata metadata,
                       FromProto(prepared.header.metadata()));
  EXPECT_EQ(metadata, registered->metadata->shards_metadata[1]);
  ASSERT_OK_AND_ASSIGN(Tensor box, RegionView(tensor, {2, 3}, {4, 12}));
  EXPECT_EQ(Bytes(prepared.bytes), Bytes(box));
  // No region: the whole shard, as before.
  ASSERT_OK_AND_ASSIGN(prepared,
                       PrepareFetch(*registry_, RegionRequest("t", 1, {}, {})));
  EXPECT_THAT(prepared.header.sizes(), ElementsAre(8, 20));
  EXPECT_EQ(Bytes(prepared.bytes), Bytes(tensor));
}

TEST_F(ShardServiceTest, FetchesRegionsIntoAnyDestination) {
  // 64 x 300 int64: a 40 x 250 box is 80 KB, 20 chunks of 4 KiB.
  const Tensor tensor = Pattern({64, 300}, DType::kInt64);
  Serve("t", tensor);
  ASSERT_OK_AND_ASSIGN(Tensor expected,
                       RegionView(tensor, {10, 25}, {40, 250}));
  const TensorOptions int64 = TensorOptions().WithDType(DType::kInt64);
  ASSERT_OK_AND_ASSIGN(Tensor into, Tensor::Zeros({40, 250}, int64));
  int64_t reported = 0;
  int chunks = 0;
  FetchOptions options = WithChunks(4096);
  options.on_chunk = [&](int64_t bytes) {
    reported += bytes;
    ++chunks;
  };
  ASSERT_OK(client_->FetchRegionInto("t", 1, {10, 25}, into, options));
  EXPECT_EQ(Bytes(into), Bytes(expected));
  EXPECT_EQ(reported, 40 * 250 * 8);
  EXPECT_EQ(chunks, 20);
  // A transposed destination.
  ASSERT_OK_AND_ASSIGN(Tensor tall, Tensor::Zeros({250, 40}, int64));
  ASSERT_OK_AND_ASSIGN(Tensor transposed, tall.T());
  ASSERT_OK(client_->FetchRegionInto("t", 1, {10, 25}, transposed));
  EXPECT_EQ(Bytes(transposed), Bytes(expected));
  // Edge boxes: one element in the last corner, an empty box at the end.
  ASSERT_OK_AND_ASSIGN(Tensor corner, Tensor::Zeros({1, 1}, int64));
  ASSERT_OK(client_->FetchRegionInto("t", 1, {63, 299}, corner));
  ASSERT_OK_AND_ASSIGN(Tensor last, RegionView(tensor, {63, 299}, {1, 1}));
  EXPECT_EQ(Bytes(corner), Bytes(last));
  ASSERT_OK_AND_ASSIGN(Tensor empty, Tensor::Zeros({0, 300}, int64));
  EXPECT_OK(client_->FetchRegionInto("t", 1, {64, 0}, empty));
}

TEST_F(ShardServiceTest, RegionOutsideTheShardIsOutOfRange) {
  Serve("t", Pattern({8, 20}, DType::kFloat32));
  ASSERT_OK_AND_ASSIGN(Tensor four_rows, Tensor::Zeros({4, 20}));
  EXPECT_THAT(client_->FetchRegionInto("t", 1, {6, 0}, four_rows),
              StatusIs(absl::StatusCode::kOutOfRange,
                       HasSubstr("region offsets [6, 0] sizes [4, 20] of shard "
                                 "1 of tensor t leaves the shard (sizes [8, "
                                 "20])")));
  ASSERT_OK_AND_ASSIGN(Tensor wide, Tensor::Zeros({1, 21}));
  EXPECT_THAT(client_->FetchRegionInto("t", 1, {0, 0}, wide),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("leaves")));
  // Offsets so large that offset + size overflows int64.
  EXPECT_THAT(client_->FetchRegionInto(
                  "t", 1, {0, std::numeric_limits<int64_t>::max()}, wide),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("leaves")));
}

TEST_F(ShardServiceTest, MalformedRegionsAreInvalidArgument) {
  Serve("t", Pattern({8, 20}, DType::kFloat32));
  ASSERT_OK_AND_ASSIGN(Tensor row, Tensor::Zeros({20}));
  EXPECT_THAT(client_->FetchRegionInto("t", 1, {0}, row),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("1 offsets and 1 sizes for a shard of 2 "
                                 "dimensions")));
  ASSERT_OK_AND_ASSIGN(Tensor box, Tensor::Zeros({2, 2}));
  EXPECT_THAT(client_->FetchRegionInto("t", 1, {1}, box),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("1 offsets and 2 sizes")));
  EXPECT_THAT(client_->FetchRegionInto("t", 1, {-1, 0}, box),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("negative offsets or sizes")));
  // Sizes without offsets is a region of the wrong rank, not the shard.
  EXPECT_THAT(PrepareFetch(*registry_, RegionRequest("t", 1, {}, {8, 20})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("0 offsets and 2 sizes")));
  EXPECT_THAT(
      PrepareFetch(*registry_, RegionRequest("t", 1, {0, 0}, {-2, 1})),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("negative")));
  EXPECT_TRUE(AllFetchesDone());
}

TEST_F(ShardAssemblerTest, RegionStreamMustMatchTheRequestedRegion) {
  // A server that sends a 3 x 10 box of the 6 x 10 shard.
  std::vector<v1::ShardChunk> chunks =
      Chunks(metadata_, DType::kFloat32, bytes_.substr(0, 3 * 10 * 4), 64);
  v1::ShardHeader* header = chunks[0].mutable_header();
  header->set_sizes(0, 3);
  {
    ASSERT_OK_AND_ASSIGN(Tensor box, Tensor::Zeros({3, 10}));
    ShardAssembler assembler("t", 1, box);
    assembler.ExpectRegion({0, 0}, {3, 10});
    ASSERT_OK(Assemble(chunks, assembler));
    EXPECT_EQ(Bytes(box), bytes_.substr(0, 3 * 10 * 4));
  }
  {
    // Without ExpectRegion the box is not the shard the metadata names.
    ASSERT_OK_AND_ASSIGN(Tensor box, Tensor::Zeros({3, 10}));
    ShardAssembler assembler("t", 1, box);
    EXPECT_THAT(Assemble(chunks, assembler),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr("differ")));
  }
  {
    // A box other than the one asked for.
    ASSERT_OK_AND_ASSIGN(Tensor box, Tensor::Zeros({2, 10}));
    ShardAssembler assembler("t", 1, box);
    assembler.ExpectRegion({0, 0}, {2, 10});
    EXPECT_THAT(Assemble(chunks, assembler),
                StatusIs(absl::StatusCode::kDataLoss,
                         HasSubstr("differ from the requested region's")));
  }
  {
    // A requested region the shard cannot hold.
    ASSERT_OK_AND_ASSIGN(Tensor box, Tensor::Zeros({3, 10}));
    ShardAssembler assembler("t", 1, box);
    assembler.ExpectRegion({4, 0}, {3, 10});
    EXPECT_THAT(Assemble(chunks, assembler),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr("leaves")));
  }
}

TEST_F(ShardServiceTest, CudaShardsAndDestinations) {
  if (!CudaAvailable()) GTEST_SKIP() << "no CUDA device visible";
  const Tensor host = Pattern({300, 70}, DType::kFloat32);
  ASSERT_OK_AND_ASSIGN(Tensor device, host.To(Device::Cuda(0)));
  Serve("t", device);
  FetchOptions to_device = WithChunks(4096);
  to_device.device = Device::Cuda(0);
  ASSERT_OK_AND_ASSIGN(Shard shard, client_->FetchShard("t", 1, to_device));
  EXPECT_TRUE(shard.tensor.device().is_cuda());
  EXPECT_EQ(Bytes(shard.tensor), Bytes(host));
  ASSERT_OK_AND_ASSIGN(
      Tensor wide,
      Tensor::Zeros({300, 90}, TensorOptions().WithDevice(Device::Cuda(0))));
  ASSERT_OK_AND_ASSIGN(Tensor block, wide.Narrow(1, 10, 70));
  ASSERT_OK(client_->FetchShardInto("t", 1, block));
  EXPECT_EQ(Bytes(block), Bytes(host));
  FetchOptions pinned_host;
  pinned_host.pin_memory = true;
  ASSERT_OK_AND_ASSIGN(Shard pinned, client_->FetchShard("t", 1, pinned_host));
  EXPECT_TRUE(pinned.tensor.is_pinned());
  EXPECT_EQ(Bytes(pinned.tensor), Bytes(host));
  // A region of the CUDA shard into a region of a CUDA destination.
  ASSERT_OK_AND_ASSIGN(Tensor region, wide.Narrow(0, 100, 50));
  ASSERT_OK_AND_ASSIGN(region, region.Narrow(1, 0, 30));
  ASSERT_OK(client_->FetchRegionInto("t", 1, {7, 40}, region));
  ASSERT_OK_AND_ASSIGN(Tensor expected, RegionView(host, {7, 40}, {50, 30}));
  EXPECT_EQ(Bytes(region), Bytes(expected));
}

}  // namespace
}  // namespace tessera
