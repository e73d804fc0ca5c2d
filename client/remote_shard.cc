#include "client/remote_shard.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace tessera {

RemoteShard::RemoteShard(WorkerInfo owner, std::string tensor_id,
                         int64_t shard_index, ShardMetadata metadata,
                         std::shared_ptr<ShardClient> client, int64_t published)
    : owner_(std::move(owner)),
      tensor_id_(std::move(tensor_id)),
      shard_index_(shard_index),
      metadata_(std::move(metadata)),
      client_(std::move(client)),
      published_(published) {}

absl::StatusOr<Shard> RemoteShard::to_here(const FetchOptions& options) const {
  if (client_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("remote shard ", shard_index_, " of tensor ", tensor_id_,
                     " has no client for its owner ", owner_.name));
  }
  // A shard known to be small takes the stream at once: owners do not lend
  // memory that small (kLocalPathMinBytes). The bound holds for every
  // dtype (16 bytes at most).
  FetchOptions fetch = options;
  if (fetch.local_path == LocalPath::kAuto &&
      metadata_.numel() * int64_t{16} < fetch.local_min_bytes) {
    fetch.local_path = LocalPath::kOff;
  }
  int64_t served = 0;
  fetch.served_version = &served;
  ASSIGN_OR_RETURN(Shard shard,
                   client_->FetchShard(tensor_id_, shard_index_, fetch));
  if (published_ > 0) {
    RETURN_IF_ERROR(AwaitPublished(
        absl::Now() + options.timeout,
        absl::StrCat("shard ", shard_index_, " of tensor ", tensor_id_,
                     " from ", owner_.name),
        published_, [&] { return served != published_; },
        [&]() -> absl::Status {
          ASSIGN_OR_RETURN(
              shard, client_->FetchShard(tensor_id_, shard_index_, fetch));
          return absl::OkStatus();
        }));
  }
  if (options.served_version != nullptr) *options.served_version = served;
  // The owner serving different metadata under this id means the ranks
  // disagree about the tensor: a bug, not something a retry would fix.
  if (shard.metadata != metadata_) {
    return absl::InternalError(absl::StrCat(
        "shard ", shard_index_, " of tensor ", tensor_id_, " from ",
        owner_.name, " has metadata ", shard.metadata.ToString(), ", expected ",
        metadata_.ToString()));
  }
  return shard;
}

}  // namespace tessera
