#include "server/store/hash_store.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/status_macros.h"

namespace tessera {

template <typename Mutate>
auto HashStore::MutateAndNotify(absl::string_view key, Mutate mutate) {
  Ready ready;
  decltype(mutate()) result;
  {
    absl::MutexLock lock(&mu_);
    result = mutate();
    TakeReady(key, &ready);
  }
  for (auto& [on_ready, values] : ready) on_ready(std::move(values));
  return result;
}

absl::Status HashStore::Admit(absl::string_view key, size_t size) const {
  if (static_cast<int64_t>(size) > limits_.max_value_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("store value of \"", key, "\": ", size,
                     " bytes exceeds the limit of ", limits_.max_value_bytes));
  }
  auto it = values_.find(key);
  const int64_t now =
      it == values_.end()
          ? 0
          : static_cast<int64_t>(key.size() + it->second.size());
  const int64_t after =
      total_bytes_ - now + static_cast<int64_t>(key.size() + size);
  if (after > limits_.max_total_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("store is full: setting \"", key, "\" would hold ", after,
                     " bytes, over the limit of ", limits_.max_total_bytes));
  }
  return absl::OkStatus();
}

void HashStore::Put(absl::string_view key, std::string value) {
  auto [it, inserted] = values_.try_emplace(key);
  total_bytes_ += static_cast<int64_t>(value.size()) -
                  (inserted ? -static_cast<int64_t>(key.size())
                            : static_cast<int64_t>(it->second.size()));
  it->second = std::move(value);
}

absl::Status HashStore::Set(absl::string_view key, absl::string_view value) {
  RETURN_IF_ERROR(ValidateStoreKey(key));
  return MutateAndNotify(
      key, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
        RETURN_IF_ERROR(Admit(key, value.size()));
        Put(key, std::string(value));
        return absl::OkStatus();
      });
}

absl::StatusOr<std::string> HashStore::Get(absl::string_view key,
                                           absl::Duration timeout) {
  ASSIGN_OR_RETURN(std::vector<std::string> values,
                   WaitForValues({std::string(key)}, timeout));
  return std::move(values.front());
}

absl::StatusOr<int64_t> HashStore::Add(absl::string_view key, int64_t delta) {
  RETURN_IF_ERROR(ValidateStoreKey(key));
  return MutateAndNotify(
      key, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::StatusOr<int64_t> {
        auto it = values_.find(key);
        ASSIGN_OR_RETURN(
            int64_t sum,
            StoreAddResult(key, it == values_.end() ? nullptr : &it->second,
                           delta));
        std::string text = absl::StrCat(sum);
        RETURN_IF_ERROR(Admit(key, text.size()));
        Put(key, std::move(text));
        return sum;
      });
}

absl::StatusOr<std::string> HashStore::CompareSet(absl::string_view key,
                                                  absl::string_view expected,
                                                  absl::string_view desired) {
  RETURN_IF_ERROR(ValidateStoreKey(key));
  return MutateAndNotify(
      key,
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::StatusOr<std::string> {
        auto it = values_.find(key);
        CompareSetOutcome outcome = StoreCompareSetResult(
            it == values_.end() ? nullptr : &it->second, expected, desired);
        if (outcome.write) {
          RETURN_IF_ERROR(Admit(key, desired.size()));
          Put(key, std::string(desired));
        }
        return std::move(outcome.value);
      });
}

absl::StatusOr<bool> HashStore::Delete(absl::string_view key) {
  RETURN_IF_ERROR(ValidateStoreKey(key));
  absl::MutexLock lock(&mu_);
  auto it = values_.find(key);
  if (it == values_.end()) return false;
  total_bytes_ -= static_cast<int64_t>(key.size() + it->second.size());
  values_.erase(it);
  return true;
}

absl::Status HashStore::Wait(absl::Span<const std::string> keys,
                             absl::Duration timeout) {
  return WaitForValues(keys, timeout).status();
}

absl::StatusOr<bool> HashStore::Check(absl::Span<const std::string> keys) {
  for (const std::string& key : keys) RETURN_IF_ERROR(ValidateStoreKey(key));
  return MissingKeys(keys).empty();
}

HashStore::WatchId HashStore::Watch(std::vector<std::string> keys,
                                    WatchCallback on_ready) {
  std::vector<std::string> values;
  WatchId id;
  {
    absl::MutexLock lock(&mu_);
    id = next_watch_id_++;
    if (!ValuesOf(keys, &values)) {
      for (const std::string& key : keys) watches_of_[key].insert(id);
      watchers_.emplace(id, Watcher{std::move(keys), std::move(on_ready)});
      return id;
    }
  }
  on_ready(std::move(values));
  return id;
}

bool HashStore::Unwatch(WatchId id) {
  // Destroyed after the lock is released: the callback may hold the last
  // reference to objects whose destructors call back into this store.
  Watcher watcher;
  absl::MutexLock lock(&mu_);
  return Forget(id, &watcher);
}

std::vector<std::string> HashStore::MissingKeys(
    absl::Span<const std::string> keys) {
  std::vector<std::string> missing;
  absl::MutexLock lock(&mu_);
  for (const std::string& key : keys) {
    if (!values_.contains(key)) missing.push_back(key);
  }
  return missing;
}

absl::StatusOr<std::vector<std::string>> HashStore::WaitForValues(
    absl::Span<const std::string> keys, absl::Duration timeout) {
  RETURN_IF_ERROR(ValidateStoreWait(keys, timeout));
  struct Result {
    absl::Notification ready;
    std::vector<std::string> values;
  };
  auto result = std::make_shared<Result>();
  const WatchId id = Watch({keys.begin(), keys.end()},
                           [result](std::vector<std::string> values) {
                             result->values = std::move(values);
                             result->ready.Notify();
                           });
  if (!result->ready.WaitForNotificationWithTimeout(timeout) && Unwatch(id)) {
    return StoreTimeoutError(timeout, MissingKeys(keys));
  }
  // Unwatch lost the race: the callback is running and does not block.
  result->ready.WaitForNotification();
  return std::move(result->values);
}

bool HashStore::ValuesOf(absl::Span<const std::string> keys,
                         std::vector<std::string>* values) const {
  values->clear();
  values->reserve(keys.size());
  for (const std::string& key : keys) {
    auto it = values_.find(key);
    if (it == values_.end()) return false;
    values->push_back(it->second);
  }
  return true;
}

void HashStore::TakeReady(absl::string_view key, Ready* ready) {
  auto index = watches_of_.find(key);
  if (index == watches_of_.end()) return;
  const std::vector<WatchId> candidates(index->second.begin(),
                                        index->second.end());
  for (WatchId id : candidates) {
    std::vector<std::string> values;
    if (!ValuesOf(watchers_.at(id).keys, &values)) continue;
    Watcher watcher;
    Forget(id, &watcher);
    ready->emplace_back(std::move(watcher.on_ready), std::move(values));
  }
}

bool HashStore::Forget(WatchId id, Watcher* watcher) {
  auto it = watchers_.find(id);
  if (it == watchers_.end()) return false;
  *watcher = std::move(it->second);
  watchers_.erase(it);
  for (const std::string& key : watcher->keys) {
    auto index = watches_of_.find(key);
    if (index == watches_of_.end()) continue;  // a key listed twice
    index->second.erase(id);
    if (index->second.empty()) watches_of_.erase(index);
  }
  return true;
}

}  // namespace tessera
