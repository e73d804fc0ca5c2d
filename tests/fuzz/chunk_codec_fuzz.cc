// libFuzzer target: what a peer sends on a shard stream. The input is cut
// into messages (a length byte before each); every message is parsed as a
// ShardChunk (split over two slices, as gRPC may deliver it) and fed to a
// ShardAssembler writing into a fixed 16 x 16 float32 destination, as the
// client does for gRPC fetches; the same bytes are decoded as data-plane
// chunk prefixes and fed to the assembler's data-plane checks (Start,
// Place, Verify), as for the raw data plane and the local path.
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/tensor/tensor.h"
#include "wire/chunk_assembler.h"
#include "wire/chunk_codec.h"

namespace {

using namespace tessera;  // NOLINT: a fuzz target's short names.

std::vector<std::string> Messages(const uint8_t* data, size_t size) {
  std::vector<std::string> messages;
  size_t at = 0;
  while (at < size && messages.size() < 64) {
    const size_t length = std::min<size_t>(data[at], size - at - 1);
    messages.emplace_back(reinterpret_cast<const char*>(data + at + 1), length);
    at += 1 + length;
  }
  return messages;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Tensor destination = *Tensor::Zeros({16, 16});
  const std::vector<std::string> messages = Messages(data, size);

  ShardAssembler grpc_stream("t", 0, destination);
  for (const std::string& message : messages) {
    const size_t cut = message.empty() ? 0 : message[0] % (message.size() + 1);
    std::vector<grpc::Slice> slices = {grpc::Slice(message.substr(0, cut)),
                                       grpc::Slice(message.substr(cut))};
    ParsedChunk chunk;
    (void)ParseShardChunk(slices, &chunk);
    grpc::ByteBuffer buffer(slices.data(), slices.size());
    if (!grpc_stream.Consume(buffer).ok()) break;
  }
  (void)grpc_stream.Finish();

  // The data plane: a header, then prefixes whose payloads follow them.
  ShardAssembler data_plane("t", 0, destination);
  if (messages.empty()) return 0;
  v1::ShardHeader header;
  if (!header.ParseFromString(messages[0]) || !data_plane.Start(header).ok()) {
    return 0;
  }
  for (size_t m = 1; m < messages.size(); ++m) {
    if (messages[m].size() < kDataPlaneChunkPrefixBytes) break;
    const ChunkPrefix prefix = DecodeChunkPrefix(messages[m].data());
    absl::StatusOr<char*> place =
        data_plane.Place(prefix.offset, prefix.length);
    if (!place.ok()) break;
    const size_t available = messages[m].size() - kDataPlaneChunkPrefixBytes;
    std::memcpy(*place, messages[m].data() + kDataPlaneChunkPrefixBytes,
                std::min<size_t>(available, prefix.length));
    if (!data_plane.Verify(prefix.offset, prefix.length, prefix.checksum)
             .ok()) {
      break;
    }
  }
  (void)data_plane.Finish();
  return 0;
}
