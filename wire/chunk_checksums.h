// ChunkChecksums: the checksum a data-plane sender puts in each chunk's
// prefix (wire/chunk_codec.h, ChunkPrefix), chosen once per transfer for
// every sender (the daemon answering a fetch, the client writing a box).
//
// Over a connection that authenticates its bytes itself (TLS) it is
// kUncheckedChunk and nothing is hashed. Otherwise it is the XXH3-64 of
// the chunk: hashed ahead on a helper (wire/checksum_ahead.h) for the
// chunks of a dense host run of at least ChecksumAhead::kMinChunks chunks,
// and on the caller's thread for any other chunk (a gathered box's, a CUDA
// chunk staged to a pinned buffer, a run too short for a helper).
//
// Ownership: the run's bytes ([run, run + total_bytes)) are the caller's
// and must stay valid until the ChunkChecksums is destroyed.
//
// Thread-safety: For is called by one thread, for chunks in increasing
// order of offset. Never fails.
#ifndef TESSERA_WIRE_CHUNK_CHECKSUMS_H_
#define TESSERA_WIRE_CHUNK_CHECKSUMS_H_

#include <cstdint>
#include <optional>

#include "wire/checksum_ahead.h"

namespace tessera {

class ChunkChecksums {
 public:
  // `checked`: false over a connection that authenticates its bytes (every
  // chunk is then kUncheckedChunk). `run`: the transfer's bytes when they
  // are one dense run of host memory, chunk k being [k * chunk_bytes,
  // min(total_bytes, (k + 1) * chunk_bytes)) of it; nullptr otherwise.
  ChunkChecksums(bool checked, const char* run, int64_t total_bytes,
                 int64_t chunk_bytes);
  ChunkChecksums(const ChunkChecksums&) = delete;
  ChunkChecksums& operator=(const ChunkChecksums&) = delete;

  // The prefix checksum of the chunk of `size` bytes at `data`, at
  // `offset` in the transfer.
  uint64_t For(int64_t offset, const char* data, int64_t size);

 private:
  const bool checked_;
  const char* const run_;
  const int64_t chunk_bytes_;
  std::optional<ChecksumAhead> ahead_;
};

}  // namespace tessera

#endif  // TESSERA_WIRE_CHUNK_CHECKSUMS_H_
