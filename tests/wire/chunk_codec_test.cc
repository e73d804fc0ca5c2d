// The chunk codec (wire/chunk_codec.h): ShardChunk messages built around a
// payload slice and parsed back without copying it, data-plane chunk
// prefixes and frames.
#include "wire/chunk_codec.h"

#include <sys/socket.h>

#include <cstdint>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
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

// The bytes of a ByteBuffer, flattened.
std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::string bytes;
  for (const grpc::Slice& slice : SlicesOf(buffer)) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return bytes;
}

TEST(ShardChunkTest, RoundTripsMatchProtobuf) {
  const v1::ShardHeader header = Header();
  const std::string big(3 << 20, 'b');
  struct Case {
    const v1::ShardHeader* header;
    int64_t offset;
    std::string payload;
  };
  for (const Case& c : {Case{&header, 0, ""}, Case{nullptr, 12, "xyz"},
                        Case{&header, -1, "negative offset"},
                        Case{nullptr, std::numeric_limits<int64_t>::max(), big},
                        Case{nullptr, 0, std::string(1, '\0')}}) {
    SCOPED_TRACE(c.offset);
    const grpc::ByteBuffer message =
        EncodeShardChunk(c.header, c.offset, grpc::Slice(c.payload));
    // What protobuf makes of the same bytes.
    v1::ShardChunk reference;
    ASSERT_TRUE(reference.ParseFromString(Flatten(message)));
    EXPECT_EQ(reference.has_header(), c.header != nullptr);
    EXPECT_EQ(reference.offset(), c.offset);
    EXPECT_EQ(reference.data(), c.payload);
    EXPECT_EQ(reference.checksum(),
              XXH3_64bits(c.payload.data(), c.payload.size()));
    // The chunk's data views point into the slices: they outlive it.
    const std::vector<grpc::Slice> slices = SlicesOf(message);
    ParsedChunk chunk;
    ASSERT_TRUE(ParseShardChunk(slices, &chunk));
    EXPECT_EQ(chunk.header.has_value(), c.header != nullptr);
    if (c.header != nullptr) {
      EXPECT_EQ(chunk.header->SerializeAsString(),
                c.header->SerializeAsString());
    }
    EXPECT_EQ(chunk.offset, c.offset);
    EXPECT_EQ(chunk.checksum, reference.checksum());
    EXPECT_EQ(chunk.data_size, static_cast<int64_t>(c.payload.size()));
    EXPECT_EQ(Joined(chunk), c.payload);
  }
}

TEST(ShardChunkTest, PayloadIsNotCopied) {
  const std::string payload(4096, 'p');
  const grpc::Slice slice(payload);
  const grpc::ByteBuffer message = EncodeShardChunk(nullptr, 0, slice);
  const std::vector<grpc::Slice> slices = SlicesOf(message);
  ParsedChunk chunk;
  ASSERT_TRUE(ParseShardChunk(slices, &chunk));
  ASSERT_EQ(chunk.data.size(), 1u);
  // The view points at the very bytes of the slice handed to the encoder.
  EXPECT_EQ(reinterpret_cast<const uint8_t*>(chunk.data[0].data()),
            slice.begin());
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

// Where a serialized ShardChunk's fields end: the cuts that leave a valid
// message (protobuf writes fields in field-number order).
std::set<size_t> FieldEnds(const v1::ShardChunk& message) {
  std::set<size_t> ends = {0};
  v1::ShardChunk prefix;
  if (message.has_header()) {
    *prefix.mutable_header() = message.header();
    ends.insert(prefix.ByteSizeLong());
  }
  prefix.set_offset(message.offset());
  ends.insert(prefix.ByteSizeLong());
  prefix.set_data(message.data());
  ends.insert(prefix.ByteSizeLong());
  prefix.set_checksum(message.checksum());
  ends.insert(prefix.ByteSizeLong());
  return ends;
}

TEST(ShardChunkTest, CutsInsideAFieldAreRefused) {
  v1::ShardChunk message;
  *message.mutable_header() = Header();
  message.set_offset(-5);                   // A ten-byte varint.
  message.set_data(std::string(300, 'd'));  // A two-byte length.
  message.set_checksum(0x0123456789abcdefull);
  const std::string bytes = message.SerializeAsString();
  const std::set<size_t> ends = FieldEnds(message);
  ASSERT_EQ(ends.size(), 5u);
  ASSERT_EQ(*ends.rbegin(), bytes.size());
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    SCOPED_TRACE(cut);
    // The truncated bytes, split once more at every third cut, so that a
    // field also ends up across two slices.
    const std::string head = bytes.substr(0, cut);
    std::vector<grpc::Slice> slices;
    if (cut % 3 == 0) {
      slices.emplace_back(head.substr(0, cut / 2));
      slices.emplace_back(head.substr(cut / 2));
    } else {
      slices.emplace_back(head);
    }
    v1::ShardChunk reference;
    const bool valid = reference.ParseFromString(head);
    EXPECT_EQ(valid, ends.count(cut) == 1);
    ParsedChunk chunk;
    ASSERT_EQ(ParseShardChunk(slices, &chunk), valid);
    if (!valid) continue;
    EXPECT_EQ(chunk.header.has_value(), reference.has_header());
    EXPECT_EQ(chunk.offset, reference.offset());
    EXPECT_EQ(Joined(chunk), reference.data());
    EXPECT_EQ(chunk.checksum, reference.checksum());
  }
}

