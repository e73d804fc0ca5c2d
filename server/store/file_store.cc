#include "server/store/file_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "io/errno.h"
#include "io/file.h"

namespace tessera {
namespace {

// Record layout: op byte, key length and value length (native uint32, the
// file never leaves the host), key bytes, value bytes.
constexpr char kSetOp = 'S';
constexpr char kDeleteOp = 'D';
constexpr size_t kHeaderSize = 1 + 2 * sizeof(uint32_t);

struct Record {
  absl::string_view key;
  std::optional<absl::string_view> value;  // nullopt: deleted
  size_t size = 0;
};

enum class Parse { kRecord, kIncomplete, kCorrupt };

uint32_t LoadU32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

void AppendU32(uint32_t v, std::string* out) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(v));
}

std::string EncodeRecord(absl::string_view key,
                         std::optional<absl::string_view> value) {
  std::string out(1, value.has_value() ? kSetOp : kDeleteOp);
  AppendU32(static_cast<uint32_t>(key.size()), &out);
  AppendU32(static_cast<uint32_t>(value.value_or("").size()), &out);
  absl::StrAppend(&out, key, value.value_or(""));
  return out;
}

// Decodes the record at the start of `bytes`. kIncomplete while a writer is
// mid-append (or died there).
Parse ParseRecord(absl::string_view bytes, Record* record) {
  if (bytes.size() < kHeaderSize) return Parse::kIncomplete;
  const char op = bytes[0];
  if (op != kSetOp && op != kDeleteOp) return Parse::kCorrupt;
  const size_t key_size = LoadU32(bytes.data() + 1);
  const size_t value_size = LoadU32(bytes.data() + 1 + sizeof(uint32_t));
  if (op == kDeleteOp && value_size != 0) return Parse::kCorrupt;
  record->size = kHeaderSize + key_size + value_size;
  if (bytes.size() < record->size) return Parse::kIncomplete;
  record->key = bytes.substr(kHeaderSize, key_size);
  record->value = std::nullopt;
  if (op == kSetOp) {
    record->value = bytes.substr(kHeaderSize + key_size, value_size);
  }
  return Parse::kRecord;
}

absl::Status FileError(absl::string_view path, absl::string_view what,
                       int err) {
  return ErrnoError(err,
                    absl::StrCat("file store ", path, ": ", what, " failed"),
                    absl::StatusCode::kUnavailable);
}

// A read or write of the log failed: UNAVAILABLE, as every store error.
absl::Status LogError(absl::string_view path, const absl::Status& status) {
  return absl::UnavailableError(
      absl::StrCat("file store ", path, ": ", status.message()));
}

// Sleeps 1 ms, then 2, 4, 8, and 10 ms from then on, never past `deadline`.
class Backoff {
 public:
  // False, without sleeping, once `deadline` has passed.
  bool Sleep(absl::Time deadline) {
    const absl::Time now = absl::Now();
    if (now >= deadline) return false;
    absl::SleepFor(std::min(delay_, deadline - now));
    delay_ = std::min(delay_ * 2, absl::Milliseconds(10));
    return true;
  }

 private:
  absl::Duration delay_ = absl::Milliseconds(1);
};

}  // namespace

absl::StatusOr<std::shared_ptr<FileStore>> FileStore::Open(
    const std::string& path) {
  absl::StatusOr<UniqueFd> fd = OpenFile(path, O_RDWR | O_CREAT, 0644);
  if (!fd.ok()) return LogError(path, fd.status());
  return std::shared_ptr<FileStore>(new FileStore(path, *std::move(fd)));
}

FileStore::~FileStore() = default;

absl::Status FileStore::Set(absl::string_view key, absl::string_view value) {
  RETURN_IF_ERROR(ValidateStoreKey(key));
  return WithLog(LockMode::kExclusive, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(
                                           mu_) { return Append(key, value); });
}

absl::StatusOr<std::string> FileStore::Get(absl::string_view key,
                                           absl::Duration timeout) {
  ASSIGN_OR_RETURN(std::vector<std::string> values,
                   WaitForValues({std::string(key)}, timeout));
  return std::move(values.front());
}

absl::StatusOr<int64_t> FileStore::Add(absl::string_view key, int64_t delta) {
  RETURN_IF_ERROR(ValidateStoreKey(key));
  int64_t sum = 0;
  RETURN_IF_ERROR(
      WithLog(LockMode::kExclusive, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        ASSIGN_OR_RETURN(sum, StoreAddResult(key, Find(key), delta));
        return Append(key, absl::StrCat(sum));
      }));
  return sum;
}

absl::StatusOr<std::string> FileStore::CompareSet(absl::string_view key,
                                                  absl::string_view expected,
                                                  absl::string_view desired) {
  RETURN_IF_ERROR(ValidateStoreKey(key));
  CompareSetOutcome outcome;
  RETURN_IF_ERROR(
      WithLog(LockMode::kExclusive, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        outcome = StoreCompareSetResult(Find(key), expected, desired);
        return outcome.write ? Append(key, desired) : absl::OkStatus();
      }));
  return std::move(outcome.value);
}

absl::StatusOr<bool> FileStore::Delete(absl::string_view key) {
  RETURN_IF_ERROR(ValidateStoreKey(key));
  bool existed = false;
  RETURN_IF_ERROR(
      WithLog(LockMode::kExclusive, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        existed = Find(key) != nullptr;
        return existed ? Append(key, std::nullopt) : absl::OkStatus();
      }));
  return existed;
}

