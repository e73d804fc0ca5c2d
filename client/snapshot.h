// Snapshot: pinned versions of versioned tensors (docs/versions.md), from
// Client::Pin.
//
// Thread-safety: safe to use from many threads at once. A snapshot not
// released ends with its lease (pins are leases: a dead reader's pin
// expires); a renewed one (Client::Pin's default) is renewed until the
// last copy of it goes.
#ifndef TESSERA_CLIENT_SNAPSHOT_H_
#define TESSERA_CLIENT_SNAPSHOT_H_

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

// Pinned versions (Client::Pin): each view(name) reads its pinned
// version until Release() or the lease ends. Cheap to copy.
class Snapshot {
 public:
  // The pin's id.
  const std::string& id() const { return group_.id(); }
  const v1::VersionGroup& group() const { return group_; }
  // The version pinned for `name` (0 when it is not in the snapshot).
  int64_t version(const std::string& name) const;
  absl::StatusOr<ShardedTensorView> view(const std::string& name) const;
  // Saves the pinned versions of every tensor of the snapshot into a
  // checkpoint at `path` (as Client::Save): one consistent state of them,
  // whatever was published since.
  absl::StatusOr<std::vector<std::string>> Save(const std::string& path,
                                                bool overwrite = false) const;
  // Ends the pin (the versions it alone kept are freed) and its renewal.
  absl::Status Release() const;

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

#endif  // TESSERA_CLIENT_SNAPSHOT_H_
