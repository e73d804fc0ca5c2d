// Replicas of shards (CreateTensorRequest.replicas, TensorInfo.replicas):
// where copies go, how they are named, and which daemons hold a shard.
// Both ends use these: the daemons to place, fill, write and refill the
// copies, the client to write every copy and to read from a replica when
// an owner is dead or stalled.
//
// Thread-safety: pure functions.
#ifndef TESSERA_WIRE_REPLICAS_H_
#define TESSERA_WIRE_REPLICAS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "tessera/v1/control.pb.h"

namespace tessera {

// The id under which a daemon's ShardRegistry serves its replicas of the
// tensor with id `tensor_id` ("0/7" -> "0/7/replicas"). Tensor ids end in
// their number, so the two never meet. The copies of version n of a
// versioned tensor (wire/version_id.h) are version n of its replicas' id
// ("0/7@3" -> "0/7/replicas@3"), so that a daemon's registry maps the
// replicas' id to their latest published version as it does the tensor's;
// a read of at least version n likewise ("0/7@>=3" -> "0/7/replicas@>=3").
std::string ReplicaTensorId(absl::string_view tensor_id);

// The R - 1 daemons that hold a copy of each shard besides its owner
// (`owners[i]`, a rank in [0, hosts.size())), for `replicas` = R copies in
// all. `hosts[r]` names rank r's host (any string; daemons with the same
// one share a host). For each shard, the ranks on other hosts than the
// owner's come first, then the owner's host; within each, by distance
// after the owner (owner + 1, owner + 2, ... modulo the world), so that the
// copies of one owner's shards spread evenly. INVALID_ARGUMENT when R < 1
// or R exceeds the daemons. Deterministic: every daemon computes the same.
absl::StatusOr<std::vector<std::vector<int>>> PlaceReplicas(
    absl::Span<const int> owners, int replicas,
    absl::Span<const std::string> hosts);

// Every daemon that holds shard `shard` of `info`: its owner first, then
// its replicas in order.
std::vector<int> HoldersOf(const v1::TensorInfo& info, int shard);

// The number of copies of each shard of `info` (1 without replicas).
int CopiesOf(const v1::TensorInfo& info);

}  // namespace tessera

#endif  // TESSERA_WIRE_REPLICAS_H_