TEST(ShardChunkTest, EveryCutOfAnEncodedChunk) {
  // EncodeShardChunk's own layout (the data field last, in its own slice).
  const v1::ShardHeader header = Header();
  const std::string bytes = Flatten(
      EncodeShardChunk(&header, 4096, grpc::Slice(std::string("0123456789"))));
  int valid = 0;
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    SCOPED_TRACE(cut);
    v1::ShardChunk reference;
    const bool reference_valid =
        reference.ParseFromString(bytes.substr(0, cut));
    const std::vector<grpc::Slice> slices = {grpc::Slice(bytes.substr(0, cut))};
    ParsedChunk chunk;
    ASSERT_EQ(ParseShardChunk(slices, &chunk), reference_valid);
    if (!reference_valid) continue;
    ++valid;
    EXPECT_EQ(chunk.offset, reference.offset());
    EXPECT_EQ(Joined(chunk), reference.data());
  }
  EXPECT_EQ(valid, 4);  // Nothing, header, + offset, + checksum.
}

TEST(ShardChunkTest, ViewsStayInsideTheInput) {
  // Random corruptions: whatever is accepted points into the slices given.
  v1::ShardChunk message;
  *message.mutable_header() = Header();
  message.set_offset(77);
  message.set_data(std::string(200, 'd'));
  message.set_checksum(5);
  const std::string bytes = message.SerializeAsString();
  std::mt19937 random(1234);
  int accepted = 0;
  for (int round = 0; round < 2000; ++round) {
    std::string corrupt = bytes;
    for (int flips = 1 + round % 4; flips > 0; --flips) {
      corrupt[random() % corrupt.size()] ^=
          static_cast<char>(1 << (random() % 8));
    }
    const std::vector<grpc::Slice> slices = {
        grpc::Slice(corrupt.substr(0, corrupt.size() / 3)),
        grpc::Slice(corrupt.substr(corrupt.size() / 3))};
    ParsedChunk chunk;
    if (!ParseShardChunk(slices, &chunk)) continue;
    ++accepted;
    int64_t viewed = 0;
    for (absl::string_view view : chunk.data) {
      viewed += static_cast<int64_t>(view.size());
      bool inside = false;
      for (const grpc::Slice& slice : slices) {
        const char* begin = reinterpret_cast<const char*>(slice.begin());
        inside |= view.data() >= begin &&
                  view.data() + view.size() <= begin + slice.size();
      }
      EXPECT_TRUE(inside) << "round " << round;
    }
    EXPECT_EQ(viewed, chunk.data_size) << "round " << round;
  }
  EXPECT_GT(accepted, 0);
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

// Regression: ParseField accepted (and skipped) field number 0, which
// protobuf refuses.
TEST(ShardChunkTest, MalformedTagsAreRefusedAsProtobufRefusesThem) {
  for (const std::string& bytes : {
           std::string("\x00\x01", 2),  // Field number 0.
           std::string("\x07", 1),      // Wire type 7.
           std::string("\x0e\x01", 2),  // Wire type 6.
           std::string("\x10\xff\xff\xff\xff\xff\xff\xff\xff\xff"
                       "\xff\x01",
                       12),                     // An eleven-byte varint.
           std::string("\x25\x01\x02\x03", 4),  // A cut fixed32.
       }) {
    SCOPED_TRACE(absl::CHexEscape(bytes));
    v1::ShardChunk reference;
    ASSERT_FALSE(reference.ParseFromString(bytes));
    ParsedChunk chunk;
    EXPECT_FALSE(ParseShardChunk({grpc::Slice(bytes)}, &chunk));
  }
}

TEST(ShardChunkTest, UnknownFieldsAreSkipped) {
  v1::ShardChunk message;
  message.set_offset(8);
  message.set_data("abc");
  std::string bytes = message.SerializeAsString();
  bytes += std::string("\x28\x05", 2);  // Field 5, varint.
  bytes += std::string(
      "\x31"
      "12345678",
      9);  // Field 6, fixed64.
  bytes += std::string(
      "\x3a\x02"
      "zz",
      4);  // Field 7, bytes.
  bytes += std::string(
      "\x45"
      "1234",
      5);                               // Field 8, fixed32.
  bytes += std::string("\x10\x09", 2);  // Offset again: 9.
  ASSERT_TRUE(message.ParseFromString(bytes));
  const std::vector<grpc::Slice> slices = {grpc::Slice(bytes)};
  ParsedChunk chunk;
  ASSERT_TRUE(ParseShardChunk(slices, &chunk));
  EXPECT_EQ(chunk.offset, 9);  // The later value wins.
  EXPECT_EQ(Joined(chunk), "abc");
  EXPECT_EQ(chunk.data_size, 3);
}

TEST(ChunkPrefixTest, RoundTrip) {
  for (const ChunkPrefix& prefix :
       {ChunkPrefix{0, 1, 0}, ChunkPrefix{4096, 1 << 20, 0xfeedfacecafebeefull},
        ChunkPrefix{std::numeric_limits<int64_t>::max(), -1,
                    std::numeric_limits<uint64_t>::max()},
        ChunkPrefix{std::numeric_limits<int64_t>::min(), int64_t{1} << 40,
                    uint64_t{1} << 63}}) {
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

TEST_F(FrameTest, TheLargestFrameRoundTrips) {
  // Larger than a socket's buffer: written while the other side reads.
  std::string big(kMaxDataPlaneFrameBytes, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 7);
  std::thread writer(
      [&] { EXPECT_OK(WriteFrame(a_.get(), big, absl::Now() + kWait)); });
  absl::StatusOr<std::string> got = ReadFrame(b_.get(), absl::Now() + kWait);
  writer.join();
  ASSERT_OK(got.status());
  EXPECT_TRUE(*got == big);
}

TEST_F(FrameTest, LengthIsLittleEndian) {
  ASSERT_OK(
      WriteFrame(a_.get(), std::string(0x0102, 'z'), absl::Now() + kWait));
  unsigned char length[4];
  ASSERT_OK(ReadFull(b_.get(), length, 4, absl::Now() + kWait));
  EXPECT_EQ(length[0], 0x02);
  EXPECT_EQ(length[1], 0x01);
  EXPECT_EQ(length[2], 0);
  EXPECT_EQ(length[3], 0);
}

TEST_F(FrameTest, SilentPeerEndsAtTheDeadline) {
  EXPECT_THAT(ReadFrame(b_.get(), absl::Now() + absl::Milliseconds(50)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, ::testing::_));
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
