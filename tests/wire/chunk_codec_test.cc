// The chunk codec (wire/chunk_codec.h): ShardChunk messages built around a
// payload slice and parsed back without copying it, data-plane chunk
// prefixes and frames.
#include "wire/chunk_codec.h"

#include <sys/socket.h>

#include <cstdint>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/socket.h"
#include "io/unique_fd.h"
#include "tests/testing/status_matchers.h"
#include "xxhash.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

constexpr absl::Duration kWait = absl::Seconds(5);

std::vector<grpc::Slice> SlicesOf(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  return slices;
}

std::string Joined(const ParsedChunk& chunk) {
  return absl::StrJoin(chunk.data, "");
}

v1::ShardHeader Header() {
  v1::ShardHeader header;
  header.set_dtype(v1::DTYPE_FLOAT32);
  header.add_sizes(2);
  header.add_sizes(3);
  header.set_total_bytes(24);
  return header;
}

TEST(ShardChunkTest, RoundTripWithHeader) {
  const std::string payload = "0123456789abcdef";
  const v1::ShardHeader header = Header();
  const grpc::ByteBuffer message =
      EncodeShardChunk(&header, 4096, grpc::Slice(payload));
  const std::vector<grpc::Slice> slices = SlicesOf(message);
  EXPECT_GE(slices.size(), 2u);  // The payload is a slice of its own.
  ParsedChunk chunk;
  ASSERT_TRUE(ParseShardChunk(slices, &chunk));
  ASSERT_TRUE(chunk.header.has_value());
  EXPECT_EQ(chunk.header->SerializeAsString(), header.SerializeAsString());
  EXPECT_EQ(chunk.offset, 4096);
  EXPECT_EQ(chunk.checksum, XXH3_64bits(payload.data(), payload.size()));
  EXPECT_EQ(chunk.data_size, static_cast<int64_t>(payload.size()));
  EXPECT_EQ(Joined(chunk), payload);
}

TEST(ShardChunkTest, RoundTripWithoutHeaderOrPayload) {
  const grpc::ByteBuffer message = EncodeShardChunk(nullptr, 7, grpc::Slice());
  ParsedChunk chunk;
  ASSERT_TRUE(ParseShardChunk(SlicesOf(message), &chunk));
  EXPECT_FALSE(chunk.header.has_value());
  EXPECT_EQ(chunk.offset, 7);
  EXPECT_EQ(chunk.data_size, 0);
  EXPECT_EQ(chunk.checksum, XXH3_64bits(nullptr, 0));
}

TEST(ShardChunkTest, ParsesWhatProtobufSerializes) {
  v1::ShardChunk message;
  *message.mutable_header() = Header();
  message.set_offset(123);
  message.set_data(std::string(1000, 'd'));
  message.set_checksum(99);
  const std::string bytes = message.SerializeAsString();
  // Cut into uneven slices, as a transport may hand them over.
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < bytes.size(); at += 97) {
    slices.emplace_back(bytes.substr(at, 97));
  }
  ParsedChunk chunk;
  ASSERT_TRUE(ParseShardChunk(slices, &chunk));
  EXPECT_EQ(chunk.offset, 123);
  EXPECT_EQ(chunk.checksum, 99u);
  EXPECT_EQ(Joined(chunk), message.data());
  ASSERT_TRUE(chunk.header.has_value());
  EXPECT_EQ(chunk.header->total_bytes(), 24);
}

TEST(ShardChunkTest, EveryTruncationIsRefusedOrParsesAPrefix) {
  v1::ShardChunk message;
  *message.mutable_header() = Header();
  message.set_offset(1 << 20);
  message.set_data("payload bytes");
  message.set_checksum(0x0123456789abcdefull);
  const std::string bytes = message.SerializeAsString();
  int refused = 0;
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    const std::vector<grpc::Slice> slices = {grpc::Slice(bytes.substr(0, cut))};
    ParsedChunk chunk;
    if (!ParseShardChunk(slices, &chunk)) {
      ++refused;
      continue;
    }
    // A cut between fields is a valid message with fewer fields: whatever
    // it holds came from the real one.
    EXPECT_LE(chunk.data_size, static_cast<int64_t>(message.data().size()));
  }
  EXPECT_GT(refused, static_cast<int>(bytes.size()) / 2);
}

