// The chunk codec: how shard bytes travel, as both ends see them.
//
//  - gRPC (FetchShard, ReadRegion, Gather): a stream of v1::ShardChunk
//    messages. EncodeShardChunk builds one around a payload slice without
//    copying it (protobuf serializes the small fields; the payload follows
//    as the caller's slice), and ParseShardChunk reads one back leaving the
//    payload where it lies, as views into the message's slices.
//  - The data plane (docs/data_plane.md): a connection (plaintext, or TLS
//    when the cluster uses it: data_connection.h) opens with
//    kDataPlaneMagic, or kDataPlaneTokenMagic and a frame with the
//    client's token (kDataPlaneRequestMagic and kDataPlaneRequestTokenMagic
//    for connections that may also write); requests and replies are
//    length-prefixed frames (WriteFrame/ReadFrame, at most
//    kMaxDataPlaneFrameBytes); each chunk's bytes follow a 24-byte
//    little-endian prefix (offset, length, XXH3-64),
//    EncodeChunkPrefix/DecodeChunkPrefix.
//  - The local path (proto/tessera/v1/local.proto): a connection opens with
//    kLocalMagic; a lease ends with the one-byte message kLocalDone.
//
// Nothing here trusts the peer: parsing reports malformed input as a value
// and never reads past the bytes it was given. Thread-safe (no state).
#ifndef TESSERA_WIRE_CHUNK_CODEC_H_
#define TESSERA_WIRE_CHUNK_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "tessera/v1/shard.pb.h"

namespace tessera {

// The magic that opens every data-plane connection (the wire contract of
// proto/tessera/v1/shard.proto keeps its historic bytes).
inline constexpr absl::string_view kDataPlaneMagic = "TSRBULK1";
// The same for a client that presents a token (wire/auth.h): the magic is
// followed by one frame holding the token.
inline constexpr absl::string_view kDataPlaneTokenMagic = "TSRBULK2";
// The same two for a connection whose frames are v1::DataPlaneRequests
// (fetches and writes) instead of bare FetchShardRequests.
inline constexpr absl::string_view kDataPlaneRequestMagic = "TSRBULK3";
inline constexpr absl::string_view kDataPlaneRequestTokenMagic = "TSRBULK4";
// Largest control frame (request or reply) either side accepts.
inline constexpr uint32_t kMaxDataPlaneFrameBytes = 1 << 20;
// Largest box a data-plane write carries inside its request
// (BulkWriteRequest.data): one round trip instead of two.
inline constexpr int64_t kInlineWriteBytes = int64_t{64} << 10;
// Size of the binary prefix of each data-plane chunk.
inline constexpr size_t kDataPlaneChunkPrefixBytes = 24;

// The first message of every local-path connection.
inline constexpr absl::string_view kLocalMagic = "TSRLOCL1";
// The one-byte message that ends a lease (the client has copied the bytes).
inline constexpr char kLocalDone = 'D';

// ---- gRPC: ShardChunk -------------------------------------------------------

// A received ShardChunk whose payload still lies in the message's slices.
struct ParsedChunk {
  std::optional<v1::ShardHeader> header;
  int64_t offset = 0;
  uint64_t checksum = 0;
  // Views into the message's slices, in order.
  std::vector<absl::string_view> data;
  int64_t data_size = 0;
};

// Parses a serialized ShardChunk from `slices` (proto3 semantics: later
// scalars win, messages merge, unknown fields are skipped). `data` views
// point into `slices`, which must outlive `chunk`. False when malformed.
bool ParseShardChunk(const std::vector<grpc::Slice>& slices,
                     ParsedChunk* chunk);

// The serialized ShardChunk {header (when not null), offset, checksum of
// the payload, data = payload}; the payload slice is referenced, not
// copied (it keeps whatever owns its bytes alive until gRPC drops it).
grpc::ByteBuffer EncodeShardChunk(const v1::ShardHeader* header, int64_t offset,
                                  grpc::Slice payload);

// ---- The data plane ---------------------------------------------------------

struct ChunkPrefix {
  int64_t offset = 0;
  int64_t length = 0;
  // XXH3-64 of the chunk's bytes; kUncheckedChunk over a connection that
  // authenticates its bytes itself (TLS: DataConnection::authenticated()),
  // where neither end hashes.
  uint64_t checksum = 0;
};
inline constexpr uint64_t kUncheckedChunk = 0;
void EncodeChunkPrefix(const ChunkPrefix& prefix,
                       char out[kDataPlaneChunkPrefixBytes]);
ChunkPrefix DecodeChunkPrefix(const char in[kDataPlaneChunkPrefixBytes]);

// A length-prefixed frame on a data-plane socket (io/socket.h's deadlines
// and errors); INVALID_ARGUMENT (writing) or DATA_LOSS (reading) for one
// larger than kMaxDataPlaneFrameBytes. `more`: see WriteFull.
absl::Status WriteFrame(int fd, absl::string_view payload, absl::Time deadline,
                        bool more = false);
absl::StatusOr<std::string> ReadFrame(int fd, absl::Time deadline);

}  // namespace tessera

#endif  // TESSERA_WIRE_CHUNK_CODEC_H_
