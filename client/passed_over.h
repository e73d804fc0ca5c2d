// PassedOver: the holders one operation gave up on. A read of many pieces
// (a read plan's run, a tensor's read) asks each piece of a replicated
// shard of its owner first (FetchFromHolders, client/cluster.h); when the
// owner is stalled, each of those tries waits the holder patience before
// the replica is asked, so a run with hundreds of pieces on a stalled
// owner would pay that patience hundreds of times over (parallelism
// pieces at once). The pieces of one operation share a PassedOver: once a
// holder was passed over (stalled, gone, or without the shard), the
// operation's later pieces skip it when another holder is left, so a
// stalled owner costs one patience per operation. A new operation starts
// with none (the owner may be back).
//
//   PassedOver passed_over;
//   for each piece: FetchFromHolders(..., &passed_over);
//
// Thread-safety: every method may be called from any thread.
#ifndef TESSERA_CLIENT_PASSED_OVER_H_
#define TESSERA_CLIENT_PASSED_OVER_H_

#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"

namespace tessera::internal_client {

class PassedOver {
 public:
  // Records that `rank` was given up on for another holder.
  void Add(int rank) {
    absl::MutexLock lock(&mu_);
    ranks_.insert(rank);
  }
  // Whether `rank` was given up on during this operation.
  bool Contains(int rank) const {
    absl::MutexLock lock(&mu_);
    return ranks_.contains(rank);
  }

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_set<int> ranks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::internal_client

#endif  // TESSERA_CLIENT_PASSED_OVER_H_
