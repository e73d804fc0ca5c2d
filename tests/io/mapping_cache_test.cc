#include "io/mapping_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "io/unique_fd.h"

namespace tessera {
namespace {

// A memory file of `size` bytes holding `fill`.
UniqueFd MemoryFile(int64_t size, char fill) {
  UniqueFd fd(memfd_create("mapping_cache_test", MFD_CLOEXEC));
  EXPECT_TRUE(fd.valid());
  EXPECT_EQ(ftruncate(fd.get(), size), 0);
  std::string bytes(static_cast<size_t>(size), fill);
  EXPECT_EQ(pwrite(fd.get(), bytes.data(), bytes.size(), 0),
            static_cast<ssize_t>(size));
  return fd;
}

// Polls `done` for up to 10 s.
template <typename F>
bool Eventually(F done) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

TEST(MappingCacheTest, AFileMappedAgainIsTheKeptMapping) {
  MappingCache cache;
  UniqueFd file = MemoryFile(1 << 20, 'a');
  bool fresh = false;
  auto first = cache.Map(file.get(), 1 << 20, &fresh);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(fresh);
  EXPECT_EQ((*first)->size(), 1 << 20);
  EXPECT_EQ((*first)->data()[12345], 'a');
  // Another descriptor of the same file, as each lease sends one.
  UniqueFd again(dup(file.get()));
  auto second = cache.Map(again.get(), 4096, &fresh);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_FALSE(fresh);
  EXPECT_EQ(second->get(), first->get());
  EXPECT_EQ(cache.kept(), 1u);
  EXPECT_EQ(cache.kept_bytes(), 1 << 20);
  // Another file is another mapping.
  UniqueFd other = MemoryFile(8192, 'b');
  auto third = cache.Map(other.get(), 8192, &fresh);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_TRUE(fresh);
  EXPECT_EQ((*third)->data()[0], 'b');
  EXPECT_EQ(cache.kept(), 2u);
}

// A caller that fstat'ed the file already (the local path) passes what it
// saw: the same mapping, the same checks.
TEST(MappingCacheTest, MapsWithTheCallersStat) {
  MappingCache cache;
  UniqueFd file = MemoryFile(65536, 'c');
  struct stat info;
  ASSERT_EQ(fstat(file.get(), &info), 0);
  bool fresh = false;
  auto first = cache.Map(file.get(), info, 65536, &fresh);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(fresh);
  EXPECT_EQ((*first)->size(), 65536);
  EXPECT_EQ((*first)->data()[65535], 'c');
  auto second = cache.Map(file.get(), info, 4096, &fresh);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_FALSE(fresh);
  EXPECT_EQ(second->get(), first->get());
  auto longer = cache.Map(file.get(), info, 65537, &fresh);
  EXPECT_EQ(longer.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(MappingCacheTest, AKeptMappingShowsLaterWritesToItsFile) {
  MappingCache cache;
  UniqueFd file = MemoryFile(65536, 'a');
  auto first = cache.Map(file.get(), 65536);
  ASSERT_TRUE(first.ok());
  ASSERT_EQ((*first)->data()[100], 'a');
  ASSERT_EQ(pwrite(file.get(), "z", 1, 100), 1);
  auto second = cache.Map(file.get(), 65536);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->get(), first->get());
  EXPECT_EQ((*second)->data()[100], 'z');
}

TEST(MappingCacheTest, AFileThatGrewPastItsMappingIsMappedAgain) {
  MappingCache cache;
  UniqueFd file = MemoryFile(4096, 'a');
  auto small = cache.Map(file.get(), 4096);
  ASSERT_TRUE(small.ok());
  ASSERT_EQ(ftruncate(file.get(), 3 * 4096), 0);
  bool fresh = false;
  auto large = cache.Map(file.get(), 3 * 4096, &fresh);
  ASSERT_TRUE(large.ok()) << large.status();
  EXPECT_TRUE(fresh);
  EXPECT_EQ((*large)->size(), 3 * 4096);
  EXPECT_EQ(cache.kept(), 1u);          // In place of the smaller one...
  EXPECT_EQ((*small)->data()[0], 'a');  // ...which its holder still reads.
}

TEST(MappingCacheTest, AFileShorterThanAskedIsRefused) {
  MappingCache cache;
  UniqueFd file = MemoryFile(4096, 'a');
  auto mapped = cache.Map(file.get(), 8192);
  EXPECT_TRUE(absl::IsInvalidArgument(mapped.status())) << mapped.status();
  EXPECT_EQ(cache.kept(), 0u);
  auto bad = cache.Map(-1, 0);
  EXPECT_TRUE(absl::IsUnavailable(bad.status())) << bad.status();
}

TEST(MappingCacheTest, MappingsUnusedForTheirKeepAreLetGo) {
  MappingCache cache(absl::Milliseconds(50));
  UniqueFd file = MemoryFile(65536, 'a');
  UniqueFd held_file = MemoryFile(65536, 'h');
  ASSERT_TRUE(cache.Map(file.get(), 65536).ok());
  auto held = cache.Map(held_file.get(), 65536);
  ASSERT_TRUE(held.ok());
  EXPECT_EQ(cache.kept(), 2u);
  EXPECT_TRUE(Eventually([&] { return cache.kept() == 0; }));
  EXPECT_EQ(cache.kept_bytes(), 0);
  // One still held stays mapped for its holder.
  EXPECT_EQ((*held)->data()[65535], 'h');
  // And the cache keeps mappings again (a new helper).
  bool fresh = false;
  ASSERT_TRUE(cache.Map(file.get(), 65536, &fresh).ok());
  EXPECT_TRUE(fresh);
  EXPECT_TRUE(Eventually([&] { return cache.kept() == 0; }));
}

TEST(MappingCacheTest, BeyondMaxBytesTheLeastRecentlyUsedGoFirst) {
  MappingCache cache(absl::Hours(1), 3 * 65536);
  UniqueFd a = MemoryFile(65536, 'a');
  UniqueFd b = MemoryFile(65536, 'b');
  UniqueFd c = MemoryFile(2 * 65536, 'c');
  ASSERT_TRUE(cache.Map(a.get(), 1).ok());
  absl::SleepFor(absl::Milliseconds(2));
  ASSERT_TRUE(cache.Map(b.get(), 1).ok());
  absl::SleepFor(absl::Milliseconds(2));
  ASSERT_TRUE(cache.Map(a.get(), 1).ok());  // a is now the most recent.
  absl::SleepFor(absl::Milliseconds(2));
  ASSERT_TRUE(cache.Map(c.get(), 1).ok());
  EXPECT_EQ(cache.kept(), 2u);
  EXPECT_EQ(cache.kept_bytes(), 3 * 65536);
  bool fresh = false;
  ASSERT_TRUE(cache.Map(a.get(), 1, &fresh).ok());
  EXPECT_FALSE(fresh);  // b went.
  ASSERT_TRUE(cache.Map(b.get(), 1, &fresh).ok());
  EXPECT_TRUE(fresh);
  // A file larger than max_bytes is mapped but not kept.
  UniqueFd huge = MemoryFile(4 * 65536, 'h');
  auto mapped = cache.Map(huge.get(), 1);
  ASSERT_TRUE(mapped.ok());
  EXPECT_EQ((*mapped)->data()[4 * 65536 - 1], 'h');
  EXPECT_LE(cache.kept_bytes(), 3 * 65536);
}

// A writable mapping is kept apart from the read-only one of the same
// file, and is had only through a descriptor open for writing, kept or
// not: a kept one is never handed out through a read-only descriptor.
TEST(MappingCacheTest, WritableMappingsNeedAWritableDescriptor) {
  MappingCache cache;
  UniqueFd file = MemoryFile(65536, 'a');
  bool fresh = false;
  auto writable =
      cache.Map(file.get(), 65536, &fresh, MappingCache::Access::kWrite);
  ASSERT_TRUE(writable.ok()) << writable.status();
  EXPECT_TRUE(fresh);
  ASSERT_NE((*writable)->writable_data(), nullptr);
  (*writable)->writable_data()[100] = 'w';
  char byte = 0;
  ASSERT_EQ(pread(file.get(), &byte, 1, 100), 1);
  EXPECT_EQ(byte, 'w');  // Written through to the file.
  auto again =
      cache.Map(file.get(), 4096, &fresh, MappingCache::Access::kWrite);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(fresh);
  EXPECT_EQ(again->get(), writable->get());
  // The read-only kind of the same file is its own mapping.
  auto readable = cache.Map(file.get(), 65536, &fresh);
  ASSERT_TRUE(readable.ok()) << readable.status();
  EXPECT_TRUE(fresh);
  EXPECT_EQ((*readable)->writable_data(), nullptr);
  EXPECT_EQ((*readable)->data()[100], 'w');
  EXPECT_EQ(cache.kept(), 2u);
  // A read-only descriptor of the file: refused, though one is kept.
  const std::string path = "/proc/self/fd/" + std::to_string(file.get());
  UniqueFd read_only(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(read_only.valid());
  EXPECT_EQ(
      cache.Map(read_only.get(), 4096, &fresh, MappingCache::Access::kWrite)
          .status()
          .code(),
      absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(cache.kept(), 2u);
}

TEST(MappingCacheTest, AForkedChildInheritsNoKeptMapping) {
  MappingCache cache;
  UniqueFd file = MemoryFile(65536, 'a');
  auto mapped = cache.Map(file.get(), 65536);
  ASSERT_TRUE(mapped.ok());
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // mincore fails with ENOMEM on an address that is not mapped.
    unsigned char vec[16];
    const bool mapped_here =
        mincore(const_cast<char*>((*mapped)->data()), 65536, vec) == 0;
    _exit(mapped_here ? 1 : 0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace tessera
