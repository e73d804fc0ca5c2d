// RemoteShard: a shard owned by another rank (PyTorch's RRef[Shard]).
//
// Creating one costs nothing on the wire: it is the shard's metadata, the
// owner's identity and a client for the owner's shard server. to_here()
// fetches the bytes over gRPC.
//
// Thread-safety: const methods may be called concurrently.
#ifndef TESSERA_CLIENT_REMOTE_SHARD_H_
#define TESSERA_CLIENT_REMOTE_SHARD_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "client/shard_client.h"
#include "common/shard_metadata.h"

namespace tessera {

// rpc.WorkerInfo: a rank's worker name, its RPC id (its rank) and where
// its shard server listens.
struct WorkerInfo {
  std::string name;
  int id = -1;
  std::string address;
  // Its raw-TCP data plane ("" when it serves shards over gRPC only).
  std::string data_plane_address;
  // Its local path, "<host id>/<socket name>" ("" when it has
  // none); see client/local_path.h.
  std::string local_address;
};

class RemoteShard {
 public:
  // `published`: the version `tensor_id` names (a VersionId) must be a
  // published one (a view at a version; not a writer's open version).
  RemoteShard(WorkerInfo owner, std::string tensor_id, int64_t shard_index,
              ShardMetadata metadata, std::shared_ptr<ShardClient> client,
              int64_t published = 0);

  const WorkerInfo& owner() const { return owner_; }
  const ShardMetadata& metadata() const { return metadata_; }
  const std::string& tensor_id() const { return tensor_id_; }
  int64_t shard_index() const { return shard_index_; }

  // Fetches the shard (tensor + metadata) from its owner. Errors as
  // ShardClient::FetchShard; NOT_FOUND once the owner freed the tensor;
  // FAILED_PRECONDITION for a version that the owner has not published
  // within a second (it is open there, or aborted).
  absl::StatusOr<Shard> to_here(const FetchOptions& options = {}) const;

 private:
  WorkerInfo owner_;
  std::string tensor_id_;
  int64_t shard_index_;
  ShardMetadata metadata_;
  std::shared_ptr<ShardClient> client_;
  int64_t published_ = 0;
};

}  // namespace tessera

#endif  // TESSERA_CLIENT_REMOTE_SHARD_H_
