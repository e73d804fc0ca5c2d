// ChunkChecksums (wire/chunk_checksums.h): over an authenticated
// connection every chunk is kUncheckedChunk; otherwise every chunk's
// checksum is the XXH3-64 of the bytes the sender hands it: the run's own
// chunks (hashed ahead), chunks that lie elsewhere (a staging copy, a
// gathered box) and a mix of both, with and without a run.
#include "wire/chunk_checksums.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>

#include "gtest/gtest.h"
#include "wire/chunk_codec.h"
#include "xxhash.h"

namespace tessera {
namespace {

constexpr int64_t kChunk = 1024;

std::string RandomBytes(size_t size, uint64_t seed) {
  std::mt19937_64 random(seed);
  std::string bytes(size, '\0');
  for (char& c : bytes) c = static_cast<char>(random());
  return bytes;
}

uint64_t Hash(const char* data, int64_t size) {
  return XXH3_64bits(data, static_cast<size_t>(size));
}

TEST(ChunkChecksumsTest, AnAuthenticatedConnectionHashesNothing) {
  const std::string run = RandomBytes(8 * kChunk + 5, 1);
  const int64_t total = static_cast<int64_t>(run.size());
  for (const char* base : {run.data(), static_cast<const char*>(nullptr)}) {
    ChunkChecksums checksums(/*checked=*/false, base, total, kChunk);
    for (int64_t offset = 0; offset < total; offset += kChunk) {
      EXPECT_EQ(checksums.For(offset, run.data() + offset,
                              std::min(kChunk, total - offset)),
                kUncheckedChunk);
    }
  }
}

TEST(ChunkChecksumsTest, EveryChunkHashesTheBytesItIsGiven) {
  const std::string run = RandomBytes(8 * kChunk + 5, 2);
  // A staging copy whose bytes differ from the run's: a checksum of the
  // run's chunk instead of the bytes sent would be caught.
  const std::string staged = RandomBytes(run.size(), 3);
  const int64_t total = static_cast<int64_t>(run.size());
  for (const int64_t run_bytes : {total, int64_t{kChunk}, int64_t{0}}) {
    for (const bool with_run : {true, false}) {
      ChunkChecksums checksums(
          /*checked=*/true, with_run ? run.data() : nullptr, run_bytes, kChunk);
      for (int64_t offset = 0; offset < run_bytes; offset += kChunk) {
        const int64_t size = std::min(kChunk, run_bytes - offset);
        // Chunks 2 and 5 come from elsewhere; the others from the run.
        const bool elsewhere = offset / kChunk == 2 || offset / kChunk == 5;
        const char* data = (elsewhere ? staged.data() : run.data()) + offset;
        EXPECT_EQ(checksums.For(offset, data, size), Hash(data, size))
            << "run of " << run_bytes << " bytes, offset " << offset
            << (with_run ? ", with its run" : ", no run");
      }
    }
  }
}

TEST(ChunkChecksumsTest, ChunksOffTheRunsBoundariesHashTheirOwnBytes) {
  // A sender whose chunks do not start on the run's chunk boundaries (a
  // source that cut them otherwise) still gets each chunk's own checksum.
  const std::string run = RandomBytes(6 * kChunk, 4);
  const int64_t total = static_cast<int64_t>(run.size());
  ChunkChecksums checksums(/*checked=*/true, run.data(), total, kChunk);
  for (int64_t offset = 0; offset < total; offset += kChunk + 100) {
    const int64_t size = std::min(kChunk, total - offset);
    EXPECT_EQ(checksums.For(offset, run.data() + offset, size),
              Hash(run.data() + offset, size))
        << "offset " << offset;
  }
}

}  // namespace
}  // namespace tessera
