// DataPlaneServer, the raw-TCP data plane, and ShardClient fetching over it: a
// real DataPlaneServer on 127.0.0.1; clients are ShardClient and raw sockets
// that speak the protocol badly on purpose. ShardClient against peers that
// never answer or answer badly on purpose is tests/client/shard_client_test.cc.
#include "server/serve/data_plane_server.h"

#include <sys/socket.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/shard_client.h"
#include "common/proto_convert.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "io/socket.h"
#include "server/serve/shard_registry.h"
#include "server/serve/shard_service.h"
#include "tests/testing/filled.h"
#include "tests/testing/local_shard.h"
#include "tests/testing/status_matchers.h"
#include "wire/chunk_codec.h"
#include "xxhash.h"

namespace tessera {
namespace {

using ::tessera::testing::Filled;
using ::tessera::testing::IsOk;
using ::tessera::testing::IsOkAndHolds;
using ::tessera::testing::RowMajorBytes;
using ::tessera::testing::StatusIs;
using ::testing::_;
using ::testing::AnyOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Fetches over the data plane never use the gRPC channel, which connects
// lazily, so clients that only fetch get an address nothing answers on.
constexpr char kNoGrpc[] = "127.0.0.1:1";
// Bound on every wait of the test itself.
constexpr absl::Duration kWait = absl::Seconds(5);

// ---- helpers ----------------------------------------------------------------

FetchOptions Chunked(int64_t chunk_bytes,
                     absl::Duration timeout = absl::Seconds(10)) {
  FetchOptions options;
  options.chunk_bytes = chunk_bytes;
  options.timeout = timeout;
  return options;
}

// Fetches shard `index` of `id` into a zeroed tensor shaped like
// `expected`; DATA_LOSS when the bytes differ. Safe from any thread.
absl::Status FetchMatches(const ShardClient& client, absl::string_view id,
                          const Tensor& expected, int64_t index = 1,
                          int64_t chunk_bytes = 0) {
  absl::StatusOr<Tensor> destination = Tensor::Zeros(
      expected.sizes(), TensorOptions().WithDType(expected.dtype()));
  if (!destination.ok()) return destination.status();
  absl::Status status =
      client.FetchShardInto(id, index, *destination, Chunked(chunk_bytes));
  if (!status.ok()) return status;
  if (RowMajorBytes(*destination) != RowMajorBytes(expected)) {
    return absl::DataLossError(absl::StrCat("bytes of ", id, " differ"));
  }
  return absl::OkStatus();
}

// ---- raw protocol -----------------------------------------------------------

// A data-plane connection that has sent `greeting` (the magic, or not).
UniqueFd Dial(const std::string& address,
              absl::string_view greeting = kDataPlaneMagic) {
  absl::StatusOr<UniqueFd> socket = ConnectTcp(address, absl::Now() + kWait);
  EXPECT_OK(socket.status());
  if (!socket.ok()) return UniqueFd();
  EXPECT_OK(WriteFull(socket->get(), greeting.data(), greeting.size(),
                      absl::Now() + kWait));
  return *std::move(socket);
}

std::string RequestFrame(const std::string& id, int64_t index,
                         int64_t chunk_bytes = 0) {
  v1::FetchShardRequest request;
  request.set_tensor_id(id);
  request.set_shard_index(index);
  request.set_chunk_bytes(chunk_bytes);
  return request.SerializeAsString();
}

// The next reply frame of a raw connection, parsed as a `Reply`.
template <typename Reply = v1::BulkFetchReply>
absl::StatusOr<Reply> ReadReply(int fd) {
  absl::StatusOr<std::string> frame = ReadFrame(fd, absl::Now() + kWait);
  if (!frame.ok()) return frame.status();
  Reply reply;
  if (!reply.ParseFromString(*frame)) {
    return absl::DataLossError("unparsable reply");
  }
  return reply;
}

// Reads the chunks that follow an OK reply, checking the prefixes as the
// protocol defines them; returns the payload.
absl::StatusOr<std::string> ReadChunks(int fd,
                                       const v1::BulkFetchReply& reply) {
  std::string bytes;
  char prefix[kDataPlaneChunkPrefixBytes];
  while (static_cast<int64_t>(bytes.size()) < reply.header().total_bytes()) {
    const absl::Time deadline = absl::Now() + kWait;
    if (absl::Status s = ReadFull(fd, prefix, sizeof(prefix), deadline);
        !s.ok()) {
      return s;
    }
    const ChunkPrefix chunk = DecodeChunkPrefix(prefix);
    const uint64_t offset = static_cast<uint64_t>(chunk.offset);
    const uint64_t length = static_cast<uint64_t>(chunk.length);
    if (offset != bytes.size() || length == 0 ||
        length > static_cast<uint64_t>(reply.chunk_bytes())) {
      return absl::DataLossError(
          absl::StrCat("chunk at ", offset, " of ", length, " bytes"));
    }
    std::string payload(length, '\0');
    if (absl::Status s = ReadFull(fd, payload.data(), length, deadline);
        !s.ok()) {
      return s;
    }
    if (XXH3_64bits(payload.data(), length) != chunk.checksum) {
      return absl::DataLossError(absl::StrCat("checksum at ", offset));
    }
    bytes += payload;
  }
  return bytes;
}

// What the next read of a connection the server has closed gives.
absl::Status ReadAfterClose(int fd) {
  char byte;
  return ReadFull(fd, &byte, 1, absl::Now() + kWait);
}

// ---- DataPlaneServer + ShardClient
// -----------------------------------------------
class DataPlaneServerTest : public ::testing::Test {
 protected:
  void SetUp() override { StartServer(); }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
    if (grpc_server_ != nullptr) {
      grpc_server_->Shutdown(absl::ToChronoTime(absl::Now() + kWait));
    }
  }

  void StartServer(DataPlaneServerOptions options = {}) {
    ASSERT_OK_AND_ASSIGN(
        server_, DataPlaneServer::Start("127.0.0.1", registry_, options));
    client_ = ShardClient::Create(kNoGrpc, server_->address());
  }

  // The gRPC ShardService over the same registry, on 127.0.0.1:0; returns
  // its address.
  std::string StartGrpcServer() {
    grpc_service_ = std::make_unique<ShardServiceImpl>(registry_);
    grpc::ServerBuilder builder;
    ConfigureShardServer(&builder);
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port);
    builder.RegisterService(grpc_service_.get());
    grpc_server_ = builder.BuildAndStart();
    EXPECT_NE(grpc_server_, nullptr);
    return absl::StrCat("127.0.0.1:", port);
  }

  // Registers `tensor` as shard `index` of `num_shards` of `id`.
  Tensor Serve(const std::string& id, Tensor tensor, int64_t index = 1,
               int num_shards = 3) {
    EXPECT_OK(registry_->Register(
        id, testing::AsLocalShard(tensor, index, num_shards)));
    return tensor;
  }

  // A small fetch through a fresh client: the server still serves.
  absl::Status ServesGoodClient() {
    if (registry_->Find("probe") == nullptr) {
      Serve("probe", Filled({16, 8}, DType::kInt32, 99));
    }
    const std::shared_ptr<ShardClient> client =
        ShardClient::Create(kNoGrpc, server_->address());
    return FetchMatches(*client, "probe",
                        registry_->Find("probe")->local_shards[0].tensor);
  }

  std::shared_ptr<ShardRegistry> registry_ = std::make_shared<ShardRegistry>();
  std::unique_ptr<DataPlaneServer> server_;
  std::shared_ptr<ShardClient> client_;
  std::unique_ptr<ShardServiceImpl> grpc_service_;
  std::unique_ptr<grpc::Server> grpc_server_;
};

TEST_F(DataPlaneServerTest, FetchesEachDType) {
  for (DType dtype : {DType::kFloat32, DType::kInt64, DType::kBool}) {
    SCOPED_TRACE(DTypeName(dtype));
    const std::string id = absl::StrCat("t_", DTypeName(dtype));
    const Tensor tensor = Serve(id, Filled({37, 11}, dtype));
    EXPECT_OK(FetchMatches(*client_, id, tensor));
    EXPECT_OK(FetchMatches(*client_, id, tensor, 1, /*chunk_bytes=*/1));
  }
}

TEST_F(DataPlaneServerTest, ManyChunksOfAShardNotAMultipleOfTheChunk) {
  // 257 * 1021 * 4 bytes: about 1 MiB, 256 full chunks and a partial one.
  const Tensor tensor = Serve("t", Filled({257, 1021}, DType::kFloat32));
  ASSERT_NE(tensor.nbytes() % 4096, 0u);
  EXPECT_OK(FetchMatches(*client_, "t", tensor, 1, 4096));
}

