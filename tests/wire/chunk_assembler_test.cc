// ChunkSequence and ShardAssembler (wire/chunk_assembler.h) fed hand-made
// chunks: the receiving half of every transport, without a transport.
#include "wire/chunk_assembler.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <optional>
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

TEST(ChunkSequenceTest, ServerStreamsAreDataLoss) {
  ChunkSequence sequence(absl::StatusCode::kDataLoss, "shard");
  sequence.Start(8);
  EXPECT_THAT(sequence.CheckNext(0, -1, "c"),
              StatusIs(absl::StatusCode::kDataLoss,
                       "c: -1 bytes overrun the shard's 8 bytes"));
  EXPECT_THAT(sequence.CheckNext(0, 9, "c"),
              StatusIs(absl::StatusCode::kDataLoss,
                       "c: 9 bytes overrun the shard's 8 bytes"));
  EXPECT_THAT(
      sequence.CheckNext(1, 1, "c"),
      StatusIs(absl::StatusCode::kDataLoss, HasSubstr("c: expected offset 0")));
  EXPECT_OK(sequence.CheckNext(0, 0, "empty chunk"));
  EXPECT_OK(sequence.CheckNext(0, 8, "all of it"));
  EXPECT_THAT(sequence.CheckComplete("s"),
              StatusIs(absl::StatusCode::kDataLoss,
                       "s: the stream ended after 0 of 8 bytes"));
  sequence.Complete(8);
  EXPECT_OK(sequence.CheckComplete("s"));
  EXPECT_EQ(sequence.received_bytes(), 8);
  EXPECT_EQ(sequence.total_bytes(), 8);
  // Start again: a new stream.
  sequence.Start(4);
  EXPECT_EQ(sequence.received_bytes(), 0);
  EXPECT_THAT(sequence.CheckNext(0, 5, "c"),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("overrun the shard's 4 bytes")));
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

// The stream as EncodeShardChunk builds it (the payload in a slice of its
// own), in chunks of `chunk_bytes`, which need not hold whole elements.
std::vector<grpc::ByteBuffer> Encoded(const std::string& bytes,
                                      const v1::ShardHeader& header,
                                      size_t chunk_bytes) {
  std::vector<grpc::ByteBuffer> messages;
  for (size_t offset = 0; offset < bytes.size(); offset += chunk_bytes) {
    messages.push_back(EncodeShardChunk(
        offset == 0 ? &header : nullptr, static_cast<int64_t>(offset),
        grpc::Slice(bytes.substr(offset, chunk_bytes))));
  }
  return messages;
}