TEST(ShardChunkTest, GarbageIsRefused) {
  const std::vector<grpc::Slice> slices = {
      grpc::Slice(std::string("\xff\xff\xff"))};
  ParsedChunk chunk;
  EXPECT_FALSE(ParseShardChunk(slices, &chunk));
  // A length that runs past the message.
  const std::vector<grpc::Slice> overrun = {
      grpc::Slice(std::string("\x1a\x7f"
                              "abc",
                              5))};
  EXPECT_FALSE(ParseShardChunk(overrun, &chunk));
}

TEST(ChunkPrefixTest, RoundTrip) {
  for (const ChunkPrefix& prefix :
       {ChunkPrefix{0, 1, 0}, ChunkPrefix{4096, 1 << 20, 0xfeedfacecafebeefull},
        ChunkPrefix{std::numeric_limits<int64_t>::max(), -1,
                    std::numeric_limits<uint64_t>::max()}}) {
    char bytes[kDataPlaneChunkPrefixBytes];
    EncodeChunkPrefix(prefix, bytes);
    const ChunkPrefix back = DecodeChunkPrefix(bytes);
    EXPECT_EQ(back.offset, prefix.offset);
    EXPECT_EQ(back.length, prefix.length);
    EXPECT_EQ(back.checksum, prefix.checksum);
  }
}

TEST(ChunkPrefixTest, LittleEndianOnTheWire) {
  char bytes[kDataPlaneChunkPrefixBytes];
  EncodeChunkPrefix(ChunkPrefix{0x0102, 0x03, 0x04}, bytes);
  EXPECT_EQ(bytes[0], 0x02);
  EXPECT_EQ(bytes[1], 0x01);
  EXPECT_EQ(bytes[8], 0x03);
  EXPECT_EQ(bytes[16], 0x04);
}

class FrameTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int fds[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    a_.reset(fds[0]);
    b_.reset(fds[1]);
  }
  UniqueFd a_, b_;
};

TEST_F(FrameTest, RoundTrip) {
  ASSERT_OK(WriteFrame(a_.get(), "request", absl::Now() + kWait));
  ASSERT_OK(WriteFrame(a_.get(), "", absl::Now() + kWait));
  ASSERT_OK_AND_ASSIGN(std::string first,
                       ReadFrame(b_.get(), absl::Now() + kWait));
  ASSERT_OK_AND_ASSIGN(std::string second,
                       ReadFrame(b_.get(), absl::Now() + kWait));
  EXPECT_EQ(first, "request");
  EXPECT_EQ(second, "");
}

TEST_F(FrameTest, TooLargeToWrite) {
  const std::string big(kMaxDataPlaneFrameBytes + 1, 'x');
  EXPECT_THAT(
      WriteFrame(a_.get(), big, absl::Now() + kWait),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("too large")));
}

TEST_F(FrameTest, PeerAnnouncingTooMuchIsDataLoss) {
  const uint32_t n = kMaxDataPlaneFrameBytes + 1;
  char length[4];
  for (int i = 0; i < 4; ++i) length[i] = static_cast<char>(n >> (8 * i));
  ASSERT_OK(WriteFull(a_.get(), length, 4, absl::Now() + kWait));
  EXPECT_THAT(
      ReadFrame(b_.get(), absl::Now() + kWait),
      StatusIs(absl::StatusCode::kDataLoss, HasSubstr("exceeds the limit")));
}

TEST_F(FrameTest, TruncatedFrameEndsWithThePeer) {
  ASSERT_OK(WriteFull(a_.get(),
                      "\x10\x00\x00\x00"
                      "abc",
                      7, absl::Now() + kWait));
  a_.reset();
  EXPECT_THAT(ReadFrame(b_.get(), absl::Now() + kWait),
              StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
}

}  // namespace
}  // namespace tessera