TEST_F(DataPlaneServerTest, EmptyShard) {
  Serve("empty", Filled({0, 20}, DType::kFloat32), 0, 1);
  ASSERT_OK_AND_ASSIGN(Tensor destination, Tensor::Zeros({0, 20}));
  EXPECT_OK(client_->FetchShardInto("empty", 0, destination, Chunked(4096)));
  ASSERT_OK_AND_ASSIGN(Shard shard, client_->FetchShard("empty", 0));
  EXPECT_THAT(shard.tensor.sizes(), ElementsAre(0, 20));
  // The connection is still in step for the next request.
  EXPECT_OK(client_->FetchShardInto("empty", 0, destination));
}

TEST_F(DataPlaneServerTest, FetchesIntoAStridedView) {
  const Tensor tensor = Serve("t", Filled({50, 30}, DType::kInt64));
  ASSERT_OK_AND_ASSIGN(
      Tensor big,
      Tensor::Zeros({50, 40}, TensorOptions().WithDType(DType::kInt64)));
  ASSERT_OK_AND_ASSIGN(Tensor view, big.Narrow(1, 5, 30));
  ASSERT_FALSE(view.is_contiguous());
  ASSERT_OK(client_->FetchShardInto("t", 1, view, Chunked(4096)));
  EXPECT_EQ(RowMajorBytes(view), RowMajorBytes(tensor));
  // Columns outside the view are untouched.
  for (auto [start, length] : {std::pair<int64_t, int64_t>{0, 5}, {35, 5}}) {
    ASSERT_OK_AND_ASSIGN(Tensor outside, big.Narrow(1, start, length));
    EXPECT_EQ(RowMajorBytes(outside), std::string(50 * 5 * 8, '\0'));
  }
}

TEST_F(DataPlaneServerTest, StridedBoxesAreSentRunByRunOrStaged) {
  // Rows of 2 KiB; boxes of 300 columns (runs of 1200 bytes: sent from the
  // shard's memory, gathered by the kernel, thousands of runs a chunk, more
  // than one sendmsg takes) and of 100 (400 bytes: staged), in chunks that
  // end inside a run, inside an element, or hold all of it.
  const Tensor shard = Serve("t", Filled({3000, 512}, DType::kFloat32, 7));
  for (int64_t columns : {int64_t{300}, int64_t{100}}) {
    for (int64_t chunk_bytes : {int64_t{0}, int64_t{5003}, int64_t{1200}}) {
      SCOPED_TRACE(absl::StrCat(columns, " columns, chunks of ", chunk_bytes));
      ASSERT_OK_AND_ASSIGN(Tensor box, Tensor::Zeros({2990, columns}));
      ASSERT_OK(client_->FetchRegionInto("t", 1, {7, 128}, box,
                                         Chunked(chunk_bytes)));
      ASSERT_OK_AND_ASSIGN(const Tensor rows, shard.Narrow(0, 7, 2990));
      ASSERT_OK_AND_ASSIGN(const Tensor expected, rows.Narrow(1, 128, columns));
      EXPECT_EQ(RowMajorBytes(box), RowMajorBytes(expected));
    }
  }
  EXPECT_OK(ServesGoodClient());
}

TEST_F(DataPlaneServerTest, FetchShardAllocates) {
  const Tensor tensor = Serve("t", Filled({9, 13}, DType::kFloat32), 2);
  ASSERT_OK_AND_ASSIGN(Shard shard, client_->FetchShard("t", 2, Chunked(4096)));
  EXPECT_EQ(shard.tensor.dtype(), DType::kFloat32);
  EXPECT_EQ(RowMajorBytes(shard.tensor), RowMajorBytes(tensor));
  EXPECT_THAT(shard.metadata.shard_offsets(), ElementsAre(18, 0));
  EXPECT_THAT(shard.metadata.shard_sizes(), ElementsAre(9, 13));
}

TEST_F(DataPlaneServerTest, ErrorsKeepTheClientUsable) {
  const Tensor tensor = Serve("t", Filled({512, 512}, DType::kFloat32));
  ASSERT_OK_AND_ASSIGN(Tensor wrong_sizes, Tensor::Zeros({512, 511}));
  ASSERT_OK_AND_ASSIGN(Tensor right_sizes, Tensor::Zeros({512, 512}));
  struct Case {
    std::string id;
    int64_t index;
    const Tensor* destination;
    absl::StatusCode code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"missing", 1, &right_sizes, absl::StatusCode::kNotFound,
       "unknown tensor missing"},
      {"t", 0, &right_sizes, absl::StatusCode::kNotFound, "not served"},
      {"t", -1, &right_sizes, absl::StatusCode::kInvalidArgument,
       "negative shard_index -1"},
      // The server is streaming 1 MiB in 4 KiB chunks when the client
      // rejects the header and drops the connection.
      {"t", 1, &wrong_sizes, absl::StatusCode::kInvalidArgument, "[512, 511]"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(c.id, "/", c.index));
    EXPECT_THAT(
        client_->FetchShardInto(c.id, c.index, *c.destination, Chunked(4096)),
        StatusIs(c.code, HasSubstr(c.message)));
    EXPECT_OK(FetchMatches(*client_, "t", tensor, 1, 4096));
  }
}

TEST_F(DataPlaneServerTest, AgreesWithTheGrpcPlane) {
  const Tensor tensor = Serve("t", Filled({64, 33}, DType::kInt64));
  const std::string grpc_address = StartGrpcServer();
  const auto data_plane = ShardClient::Create(grpc_address, server_->address());
  const auto grpc_only = ShardClient::Create(grpc_address);
  ASSERT_OK_AND_ASSIGN(TensorDescription description,
                       data_plane->DescribeTensor("t"));
  EXPECT_THAT(description.local_shard_indices, ElementsAre(1));
  for (const auto& [id, index] : std::vector<std::pair<std::string, int64_t>>{
           {"t", 1}, {"t", 0}, {"t", 7}, {"t", -1}, {"missing", 0}, {"", 0}}) {
    SCOPED_TRACE(absl::StrCat(id, "/", index));
    absl::StatusOr<Shard> over_data_plane = data_plane->FetchShard(id, index);
    absl::StatusOr<Shard> over_grpc = grpc_only->FetchShard(id, index);
    EXPECT_EQ(over_data_plane.status().code(), over_grpc.status().code())
        << over_data_plane.status() << " vs " << over_grpc.status();
    if (over_data_plane.ok() && over_grpc.ok()) {
      EXPECT_EQ(RowMajorBytes(over_data_plane->tensor), RowMajorBytes(tensor));
      EXPECT_EQ(RowMajorBytes(over_grpc->tensor), RowMajorBytes(tensor));
    }
  }
}

TEST_F(DataPlaneServerTest, FetchesRegionsLikeTheGrpcPlane) {
  const Tensor tensor = Serve("t", Filled({64, 33}, DType::kInt64));
  const std::string grpc_address = StartGrpcServer();
  const auto grpc_only = ShardClient::Create(grpc_address);
  ASSERT_OK_AND_ASSIGN(Tensor box, tensor.Narrow(0, 5, 50));
  ASSERT_OK_AND_ASSIGN(box, box.Narrow(1, 3, 27));
  const std::string expected = RowMajorBytes(box);
  const TensorOptions int64 = TensorOptions().WithDType(DType::kInt64);
  for (const ShardClient* client : {client_.get(), grpc_only.get()}) {
    ASSERT_OK_AND_ASSIGN(Tensor into, Tensor::Zeros({50, 27}, int64));
    int64_t reported = 0;
    FetchOptions options = Chunked(4096);
    options.on_chunk = [&reported](int64_t bytes) { reported += bytes; };
    ASSERT_OK(client->FetchRegionInto("t", 1, {5, 3}, into, options));
    EXPECT_EQ(RowMajorBytes(into), expected);
    EXPECT_EQ(reported, 50 * 27 * 8);
  }
  // Errors are the same on both planes, and the data-plane connection
  // stays usable after each.
  ASSERT_OK_AND_ASSIGN(Tensor ten_rows, Tensor::Zeros({10, 33}, int64));
  ASSERT_OK_AND_ASSIGN(Tensor row, Tensor::Zeros({33}, int64));
  struct Case {
    std::vector<int64_t> offsets;
    const Tensor* destination;
    absl::StatusCode code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{60, 0},
       &ten_rows,
       absl::StatusCode::kOutOfRange,
       "leaves the shard (sizes [64, 33])"},
      {{0},
       &row,
       absl::StatusCode::kInvalidArgument,
       "1 offsets and 1 sizes for a shard of 2 dimensions"},
      {{0, -3}, &ten_rows, absl::StatusCode::kInvalidArgument, "negative"},
  };
  for (const Case& c : cases) {
    for (const ShardClient* client : {client_.get(), grpc_only.get()}) {
      EXPECT_THAT(client->FetchRegionInto("t", 1, c.offsets, *c.destination),
                  StatusIs(c.code, HasSubstr(c.message)));
    }
    EXPECT_OK(FetchMatches(*client_, "t", tensor, 1, 4096));
  }
}