TEST_F(ShardAssemblerTest, EncodedChunksOfAnySize) {
  for (size_t chunk_bytes : {1, 7, 16, 47, 48}) {
    SCOPED_TRACE(chunk_bytes);
    const Tensor destination =
        *Tensor::Full({3, 4}, -1.0, TensorOptions().WithDType(DType::kFloat32));
    ShardAssembler assembler("t", 2, destination);
    std::vector<int64_t> reported;
    assembler.set_on_chunk([&](int64_t bytes) { reported.push_back(bytes); });
    for (const grpc::ByteBuffer& message :
         Encoded(bytes_, header_, chunk_bytes)) {
      ASSERT_OK(assembler.Consume(message));
    }
    EXPECT_EQ(assembler.received_bytes(), 48);
    EXPECT_EQ(assembler.total_bytes(), 48);
    ASSERT_OK(assembler.Finish());
    EXPECT_EQ(RowMajor(destination), bytes_);
    EXPECT_EQ(reported.size(), (48 + chunk_bytes - 1) / chunk_bytes);
    EXPECT_EQ(std::accumulate(reported.begin(), reported.end(), int64_t{0}),
              48);
  }
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

TEST_F(ShardAssemblerTest, StridedDestinationIsWrittenOnlyByFinish) {
  // The bytes are staged; the strided destination is untouched until the
  // stream is known complete.
  const Tensor base =
      *Tensor::Zeros({4, 3}, TensorOptions().WithDType(DType::kFloat32));
  const Tensor destination = *base.T();
  ShardAssembler assembler("t", 2, destination);
  for (const grpc::ByteBuffer& message : Encoded(bytes_, header_, 13)) {
    ASSERT_OK(assembler.Consume(message));
  }
  EXPECT_EQ(RowMajor(destination), std::string(48, '\0'));
  ASSERT_OK(assembler.Finish());
  EXPECT_EQ(RowMajor(destination), bytes_);
  // Element (i, j) of the view is element (j, i) of the base.
  const float* base_values = static_cast<const float*>(base.data_ptr());
  EXPECT_EQ(base_values[1 * 3 + 2], 0.5f * (2 * 4 + 1));
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

TEST_F(ShardAssemblerTest, MoreBadStreams) {
  const TensorOptions f32 = TensorOptions().WithDType(DType::kFloat32);
  {
    ShardAssembler assembler("t", 2, *Tensor::Empty({3, 4}, f32));
    EXPECT_THAT(assembler.Finish(),
                StatusIs(absl::StatusCode::kDataLoss,
                         "shard 2 of tensor t: stream ended without a header"));
  }
  {
    ShardAssembler assembler("t", 2, *Tensor::Empty({3, 4}, f32));
    const std::string garbage = "\xff\xff\xff";
    grpc::Slice slice(garbage);
    EXPECT_THAT(assembler.Consume(grpc::ByteBuffer(&slice, 1)),
                StatusIs(absl::StatusCode::kDataLoss,
                         HasSubstr("malformed chunk after offset 0")));
  }
  {
    // The chunk's data runs past total_bytes: refused before being written
    // (it would land past the destination's end).
    ShardAssembler assembler("t", 2, *Tensor::Empty({3, 4}, f32));
    ASSERT_OK(assembler.Consume(Chunk(0, 40, true)));
    v1::ShardChunk past;
    past.set_offset(40);
    past.set_data(std::string(16, 'x'));
    past.set_checksum(XXH3_64bits(past.data().data(), 16));
    EXPECT_THAT(assembler.Consume(past),
                StatusIs(absl::StatusCode::kDataLoss,
                         HasSubstr("16 bytes overrun the shard's 48 bytes")));
  }
  {
    // A chunk repeated (the same offset twice).
    ShardAssembler assembler("t", 2, *Tensor::Empty({3, 4}, f32));
    ASSERT_OK(assembler.Consume(Chunk(0, 24, true)));
    EXPECT_THAT(assembler.Consume(Chunk(0, 24, false)),
                StatusIs(absl::StatusCode::kDataLoss,
                         HasSubstr("chunk at offset 0 of shard 2 of tensor t: "
                                   "expected offset 24")));
  }
  {
    // Corrupt bytes with the original checksum; the process's observer
    // hears of it (the daemon counts it in its metrics).
    static int failures = 0;
    SetChecksumFailureObserver([] { ++failures; });
    ShardAssembler assembler("t", 2, *Tensor::Empty({3, 4}, f32));
    v1::ShardChunk corrupt = Chunk(0, 48, true);
    (*corrupt.mutable_data())[5] ^= 1;
    EXPECT_THAT(assembler.Consume(corrupt),
                StatusIs(absl::StatusCode::kDataLoss,
                         "chunk at offset 0 of shard 2 of tensor t: checksum "
                         "mismatch"));
    SetChecksumFailureObserver(nullptr);
    EXPECT_EQ(failures, 1);
  }
}

TEST_F(ShardAssemblerTest, MalformedHeadersAreDataLoss) {
  const TensorOptions f32 = TensorOptions().WithDType(DType::kFloat32);
  {
    v1::ShardHeader header = header_;
    header.set_total_bytes(44);
    ShardAssembler assembler("t", 2, *Tensor::Empty({3, 4}, f32));
    EXPECT_THAT(assembler.Start(header),
                StatusIs(absl::StatusCode::kDataLoss,
                         HasSubstr("total_bytes 44 does not match")));
  }
  {
    v1::ShardHeader header = header_;
    header.set_sizes(0, 2);
    ShardAssembler assembler("t", 2, *Tensor::Empty({2, 4}, f32));
    EXPECT_THAT(assembler.Start(header),
                StatusIs(absl::StatusCode::kDataLoss,
                         HasSubstr("differ from its metadata's [3, 4]")));
  }
  {
    v1::ShardHeader header = header_;
    header.mutable_metadata()->clear_shard_sizes();
    ShardAssembler assembler("t", 2, *Tensor::Empty({3, 4}, f32));
    EXPECT_THAT(assembler.Start(header),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr("malformed")));
  }
  {
    // The header of another dtype: the destination does not fit.
    v1::ShardHeader header = header_;
    header.set_dtype(ToProto(DType::kInt32));
    ShardAssembler assembler("t", 2, *Tensor::Empty({3, 4}, f32));
    EXPECT_THAT(assembler.Start(header),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("does not match shard 2 of tensor t")));
  }
}

