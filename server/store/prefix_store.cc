#include "server/store/prefix_store.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/status_macros.h"

namespace tessera {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> base)
    : prefix_(std::move(prefix)),
      key_prefix_(absl::StrCat(prefix_, "/")),
      base_(std::move(base)) {
  set_timeout(base_->timeout());
}

absl::Status PrefixStore::Set(absl::string_view key, absl::string_view value) {
  ASSIGN_OR_RETURN(std::string full_key, Key(key));
  return Unprefixed(base_->Set(full_key, value));
}

absl::StatusOr<std::string> PrefixStore::Get(absl::string_view key,
                                             absl::Duration timeout) {
  ASSIGN_OR_RETURN(std::string full_key, Key(key));
  return Unprefixed(base_->Get(full_key, timeout));
}

absl::StatusOr<int64_t> PrefixStore::Add(absl::string_view key, int64_t delta) {
  ASSIGN_OR_RETURN(std::string full_key, Key(key));
  return Unprefixed(base_->Add(full_key, delta));
}

absl::StatusOr<std::string> PrefixStore::CompareSet(absl::string_view key,
                                                    absl::string_view expected,
                                                    absl::string_view desired) {
  ASSIGN_OR_RETURN(std::string full_key, Key(key));
  return Unprefixed(base_->CompareSet(full_key, expected, desired));
}

absl::StatusOr<bool> PrefixStore::Delete(absl::string_view key) {
  ASSIGN_OR_RETURN(std::string full_key, Key(key));
  return Unprefixed(base_->Delete(full_key));
}

absl::Status PrefixStore::Wait(absl::Span<const std::string> keys,
                               absl::Duration timeout) {
  ASSIGN_OR_RETURN(std::vector<std::string> full_keys, Keys(keys));
  return Unprefixed(base_->Wait(full_keys, timeout));
}

absl::StatusOr<bool> PrefixStore::Check(absl::Span<const std::string> keys) {
  ASSIGN_OR_RETURN(std::vector<std::string> full_keys, Keys(keys));
  return Unprefixed(base_->Check(full_keys));
}

absl::StatusOr<std::string> PrefixStore::Key(absl::string_view key) const {
  RETURN_IF_ERROR(ValidateStoreKey(key));
  return absl::StrCat(key_prefix_, key);
}

absl::StatusOr<std::vector<std::string>> PrefixStore::Keys(
    absl::Span<const std::string> keys) const {
  std::vector<std::string> full_keys;
  full_keys.reserve(keys.size());
  for (const std::string& key : keys) {
    ASSIGN_OR_RETURN(full_keys.emplace_back(), Key(key));
  }
  return full_keys;
}

absl::Status PrefixStore::Unprefixed(const absl::Status& status) const {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrReplaceAll(status.message(),
                                                         {{key_prefix_, ""}}));
}

absl::StatusOr<int64_t> PrefixStore::SetLive(absl::string_view key,
                                             absl::string_view value,
                                             absl::Duration ttl) {
  ASSIGN_OR_RETURN(std::string full, Key(key));
  return Unprefixed(base_->SetLive(full, value, ttl));
}

absl::Status PrefixStore::Renew(int64_t lease) { return base_->Renew(lease); }

}  // namespace tessera
