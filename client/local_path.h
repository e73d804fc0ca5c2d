// LocalPathClient: the client half of the local path
// (docs/data_plane.md, "The local path"; server/serve/local_path_server.h;
// proto/tessera/v1/local.proto).
//
// When a shard's owner runs on this host, its bytes need not cross the TCP
// stack: the owner lends the shard's memory (a read-only descriptor of a
// shared host memory file, or a CUDA IPC handle) and the client copies the
// requested box straight from it into the destination, then tells the
// owner it is done, which ends the owner's lease on the memory. A memory
// file is read through a mapping of all of it that this client keeps for
// the next lease of the same file, for up to a second after its last use
// (io/mapping_cache.h: a file lent again is copied without filling page
// tables again; an owner that frees the file frees its pages all the
// same, common/tensor/storage.h). A dense run bound for a contiguous host
// destination is copied with memcpy by several threads (from 16 MiB),
// which fault a new mapping in themselves; anything else (a new mapping's
// view populated at once, or an opened IPC handle) is copied with CopyBox
// (any strides, CPU or CUDA). An IPC handle is closed before "done" is
// sent.
// Writes go the other way (Write): a daemon lends the file writable to its
// own user's processes, and the client copies into the box's run with
// memcpy by the same threads (pwrite(2) where the pages cannot be
// populated first), through a writable mapping of the file kept as reads
// keep theirs (only ever reached through a descriptor lent writable).
//
// Any failure that is about the path rather than the request (another
// host, no socket under that name, memory the owner cannot share, a
// mapping or CUDA IPC failure, a malformed reply) is reported as
// fall_back: the caller fetches over a stream instead. The owner's verdict
// on the request itself (NOT_FOUND, OUT_OF_RANGE, INVALID_ARGUMENT) and a
// destination that does not match are final, as is DEADLINE_EXCEEDED (no
// time is left for a stream).
//
// After a failed connect the fetcher skips the local path for
// kRetryAfterConnectFailure (unless asked not to), so that an owner whose
// socket this process cannot reach (another network namespace) costs one
// attempt, not one per fetch. Connections are pooled, one per concurrent
// fetch, and dropped after any error.
//
// Thread-safety: Fetch and Write may be called from many threads at once.
#ifndef TESSERA_CLIENT_LOCAL_PATH_H_
#define TESSERA_CLIENT_LOCAL_PATH_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/shard_client.h"
#include "io/mapping_cache.h"
#include "io/socket.h"
#include "tessera/v1/local.pb.h"
#include "tessera/v1/shard.pb.h"

namespace tessera {

// What a local attempt came to.
struct LocalAttempt {
  // OK: the bytes are in the assembler's destination. Otherwise why not.
  absl::Status status;
  // The local path could not be taken and nothing final was learned: fetch
  // over a stream instead (the assembler is untouched).
  bool fall_back = false;
};

class LocalPathClient {
 public:
  static constexpr absl::Duration kRetryAfterConnectFailure = absl::Seconds(30);

  // `local_address` as workers publish it ("<host id>/<socket name>"); one
  // that is malformed or names another host makes every attempt fall back.
  explicit LocalPathClient(std::string local_address);
  ~LocalPathClient();
  LocalPathClient(const LocalPathClient&) = delete;
  LocalPathClient& operator=(const LocalPathClient&) = delete;

  // Whether the address names this host (the local path may work).
  bool same_host() const { return same_host_; }
  // OK when an attempt may be made: the owner is on this host and, with
  // `skip_after_failure`, no connect failed recently (a daemon of this host
  // in another network namespace: its socket cannot be reached).
  absl::Status Usable(bool skip_after_failure) const;
  const std::string& address() const { return address_; }

  // Fetches `request` into `assembler` over the local path, every socket
  // operation bounded by `deadline`. With `skip_after_failure` an attempt
  // within kRetryAfterConnectFailure of a failed connect falls back at
  // once.
  LocalAttempt Fetch(const v1::FetchShardRequest& request, absl::Time deadline,
                     bool skip_after_failure, ShardAssembler* assembler) const;

  // Writes `bytes` (contiguous host memory, the box's row-major bytes) as
  // the box `request` names (its tensor id, shard and region: the owner
  // validates it as a fetch of that box) straight into the owner's memory
  // file, which the owner lends writable to processes of its own user or
  // root only, for a box that is one dense run of it (mapped, populated
  // and copied into by several threads; pwrite(2) where the pages cannot be
  // populated). fall_back, with nothing written, whenever the path
  // cannot be taken (the owner refuses to lend, another host...), also
  // when the owner has no such tensor or shard registered (it may be
  // refilling it: a stream routes the write there); the owner's other
  // verdicts (OUT_OF_RANGE, INVALID_ARGUMENT) are final, and so is a
  // failure once the copy began, which says "may be partly written".
  LocalAttempt Write(const v1::FetchShardRequest& request, const Tensor& bytes,
                     absl::Time deadline,
                     const std::shared_ptr<Cancellation>& cancel) const;

 private:
  // An idle pooled connection when `reuse` and there is one (*pooled set),
  // else a new one, greeted.
  absl::StatusOr<UniqueFd> TakeConnection(absl::Time deadline, bool reuse,
                                          bool* pooled) const;
  void ReturnConnection(UniqueFd socket) const;
  // A reply (code 0) to one request, with its connection and the memory
  // file it lends (when its transport is SHM).
  struct Answer {
    UniqueFd socket;
    UniqueFd attached;
    v1::LocalFetchReply reply;
  };
  // Sends `serialized` over a pooled connection (or a new one; once more
  // on a new one when a pooled one was closed meanwhile) and reads the
  // reply. False, with *outcome, when the attempt ends there: a transport
  // failure or a malformed reply (fall back), cancellation (final
  // CANCELLED), or the owner's refusal (FAILED_PRECONDITION and
  // UNAVAILABLE fall back; the rest is final).
  bool Ask(const std::string& serialized, absl::Time deadline,
           const std::shared_ptr<Cancellation>& cancel, const std::string& what,
           Answer* answer, LocalAttempt* outcome) const;
  // Closes the lent file, ends the lease ("done") and pools the connection
  // (closes it when "done" cannot be sent, which ends the lease too).
  void EndLease(Answer answer, absl::Time deadline) const;
  void DropIdleConnections() const;

  const std::string address_;
  std::string socket_name_;
  bool same_host_ = false;
  // Why the path cannot be taken, when !same_host_.
  std::string unusable_;

  // Mappings of the files lent for reads, kept for the next lease.
  mutable MappingCache mappings_;
  mutable absl::Mutex mu_;
  mutable std::vector<UniqueFd> idle_ ABSL_GUARDED_BY(mu_);
  mutable absl::Time retry_after_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace tessera

#endif  // TESSERA_CLIENT_LOCAL_PATH_H_
