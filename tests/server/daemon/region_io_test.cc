// Region reads and writes of named tensors (server/daemon/region_io.h) with two
// ranks as threads of this process, each serving a ControlService that
// holds only ReadRegion and WriteRegion, on its real shard server (gRPC and
// the data plane) on 127.0.0.1 (tests/testing/region_ranks_test.h). A 2 x 2
// grid of shards, two on each rank, so that every region mixes local copies
// and remote transfers. With a memory budget on rank 0, a call reserves its
// region and the staging of its strided remote pieces before it starts. The
// client library's Client against the same ranks is tested in
// tests/client/client_test.cc.
#include "server/daemon/region_io.h"

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/region_transfer.h"
#include "client/shard_client.h"
#include "common/proto_convert.h"
#include "common/region.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "tessera/v1/control.grpc.pb.h"
#include "tests/testing/region_ranks_test.h"
#include "tests/testing/status_matchers.h"
#include "wire/auth.h"
#include "wire/grpc_status.h"
#include "xxhash.h"

namespace tessera {
namespace {

using ::tessera::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

class RegionIoTest : public ::tessera::testing::RegionRanksTest {
 protected:
  std::unique_ptr<v1::ControlService::Stub> Stub(int r) {
    return v1::ControlService::NewStub(
        CreateTesseraChannel(ranks_[r]->rpc_address()));
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

// Rank 0's region calls within a budget of kBudget bytes.
class RegionIoBudgetTest : public RegionIoTest {
 protected:
  static constexpr int64_t kBudget = 12000;

  std::shared_ptr<MemoryBudget> BudgetOf(int r) override {
    return r == 0 ? budget_ : nullptr;
  }

  // Every call has given its bytes back (a read's once its stream is done,
  // which the server may notice after the client).
  void ExpectBudgetWhole() {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (budget_->used() != 0 && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    EXPECT_EQ(budget_->used(), 0);
  }

  const std::shared_ptr<MemoryBudget> budget_ =
      MemoryBudget::Create(kBudget, "the test's budget");
};

TEST_F(RegionIoBudgetTest, StridedPiecesFromOtherRanksCountWithTheRegion) {
  // Rows 0-20, columns 100-200: shard 0 here (columns 100-150) and shard 1
  // on rank 1 (columns 150-200), each strided within the region. 8000 bytes
  // of region, and 4000 of rank 1's piece staged before it is copied in.
  const std::vector<int64_t> offsets = {0, 100};
  const std::vector<int64_t> sizes = {20, 100};
  ASSERT_OK_AND_ASSIGN(Tensor expected, RegionView(global_, offsets, sizes));
  ASSERT_OK_AND_ASSIGN(Tensor read, Read(0, offsets, sizes));
  EXPECT_TRUE(Equal(read, *expected.Contiguous()));
  ExpectBudgetWhole();
  {
    // One byte short: refused whole, naming the request and the bytes.
    ASSERT_OK_AND_ASSIGN(MemoryBudget::Reservation held,
                         budget_->Reserve(1, "held"));
    EXPECT_THAT(
        Read(0, offsets, sizes),
        StatusIs(
            absl::StatusCode::kResourceExhausted,
            AllOf(HasSubstr("ReadRegion of tensor w [0:20, 100:200] "
                            "(8000 bytes of region and 4000 to stage"),
                  HasSubstr("needs 12000 bytes"), HasSubstr("11999 bytes left"),
                  HasSubstr("the test's budget"))));
    // A write of the same box packs rank 1's piece: refused at its header,
    // before anything is written.
    const Tensor data = Pattern(sizes, 4);
    EXPECT_THAT(Write(0, offsets, data),
                StatusIs(absl::StatusCode::kResourceExhausted,
                         AllOf(HasSubstr("WriteRegion of tensor w [0:20, "
                                         "100:200] (8000 bytes of region"),
                               HasSubstr("needs 12000 bytes"))));
    EXPECT_TRUE(Equal(Held(), global_));
    // Pieces that are runs of the region's bytes land in it directly: rows
    // 15-25 of columns 0-150 (shard 0 here, shard 2 on rank 1) stage only
    // their 6000 bytes.
    ASSERT_OK_AND_ASSIGN(MemoryBudget::Reservation more,
                         budget_->Reserve(kBudget - 1 - 6000, "more"));
    ASSERT_OK_AND_ASSIGN(Tensor rows, Read(0, {15, 0}, {10, 150}));
    ASSERT_OK_AND_ASSIGN(Tensor rows_expected,
                         RegionView(global_, {15, 0}, {10, 150}));
    EXPECT_TRUE(Equal(rows, *rows_expected.Contiguous()));
  }
  ExpectBudgetWhole();
  // With the whole budget the write goes through, and gives it back.
  const Tensor data = Pattern(sizes, 4);
  ASSERT_OK(Write(0, offsets, data));
  Tensor written = *global_.Clone();
  ASSERT_OK(CopyBox(data, {0, 0}, written, offsets, sizes));
  EXPECT_TRUE(Equal(Held(), written));
  ExpectBudgetWhole();
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

}  // namespace
}  // namespace tessera
