#include "wire/chunk_checksums.h"

#include <algorithm>

#include "common/checksum.h"
#include "common/int_math.h"
#include "wire/chunk_codec.h"

namespace tessera {

ChunkChecksums::ChunkChecksums(bool checked, const char* run,
                               int64_t total_bytes, int64_t chunk_bytes)
    : checked_(checked),
      run_(run),
      chunk_bytes_(std::max<int64_t>(chunk_bytes, 1)) {
  if (checked_ && run_ != nullptr &&
      CeilDiv(std::max<int64_t>(total_bytes, 0), chunk_bytes_) >=
          ChecksumAhead::kMinChunks) {
    ahead_.emplace(run_, total_bytes, chunk_bytes_);
  }
}

uint64_t ChunkChecksums::For(int64_t offset, const char* data, int64_t size) {
  if (!checked_) return kUncheckedChunk;
  // Hashed ahead only when this chunk is the run's chunk at that offset.
  if (ahead_.has_value() && data == run_ + offset &&
      offset % chunk_bytes_ == 0) {
    return ahead_->Take(offset / chunk_bytes_);
  }
  return Checksum64(data, static_cast<size_t>(size));
}

}  // namespace tessera
