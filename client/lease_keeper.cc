#include "client/lease_keeper.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/time/clock.h"
#include "client/cluster.h"
#include "wire/call_deadline.h"

namespace tessera::internal_client {

void LeaseKeeper::Lease::End() {
  if (std::shared_ptr<LeaseKeeper> keeper = keeper_.lock()) keeper->End(id_);
}

LeaseKeeper::~LeaseKeeper() { Stop(); }

std::shared_ptr<LeaseKeeper::Lease> LeaseKeeper::Keep(
    std::vector<v1::VersionHandle> versions, std::string pin,
    absl::Duration every) {
  absl::MutexLock lock(&mu_);
  const int64_t id = next_id_++;
  if (!stopping_ && (!versions.empty() || !pin.empty())) {
    every = std::max(every, absl::Milliseconds(50));
    entries_[id] =
        Entry{std::move(versions), std::move(pin), every, absl::Now() + every};
    ++changes_;
    if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
  }
  return std::make_shared<Lease>(weak_from_this(), id);
}

void LeaseKeeper::End(int64_t id) {
  absl::MutexLock lock(&mu_);
  if (entries_.erase(id) > 0) ++changes_;
}

void LeaseKeeper::Stop() {
  std::thread thread;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    entries_.clear();
    for (grpc::ClientContext* context : in_flight_) context->TryCancel();
    thread = std::move(thread_);
  }
  if (thread.joinable()) thread.join();
}

int LeaseKeeper::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(entries_.size());
}

void LeaseKeeper::Loop() {
  while (true) {
    std::vector<int64_t> ids;
    v1::RenewLeasesRequest request;
    absl::Duration shortest = absl::InfiniteDuration();
    {
      absl::MutexLock lock(&mu_);
      // Wait for the first entry due, a change, or Stop.
      while (!stopping_) {
        absl::Time due = absl::InfiniteFuture();
        for (const auto& [id, entry] : entries_) due = std::min(due, entry.due);
        if (due <= absl::Now()) break;
        const int64_t seen = changes_;
        const auto changed = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stopping_ || changes_ != seen;
        };
        mu_.AwaitWithDeadline(absl::Condition(&changed), due);
      }
      if (stopping_) return;
      const absl::Time now = absl::Now();
      for (auto& [id, entry] : entries_) {
        if (entry.due > now) continue;
        ids.push_back(id);
        for (const v1::VersionHandle& handle : entry.versions) {
          *request.add_versions() = handle;
        }
        if (!entry.pin.empty()) request.add_pins(entry.pin);
        shortest = std::min(shortest, entry.every);
        entry.due = now + entry.every;
      }
    }
    // Half a period: a stalled daemon delays the next round by no more.
    Round(ids, request,
          std::clamp(shortest / 2, absl::Milliseconds(100), call_timeout_));
  }
}

void LeaseKeeper::Round(const std::vector<int64_t>& ids,
                        const v1::RenewLeasesRequest& request,
                        absl::Duration deadline) {
  struct Call {
    grpc::ClientContext context;
    v1::RenewLeasesResponse response;
    grpc::Status status;
  };
  const std::vector<std::shared_ptr<const Worker>> daemons = daemons_();
  std::vector<Call> calls(daemons.size());
  absl::BlockingCounter pending(static_cast<int>(daemons.size()));
  const absl::Time until = absl::Now() + deadline;
  {
    absl::MutexLock lock(&mu_);
    for (Call& call : calls) in_flight_.push_back(&call.context);
    if (stopping_) {
      for (Call& call : calls) call.context.TryCancel();
    }
  }
  for (size_t i = 0; i < daemons.size(); ++i) {
    Call& call = calls[i];
    SetCallDeadline(call.context, until);
    daemons[i]->control->async()->RenewLeases(
        &call.context, &request, &call.response,
        [&call, &pending](grpc::Status status) {
          call.status = std::move(status);
          pending.DecrementCount();
        });
  }
  pending.Wait();
  {
    absl::MutexLock lock(&mu_);
    in_flight_.clear();
  }
  // What any daemon no longer holds is renewed no more: it was published,
  // aborted or released, or its lease ended there (a publish naming it
  // then fails).
  absl::flat_hash_set<std::string> gone_versions;
  absl::flat_hash_set<std::string> gone_pins;
  for (const Call& call : calls) {
    if (!call.status.ok()) continue;
    for (const v1::VersionHandle& handle : call.response.gone()) {
      gone_versions.insert(absl::StrCat(handle.name(), "@", handle.number()));
    }
    gone_pins.insert(call.response.gone_pins().begin(),
                     call.response.gone_pins().end());
  }
  if (gone_versions.empty() && gone_pins.empty()) return;
  absl::MutexLock lock(&mu_);
  for (const int64_t id : ids) {
    auto it = entries_.find(id);
    if (it == entries_.end()) continue;
    Entry& entry = it->second;
    entry.versions.erase(
        std::remove_if(entry.versions.begin(), entry.versions.end(),
                       [&](const v1::VersionHandle& handle) {
                         return gone_versions.contains(
                             absl::StrCat(handle.name(), "@", handle.number()));
                       }),
        entry.versions.end());
    if (gone_pins.contains(entry.pin)) entry.pin.clear();
    if (entry.versions.empty() && entry.pin.empty()) entries_.erase(it);
  }
}

}  // namespace tessera::internal_client
