// Checksum64 is XXH3-64 whichever code path the CPU gets: the wire's
// checksums must not depend on the machine that computed them.
#include "common/checksum.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tessera {
namespace {

std::vector<unsigned char> Bytes(size_t n) {
  std::vector<unsigned char> bytes(n);
  uint64_t x = 0x9e3779b97f4a7c15ULL;
  for (auto& b : bytes) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b = static_cast<unsigned char>(x);
  }
  return bytes;
}

TEST(ChecksumTest, EqualsPortableXxh3AtEverySizeClass) {
  // Each of XXH3's size classes (0, 1-3, 4-8, 9-16, 17-128, 129-240, long
  // inputs with and without a partial stripe and block), at odd offsets.
  const std::vector<unsigned char> bytes = Bytes(3 << 20);
  for (size_t size :
       {size_t{0}, size_t{1}, size_t{3}, size_t{4}, size_t{8}, size_t{9},
        size_t{16}, size_t{17}, size_t{128}, size_t{129}, size_t{240},
        size_t{241}, size_t{1023}, size_t{1024}, size_t{1025}, size_t{65536},
        size_t{(1 << 20) + 7}, size_t{3 << 20}}) {
    for (size_t at : {size_t{0}, size_t{1}, size_t{5}}) {
      if (at + size > bytes.size()) continue;
      SCOPED_TRACE(::testing::Message() << size << " bytes at " << at);
      EXPECT_EQ(Checksum64(bytes.data() + at, size),
                XXH3_64bits(bytes.data() + at, size));
    }
  }
  EXPECT_EQ(Checksum64(nullptr, 0), XXH3_64bits(nullptr, 0));
  // The value XXH3's specification gives for no input (seed 0).
  EXPECT_EQ(Checksum64(nullptr, 0), 0x2D06800538D394C2ULL);
}

TEST(ChecksumTest, AStreamInPiecesEqualsTheWhole) {
  const std::vector<unsigned char> bytes = Bytes((2 << 20) + 333);
  for (size_t piece : {size_t{1}, size_t{7}, size_t{240}, size_t{4096},
                       size_t{65537}, size_t{1 << 20}}) {
    SCOPED_TRACE(::testing::Message() << "pieces of " << piece);
    Checksum64Stream stream;
    for (size_t at = 0; at < bytes.size(); at += piece) {
      stream.Update(bytes.data() + at, std::min(piece, bytes.size() - at));
    }
    EXPECT_EQ(stream.Digest(), XXH3_64bits(bytes.data(), bytes.size()));
  }
  EXPECT_EQ(Checksum64Stream().Digest(), XXH3_64bits(nullptr, 0));
}

}  // namespace
}  // namespace tessera
