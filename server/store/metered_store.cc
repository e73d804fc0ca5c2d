#include "server/store/metered_store.h"

#include <utility>

#include "absl/time/clock.h"
#include "server/metrics/metrics.h"

namespace tessera {
namespace {

absl::Status StatusOf(const absl::Status& status) { return status; }
template <typename T>
absl::Status StatusOf(const absl::StatusOr<T>& result) {
  return result.status();
}

// Runs `call`, counting it as the store operation `op`. A wait that ends
// at its timeout is an answer ("not yet"), not a failure: the daemons poll
// the log that way while it is idle. So is UNIMPLEMENTED from a store
// without leases (SetLive): callers fall back.
template <typename Call>
auto Metered(const char* op, Call call) {
  const absl::Time started = absl::Now();
  auto result = call();
  const absl::Status& status = StatusOf(result);
  CountStoreOp(op,
               status.ok() || absl::IsDeadlineExceeded(status) ||
                   absl::IsUnimplemented(status),
               absl::Now() - started);
  return result;
}

}  // namespace

MeteredStore::MeteredStore(std::shared_ptr<Store> base)
    : base_(std::move(base)) {
  set_timeout(base_->timeout());
}

absl::Status MeteredStore::Set(absl::string_view key, absl::string_view value) {
  return Metered("set", [&] { return base_->Set(key, value); });
}

absl::StatusOr<std::string> MeteredStore::Get(absl::string_view key,
                                              absl::Duration timeout) {
  return Metered("get", [&] { return base_->Get(key, timeout); });
}

absl::StatusOr<int64_t> MeteredStore::Add(absl::string_view key,
                                          int64_t delta) {
  return Metered("add", [&] { return base_->Add(key, delta); });
}

absl::StatusOr<std::string> MeteredStore::CompareSet(
    absl::string_view key, absl::string_view expected,
    absl::string_view desired) {
  return Metered("compare_set",
                 [&] { return base_->CompareSet(key, expected, desired); });
}

absl::StatusOr<bool> MeteredStore::Delete(absl::string_view key) {
  return Metered("delete", [&] { return base_->Delete(key); });
}

absl::Status MeteredStore::Wait(absl::Span<const std::string> keys,
                                absl::Duration timeout) {
  return Metered("wait", [&] { return base_->Wait(keys, timeout); });
}

absl::StatusOr<bool> MeteredStore::Check(absl::Span<const std::string> keys) {
  return Metered("check", [&] { return base_->Check(keys); });
}

absl::StatusOr<int64_t> MeteredStore::SetLive(absl::string_view key,
                                              absl::string_view value,
                                              absl::Duration ttl) {
  return Metered("set_live", [&] { return base_->SetLive(key, value, ttl); });
}

absl::Status MeteredStore::Renew(int64_t lease) {
  return Metered("renew", [&] { return base_->Renew(lease); });
}

}  // namespace tessera
