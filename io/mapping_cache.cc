#include "io/mapping_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <iterator>
#include <map>
#include <mutex>
#include <system_error>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "io/errno.h"

namespace tessera {

MappedFile::~MappedFile() {
  if (size_ > 0) munmap(data_, static_cast<size_t>(size_));
}

// Waits with the C library's mutexes, as io/thread_cache.h does (absl's
// slow path is not safe to meet in a forked child).
struct MappingCache::State {
  struct Entry {
    std::shared_ptr<const MappedFile> mapping;
    absl::Time used;
  };

  State(absl::Duration keep_for, int64_t max)
      : keep(keep_for), max_bytes(max) {}

  // Drops the entries unused since `now - keep` and, beyond max_bytes, the
  // least recently used; returns them, to be let go outside the lock.
  std::vector<Entry> TakeExpired(absl::Time now) {
    std::vector<Entry> gone;
    for (auto it = entries.begin(); it != entries.end();) {
      if (it->second.used + keep <= now) {
        bytes -= it->second.mapping->size();
        gone.push_back(std::move(it->second));
        it = entries.erase(it);
      } else {
        ++it;
      }
    }
    while (bytes > max_bytes && !entries.empty()) {
      auto oldest = std::min_element(entries.begin(), entries.end(),
                                     [](const auto& a, const auto& b) {
                                       return a.second.used < b.second.used;
                                     });
      bytes -= oldest->second.mapping->size();
      gone.push_back(std::move(oldest->second));
      entries.erase(oldest);
    }
    return gone;
  }

  const absl::Duration keep;
  const int64_t max_bytes;
  std::mutex mu;
  std::condition_variable wake;
  // By device, inode and whether the mapping is writable.
  std::map<std::tuple<dev_t, ino_t, bool>, Entry> entries;
  int64_t bytes = 0;
  bool reaping = false;  // A helper thread expires the entries.
  bool stopped = false;  // The cache is gone.
};

void MappingCache::Reap(std::shared_ptr<State> state) {
  std::unique_lock<std::mutex> lock(state->mu);
  while (!state->stopped) {
    std::vector<State::Entry> gone = state->TakeExpired(absl::Now());
    if (!gone.empty()) {
      lock.unlock();
      gone.clear();  // munmap outside the lock.
      lock.lock();
      continue;
    }
    if (state->entries.empty()) break;
    absl::Time next = absl::InfiniteFuture();
    for (const auto& [key, entry] : state->entries) {
      next = std::min(next, entry.used + state->keep);
    }
    state->wake.wait_until(lock, absl::ToChronoTime(next));
  }
  state->reaping = false;
}

MappingCache::MappingCache(absl::Duration keep, int64_t max_bytes)
    : state_(std::make_shared<State>(keep, max_bytes)), pid_(getpid()) {}

MappingCache::~MappingCache() {
  if (getpid() != pid_) {
    // A forked child: the parent's helper may have held the lock at the
    // fork, and the mappings were not inherited (their addresses may hold
    // the child's own since). Left alone.
    new std::shared_ptr<State>(std::move(state_));
    return;
  }
  std::vector<State::Entry> gone;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stopped = true;
    for (auto& [key, entry] : state_->entries) gone.push_back(std::move(entry));
    state_->entries.clear();
    state_->bytes = 0;
  }
  state_->wake.notify_all();
}

absl::StatusOr<std::shared_ptr<const MappedFile>> MappingCache::Map(
    int fd, int64_t min_bytes, bool* fresh, Access access) {
  if (fresh != nullptr) *fresh = false;
  struct stat info;
  if (fstat(fd, &info) != 0) {
    return ErrnoError(errno, "fstat of a memory file to map",
                      absl::StatusCode::kUnavailable);
  }
  return Map(fd, info, min_bytes, fresh, access);
}

absl::StatusOr<std::shared_ptr<const MappedFile>> MappingCache::Map(
    int fd, const struct stat& info, int64_t min_bytes, bool* fresh,
    Access access) {
  if (fresh != nullptr) *fresh = false;
  if (info.st_size < min_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory file of ", info.st_size,
                     " bytes is shorter than the ", min_bytes, " to map"));
  }
  const bool writable = access == Access::kWrite;
  if (writable) {
    // A kept writable mapping would otherwise outlive the right to it.
    const int flags = fcntl(fd, F_GETFL);
    if (flags < 0) {
      return ErrnoError(errno, "fcntl of a memory file to map",
                        absl::StatusCode::kUnavailable);
    }
    if ((flags & O_ACCMODE) != O_RDWR) {
      return absl::PermissionDeniedError(
          "a memory file lent read-only cannot be mapped for writing");
    }
  }
  const std::tuple<dev_t, ino_t, bool> key(info.st_dev, info.st_ino, writable);
  const bool keepable = getpid() == pid_;
  if (keepable) {
    std::lock_guard<std::mutex> lock(state_->mu);
    auto it = state_->entries.find(key);
    if (it != state_->entries.end() &&
        it->second.mapping->size() >= min_bytes) {
      it->second.used = absl::Now();
      return it->second.mapping;
    }
  }
  if (fresh != nullptr) *fresh = true;
  const int64_t size = info.st_size;
  if (size == 0) {
    return std::make_shared<const MappedFile>(nullptr, 0, writable);
  }
  void* data =
      mmap(nullptr, static_cast<size_t>(size),
           writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    return ErrnoError(errno, absl::StrCat("mmap of ", size, " bytes"),
                      absl::StatusCode::kUnavailable);
  }
  // A child forked later gets none of it (its range may be reused there).
  (void)madvise(data, static_cast<size_t>(size), MADV_DONTFORK);
  auto mapping = std::make_shared<const MappedFile>(static_cast<char*>(data),
                                                    size, writable);
  if (!keepable) return mapping;
  std::vector<State::Entry> gone;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (state_->stopped) return mapping;
    State::Entry& entry = state_->entries[key];
    if (entry.mapping != nullptr) {
      state_->bytes -= entry.mapping->size();
      gone.push_back(std::move(entry));
    }
    entry = State::Entry{mapping, absl::Now()};
    state_->bytes += size;
    std::vector<State::Entry> over = state_->TakeExpired(absl::Now());
    std::move(over.begin(), over.end(), std::back_inserter(gone));
    if (!state_->reaping && !state_->entries.empty()) {
      try {
        std::thread(Reap, state_).detach();
        state_->reaping = true;
      } catch (const std::system_error&) {
        // No helper: nothing may be kept (it would never expire).
        for (auto& [k, e] : state_->entries) gone.push_back(std::move(e));
        state_->entries.clear();
        state_->bytes = 0;
      }
    }
  }
  return mapping;
}

size_t MappingCache::kept() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->entries.size();
}

int64_t MappingCache::kept_bytes() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->bytes;
}

}  // namespace tessera
