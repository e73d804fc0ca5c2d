#include "server/store/store.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace tessera {

absl::Status StoreTimeoutError(absl::Duration timeout,
                               absl::Span<const std::string> missing_keys) {
  return absl::DeadlineExceededError(absl::StrCat(
      "store wait timed out after ", absl::FormatDuration(timeout),
      "; missing keys: [", absl::StrJoin(missing_keys, ", "), "]"));
}

absl::Status ValidateStoreKey(absl::string_view key) {
  if (key.empty()) {
    return absl::InvalidArgumentError("store key must not be empty");
  }
  return absl::OkStatus();
}

absl::Status ValidateStoreWait(absl::Span<const std::string> keys,
                               absl::Duration timeout) {
  for (const std::string& key : keys) RETURN_IF_ERROR(ValidateStoreKey(key));
  if (timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("store timeout must not be negative, got ",
                     absl::FormatDuration(timeout)));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> StoreAddResult(absl::string_view key,
                                       const std::string* current,
                                       int64_t delta) {
  int64_t value = 0;
  if (current != nullptr && !absl::SimpleAtoi(*current, &value)) {
    return absl::FailedPreconditionError(
        absl::StrCat("store key '", key, "' holds '", *current,
                     "', not a decimal integer; Add needs one"));
  }
  int64_t sum = 0;
  if (__builtin_add_overflow(value, delta, &sum)) {
    return absl::OutOfRangeError(absl::StrCat(
        "store key '", key, "': ", value, " + ", delta, " overflows int64"));
  }
  return sum;
}

CompareSetOutcome StoreCompareSetResult(const std::string* current,
                                        absl::string_view expected,
                                        absl::string_view desired) {
  const bool matches =
      current == nullptr ? expected.empty() : *current == expected;
  if (matches) return {std::string(desired), true};
  // c10d answers `expected` for an absent key; callers learn whether they
  // won by comparing the answer with `desired`, which stays meaningful.
  return {current == nullptr ? std::string(expected) : *current, false};
}

absl::StatusOr<int64_t> Store::SetLive(absl::string_view key,
                                       absl::string_view value,
                                       absl::Duration ttl) {
  return absl::UnimplementedError("this store has no leases");
}

absl::Status Store::Renew(int64_t lease) {
  return absl::UnimplementedError("this store has no leases");
}

}  // namespace tessera
