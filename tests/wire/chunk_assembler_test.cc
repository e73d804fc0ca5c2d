// ChunkSequence and ShardAssembler (wire/chunk_assembler.h) fed hand-made
// chunks: the receiving half of every transport, without a transport.
#include "wire/chunk_assembler.h"

#include <cstring>
#include <string>
#include <vector>

#include "common/proto_convert.h"
#include "common/shard_metadata.h"
#include "common/tensor/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "xxhash.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

TEST(ChunkSequenceTest, OrderSizeAndCompleteness) {
  ChunkSequence sequence(absl::StatusCode::kInvalidArgument, "region");
  sequence.Start(100);
  EXPECT_OK(sequence.CheckNext(0, 40, "chunk at offset 0"));
  sequence.Advance(40);
  EXPECT_THAT(sequence.CheckNext(80, 20, "chunk at offset 80"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "chunk at offset 80: expected offset 40 (chunks must "
                       "be contiguous and in order)"));
  EXPECT_THAT(sequence.CheckNext(40, 61, "chunk at offset 40"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("61 bytes overrun the region's 100 bytes")));
  EXPECT_THAT(sequence.CheckComplete("WriteRegion of tensor w"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "WriteRegion of tensor w: the stream ended after 40 "
                       "of 100 bytes"));
  EXPECT_OK(sequence.CheckNext(40, 60, "chunk at offset 40"));
  sequence.Advance(60);
  EXPECT_OK(sequence.CheckComplete("w"));
  EXPECT_EQ(sequence.received_bytes(), 100);
}

TEST(ChunkSequenceTest, ChecksumMismatchIsAlwaysDataLoss) {
  EXPECT_OK(ChunkSequence::CheckChecksum(7, 7, "c"));
  EXPECT_THAT(ChunkSequence::CheckChecksum(7, 8, "chunk at offset 0"),
              StatusIs(absl::StatusCode::kDataLoss,
                       "chunk at offset 0: checksum mismatch"));
}

// A float32 shard of 3x4 at offsets (6, 0), its row-major bytes and the
// header a server sends for it.
class ShardAssemblerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<float> values(12);
    for (int i = 0; i < 12; ++i) values[i] = 0.5f * i;
    bytes_.assign(reinterpret_cast<const char*>(values.data()), 48);
    const ShardMetadata metadata = *ShardMetadata::Create({6, 0}, {3, 4});
    *header_.mutable_metadata() = ToProto(metadata);
    header_.set_dtype(ToProto(DType::kFloat32));
    header_.add_sizes(3);
    header_.add_sizes(4);
    header_.set_total_bytes(48);
  }

  // Chunk [offset, offset + size) of the shard's bytes.
  v1::ShardChunk Chunk(int64_t offset, int64_t size, bool with_header) const {
    v1::ShardChunk chunk;
    if (with_header) *chunk.mutable_header() = header_;
    chunk.set_offset(offset);
    chunk.set_data(bytes_.substr(offset, size));
    chunk.set_checksum(XXH3_64bits(bytes_.data() + offset, size));
    return chunk;
  }

  static std::string RowMajor(const Tensor& tensor) {
    const Tensor dense = *tensor.Contiguous();
    return std::string(static_cast<const char*>(dense.data_ptr()),
                       dense.nbytes());
  }

  std::string bytes_;
  v1::ShardHeader header_;
};

TEST_F(ShardAssemblerTest, StreamIntoAContiguousDestination) {
  const Tensor destination =
      *Tensor::Empty({3, 4}, TensorOptions().WithDType(DType::kFloat32));
  ShardAssembler assembler("t", 2, destination);
  int64_t reported = 0;
  assembler.set_on_chunk([&](int64_t bytes) { reported += bytes; });
  ASSERT_OK(assembler.Consume(Chunk(0, 20, true)));
  ASSERT_OK(assembler.Consume(Chunk(20, 28, false)));
  ASSERT_OK(assembler.Finish());
  EXPECT_EQ(RowMajor(destination), bytes_);
  EXPECT_EQ(reported, 48);
  ASSERT_TRUE(assembler.metadata().has_value());
  EXPECT_EQ(assembler.metadata()->shard_offsets(),
            (std::vector<int64_t>{6, 0}));
}

TEST_F(ShardAssemblerTest, StreamIntoAStridedDestination) {
  // The transpose of a 4x3 tensor: a 3x4 view that is not contiguous.
  const Tensor base =
      *Tensor::Zeros({4, 3}, TensorOptions().WithDType(DType::kFloat32));
  const Tensor destination = *base.T();
  ASSERT_FALSE(destination.is_contiguous());
  ShardAssembler assembler("t", 2, destination);
  ASSERT_OK(assembler.Consume(Chunk(0, 48, true)));
  ASSERT_OK(assembler.Finish());
  EXPECT_EQ(RowMajor(destination), bytes_);
}