// Regression: CheckHeader multiplied the element count by the element size
// in int64 without an overflow check; 2^61 * 8 wrapped to 0, so total_bytes
// 0 passed and the header was refused later with the wrong code.
TEST_F(ShardAssemblerTest, TotalBytesThatOverflowAreDataLoss) {
  // 2^61 float64 elements are 2^64 bytes: no total_bytes is right, and the
  // product must not wrap around to 0 and pass.
  v1::ShardHeader header;
  const int64_t huge = int64_t{1} << 61;
  *header.mutable_metadata() = ToProto(*ShardMetadata::Create({0}, {huge}));
  header.set_dtype(ToProto(DType::kFloat64));
  header.add_sizes(huge);
  header.set_total_bytes(0);
  ShardAssembler into_tensor(
      "t", 2, *Tensor::Empty({2}, TensorOptions().WithDType(DType::kFloat64)));
  EXPECT_THAT(into_tensor.Start(header),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("total_bytes 0 does not match")));
  ShardAssembler allocating("t", 2, Device::Cpu(), /*pin_memory=*/false);
  EXPECT_THAT(allocating.Start(header),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("total_bytes 0 does not match")));
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
  static int failures = 0;
  SetChecksumFailureObserver([] { ++failures; });
  EXPECT_THAT(assembler.Verify(32, 16, 12345),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("chunk at offset 32 of shard 2 of tensor t: "
                                 "checksum mismatch")));
  SetChecksumFailureObserver(nullptr);
  EXPECT_EQ(failures, 1);  // The data plane's path is observed too.
}

// Over a channel that authenticates its bytes (TLS), the data plane sends
// no checksum and the assembler does not hash: the chunk is placed and
// counted as it arrived.
TEST_F(ShardAssemblerTest, DataPlaneOverAnAuthenticatedChannelIsNotHashed) {
  const Tensor destination =
      *Tensor::Empty({3, 4}, TensorOptions().WithDType(DType::kFloat32));
  ShardAssembler assembler("t", 2, destination);
  ASSERT_OK(assembler.Start(header_));
  ASSERT_OK_AND_ASSIGN(char* place, assembler.Place(0, 48));
  std::memcpy(place, bytes_.data(), 48);
  ASSERT_OK(assembler.Verify(0, 48, std::nullopt));
  EXPECT_EQ(assembler.received_bytes(), 48);
  ASSERT_OK(assembler.Finish());
  EXPECT_EQ(std::memcmp(destination.data_ptr(), bytes_.data(), 48), 0);
}

TEST_F(ShardAssemblerTest, DataPlaneWholeStream) {
  for (bool strided : {false, true}) {
    SCOPED_TRACE(strided);
    const TensorOptions f32 = TensorOptions().WithDType(DType::kFloat32);
    const Tensor base =
        strided ? *Tensor::Zeros({4, 3}, f32) : *Tensor::Zeros({3, 4}, f32);
    const Tensor destination = strided ? *base.T() : base;
    ShardAssembler assembler("t", 2, destination);
    int64_t reported = 0;
    assembler.set_on_chunk([&](int64_t bytes) { reported += bytes; });
    EXPECT_THAT(assembler.Place(0, 4),
                StatusIs(absl::StatusCode::kDataLoss,
                         HasSubstr("chunk before the header")));
    ASSERT_OK(assembler.Start(header_));
    EXPECT_THAT(
        assembler.Start(header_),
        StatusIs(absl::StatusCode::kDataLoss, HasSubstr("header repeated")));
    for (int64_t offset = 0; offset < 48; offset += 20) {
      const int64_t length = std::min<int64_t>(20, 48 - offset);
      ASSERT_OK_AND_ASSIGN(char* place, assembler.Place(offset, length));
      std::memcpy(place, bytes_.data() + offset, length);
      ASSERT_OK(assembler.Verify(offset, length,
                                 XXH3_64bits(bytes_.data() + offset, length)));
    }
    EXPECT_EQ(reported, 48);
    ASSERT_OK(assembler.Finish());
    EXPECT_EQ(RowMajor(destination), bytes_);
  }
}

TEST_F(ShardAssemblerTest, DataPlaneEndedEarlyIsDataLoss) {
  ShardAssembler assembler(
      "t", 2,
      *Tensor::Empty({3, 4}, TensorOptions().WithDType(DType::kFloat32)));
  ASSERT_OK(assembler.Start(header_));
  ASSERT_OK_AND_ASSIGN(char* place, assembler.Place(0, 8));
  std::memcpy(place, bytes_.data(), 8);
  ASSERT_OK(assembler.Verify(0, 8, XXH3_64bits(bytes_.data(), 8)));
  EXPECT_THAT(assembler.Finish(),
              StatusIs(absl::StatusCode::kDataLoss,
                       "shard 2 of tensor t: the stream ended after 8 of 48 "
                       "bytes"));
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
