// MappingCache: shared mappings of whole memory files, read-only or
// writable, kept for reuse for a short while after their last use.
//
// Why: the local path (client/local_path.h) copies a shard out of the
// memory file its owner lends for each fetch. Mapping that file for every
// fetch and unmapping it after cost more than the copy: a 256 MiB read
// spent about a third of its time filling and tearing down page tables
// (8-9 GB/s on a 2-core VM, where the same read through a mapping kept
// from the fetch before ran at 14-16 GB/s). A file lent again soon (a
// loop of to_here, a read plan run every step, a few reads of one
// tensor) is copied through the mapping made the first time: its page
// tables are already filled. Writes through the local path keep theirs
// the same way (a writable mapping, kept apart from the read-only one of
// the same file): mapping a small box writable and unmapping it after
// cost more than the write.
//
// What a kept mapping costs: its file stays open, and its memory stays
// allocated until it is unmapped even after its owner let go of the file,
// unless the owner frees the pages itself (Tessera's owners punch them out
// when they free a file: common/tensor/storage.h). Mappings are therefore
// unmapped `keep` after their last Map (one second by default) by a helper
// thread, and at once, least recently used first, beyond `max_bytes` of
// kept mappings. Mappings are not inherited by a forked child
// (MADV_DONTFORK).
//
// Reads through a kept mapping see the file's current bytes (a shared
// mapping of the same file): keeping it changes no value read. The cache
// trusts the caller to have checked the file (sealed against shrinking,
// at least `min_bytes` long) before asking: pages past a file's end fault
// with SIGBUS.
//
// Thread-safety: Map may be called from many threads at once. A returned
// MappedFile stays mapped while anyone holds it, expired or not.
// Destroying the cache unmaps every mapping no one holds; a process forked
// while a cache existed must not use it (the local path refuses to run in
// such a child: wire/fork_guard.h) and leaves it alone when destroying it.
#ifndef TESSERA_IO_MAPPING_CACHE_H_
#define TESSERA_IO_MAPPING_CACHE_H_

#include <sys/stat.h>
#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tessera {

// A shared mapping of [0, size) of a file, read-only unless `writable`;
// unmapped when the last holder lets it go.
class MappedFile {
 public:
  MappedFile(char* data, int64_t size, bool writable)
      : data_(data), size_(size), writable_(writable) {}
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const char* data() const { return data_; }
  // The same bytes, for writing; nullptr for a read-only mapping.
  char* writable_data() const { return writable_ ? data_ : nullptr; }
  int64_t size() const { return size_; }
  bool writable() const { return writable_; }

  // The bytes copied into or out of the file around this mapping (by
  // pwrite(2) or pread(2), its page tables left unfilled) while it was
  // kept: the local path goes around a mapping until filling its page
  // tables would have paid (client/local_path.cc, WriteIntoMappedRun and
  // ReadDenseRun). AddCopiedAround adds to them. Thread-safe.
  int64_t copied_around() const {
    return copied_around_.load(std::memory_order_relaxed);
  }
  void AddCopiedAround(int64_t bytes) const {
    copied_around_.fetch_add(bytes, std::memory_order_relaxed);
  }

 private:
  char* const data_;
  const int64_t size_;
  const bool writable_;
  mutable std::atomic<int64_t> copied_around_{0};
};

class MappingCache {
 public:
  static constexpr absl::Duration kDefaultKeep = absl::Seconds(1);
  static constexpr int64_t kDefaultMaxBytes = int64_t{4} << 30;

  // What a mapping is for. A writable one needs a descriptor open for
  // reading and writing; the two kinds of one file are kept apart.
  enum class Access { kRead, kWrite };

  explicit MappingCache(absl::Duration keep = kDefaultKeep,
                        int64_t max_bytes = kDefaultMaxBytes);
  ~MappingCache();
  MappingCache(const MappingCache&) = delete;
  MappingCache& operator=(const MappingCache&) = delete;

  // A mapping of all of file `fd` (its size when mapped, at least
  // `min_bytes`) for `access`: the one kept for the same file (device and
  // inode) and access when it covers `min_bytes`, else a new one (not
  // populated: pages are filled as they are touched), kept in place of any
  // older one of that file and access. *fresh (when not null) says whether
  // it is new. UNAVAILABLE, with errno's message, when the file cannot be
  // mapped; INVALID_ARGUMENT when it is shorter than `min_bytes`;
  // PERMISSION_DENIED when kWrite is asked through a descriptor not open
  // for writing (a kept writable mapping is lent only through one that
  // is).
  absl::StatusOr<std::shared_ptr<const MappedFile>> Map(
      int fd, int64_t min_bytes, bool* fresh = nullptr,
      Access access = Access::kRead);
  // The same, for a caller that has just fstat'ed `fd` into `info` (the
  // local path checks the file first): the file is not fstat'ed again.
  absl::StatusOr<std::shared_ptr<const MappedFile>> Map(
      int fd, const struct stat& info, int64_t min_bytes, bool* fresh = nullptr,
      Access access = Access::kRead);

  // Mappings kept now, and their bytes.
  size_t kept() const;
  int64_t kept_bytes() const;

 private:
  struct State;
  // The helper thread: unmaps entries as they expire; ends when none is
  // left or the cache is gone.
  static void Reap(std::shared_ptr<State> state);

  std::shared_ptr<State> state_;
  const pid_t pid_;
};

}  // namespace tessera

#endif  // TESSERA_IO_MAPPING_CACHE_H_
