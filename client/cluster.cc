#include "client/cluster.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/stall_watchdog.h"
#include "wire/replicas.h"

namespace tessera::internal_client {

absl::Status FetchFromHolders(const Cluster& cluster,
                              const v1::TensorInfo& info, const std::string& id,
                              size_t shard,
                              absl::Span<const int64_t> offsets_in_shard,
                              const Tensor& view, FetchOptions fetch,
                              absl::Time deadline, absl::string_view what,
                              PassedOver* passed_over) {
  // The owner first; when it is dead, stalled or not yet refilled after a
  // restart, each replica in turn. A try that moves nothing for the
  // patience is given up for the next holder (a stalled owner costs that,
  // not the deadline); without a patience, each try gets an even share of
  // the time left, so that a stalled owner leaves time for the others.
  const std::vector<int> holders = HoldersOf(info, static_cast<int>(shard));
  const absl::Duration patience = cluster.options().holder_patience;
  absl::Status status;
  bool reconnected = false;
  for (size_t k = 0; k < holders.size(); ++k) {
    // One this operation gave up on already, while another is left.
    if (passed_over != nullptr && k + 1 < holders.size() &&
        passed_over->Contains(holders[k])) {
      continue;
    }
    ASSIGN_OR_RETURN(std::shared_ptr<const Worker> worker,
                     cluster.worker(holders[k]));
    const std::string holder =
        absl::StrCat(k == 0 ? "rank " : "replica rank ", holders[k], " (",
                     worker->address.address(), ")");
    FetchOptions attempt = fetch;
    attempt.local_min_bytes = cluster.options().local_min_bytes;
    attempt.shard_bytes = HostShardBytes(info.metadata(), shard);
    const std::string from = k == 0 ? id : ReplicaTensorId(id);
    const auto fetch_from = [&](const FetchOptions& options) {
      return worker->shards->FetchRegionInto(from, static_cast<int64_t>(shard),
                                             offsets_in_shard, view, options);
    };
    // The last holder, and every one without a patience, is unwatched.
    const absl::Duration watch =
        k + 1 < holders.size() ? patience : absl::ZeroDuration();
    attempt.timeout = watch > absl::ZeroDuration()
                          ? deadline - absl::Now()
                          : (deadline - absl::Now()) /
                                static_cast<int64_t>(holders.size() - k);
    status = FetchWatched(attempt, watch, fetch_from);
    status = Annotate(status, absl::StrCat(what, " from ", holder));
    if (status.ok() ||
        !(absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status) ||
          absl::IsNotFound(status))) {
      return status;
    }
    // A holder that restarted elsewhere is asked again where it is now.
    if (absl::IsUnavailable(status) && !reconnected &&
        cluster.Reconnect(holders[k], worker)) {
      reconnected = true;
      --k;
    } else if (passed_over != nullptr && k + 1 < holders.size()) {
      passed_over->Add(holders[k]);
    }
  }
  return status;
}

}  // namespace tessera::internal_client