absl::Status FileStore::Wait(absl::Span<const std::string> keys,
                             absl::Duration timeout) {
  return WaitForValues(keys, timeout).status();
}

absl::StatusOr<bool> FileStore::Check(absl::Span<const std::string> keys) {
  for (const std::string& key : keys) RETURN_IF_ERROR(ValidateStoreKey(key));
  std::vector<std::string> values, missing;
  RETURN_IF_ERROR(Snapshot(keys, &values, &missing));
  return missing.empty();
}

absl::StatusOr<std::vector<std::string>> FileStore::WaitForValues(
    absl::Span<const std::string> keys, absl::Duration timeout) {
  RETURN_IF_ERROR(ValidateStoreWait(keys, timeout));
  const absl::Time deadline = absl::Now() + timeout;
  Backoff backoff;
  std::vector<std::string> values, missing;
  while (true) {
    RETURN_IF_ERROR(Snapshot(keys, &values, &missing));
    if (missing.empty()) return values;
    if (!backoff.Sleep(deadline)) return StoreTimeoutError(timeout, missing);
  }
}

absl::Status FileStore::Snapshot(absl::Span<const std::string> keys,
                                 std::vector<std::string>* values,
                                 std::vector<std::string>* missing) {
  values->clear();
  missing->clear();
  return WithLog(LockMode::kShared, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const std::string& key : keys) {
      const std::string* value = Find(key);
      if (value == nullptr) missing->push_back(key);
      if (value != nullptr) values->push_back(*value);
    }
    return absl::OkStatus();
  });
}

template <typename Fn>
absl::Status FileStore::WithLog(LockMode mode, Fn fn) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(LockFile(mode));
  absl::Status status = CatchUp(mode);
  if (status.ok()) status = fn();
  if (flock(fd_.get(), LOCK_UN) != 0 && status.ok()) {
    status = FileError(path_, "unlock", errno);
  }
  return status;
}

absl::Status FileStore::LockFile(LockMode mode) {
  const int op = (mode == LockMode::kExclusive ? LOCK_EX : LOCK_SH) | LOCK_NB;
  // Non-blocking and polled, so that a process stopped while holding the
  // lock costs the others a timeout rather than a hang.
  const absl::Time deadline = absl::Now() + timeout();
  Backoff backoff;
  while (flock(fd_.get(), op) != 0) {
    if (errno == EINTR) continue;
    if (errno != EWOULDBLOCK) return FileError(path_, "flock", errno);
    if (!backoff.Sleep(deadline)) {
      return absl::DeadlineExceededError(
          absl::StrCat("file store ", path_, ": could not lock the file in ",
                       absl::FormatDuration(timeout())));
    }
  }
  return absl::OkStatus();
}

absl::Status FileStore::CatchUp(LockMode mode) {
  struct stat st;
  if (fstat(fd_.get(), &st) != 0) return FileError(path_, "fstat", errno);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < replayed_) {
    return absl::InternalError(
        absl::StrCat("file store ", path_, ": the log shrank from ", replayed_,
                     " to ", size, " bytes; was the file replaced?"));
  }
  std::string bytes(size - replayed_, '\0');
  absl::StatusOr<size_t> got = PreadAll(fd_.get(), bytes.data(), bytes.size(),
                                        static_cast<int64_t>(replayed_), path_);
  if (!got.ok()) return LogError(path_, got.status());
  if (*got < bytes.size()) return FileError(path_, "read", EIO);
  absl::string_view rest = bytes;
  Record record;
  Parse parse;
  while ((parse = ParseRecord(rest, &record)) == Parse::kRecord) {
    Apply(record.key, record.value);
    rest.remove_prefix(record.size);
    replayed_ += record.size;
  }
  if (parse == Parse::kCorrupt) {
    return absl::InternalError(absl::StrCat(
        "file store ", path_, ": corrupt record at offset ", replayed_));
  }
  // Writers exclude each other, so a writer that sees a partial record
  // knows its author died mid-append.
  if (!rest.empty() && mode == LockMode::kExclusive &&
      ftruncate(fd_.get(), static_cast<off_t>(replayed_)) != 0) {
    return FileError(path_, "ftruncate", errno);
  }
  return absl::OkStatus();
}

absl::Status FileStore::Append(absl::string_view key,
                               std::optional<absl::string_view> value) {
  const std::string record = EncodeRecord(key, value);
  const absl::Status status = PwriteAll(fd_.get(), record.data(), record.size(),
                                        static_cast<int64_t>(replayed_), path_);
  if (!status.ok()) {
    // Best effort: leave no torn record behind (the next writer would cut
    // it off anyway).
    (void)ftruncate(fd_.get(), static_cast<off_t>(replayed_));
    return LogError(path_, status);
  }
  replayed_ += record.size();
  Apply(key, value);
  return absl::OkStatus();
}

void FileStore::Apply(absl::string_view key,
                      std::optional<absl::string_view> value) {
  if (value.has_value()) {
    values_[key] = std::string(*value);
  } else {
    values_.erase(key);
  }
}

const std::string* FileStore::Find(absl::string_view key) const {
  auto it = values_.find(key);
  return it == values_.end() ? nullptr : &it->second;
}

}  // namespace tessera
