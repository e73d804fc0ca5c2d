// PrefixStore: scopes the keys of a base Store under "<prefix>/" (c10d's
// PrefixStore), so that process groups, or tests, sharing one store cannot
// see each other's keys.
//
// Errors of the base that name keys (timeouts, non-integer Adds) are
// rewritten to name them as the caller knows them, without the prefix.
//
// Ownership: shares the base with whoever else holds it. Thread-safety: as
// the base; PrefixStore itself holds no mutable state. The timeout of the
// overloads without one starts as the base's.
#ifndef TESSERA_SERVER_STORE_PREFIX_STORE_H_
#define TESSERA_SERVER_STORE_PREFIX_STORE_H_

#include <memory>
#include <string>
#include <vector>

#include "server/store/store.h"

namespace tessera {

class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base);

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
  absl::StatusOr<int64_t> SetLive(absl::string_view key,
                                  absl::string_view value,
                                  absl::Duration ttl) override;
  absl::Status Renew(int64_t lease) override;

  const std::string& prefix() const { return prefix_; }
  const std::shared_ptr<Store>& base() const { return base_; }

 private:
  // The base's key for `key`; INVALID_ARGUMENT for an empty key, which
  // would otherwise become the real key "<prefix>/".
  absl::StatusOr<std::string> Key(absl::string_view key) const;
  absl::StatusOr<std::vector<std::string>> Keys(
      absl::Span<const std::string> keys) const;
  // `status` with the base's keys in its message named as the caller's.
  absl::Status Unprefixed(const absl::Status& status) const;
  template <typename T>
  absl::StatusOr<T> Unprefixed(absl::StatusOr<T> result) const {
    if (result.ok()) return result;
    return Unprefixed(result.status());
  }

  const std::string prefix_;
  const std::string key_prefix_;  // prefix_ + "/"
  const std::shared_ptr<Store> base_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_STORE_PREFIX_STORE_H_
