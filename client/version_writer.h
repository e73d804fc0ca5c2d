// VersionWriter: open versions of versioned tensors (docs/versions.md),
// from Client::Begin or Client::Join.
//
// Thread-safety: safe to use from many threads at once. Failure: the
// daemons' errors, as Client's logged calls give them (a publish or abort
// is retried under one request id).
#ifndef TESSERA_CLIENT_VERSION_WRITER_H_
#define TESSERA_CLIENT_VERSION_WRITER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/client.h"
#include "client/lease_keeper.h"
#include "tessera/v1/control.pb.h"

namespace tessera {

// Open versions of one or more tensors (Client::Begin or Join): written
// through view(name), then published together or aborted. Cheap to copy;
// safe to use from many threads. Publishing or aborting twice, or from
// two processes, is harmless: the second finds the versions no longer
// open (FAILED_PRECONDITION for a publish, nothing for an abort).
class VersionWriter {
 public:
  // Names the group for Client::Join: "a@5,b@3".
  const std::string& id() const { return group_.id(); }
  const v1::VersionGroup& group() const { return group_; }
  // The view of `name`'s open version (NOT_FOUND for a name not in it).
  absl::StatusOr<ShardedTensorView> view(const std::string& name) const;
  // Makes every version of the group the latest, at once on every daemon.
  // Ends this process's renewal of their lease (BeginOptions::lease) when
  // it is over, however it ended.
  absl::StatusOr<v1::VersionGroup> Publish() const;
  // Drops the versions (their memory is freed), and ends the renewal.
  absl::Status Abort() const;

 private:
  friend class Client;
  std::shared_ptr<internal_client::Cluster> cluster_;
  v1::VersionGroup group_;
  std::vector<ShardedTensorView> views_;
  // Position in views_ (and in group_) by name.
  std::shared_ptr<const absl::flat_hash_map<std::string, size_t>> index_;
  // The renewal of the group's leases (null: not renewed), shared by the
  // copies: renewed until the last one goes or it is ended.
  std::shared_ptr<internal_client::LeaseKeeper::Lease> lease_;
};

}  // namespace tessera

#endif  // TESSERA_CLIENT_VERSION_WRITER_H_
