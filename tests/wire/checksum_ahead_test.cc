// ChecksumAhead (wire/checksum_ahead.h): every chunk's checksum equals
// XXH3-64 of its bytes, for runs that end on a chunk boundary and that do
// not, and any lead; the helper never hashes more than `lead` chunks past
// the last one taken; a ChecksumAhead dropped before its chunks were all
// taken stops its helper.
#include "wire/checksum_ahead.h"

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "xxhash.h"

namespace tessera {
namespace {

std::string RandomBytes(size_t size) {
  std::mt19937_64 random(size);
  std::string bytes(size, '\0');
  for (char& c : bytes) c = static_cast<char>(random());
  return bytes;
}

TEST(ChecksumAheadTest, EveryChunkHashesItsOwnBytes) {
  for (const int64_t total :
       {0, 1, 4095, 4096, 4097, 3 * 4096, 10 * 4096 + 7}) {
    for (const int lead : {0, 1, 2, 5}) {
      const std::string bytes = RandomBytes(static_cast<size_t>(total));
      const int64_t chunk = 4096;
      ChecksumAhead ahead(bytes.data(), total, chunk, lead);
      ASSERT_EQ(ahead.num_chunks(), (total + chunk - 1) / chunk);
      for (int64_t k = 0; k < ahead.num_chunks(); ++k) {
        const int64_t size = std::min(chunk, total - k * chunk);
        EXPECT_EQ(ahead.Take(k), XXH3_64bits(bytes.data() + k * chunk,
                                             static_cast<size_t>(size)))
            << "total " << total << ", lead " << lead << ", chunk " << k;
      }
    }
  }
}

TEST(ChecksumAheadTest, HashesAtMostLeadChunksPastTheLastTaken) {
  // Bytes changed after the sender took chunk 0 are hashed as changed in
  // every chunk the helper may not have reached yet (k >= lead): it waits
  // for Take before it goes further.
  std::string bytes = RandomBytes(8 * 1024);
  const int64_t chunk = 1024;
  const int lead = 2;
  ChecksumAhead ahead(bytes.data(), static_cast<int64_t>(bytes.size()), chunk,
                      lead);
  EXPECT_EQ(ahead.Take(0), XXH3_64bits(bytes.data(), chunk));
  // The helper may now hash chunks 1 (taken 0 + lead - 1) at most; give it
  // time to run ahead if it (wrongly) would.
  absl::SleepFor(absl::Milliseconds(50));
  for (int64_t k = lead; k < 8; ++k) bytes[static_cast<size_t>(k * chunk)] ^= 1;
  for (int64_t k = 1; k < 8; ++k) {
    EXPECT_EQ(ahead.Take(k), XXH3_64bits(bytes.data() + k * chunk, chunk))
        << "chunk " << k;
  }
}

TEST(ChecksumAheadTest, DroppedBeforeEveryChunkWasTakenStopsItsHelper) {
  const std::string bytes = RandomBytes(64 * 1024);
  for (int i = 0; i < 100; ++i) {
    ChecksumAhead ahead(bytes.data(), static_cast<int64_t>(bytes.size()), 1024);
    if (i % 2 == 1) ahead.Take(0);
  }
}

}  // namespace
}  // namespace tessera
