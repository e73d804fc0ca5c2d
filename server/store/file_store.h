// FileStore: a Store shared by the processes of one host through one file
// (PyTorch's FileStore, the file:// init method).
//
// The file is an append-only log of records (set key value | delete key),
// written under an exclusive flock() and read under a shared one. Each
// FileStore replays the records appended since its last read into an
// in-memory map, so a read costs only the new bytes. Add and CompareSet are
// decided on the replayed map while the exclusive lock is held and logged
// as the Set they amount to, which makes them atomic across processes.
// Waits poll the file with a backoff of 1 ms growing to 10 ms.
//
// The log is never compacted: it suits rendezvous traffic (kilobytes), not
// a general key-value workload. A torn record left by a process that died
// mid-append is cut off by the next writer. flock() must be honoured by the
// filesystem (local filesystems; not every NFS mount).
//
// Thread-safety: every method may be called from any thread; threads of one
// process are serialised by a mutex, processes by the file lock. A forked
// child must Open() its own FileStore: flock() locks are shared by
// descriptors inherited across fork(), so they would not exclude each other.
// Failure: filesystem errors are UNAVAILABLE (open, lock, read, write) or
// INTERNAL (a record that does not parse), naming the path and errno text;
// a file lock that cannot be taken within the store's timeout() is
// DEADLINE_EXCEEDED.
#ifndef TESSERA_SERVER_STORE_FILE_STORE_H_
#define TESSERA_SERVER_STORE_FILE_STORE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "io/unique_fd.h"
#include "server/store/store.h"

namespace tessera {

class FileStore : public Store {
 public:
  // Opens the log at `path`, creating an empty one when it is missing.
  static absl::StatusOr<std::shared_ptr<FileStore>> Open(
      const std::string& path);
  ~FileStore() override;

  FileStore(const FileStore&) = delete;
  FileStore& operator=(const FileStore&) = delete;

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key,
                                  absl::Duration timeout) override;
  using Store::Get;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;
  absl::StatusOr<std::string> CompareSet(absl::string_view key,
                                         absl::string_view expected,
                                         absl::string_view desired) override;
  absl::StatusOr<bool> Delete(absl::string_view key) override;
  absl::Status Wait(absl::Span<const std::string> keys,
                    absl::Duration timeout) override;
  using Store::Wait;
  absl::StatusOr<bool> Check(absl::Span<const std::string> keys) override;

  const std::string& path() const { return path_; }

 private:
  enum class LockMode { kShared, kExclusive };

  FileStore(std::string path, UniqueFd fd)
      : path_(std::move(path)), fd_(std::move(fd)) {}

  // Runs `fn` on the map brought up to date with the file, under the file
  // lock; kExclusive when `fn` appends.
  template <typename Fn>
  absl::Status WithLog(LockMode mode, Fn fn) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status LockFile(LockMode mode) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Replays the records appended since the last call. A writer (`mode`
  // kExclusive) also cuts off a torn record at the end.
  absl::Status CatchUp(LockMode mode) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends a record and applies it to the map; nullopt deletes.
  absl::Status Append(absl::string_view key,
                      std::optional<absl::string_view> value)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Apply(absl::string_view key, std::optional<absl::string_view> value)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const std::string* Find(absl::string_view key) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The values of the keys that are set and the keys that are not, as of
  // now.
  absl::Status Snapshot(absl::Span<const std::string> keys,
                        std::vector<std::string>* values,
                        std::vector<std::string>* missing);
  // Polls until every key is set; their values, or DEADLINE_EXCEEDED.
  absl::StatusOr<std::vector<std::string>> WaitForValues(
      absl::Span<const std::string> keys, absl::Duration timeout);

  const std::string path_;
  const UniqueFd fd_;
  absl::Mutex mu_;
  // The length of the log that `values_` reflects.
  uint64_t replayed_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_SERVER_STORE_FILE_STORE_H_
