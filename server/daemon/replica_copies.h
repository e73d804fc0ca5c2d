// ReplicaCopies: this daemon's copies of other daemons' shards of one
// tensor (TensorInfo.replicas, wire/replicas.h), served under
// ReplicaTensorId(tensor id) from construction until destruction, with
// their share of the memory budget.
//
// Ownership: the tensor table's entry holds it; a fetch in flight keeps the
// copies' memory alive through the registry's shared_ptr, and fetches that
// start after destruction get NOT_FOUND. Thread-safety: immutable once
// registered.
#ifndef TESSERA_SERVER_DAEMON_REPLICA_COPIES_H_
#define TESSERA_SERVER_DAEMON_REPLICA_COPIES_H_

#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "server/daemon/memory_budget.h"
#include "server/rank/rank.h"
#include "server/serve/shard_registry.h"

namespace tessera::control_internal {

class ReplicaCopies {
 public:
  // Registers `copies` with the rank's registry. ALREADY_EXISTS /
  // INVALID_ARGUMENT as ShardRegistry::Register.
  static absl::StatusOr<std::shared_ptr<ReplicaCopies>> Register(
      std::shared_ptr<Rank> rank, const std::string& tensor_id,
      std::shared_ptr<RegisteredTensor> copies, MemoryBudget::Reservation held);
  // Unregisters them.
  ~ReplicaCopies();
  ReplicaCopies(const ReplicaCopies&) = delete;
  ReplicaCopies& operator=(const ReplicaCopies&) = delete;

 private:
  ReplicaCopies(std::shared_ptr<Rank> rank, std::string id,
                MemoryBudget::Reservation held)
      : rank_(std::move(rank)), id_(std::move(id)), held_(std::move(held)) {}

  const std::shared_ptr<Rank> rank_;
  const std::string id_;
  MemoryBudget::Reservation held_;
};

}  // namespace tessera::control_internal

#endif  // TESSERA_SERVER_DAEMON_REPLICA_COPIES_H_
