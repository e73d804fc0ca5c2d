#include "server/daemon/replica_copies.h"

#include "common/status_macros.h"
#include "wire/replicas.h"

namespace tessera::control_internal {

absl::StatusOr<std::shared_ptr<ReplicaCopies>> ReplicaCopies::Register(
    std::shared_ptr<Rank> rank, const std::string& tensor_id,
    std::shared_ptr<RegisteredTensor> copies, MemoryBudget::Reservation held) {
  std::string id = ReplicaTensorId(tensor_id);
  RETURN_IF_ERROR(rank->registry().Register(id, std::move(copies)));
  return std::shared_ptr<ReplicaCopies>(
      new ReplicaCopies(std::move(rank), std::move(id), std::move(held)));
}

// A fetch in flight keeps the copies alive (the registry hands out
// shared_ptrs); new fetches get NOT_FOUND.
ReplicaCopies::~ReplicaCopies() { rank_->registry().Unregister(id_); }

}  // namespace tessera::control_internal
