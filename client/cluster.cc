#include "client/cluster.h"

#include <utility>

#include "wire/replicas.h"

namespace tessera::internal_client {

absl::Status FetchFromHolders(const Cluster& cluster,
                              const v1::TensorInfo& info, const std::string& id,
                              size_t shard,
                              absl::Span<const int64_t> offsets_in_shard,
                              const Tensor& view, FetchOptions fetch,
                              absl::Time deadline, absl::string_view what) {
  // The owner first; when it is dead, stalled or not yet refilled after a
  // restart, each replica in turn. With replicas, each try gets an even
  // share of the time left, so that a stalled owner leaves time for the
  // others.
  const std::vector<int> holders = HoldersOf(info, static_cast<int>(shard));
  absl::Status status;
  bool reconnected = false;
  for (size_t k = 0; k < holders.size(); ++k) {
    ASSIGN_OR_RETURN(std::shared_ptr<const Worker> worker,
                     cluster.worker(holders[k]));
    fetch.local_min_bytes = cluster.options().local_min_bytes;
    fetch.timeout =
        (deadline - absl::Now()) / static_cast<int64_t>(holders.size() - k);
    const std::string from = k == 0 ? id : ReplicaTensorId(id);
    status = Annotate(
        worker->shards->FetchRegionInto(from, static_cast<int64_t>(shard),
                                        offsets_in_shard, view, fetch),
        absl::StrCat(what, " from ", k == 0 ? "rank " : "replica rank ",
                     holders[k], " (", worker->address.address(), ")"));
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
    }
  }
  return status;
}

}  // namespace tessera::internal_client