TEST_F(ShardAssemblerTest, AllocatesFromTheHeader) {
  ShardAssembler assembler("t", 2, Device::Cpu(), /*pin_memory=*/false);
  ASSERT_OK(assembler.Consume(Chunk(0, 48, true)));
  ASSERT_OK(assembler.Finish());
  EXPECT_EQ(assembler.destination().sizes(), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(RowMajor(assembler.destination()), bytes_);
}

TEST_F(ShardAssemblerTest, BadStreamsAreDataLoss) {
  const TensorOptions f32 = TensorOptions().WithDType(DType::kFloat32);
  {
    ShardAssembler assembler("t", 2, *Tensor::Empty({3, 4}, f32));
    EXPECT_THAT(assembler.Consume(Chunk(0, 20, false)),
                StatusIs(absl::StatusCode::kDataLoss,
                         HasSubstr("first chunk carries no header")));
  }
  {
    ShardAssembler assembler("t", 2, *Tensor::Empty({3, 4}, f32));
    ASSERT_OK(assembler.Consume(Chunk(0, 20, true)));
    EXPECT_THAT(
        assembler.Consume(Chunk(24, 24, false)),
        StatusIs(absl::StatusCode::kDataLoss, HasSubstr("expected offset 20")));
  }
  {
    ShardAssembler assembler("t", 2, *Tensor::Empty({3, 4}, f32));
    v1::ShardChunk corrupt = Chunk(0, 48, true);
    corrupt.set_checksum(corrupt.checksum() ^ 1);
    EXPECT_THAT(
        assembler.Consume(corrupt),
        StatusIs(absl::StatusCode::kDataLoss, HasSubstr("checksum mismatch")));
  }
  {
    ShardAssembler assembler("t", 2, *Tensor::Empty({3, 4}, f32));
    ASSERT_OK(assembler.Consume(Chunk(0, 20, true)));
    EXPECT_THAT(assembler.Finish(),
                StatusIs(absl::StatusCode::kDataLoss,
                         HasSubstr("ended after 20 of 48 bytes")));
  }
  {
    ShardAssembler assembler("t", 2, *Tensor::Empty({3, 4}, f32));
    ASSERT_OK(assembler.Consume(Chunk(0, 20, true)));
    EXPECT_THAT(
        assembler.Consume(Chunk(20, 28, true)),
        StatusIs(absl::StatusCode::kDataLoss, HasSubstr("header repeated")));
  }
}

TEST_F(ShardAssemblerTest, DestinationOfAnotherShapeIsInvalidArgument) {
  ShardAssembler assembler(
      "t", 2,
      *Tensor::Empty({4, 3}, TensorOptions().WithDType(DType::kFloat32)));
  EXPECT_THAT(assembler.Consume(Chunk(0, 48, true)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("does not match shard 2 of tensor t")));
}

TEST_F(ShardAssemblerTest, DataPlanePlacesAndVerifiesInPlace) {
  const Tensor destination =
      *Tensor::Empty({3, 4}, TensorOptions().WithDType(DType::kFloat32));
  ShardAssembler assembler("t", 2, destination);
  ASSERT_OK(assembler.Start(header_));
  ASSERT_OK_AND_ASSIGN(char* place, assembler.Place(0, 32));
  std::memcpy(place, bytes_.data(), 32);
  ASSERT_OK(assembler.Verify(0, 32, XXH3_64bits(bytes_.data(), 32)));
  EXPECT_THAT(
      assembler.Place(16, 16),
      StatusIs(absl::StatusCode::kDataLoss, HasSubstr("expected offset 32")));
  EXPECT_THAT(assembler.Place(32, 0),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("empty chunk")));
  EXPECT_THAT(assembler.Place(32, 17),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("overrun the shard's 48 bytes")));
  ASSERT_OK_AND_ASSIGN(place, assembler.Place(32, 16));
  std::memcpy(place, bytes_.data() + 32, 16);
  EXPECT_THAT(assembler.Verify(32, 16, 12345),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("chunk at offset 32 of shard 2 of tensor t: "
                                 "checksum mismatch")));
}

TEST_F(ShardAssemblerTest, FillFromTakesTheWholeShardAtOnce) {
  const Tensor destination =
      *Tensor::Empty({3, 4}, TensorOptions().WithDType(DType::kFloat32));
  ShardAssembler assembler("t", 2, destination);
  ASSERT_OK(assembler.FillFrom(header_, [&](const Tensor& into) {
    std::memcpy(into.data_ptr(), bytes_.data(), bytes_.size());
    return absl::OkStatus();
  }));
  EXPECT_EQ(assembler.received_bytes(), 48);
  EXPECT_OK(assembler.Finish());
  EXPECT_EQ(RowMajor(destination), bytes_);
}

TEST_F(ShardAssemblerTest, ARegionStreamMustMatchTheRequestedBox) {
  ShardAssembler assembler(
      "t", 2,
      *Tensor::Empty({2, 2}, TensorOptions().WithDType(DType::kFloat32)));
  assembler.ExpectRegion({1, 1}, {2, 2});
  // The server answered with the whole shard instead of the box.
  EXPECT_THAT(assembler.Consume(Chunk(0, 48, true)),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("differ from the requested region's")));
}

}  // namespace
}  // namespace tessera
