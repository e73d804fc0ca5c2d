#include "io/heap.h"

#include <malloc.h>
#include <stdlib.h>

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/sanitizers.h"

namespace tessera {
namespace {

// Frees `count` blocks of 64 KiB (each under glibc's mmap threshold, so
// they come from the main thread's heap) and returns the free top the
// heap kept afterwards.
size_t KeptAfterFreeing(int count) {
  std::vector<void*> blocks;
  blocks.reserve(count);  // No live allocation between the blocks.
  for (int i = 0; i < count; ++i) {
    blocks.push_back(malloc(64 << 10));
    static_cast<char*>(blocks.back())[0] = 1;  // Touched, as a buffer is.
  }
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) free(*it);
  return mallinfo2().keepcost;
}

TEST(HeapTest, FreedMemoryStaysForTheNextAllocation) {
#ifdef TESSERA_TEST_UNDER_ASAN
  GTEST_SKIP() << "the sanitizer's allocator has no trim threshold";
#else
  // glibc's default first: 16 MiB freed at the top of the heap is given
  // back to the kernel at once.
  ASSERT_EQ(mallopt(M_TRIM_THRESHOLD, 128 << 10), 1);
  EXPECT_LT(KeptAfterFreeing(256), size_t{1} << 20);

  ASSERT_TRUE(KeepFreedHeapForReuse());
  EXPECT_GE(KeptAfterFreeing(256), size_t{16} << 20);
  // Past the threshold the heap is trimmed as before.
  EXPECT_LE(KeptAfterFreeing(1024), kKeptFreeHeapBytes);
#endif
}

TEST(HeapTest, AThresholdTheUserChoseStaysTheirs) {
  const char* before = getenv("GLIBC_TUNABLES");
  const std::string saved = before == nullptr ? "" : before;
  setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1000000", 1);
  EXPECT_FALSE(KeepFreedHeapForReuse());
  if (before == nullptr) {
    unsetenv("GLIBC_TUNABLES");
  } else {
    setenv("GLIBC_TUNABLES", saved.c_str(), 1);
  }
}

}  // namespace
}  // namespace tessera