// Pipelined boxes (a read plan's pieces of small shards): every request
// goes out before any answer is read; each box gets its bytes or its own
// error, and a refused box leaves the others and the connection in step.
TEST_F(DataPlaneServerTest, PipelinedBoxesAreAnsweredInOrder) {
  const Tensor tensor = Serve("t", Filled({64, 33}, DType::kInt64));
  const Tensor other = Serve("u", Filled({8, 4}, DType::kInt64, 7), 0, 2);
  const TensorOptions int64 = TensorOptions().WithDType(DType::kInt64);
  std::vector<ShardClient::RegionFetch> boxes(
      ShardClient::kMaxPipelinedFetches + 2);
  std::vector<int64_t> versions(boxes.size(), -1);
  for (size_t i = 0; i < boxes.size(); ++i) {
    ShardClient::RegionFetch& box = boxes[i];
    box.tensor_id = i % 2 == 0 ? "t" : "u";
    box.shard_index = i % 2 == 0 ? 1 : 0;
    const int64_t row = static_cast<int64_t>(i) % (i % 2 == 0 ? 60 : 6);
    box.region_offsets = {row, 1};
    ASSERT_OK_AND_ASSIGN(box.destination, Tensor::Zeros({2, 3}, int64));
    box.served_version = &versions[i];
  }
  boxes[5].tensor_id = "nope";        // NOT_FOUND
  boxes[8].region_offsets = {63, 0};  // OUT_OF_RANGE: leaves the shard
  const std::vector<absl::Status> fetched =
      client_->FetchRegionsPipelined(boxes, Chunked(4096));
  ASSERT_EQ(fetched.size(), boxes.size());
  for (size_t i = 0; i < ShardClient::kMaxPipelinedFetches; ++i) {
    SCOPED_TRACE(i);
    if (i == 5) {
      EXPECT_THAT(fetched[i],
                  StatusIs(absl::StatusCode::kNotFound, HasSubstr("nope")));
    } else if (i == 8) {
      EXPECT_THAT(fetched[i], StatusIs(absl::StatusCode::kOutOfRange,
                                       HasSubstr("leaves the shard")));
    } else {
      ASSERT_OK(fetched[i]);
      const Tensor& source = i % 2 == 0 ? tensor : other;
      ASSERT_OK_AND_ASSIGN(Tensor rows,
                           source.Narrow(0, boxes[i].region_offsets[0], 2));
      ASSERT_OK_AND_ASSIGN(Tensor box, rows.Narrow(1, 1, 3));
      EXPECT_EQ(RowMajorBytes(boxes[i].destination), RowMajorBytes(box));
      EXPECT_EQ(versions[i], 0);  // Unversioned.
    }
  }
  // Beyond the most one batch sends: refused, untouched.
  for (size_t i = ShardClient::kMaxPipelinedFetches; i < boxes.size(); ++i) {
    EXPECT_THAT(fetched[i], StatusIs(absl::StatusCode::kInvalidArgument,
                                     HasSubstr("per batch")));
    EXPECT_EQ(versions[i], -1);
  }
  // The pooled connection is still in step.
  EXPECT_OK(FetchMatches(*client_, "t", tensor, 1, 4096));
  // A connection the server closed while pooled is replaced once.
  server_->Shutdown();
  DataPlaneServerOptions options;
  options.idle_timeout = absl::Milliseconds(100);
  StartServer(options);
  ASSERT_OK(FetchMatches(*client_, "t", tensor));
  absl::SleepFor(absl::Milliseconds(300));
  boxes.resize(3);
  EXPECT_THAT(client_->FetchRegionsPipelined(boxes, Chunked(4096)),
              ::testing::Each(IsOk()));
  // No server at all: every box says why, none hangs.
  const auto nowhere = ShardClient::Create(kNoGrpc, "127.0.0.1:1");
  for (const absl::Status& status :
       nowhere->FetchRegionsPipelined(boxes, Chunked(4096))) {
    EXPECT_THAT(status, StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
  }
}

// ---- raw sockets ------------------------------------------------------------

TEST_F(DataPlaneServerTest, WrongMagicClosesTheConnection) {
  UniqueFd socket = Dial(server_->address(), "NOTBULK!");
  EXPECT_THAT(ReadAfterClose(socket.get()),
              StatusIs(absl::StatusCode::kUnavailable, _));
  EXPECT_OK(ServesGoodClient());
}

TEST_F(DataPlaneServerTest, OversizedFrameClosesTheConnection) {
  UniqueFd socket = Dial(server_->address());
  char length[4];
  const uint32_t n = kMaxDataPlaneFrameBytes + 1;
  for (int i = 0; i < 4; ++i) length[i] = static_cast<char>(n >> (8 * i));
  ASSERT_OK(WriteFull(socket.get(), length, 4, absl::Now() + kWait));
  EXPECT_THAT(ReadAfterClose(socket.get()),
              StatusIs(absl::StatusCode::kUnavailable, _));
  EXPECT_OK(ServesGoodClient());
}

TEST_F(DataPlaneServerTest, UnparsableRequestIsAnsweredAndTheConnectionKept) {
  const Tensor tensor = Serve("t", Filled({100, 100}, DType::kInt32));
  UniqueFd socket = Dial(server_->address());
  // A length-delimited field that claims 127 bytes and has 5.
  ASSERT_OK(WriteFrame(socket.get(), "\x0a\x7fshort", absl::Now() + kWait));
  ASSERT_OK_AND_ASSIGN(v1::BulkFetchReply reply, ReadReply(socket.get()));
  EXPECT_EQ(reply.code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(reply.message(), HasSubstr("malformed"));

  // Chunk sizes below the minimum are raised to it.
  ASSERT_OK(
      WriteFrame(socket.get(), RequestFrame("t", 1, 100), absl::Now() + kWait));
  ASSERT_OK_AND_ASSIGN(reply, ReadReply(socket.get()));
  ASSERT_EQ(reply.code(), 0) << reply.message();
  EXPECT_EQ(reply.chunk_bytes(), ShardServiceOptions::kMinChunkBytes);
  EXPECT_EQ(reply.header().total_bytes(), 40000);
  ASSERT_OK_AND_ASSIGN(std::string bytes, ReadChunks(socket.get(), reply));
  EXPECT_EQ(bytes, RowMajorBytes(tensor));
}

TEST_F(DataPlaneServerTest, ErrorReplyLeavesTheConnectionInStep) {
  UniqueFd socket = Dial(server_->address());
  ASSERT_OK(WriteFrame(socket.get(), RequestFrame("missing", 0),
                       absl::Now() + kWait));
  ASSERT_OK_AND_ASSIGN(v1::BulkFetchReply reply, ReadReply(socket.get()));
  EXPECT_EQ(reply.code(), static_cast<int>(absl::StatusCode::kNotFound));
  EXPECT_THAT(reply.message(), HasSubstr("missing"));
  EXPECT_FALSE(reply.has_header());
  const Tensor tensor = Serve("t", Filled({3, 5}, DType::kInt64));
  ASSERT_OK(
      WriteFrame(socket.get(), RequestFrame("t", 1), absl::Now() + kWait));
  ASSERT_OK_AND_ASSIGN(reply, ReadReply(socket.get()));
  ASSERT_EQ(reply.code(), 0) << reply.message();
  ASSERT_OK_AND_ASSIGN(std::string bytes, ReadChunks(socket.get(), reply));
  EXPECT_EQ(bytes, RowMajorBytes(tensor));
}

TEST_F(DataPlaneServerTest, SilentAndHalfGreetedClientsDoNotBlockOthers) {
  UniqueFd silent = Dial(server_->address(), "");
  UniqueFd half = Dial(server_->address(), "TSR");
  UniqueFd greeted = Dial(server_->address());
  EXPECT_OK(ServesGoodClient());
}

TEST_F(DataPlaneServerTest, ConnectionsBeyondTheLimitAreRefused) {
  DataPlaneServerOptions options;
  options.max_connections = 1;
  StartServer(options);
  UniqueFd held = Dial(server_->address());
  // An answered request proves the server has accepted `held`.
  ASSERT_OK(
      WriteFrame(held.get(), RequestFrame("missing", 0), absl::Now() + kWait));
  ASSERT_OK(ReadReply(held.get()).status());
  UniqueFd refused = Dial(server_->address());
  EXPECT_THAT(ReadAfterClose(refused.get()),
              StatusIs(absl::StatusCode::kUnavailable, _));
  held = UniqueFd();
  // The slot frees once the server has seen `held` close.
  const absl::Time deadline = absl::Now() + kWait;
  absl::Status served;
  while (!(served = ServesGoodClient()).ok() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_OK(served);
}

TEST_F(DataPlaneServerTest, ClientVanishingMidStreamDoesNotHurtTheServer) {
  Serve("big", Filled({1024, 1024}, DType::kFloat32));
  for (int i = 0; i < 3; ++i) {
    UniqueFd socket = Dial(server_->address());
    ASSERT_OK(WriteFrame(socket.get(), RequestFrame("big", 1, 4096),
                         absl::Now() + kWait));
    ASSERT_OK_AND_ASSIGN(v1::BulkFetchReply reply, ReadReply(socket.get()));
    ASSERT_EQ(reply.code(), 0) << reply.message();
    char some[100];
    ASSERT_OK(ReadFull(socket.get(), some, sizeof(some), absl::Now() + kWait));
  }  // Closed with most of the shard unsent.
  EXPECT_OK(ServesGoodClient());
}

TEST_F(DataPlaneServerTest, ShutdownInterruptsEveryConnectionPromptly) {
  // Bigger than the loopback socket buffers, so the server blocks writing.
  ASSERT_OK_AND_ASSIGN(
      Tensor huge,
      Tensor::Zeros({32 << 20}, TensorOptions().WithDType(DType::kUInt8)));
  Serve("huge", huge);
  EXPECT_OK(ServesGoodClient());
  std::vector<UniqueFd> sockets;
  sockets.push_back(Dial(server_->address(), ""));
  sockets.push_back(Dial(server_->address()));
  sockets.push_back(Dial(server_->address()));
  ASSERT_OK(WriteFrame(sockets.back().get(), RequestFrame("huge", 1),
                       absl::Now() + kWait));
  ASSERT_OK_AND_ASSIGN(v1::BulkFetchReply reply,
                       ReadReply(sockets.back().get()));
  absl::SleepFor(absl::Milliseconds(50));  // Let the socket buffers fill.

  const absl::Time start = absl::Now();
  server_->Shutdown();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  server_->Shutdown();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  // Every connection was closed; the one mid-stream after part of it.
  for (size_t i = 0; i + 1 < sockets.size(); ++i) {
    EXPECT_THAT(ReadAfterClose(sockets[i].get()),
                StatusIs(absl::StatusCode::kUnavailable, _));
  }
  EXPECT_THAT(ReadChunks(sockets.back().get(), reply),
              StatusIs(absl::StatusCode::kUnavailable, _));
  EXPECT_THAT(
      client_->FetchShard("probe", 1, Chunked(0, absl::Seconds(2))),
      StatusIs(absl::StatusCode::kUnavailable, HasSubstr("tensor probe")));
}

TEST_F(DataPlaneServerTest, ShutdownWithGraceLetsRunningFetchesFinish) {
  // Bigger than the loopback socket buffers, so the server blocks writing.
  ASSERT_OK_AND_ASSIGN(
      Tensor huge,
      Tensor::Zeros({32 << 20}, TensorOptions().WithDType(DType::kUInt8)));
  Serve("huge", huge);
  UniqueFd idle = Dial(server_->address());
  UniqueFd busy = Dial(server_->address());
  ASSERT_OK(
      WriteFrame(busy.get(), RequestFrame("huge", 1), absl::Now() + kWait));
  ASSERT_OK_AND_ASSIGN(v1::BulkFetchReply reply, ReadReply(busy.get()));
  ASSERT_EQ(reply.code(), 0) << reply.message();
  absl::SleepFor(absl::Milliseconds(50));  // Let the socket buffers fill.

  const absl::Time start = absl::Now();
  std::thread stopper([this] { server_->Shutdown(absl::Seconds(20)); });
  // Idle connections close at once; new ones are refused.
  EXPECT_THAT(ReadAfterClose(idle.get()),
              StatusIs(absl::StatusCode::kUnavailable, _));
  EXPECT_THAT(
      client_->FetchShard("probe", 1, Chunked(0, absl::Seconds(2))),
      StatusIs(absl::StatusCode::kUnavailable, HasSubstr("tensor probe")));
  // The running fetch completes, then its connection closes and Shutdown
  // returns without waiting out the grace period.
  ASSERT_OK_AND_ASSIGN(std::string bytes, ReadChunks(busy.get(), reply));
  EXPECT_EQ(bytes.size(), size_t{32} << 20);
  EXPECT_THAT(ReadAfterClose(busy.get()),
              StatusIs(absl::StatusCode::kUnavailable, _));
  stopper.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

TEST_F(DataPlaneServerTest, ShutdownGraceIsBoundedByStalledReaders) {
  ASSERT_OK_AND_ASSIGN(
      Tensor huge,
      Tensor::Zeros({32 << 20}, TensorOptions().WithDType(DType::kUInt8)));
  Serve("huge", huge);
  UniqueFd stalled = Dial(server_->address());
  ASSERT_OK(
      WriteFrame(stalled.get(), RequestFrame("huge", 1), absl::Now() + kWait));
  ASSERT_OK_AND_ASSIGN(v1::BulkFetchReply reply, ReadReply(stalled.get()));
  absl::SleepFor(absl::Milliseconds(50));

  // Nobody reads: the server is stuck writing until the grace ends.
  const absl::Time start = absl::Now();
  server_->Shutdown(absl::Milliseconds(300));
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, absl::Milliseconds(250));
  EXPECT_LT(took, absl::Seconds(3));
  EXPECT_THAT(ReadChunks(stalled.get(), reply),
              StatusIs(absl::StatusCode::kUnavailable, _));
}

// ---- the pool --------------------------------------------------------------
TEST_F(DataPlaneServerTest, PooledConnectionClosedByTheServerIsRetried) {
  DataPlaneServerOptions options;
  options.idle_timeout = absl::Milliseconds(100);
  StartServer(options);
  const Tensor tensor = Serve("t", Filled({20, 20}, DType::kFloat32));
  ASSERT_OK(FetchMatches(*client_, "t", tensor));
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_OK(FetchMatches(*client_, "t", tensor));
}

TEST_F(DataPlaneServerTest, ManyPooledConnectionsClosedByTheServerAreRetried) {
  DataPlaneServerOptions options;
  options.idle_timeout = absl::Milliseconds(100);
  StartServer(options);
  const Tensor tensor = Serve("t", Filled({512, 512}, DType::kFloat32));
  // Concurrent fetches leave several connections in the pool.
  std::vector<absl::Status> results(4);
  std::vector<std::thread> threads;
  for (absl::Status& result : results) {
    threads.emplace_back(
        [&] { result = FetchMatches(*client_, "t", tensor, 1, 4096); });
  }
  for (std::thread& thread : threads) thread.join();
  for (const absl::Status& result : results) EXPECT_OK(result);
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_OK(FetchMatches(*client_, "t", tensor));
}

// ---- concurrency ------------------------------------------------------------

TEST_F(DataPlaneServerTest, ConcurrentFetchesThroughOneClient) {
  constexpr int kThreads = 8;
  std::vector<Tensor> tensors;
  for (int i = 0; i < kThreads; ++i) {
    tensors.push_back(Serve(absl::StrCat("t", i),
                            Filled({64 + i, 1000}, DType::kFloat32, i), i % 3));
  }
  std::vector<absl::Status> results(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      for (int round = 0; round < 3 && results[i].ok(); ++round) {
        results[i] = FetchMatches(*client_, absl::StrCat("t", i), tensors[i],
                                  i % 3, round == 0 ? 4096 : 0);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int i = 0; i < kThreads; ++i) EXPECT_OK(results[i]) << "thread " << i;
}

TEST_F(DataPlaneServerTest, UnregisterDuringAFetch) {
  const Tensor tensor = Filled({2048, 1024}, DType::kFloat32);  // 8 MiB
  for (int delay_ms : {0, 2, 10}) {
    SCOPED_TRACE(absl::StrCat("unregistered after ", delay_ms, " ms"));
    Serve("t", tensor);
    absl::Status fetched;
    std::thread fetcher(
        [&] { fetched = FetchMatches(*client_, "t", tensor, 1, 4096); });
    absl::SleepFor(absl::Milliseconds(delay_ms));
    EXPECT_TRUE(registry_->Unregister("t"));
    fetcher.join();
    // Either the fetch started first and completes from the bytes it
    // holds, or it finds the tensor gone.
    EXPECT_THAT(fetched, AnyOf(IsOk(), StatusIs(absl::StatusCode::kNotFound,
                                                HasSubstr("tensor t"))));
    EXPECT_THAT(client_->FetchShard("t", 1),
                StatusIs(absl::StatusCode::kNotFound, HasSubstr("t")));
  }
  EXPECT_OK(ServesGoodClient());
}

// ---- writes -----------------------------------------------------------------

RegionWriteOptions WriteOptions(int64_t chunk_bytes = 0) {
  RegionWriteOptions options;
  options.chunk_bytes = chunk_bytes;
  options.deadline = absl::Now() + absl::Seconds(10);
  return options;
}

// A DataPlaneRequest frame asking to write `sizes` at `offsets` of shard
// `index` of `id`, announcing `total_bytes`.
std::string WriteRequestFrame(const std::string& id, int64_t index,
                              std::vector<int64_t> offsets,
                              std::vector<int64_t> sizes, DType dtype,
                              int64_t total_bytes, int64_t chunk_bytes = 0) {
  v1::DataPlaneRequest framed;
  v1::BulkWriteRequest& request = *framed.mutable_write();
  request.set_tensor_id(id);
  request.set_shard_index(index);
  request.mutable_region_offsets()->Add(offsets.begin(), offsets.end());
  request.mutable_region_sizes()->Add(sizes.begin(), sizes.end());
  request.set_dtype(ToProto(dtype));
  request.set_total_bytes(total_bytes);
  request.set_chunk_bytes(chunk_bytes);
  return framed.SerializeAsString();
}

absl::StatusOr<v1::BulkWriteReply> ReadWriteReply(int fd) {
  return ReadReply<v1::BulkWriteReply>(fd);
}

// Sends one chunk: its prefix (with `checksum`, the payload's own by
// default) and payload.
absl::Status SendChunk(int fd, int64_t offset, absl::string_view payload,
                       std::optional<uint64_t> checksum = std::nullopt) {
  char prefix[kDataPlaneChunkPrefixBytes];
  EncodeChunkPrefix(ChunkPrefix{offset, static_cast<int64_t>(payload.size()),
                                checksum.value_or(XXH3_64bits(payload.data(),
                                                              payload.size()))},
                    prefix);
  RETURN_IF_ERROR(WriteFull(fd, prefix, sizeof(prefix), absl::Now() + kWait));
  return WriteFull(fd, payload.data(), payload.size(), absl::Now() + kWait);
}

// A raw connection to `address` that asked to write all 16 KiB of shard 1
// of "t" (4 x 1024 int32) in 4 KiB chunks and got the go-ahead (or an
// invalid fd, with a test failure).
UniqueFd StartRawWrite(const std::string& address) {
  UniqueFd socket = Dial(address, kDataPlaneRequestMagic);
  EXPECT_OK(WriteFrame(
      socket.get(),
      WriteRequestFrame("t", 1, {0, 0}, {4, 1024}, DType::kInt32, 16384, 4096),
      absl::Now() + kWait));
  absl::StatusOr<v1::BulkWriteReply> reply = ReadWriteReply(socket.get());
  EXPECT_OK(reply.status());
  if (!reply.ok() || reply->code() != 0 || reply->chunk_bytes() != 4096) {
    ADD_FAILURE() << (reply.ok() ? reply->DebugString() : "no reply");
    return UniqueFd();
  }
  return socket;
}

// That the connection `fd` is in step: shard 1 of "t" fetched over it
// next holds `bytes`.
void ExpectFetchesNext(int fd, const std::string& bytes) {
  v1::DataPlaneRequest fetch;
  fetch.mutable_fetch()->set_tensor_id("t");
  fetch.mutable_fetch()->set_shard_index(1);
  ASSERT_OK(WriteFrame(fd, fetch.SerializeAsString(), absl::Now() + kWait));
  ASSERT_OK_AND_ASSIGN(v1::BulkFetchReply fetched, ReadReply(fd));
  ASSERT_EQ(fetched.code(), 0) << fetched.message();
  EXPECT_THAT(ReadChunks(fd, fetched), IsOkAndHolds(bytes));
}

class DataPlaneWriteTest : public DataPlaneServerTest {
 protected:
  void SetUp() override {
    DataPlaneServerOptions options;
    options.accept_writes = true;
    StartServer(options);
  }
};

TEST_F(DataPlaneWriteTest, WritesABoxStraightIntoTheShard) {
  for (DType dtype : {DType::kFloat32, DType::kInt64, DType::kBool}) {
    SCOPED_TRACE(DTypeName(dtype));
    const std::string id = absl::StrCat("t_", DTypeName(dtype));
    const Tensor shard = Serve(id, Filled({40, 16}, dtype, 1));
    const std::string before = RowMajorBytes(shard);
    const Tensor data = Filled({25, 16}, dtype, 2);
    // Whole rows 10..34: one dense run of the shard, in many chunks.
    for (int64_t chunk_bytes : {int64_t{0}, int64_t{1}}) {
      ASSERT_OK_AND_ASSIGN(const bool written,
                           client_->WriteRegion(id, 1, {10, 0}, data,
                                                WriteOptions(chunk_bytes)));
      EXPECT_TRUE(written);
    }
    const size_t row = 16 * ElementSize(dtype);
    const std::string after = RowMajorBytes(shard);
    EXPECT_EQ(after.substr(0, 10 * row), before.substr(0, 10 * row));
    EXPECT_EQ(after.substr(10 * row, 25 * row), RowMajorBytes(data));
    EXPECT_EQ(after.substr(35 * row), before.substr(35 * row));
  }
  // A strided source (a column slice of a wider tensor) is sent row-major.
  const Tensor shard = Serve("s", Filled({8, 4}, DType::kInt32, 3));
  const Tensor wide = Filled({2, 10}, DType::kInt32, 4);
  ASSERT_OK_AND_ASSIGN(const Tensor source, wide.Narrow(1, 3, 4));
  ASSERT_OK_AND_ASSIGN(
      const bool written,
      client_->WriteRegion("s", 1, {5, 0}, source, WriteOptions()));
  EXPECT_TRUE(written);
  EXPECT_EQ(RowMajorBytes(shard).substr(5 * 16, 2 * 16), RowMajorBytes(source));
  EXPECT_OK(ServesGoodClient());
}

TEST_F(DataPlaneWriteTest, WhatCannotBeWrittenInPlaceFallsBackUntouched) {
  const Tensor shard = Serve("t", Filled({8, 8}, DType::kFloat32, 1));
  const std::string before = RowMajorBytes(shard);
  // Columns 2..5 of every row: not one dense run.
  const Tensor columns = Filled({8, 4}, DType::kFloat32, 2);
  EXPECT_THAT(client_->WriteRegion("t", 1, {0, 2}, columns, WriteOptions()),
              IsOkAndHolds(false));
  // A tensor or shard this server does not hold (it may be refilling, or
  // gone: gRPC's WriteRegion says which).
  const Tensor row = Filled({1, 8}, DType::kFloat32, 3);
  EXPECT_THAT(client_->WriteRegion("missing", 1, {0, 0}, row, WriteOptions()),
              IsOkAndHolds(false));
  EXPECT_THAT(client_->WriteRegion("t", 0, {0, 0}, row, WriteOptions()),
              IsOkAndHolds(false));
  // No replica of it here.
  RegionWriteOptions replica = WriteOptions();
  replica.replica = true;
  EXPECT_THAT(client_->WriteRegion("t", 1, {0, 0}, row, replica),
              IsOkAndHolds(false));
  EXPECT_EQ(RowMajorBytes(shard), before);

  // A server that takes no writes (a library rank) falls every one back.
  DataPlaneServerOptions read_only;
  StartServer(read_only);
  EXPECT_THAT(client_->WriteRegion("t", 1, {0, 0}, row, WriteOptions()),
              IsOkAndHolds(false));
  EXPECT_EQ(RowMajorBytes(shard), before);
  // A client without a data plane never tries.
  const auto grpc_only = ShardClient::Create(kNoGrpc);
  EXPECT_THAT(grpc_only->WriteRegion("t", 1, {0, 0}, row, WriteOptions()),
              IsOkAndHolds(false));
}

TEST_F(DataPlaneWriteTest, BadWritesAreRefusedBeforeAnyByteMoves) {
  const Tensor shard = Serve("t", Filled({8, 8}, DType::kFloat32, 1));
  const std::string before = RowMajorBytes(shard);
  const Tensor row = Filled({1, 8}, DType::kFloat32, 3);
  EXPECT_THAT(client_->WriteRegion("t", 1, {8, 0}, row, WriteOptions()),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("tensor t")));
  EXPECT_THAT(client_->WriteRegion("t", 1, {-1, 0}, row, WriteOptions()),
              StatusIs(absl::StatusCode::kInvalidArgument, _));
  EXPECT_THAT(client_->WriteRegion("t", 1, {0}, row, WriteOptions()),
              StatusIs(absl::StatusCode::kInvalidArgument, _));
  const Tensor ints = Filled({1, 8}, DType::kInt32, 3);
  EXPECT_THAT(client_->WriteRegion("t", 1, {0, 0}, ints, WriteOptions()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("the tensor is float32")));
  // Raw: a total that is not the box's, an unknown dtype, huge sizes.
  UniqueFd socket = Dial(server_->address(), kDataPlaneRequestMagic);
  for (const std::string& frame :
       {WriteRequestFrame("t", 1, {0, 0}, {1, 8}, DType::kFloat32, 31),
        WriteRequestFrame("t", 1, {0, 0}, {1, 8}, DType::kFloat32, -1),
        WriteRequestFrame("t", 1, {0, 0}, {int64_t{1} << 62, int64_t{1} << 62},
                          DType::kFloat32, 32)}) {
    ASSERT_OK(WriteFrame(socket.get(), frame, absl::Now() + kWait));
    ASSERT_OK_AND_ASSIGN(v1::BulkWriteReply reply,
                         ReadWriteReply(socket.get()));
    EXPECT_NE(reply.code(), 0);
    EXPECT_FALSE(reply.fallback());
  }
  {
    v1::DataPlaneRequest framed;
    framed.mutable_write()->set_tensor_id("t");
    framed.mutable_write()->set_shard_index(1);
    framed.mutable_write()->add_region_offsets(0);
    framed.mutable_write()->add_region_offsets(0);
    framed.mutable_write()->add_region_sizes(1);
    framed.mutable_write()->add_region_sizes(8);
    framed.mutable_write()->set_dtype(static_cast<v1::DType>(999));
    framed.mutable_write()->set_total_bytes(32);
    ASSERT_OK(WriteFrame(socket.get(), framed.SerializeAsString(),
                         absl::Now() + kWait));
    ASSERT_OK_AND_ASSIGN(v1::BulkWriteReply reply,
                         ReadWriteReply(socket.get()));
    EXPECT_EQ(reply.code(),
              static_cast<int>(absl::StatusCode::kInvalidArgument));
  }
  // An empty request is malformed; the connection stays in step.
  ASSERT_OK(WriteFrame(socket.get(), "", absl::Now() + kWait));
  ASSERT_OK_AND_ASSIGN(v1::BulkWriteReply reply, ReadWriteReply(socket.get()));
  EXPECT_EQ(reply.code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(RowMajorBytes(shard), before);
  // Still usable: a real write over the same connection.
  ASSERT_OK(
      WriteFrame(socket.get(),
                 WriteRequestFrame("t", 1, {7, 0}, {1, 8}, DType::kFloat32, 32),
                 absl::Now() + kWait));
  ASSERT_OK_AND_ASSIGN(reply, ReadWriteReply(socket.get()));
  ASSERT_EQ(reply.code(), 0) << reply.message();
  ASSERT_FALSE(reply.fallback());
  ASSERT_OK(SendChunk(socket.get(), 0, RowMajorBytes(row)));
  ASSERT_OK_AND_ASSIGN(reply, ReadWriteReply(socket.get()));
  EXPECT_EQ(reply.code(), 0) << reply.message();
  EXPECT_EQ(reply.bytes_written(), 32);
  EXPECT_EQ(RowMajorBytes(shard).substr(7 * 32), RowMajorBytes(row));
}

// A box of at most kInlineWriteBytes travels inside its request: one
// request, one reply, no go-ahead and no chunks.
TEST_F(DataPlaneWriteTest, ASmallBoxComesWithItsRequestInOneRoundTrip) {
  const Tensor shard = Serve("t", Filled({4, 1024}, DType::kInt32, 1));
  const std::string before = RowMajorBytes(shard);
  const std::string bytes = RowMajorBytes(Filled({2, 1024}, DType::kInt32, 2));
  const auto inline_frame = [&](const std::string& data, uint64_t checksum) {
    v1::DataPlaneRequest framed;
    framed.ParseFromString(
        WriteRequestFrame("t", 1, {1, 0}, {2, 1024}, DType::kInt32, 8192));
    framed.mutable_write()->set_data(data);
    framed.mutable_write()->set_data_checksum(checksum);
    return framed.SerializeAsString();
  };
  UniqueFd socket = Dial(server_->address(), kDataPlaneRequestMagic);
  // Refused, nothing written, the connection kept in step: bytes whose
  // checksum does not match, and fewer bytes than the box holds.
  ASSERT_OK(
      WriteFrame(socket.get(), inline_frame(bytes, 42), absl::Now() + kWait));
  ASSERT_OK_AND_ASSIGN(v1::BulkWriteReply reply, ReadWriteReply(socket.get()));
  EXPECT_EQ(reply.code(), static_cast<int>(absl::StatusCode::kDataLoss));
  EXPECT_THAT(reply.message(), HasSubstr("nothing written"));
  const std::string short_data = bytes.substr(0, 100);
  ASSERT_OK(
      WriteFrame(socket.get(),
                 inline_frame(short_data, XXH3_64bits(short_data.data(), 100)),
                 absl::Now() + kWait));
  ASSERT_OK_AND_ASSIGN(reply, ReadWriteReply(socket.get()));
  EXPECT_EQ(reply.code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(reply.message(), HasSubstr("100 bytes for a box of 8192"));
  EXPECT_EQ(RowMajorBytes(shard), before);
  // Written: the one reply is the last (bytes written, no chunk size).
  ASSERT_OK(WriteFrame(socket.get(),
                       inline_frame(bytes, XXH3_64bits(bytes.data(), 8192)),
                       absl::Now() + kWait));
  ASSERT_OK_AND_ASSIGN(reply, ReadWriteReply(socket.get()));
  EXPECT_EQ(reply.code(), 0) << reply.message();
  EXPECT_EQ(reply.bytes_written(), 8192);
  EXPECT_EQ(reply.chunk_bytes(), 0);
  const std::string after = RowMajorBytes(shard);
  EXPECT_EQ(after.substr(0, 4096), before.substr(0, 4096));
  EXPECT_EQ(after.substr(4096, 8192), bytes);
  EXPECT_EQ(after.substr(12288), before.substr(12288));
  ExpectFetchesNext(socket.get(), after);
}

// The client sends a box of at most kInlineWriteBytes with its request and
// streams a larger one in chunks; both land whole.
TEST_F(DataPlaneWriteTest, TheClientSendsSmallBoxesInlineAndLargeOnesInChunks) {
  const int64_t columns = kInlineWriteBytes / 4;  // one row: the most inline
  const Tensor shard = Serve("t", Filled({4, columns}, DType::kFloat32, 1));
  for (int64_t rows : {int64_t{1}, int64_t{3}}) {
    SCOPED_TRACE(rows);
    const Tensor data = Filled({rows, columns}, DType::kFloat32, 2 + rows);
    ASSERT_OK_AND_ASSIGN(
        const bool written,
        client_->WriteRegion("t", 1, {1, 0}, data, WriteOptions(4096)));
    EXPECT_TRUE(written);
    const size_t row = static_cast<size_t>(kInlineWriteBytes);
    EXPECT_EQ(RowMajorBytes(shard).substr(row, rows * row),
              RowMajorBytes(data));
  }
  EXPECT_OK(ServesGoodClient());
}

TEST_F(DataPlaneWriteTest, ACorruptChunkIsDataLossAndTheConnectionStaysInStep) {
  const Tensor shard = Serve("t", Filled({4, 1024}, DType::kInt32, 1));
  const std::string before = RowMajorBytes(shard);
  const Tensor data = Filled({4, 1024}, DType::kInt32, 2);
  const std::string bytes = RowMajorBytes(data);  // 16 KiB
  UniqueFd socket = StartRawWrite(server_->address());
  ASSERT_TRUE(socket.valid());
  // The second chunk's checksum is wrong: the first is written, the second
  // holds what arrived, the last two are read and dropped.
  for (int64_t offset = 0; offset < 16384; offset += 4096) {
    ASSERT_OK(
        SendChunk(socket.get(), offset, bytes.substr(offset, 4096),
                  offset == 4096 ? std::optional<uint64_t>(42) : std::nullopt));
  }
  ASSERT_OK_AND_ASSIGN(v1::BulkWriteReply reply, ReadWriteReply(socket.get()));
  EXPECT_EQ(reply.code(), static_cast<int>(absl::StatusCode::kDataLoss));
  EXPECT_THAT(reply.message(), HasSubstr("checksum mismatch"));
  EXPECT_THAT(reply.message(), HasSubstr("bytes [0, 4096) of the box"));
  EXPECT_EQ(reply.bytes_written(), 4096);
  const std::string after = RowMajorBytes(shard);
  EXPECT_EQ(after.substr(0, 8192), bytes.substr(0, 8192));
  EXPECT_EQ(after.substr(8192), before.substr(8192));
  ExpectFetchesNext(socket.get(), after);
}

TEST_F(DataPlaneWriteTest, AStreamOutOfStepIsRefusedAndClosed) {
  const Tensor shard = Serve("t", Filled({4, 1024}, DType::kInt32, 1));
  const std::string before = RowMajorBytes(shard);
  const std::string payload(4096, 'x');
  struct Case {
    const char* name;
    int64_t offset;
    std::string payload;
  };
  for (const Case& bad : std::vector<Case>{
           {"a chunk that skips ahead", 4096, payload},
           {"a chunk larger than allowed", 0, std::string(8192, 'x')},
           {"an empty chunk", 0, ""},
       }) {
    SCOPED_TRACE(bad.name);
    UniqueFd socket = StartRawWrite(server_->address());
    ASSERT_TRUE(socket.valid());
    // Only the prefix is read before the refusal; the payload may be cut.
    SendChunk(socket.get(), bad.offset, bad.payload).IgnoreError();
    ASSERT_OK_AND_ASSIGN(v1::BulkWriteReply reply,
                         ReadWriteReply(socket.get()));
    EXPECT_EQ(reply.code(),
              static_cast<int>(absl::StatusCode::kInvalidArgument));
    EXPECT_THAT(ReadAfterClose(socket.get()),
                StatusIs(absl::StatusCode::kUnavailable, _));
  }
  // A negative or overflowing prefix, raw.
  for (int64_t offset : {int64_t{-1}, std::numeric_limits<int64_t>::max()}) {
    UniqueFd socket = StartRawWrite(server_->address());
    ASSERT_TRUE(socket.valid());
    char prefix[kDataPlaneChunkPrefixBytes];
    EncodeChunkPrefix(
        ChunkPrefix{offset, std::numeric_limits<int64_t>::max(), 0}, prefix);
    ASSERT_OK(
        WriteFull(socket.get(), prefix, sizeof(prefix), absl::Now() + kWait));
    ASSERT_OK_AND_ASSIGN(v1::BulkWriteReply reply,
                         ReadWriteReply(socket.get()));
    EXPECT_EQ(reply.code(),
              static_cast<int>(absl::StatusCode::kInvalidArgument));
  }
  EXPECT_EQ(RowMajorBytes(shard), before);
  EXPECT_OK(ServesGoodClient());
}

TEST_F(DataPlaneWriteTest, AClientVanishingMidWriteLeavesTheRestAlone) {
  const Tensor shard = Serve("t", Filled({4, 1024}, DType::kInt32, 1));
  const std::string before = RowMajorBytes(shard);
  const std::string bytes = RowMajorBytes(Filled({4, 1024}, DType::kInt32, 2));
  {
    UniqueFd socket = StartRawWrite(server_->address());
    ASSERT_TRUE(socket.valid());
    ASSERT_OK(SendChunk(socket.get(), 0, bytes.substr(0, 4096)));
    // Half of the second chunk, then gone.
    char prefix[kDataPlaneChunkPrefixBytes];
    EncodeChunkPrefix(ChunkPrefix{4096, 4096, 0}, prefix);
    ASSERT_OK(
        WriteFull(socket.get(), prefix, sizeof(prefix), absl::Now() + kWait));
    ASSERT_OK(WriteFull(socket.get(), bytes.data() + 4096, 2048,
                        absl::Now() + kWait));
  }
  // Whatever the server received of the box is in it; nothing past it.
  absl::SleepFor(absl::Milliseconds(100));
  const std::string after = RowMajorBytes(shard);
  EXPECT_EQ(after.substr(0, 4096), bytes.substr(0, 4096));
  EXPECT_EQ(after.substr(8192), before.substr(8192));
  EXPECT_OK(ServesGoodClient());
}

TEST_F(DataPlaneWriteTest, AStalledWriterIsCutAfterTheIoTimeout) {
  DataPlaneServerOptions options;
  options.accept_writes = true;
  options.io_timeout = absl::Milliseconds(200);
  StartServer(options);
  Serve("t", Filled({4, 1024}, DType::kInt32, 1));
  UniqueFd socket = StartRawWrite(server_->address());
  ASSERT_TRUE(socket.valid());
  // Sends nothing more: the server gives up and closes.
  const absl::Time start = absl::Now();
  EXPECT_THAT(ReadAfterClose(socket.get()),
              StatusIs(absl::StatusCode::kUnavailable, _));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_OK(ServesGoodClient());
}

TEST_F(DataPlaneWriteTest, ConcurrentWritersOfDisjointRows) {
  constexpr int kThreads = 8;
  const Tensor shard =
      Serve("t", Filled({kThreads * 64, 256}, DType::kFloat32));
  std::vector<Tensor> rows;
  for (int i = 0; i < kThreads; ++i) {
    rows.push_back(Filled({64, 256}, DType::kFloat32, 100 + i));
  }
  std::vector<absl::Status> results(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      for (int round = 0; round < 3 && results[i].ok(); ++round) {
        absl::StatusOr<bool> written = client_->WriteRegion(
            "t", 1, {i * 64, 0}, rows[i], WriteOptions(round == 0 ? 4096 : 0));
        results[i] = written.ok() && !*written
                         ? absl::InternalError("fell back")
                         : written.status();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  const std::string after = RowMajorBytes(shard);
  for (int i = 0; i < kThreads; ++i) {
    EXPECT_OK(results[i]) << "thread " << i;
    EXPECT_EQ(after.substr(i * 64 * 1024, 64 * 1024), RowMajorBytes(rows[i]))
        << "thread " << i;
  }
}

TEST_F(DataPlaneWriteTest, CancellingAWriteToAStalledServerEndsIt) {
  // A server that greets and never reads: the write blocks once the
  // socket buffers are full, until cancelled.
  ASSERT_OK_AND_ASSIGN(auto listening, ListenTcp("127.0.0.1"));
  const auto client = ShardClient::Create(
      kNoGrpc, absl::StrCat("127.0.0.1:", listening.second));
  const Tensor data = Filled({1024, 1024}, DType::kFloat32);
  RegionWriteOptions options = WriteOptions();
  options.cancel = std::make_shared<Cancellation>();
  std::thread canceller([&] {
    absl::SleepFor(absl::Milliseconds(300));
    options.cancel->Cancel();
  });
  const absl::Time start = absl::Now();
  EXPECT_THAT(client->WriteRegion("t", 1, {0, 0}, data, options),
              StatusIs(absl::StatusCode::kCancelled, HasSubstr("cancelled")));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  canceller.join();
}

// ---- lanes (client/lanes.h)
// --------------------------------------------------

namespace lanes_test {

// A float32 tensor of `rows` rows of 1 MiB each, every element `value`.
Tensor Rows(int64_t rows, float value) {
  Tensor tensor = *Tensor::Empty({rows, int64_t{1} << 18});
  float* data = tensor.data<float>();
  for (int64_t i = 0; i < tensor.numel(); ++i) data[i] = value;
  return tensor;
}

// The distinct threads a transfer's on_chunk ran on: one per lane.
class LaneThreads {
 public:
  std::function<void(int64_t)> Callback() {
    return [this](int64_t) {
      absl::MutexLock lock(&mu_);
      threads_.insert(std::this_thread::get_id());
    };
  }
  size_t count() {
    absl::MutexLock lock(&mu_);
    return threads_.size();
  }

 private:
  absl::Mutex mu_;
  std::set<std::thread::id> threads_;
};

}  // namespace lanes_test

TEST_F(DataPlaneServerTest, LargeFetchesAreStripedAcrossLanes) {
  const Tensor shard =
      Serve("big", Filled({40, int64_t{1} << 18}, DType::kFloat32, 5));
  // 40 MiB: 4 lanes by default, as many as asked up to one per 8 MiB.
  for (const auto& [asked, taken] :
       std::vector<std::pair<int, size_t>>{{0, 4}, {1, 1}, {3, 3}, {16, 5}}) {
    SCOPED_TRACE(absl::StrCat("lanes ", asked));
    lanes_test::LaneThreads threads;
    FetchOptions options = Chunked(0);
    options.lanes = asked;
    options.on_chunk = threads.Callback();
    ASSERT_OK_AND_ASSIGN(Tensor destination,
                         Tensor::Zeros(shard.sizes(), TensorOptions()));
    ASSERT_OK(client_->FetchShardInto("big", 1, destination, options));
    EXPECT_EQ(RowMajorBytes(destination), RowMajorBytes(shard));
    EXPECT_EQ(threads.count(), taken);
  }
  // A box of rows 3..38 and columns 1000..(end - 7) into a strided view.
  const int64_t columns = (int64_t{1} << 18) - 1007;
  ASSERT_OK_AND_ASSIGN(Tensor wide,
                       Tensor::Zeros({35, columns + 4}, TensorOptions()));
  ASSERT_OK_AND_ASSIGN(Tensor box, wide.Narrow(1, 2, columns));
  lanes_test::LaneThreads threads;
  FetchOptions options = Chunked(0);
  options.on_chunk = threads.Callback();
  int64_t version = -1;
  options.served_version = &version;
  ASSERT_OK(client_->FetchRegionInto("big", 1, {3, 1000}, box, options));
  ASSERT_OK_AND_ASSIGN(const Tensor rows, shard.Narrow(0, 3, 35));
  ASSERT_OK_AND_ASSIGN(const Tensor expected, rows.Narrow(1, 1000, columns));
  EXPECT_EQ(RowMajorBytes(box), RowMajorBytes(expected));
  EXPECT_EQ(threads.count(), 4u);
  EXPECT_EQ(version, 0);
  // A destination that is not the shard's shape is refused.
  ASSERT_OK_AND_ASSIGN(Tensor wrong,
                       Tensor::Zeros({36, int64_t{1} << 18}, TensorOptions()));
  EXPECT_FALSE(client_->FetchShardInto("big", 1, wrong, Chunked(0)).ok());
  // An unknown tensor fails every lane the same way.
  EXPECT_THAT(client_->FetchShardInto("missing", 1, wrong, Chunked(0)),
              StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  EXPECT_OK(ServesGoodClient());
}

TEST_F(DataPlaneServerTest, LanesReadOneVersionWhilePublishesGoOn) {
  // Versions of 24 MiB (3 lanes), each holding its own number everywhere,
  // published as fast as they can be made while striped reads run: every
  // read holds one version, never parts of two.
  constexpr int64_t kRows = 24;
  ASSERT_OK(registry_->Register(
      "v", testing::AsLocalShard(lanes_test::Rows(kRows, 1), 1, 3)));
  registry_->PublishVersion("v", 1, "v");
  std::atomic<bool> stop{false};
  std::thread publisher([&] {
    for (int64_t n = 2; !stop.load() && n < 400; ++n) {
      const std::string id = VersionId("v", n);
      ASSERT_OK(registry_->Register(
          id, testing::AsLocalShard(lanes_test::Rows(kRows, n), 1, 3)));
      registry_->PublishVersion("v", n, id);
      if (n > 6) {
        // Kept: the last 5, as a daemon keeps versions_kept.
        registry_->ForgetVersion("v", n - 5);
        registry_->Unregister(VersionId("v", n - 5));
      }
    }
  });
  ASSERT_OK_AND_ASSIGN(
      Tensor destination,
      Tensor::Zeros({kRows, int64_t{1} << 18}, TensorOptions()));
  int read = 0;
  int64_t last = 0;
  for (int i = 0; i < 40; ++i) {
    FetchOptions options = Chunked(0);
    options.lanes = 3;
    int64_t version = 0;
    options.served_version = &version;
    const absl::Status status =
        client_->FetchRegionInto("v", 1, {0, 0}, destination, options);
    if (absl::IsNotFound(status)) continue;  // Its version fell out.
    ASSERT_OK(status);
    ++read;
    const float* values = destination.data<float>();
    for (int64_t k = 0; k < destination.numel(); k += 4099) {
      ASSERT_EQ(values[k], static_cast<float>(version)) << "element " << k;
    }
    ASSERT_EQ(values[destination.numel() - 1], static_cast<float>(version));
    EXPECT_GE(version, last);
    last = version;
  }
  stop = true;
  publisher.join();
  EXPECT_GT(read, 20);
}

TEST_F(DataPlaneServerTest, AtLeastReadsWaitForThePublishTheReaderKnows) {
  // A reader that saw version 2 published asks for at least 2: this daemon,
  // which holds version 2 but has not yet applied its publish, serves it
  // once it has (not version 1, which the reader would only read again),
  // never before; when the publish does not come, its latest after a
  // moment.
  constexpr int64_t kRows = 2;
  ASSERT_OK(registry_->Register(
      "v", testing::AsLocalShard(lanes_test::Rows(kRows, 1), 1, 3)));
  registry_->PublishVersion("v", 1, "v");
  ASSERT_OK(registry_->Register(
      VersionId("v", 2),
      testing::AsLocalShard(lanes_test::Rows(kRows, 2), 1, 3)));
  ASSERT_OK_AND_ASSIGN(
      Tensor destination,
      Tensor::Zeros({kRows, int64_t{1} << 18}, TensorOptions()));
  const auto read = [&](const std::string& id) -> absl::StatusOr<int64_t> {
    FetchOptions options = Chunked(0);
    int64_t version = -1;
    options.served_version = &version;
    RETURN_IF_ERROR(client_->FetchRegionInto(id, 1, {0, 0}, destination,
                                             std::move(options)));
    const float* values = destination.data<float>();
    if (values[0] != static_cast<float>(version) ||
        values[destination.numel() - 1] != static_cast<float>(version)) {
      return absl::InternalError(
          absl::StrCat("version ", version, " holds ", values[0]));
    }
    return version;
  };
  EXPECT_THAT(read("v"), IsOkAndHolds(1));
  EXPECT_THAT(read(AtLeastId("v", 1)), IsOkAndHolds(1));
  // Version 2 open here: not served until published.
  ShardRegistry::Resolved now =
      registry_->Resolve(AtLeastId("v", 2), absl::InfinitePast());
  EXPECT_TRUE(now.behind);
  EXPECT_EQ(now.version, 1);
  EXPECT_FALSE(now.writable);
  std::thread publisher([&] {
    absl::SleepFor(absl::Milliseconds(100));
    registry_->PublishVersion("v", 2, VersionId("v", 2));
  });
  EXPECT_THAT(read(AtLeastId("v", 2)), IsOkAndHolds(2));
  publisher.join();
  EXPECT_FALSE(registry_->Resolve(AtLeastId("v", 2)).behind);
  // One that does not come: the latest, after a moment.
  EXPECT_THAT(read(AtLeastId("v", 4)), IsOkAndHolds(2));
  // Ids that only look alike name nothing.
  for (const std::string& id : {std::string("v@>="), std::string("v@>=x"),
                                std::string("v@>=-2"), std::string("v@>=2x")}) {
    SCOPED_TRACE(id);
    EXPECT_THAT(read(id), StatusIs(absl::StatusCode::kNotFound, _));
  }
  ASSERT_OK(registry_->Register(
      VersionId("v", 3),
      testing::AsLocalShard(lanes_test::Rows(kRows, 3), 1, 3)));
  registry_->PublishVersion("v", 3, VersionId("v", 3));
  EXPECT_THAT(read(AtLeastId("v", 2)), IsOkAndHolds(3));
  EXPECT_OK(ServesGoodClient());
}

TEST_F(DataPlaneWriteTest, LargeWritesAreStripedAcrossLanes) {
  const Tensor shard = Serve("big", lanes_test::Rows(40, 0));
  const Tensor data = Filled({33, int64_t{1} << 18}, DType::kFloat32, 6);
  for (const auto& [asked, taken] :
       std::vector<std::pair<int, size_t>>{{0, 4}, {1, 1}, {2, 2}}) {
    SCOPED_TRACE(absl::StrCat("lanes ", asked));
    lanes_test::LaneThreads threads;
    RegionWriteOptions options = WriteOptions();
    options.lanes = asked;
    options.on_chunk = threads.Callback();
    ASSERT_OK_AND_ASSIGN(const bool written,
                         client_->WriteRegion("big", 1, {4, 0}, data, options));
    EXPECT_TRUE(written);
    EXPECT_EQ(threads.count(), taken);
    ASSERT_OK_AND_ASSIGN(const Tensor rows, shard.Narrow(0, 4, 33));
    EXPECT_EQ(RowMajorBytes(rows), RowMajorBytes(data));
    ASSERT_OK_AND_ASSIGN(const Tensor before, shard.Narrow(0, 0, 4));
    EXPECT_EQ(RowMajorBytes(before), RowMajorBytes(lanes_test::Rows(4, 0)));
  }
  // A box that is no dense run (a column slice) is left to gRPC whole:
  // nothing written.
  ASSERT_OK_AND_ASSIGN(const Tensor columns, data.Narrow(1, 0, 100000));
  EXPECT_THAT(client_->WriteRegion("big", 1, {0, 7}, columns, WriteOptions()),
              IsOkAndHolds(false));
  // A box past the shard: every lane refused, no byte written.
  EXPECT_THAT(client_->WriteRegion("big", 1, {10, 0}, data, WriteOptions()),
              StatusIs(absl::StatusCode::kOutOfRange, ::testing::_));
  EXPECT_OK(ServesGoodClient());
}

}  // namespace
}  // namespace tessera
