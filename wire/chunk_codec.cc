#include "wire/chunk_codec.h"

#include "common/checksum.h"
#include "wire/data_connection.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/io/coded_stream.h"
#include "io/socket.h"

namespace tessera {
namespace {

// Reads protobuf wire primitives across the slices of a message, handing
// out length-delimited fields as views into the slices (no copy).
class SliceReader {
 public:
  explicit SliceReader(const std::vector<grpc::Slice>& slices)
      : slices_(slices) {
    SkipEmptySlices();
  }

  bool done() const { return slice_ == slices_.size(); }

  bool ReadVarint(uint64_t* value) {
    *value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t byte;
      if (!ReadByte(&byte)) return false;
      *value |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) return true;
    }
    return false;
  }

  bool ReadFixed64(uint64_t* value) {
    *value = 0;
    for (int i = 0; i < 8; ++i) {
      uint8_t byte;
      if (!ReadByte(&byte)) return false;
      *value |= static_cast<uint64_t>(byte) << (8 * i);
    }
    return true;
  }

  // The next `size` bytes as views into the slices; null `views` skips.
  bool Read(uint64_t size, std::vector<absl::string_view>* views) {
    while (size > 0) {
      if (done()) return false;
      const grpc::Slice& slice = slices_[slice_];
      const size_t take = std::min<uint64_t>(size, slice.size() - pos_);
      if (views != nullptr) {
        views->emplace_back(reinterpret_cast<const char*>(slice.begin()) + pos_,
                            take);
      }
      Advance(take);
      size -= take;
    }
    return true;
  }

 private:
  bool ReadByte(uint8_t* byte) {
    if (done()) return false;
    *byte = slices_[slice_].begin()[pos_];
    Advance(1);
    return true;
  }

  void Advance(size_t n) {
    pos_ += n;
    if (pos_ == slices_[slice_].size()) {
      ++slice_;
      pos_ = 0;
      SkipEmptySlices();
    }
  }

  void SkipEmptySlices() {
    while (!done() && slices_[slice_].size() == 0) ++slice_;
  }

  const std::vector<grpc::Slice>& slices_;
  size_t slice_ = 0;
  size_t pos_ = 0;
};

enum WireType : uint64_t { kVarint = 0, kFixed64 = 1, kDelimited = 2 };
constexpr uint64_t kFixed32 = 5;

// Parses one field into `chunk` (proto3 semantics: later scalars win,
// messages merge, unknown fields are skipped). False when malformed.
bool ParseField(SliceReader& reader, ParsedChunk& chunk) {
  uint64_t tag;
  if (!reader.ReadVarint(&tag)) return false;
  const uint64_t field = tag >> 3;
  if (field == 0) return false;  // Protobuf has no field 0.
  uint64_t value;
  switch (tag & 7) {
    case kVarint:
      if (!reader.ReadVarint(&value)) return false;
      if (field == v1::ShardChunk::kOffsetFieldNumber) {
        chunk.offset = static_cast<int64_t>(value);
      }
      return true;
    case kFixed64:
      if (!reader.ReadFixed64(&value)) return false;
      if (field == v1::ShardChunk::kChecksumFieldNumber) chunk.checksum = value;
      return true;
    case kDelimited: {
      if (!reader.ReadVarint(&value)) return false;
      std::vector<absl::string_view> views;
      const bool wanted = field == v1::ShardChunk::kHeaderFieldNumber ||
                          field == v1::ShardChunk::kDataFieldNumber;
      if (!reader.Read(value, wanted ? &views : nullptr)) return false;
      if (field == v1::ShardChunk::kDataFieldNumber) {
        chunk.data = std::move(views);
        chunk.data_size = static_cast<int64_t>(value);
      } else if (field == v1::ShardChunk::kHeaderFieldNumber) {
        if (!chunk.header.has_value()) chunk.header.emplace();
        if (!chunk.header->MergeFromString(absl::StrJoin(views, ""))) {
          return false;
        }
      }
      return true;
    }
    case kFixed32:
      return reader.Read(4, nullptr);
    default:
      return false;
  }
}

void StoreLe64(uint64_t value, char* out) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(value >> (8 * i));
}

uint64_t LoadLe64(const char* in) {
  uint64_t value = 0;
  for (int i = 0; i < 8; ++i) {
    value |= static_cast<uint64_t>(static_cast<unsigned char>(in[i]))
             << (8 * i);
  }
  return value;
}

}  // namespace

bool ParseShardChunk(const std::vector<grpc::Slice>& slices,
                     ParsedChunk* chunk) {
  SliceReader reader(slices);
  while (!reader.done()) {
    if (!ParseField(reader, *chunk)) return false;
  }
  return true;
}

grpc::ByteBuffer EncodeShardChunk(const v1::ShardHeader* header, int64_t offset,
                                  grpc::Slice payload) {
  const size_t size = payload.size();
  v1::ShardChunk fields;
  if (header != nullptr) *fields.mutable_header() = *header;
  fields.set_offset(offset);
  fields.set_checksum(Checksum64(size > 0 ? payload.begin() : nullptr, size));
  std::string prefix = fields.SerializeAsString();
  if (size == 0) {
    grpc::Slice only(prefix);
    return grpc::ByteBuffer(&only, 1);
  }
  // Everything but the payload, ending with the data field's tag and
  // length; the payload follows as its own slice. (Fields may come in any
  // order on the wire.)
  using google::protobuf::io::CodedOutputStream;
  uint8_t framing[16];
  uint8_t* end = CodedOutputStream::WriteTagToArray(
      (v1::ShardChunk::kDataFieldNumber << 3) | kDelimited, framing);
  end = CodedOutputStream::WriteVarint64ToArray(size, end);
  prefix.append(reinterpret_cast<const char*>(framing), end - framing);
  const grpc::Slice slices[] = {grpc::Slice(prefix), std::move(payload)};
  return grpc::ByteBuffer(slices, 2);
}

void EncodeChunkPrefix(const ChunkPrefix& prefix,
                       char out[kDataPlaneChunkPrefixBytes]) {
  StoreLe64(static_cast<uint64_t>(prefix.offset), out);
  StoreLe64(static_cast<uint64_t>(prefix.length), out + 8);
  StoreLe64(prefix.checksum, out + 16);
}

ChunkPrefix DecodeChunkPrefix(const char in[kDataPlaneChunkPrefixBytes]) {
  return ChunkPrefix{static_cast<int64_t>(LoadLe64(in)),
                     static_cast<int64_t>(LoadLe64(in + 8)), LoadLe64(in + 16)};
}

absl::Status WriteFrame(int fd, absl::string_view payload, absl::Time deadline,
                        bool more) {
  return DataConnection::PlainView(fd).WriteFrame(payload, deadline, more);
}

absl::StatusOr<std::string> ReadFrame(int fd, absl::Time deadline) {
  return DataConnection::PlainView(fd).ReadFrame(deadline);
}

}  // namespace tessera
