// OpOutcomes: what became of the logged ops that carried a client request
// id, so that request ids are idempotency keys (docs/control_log.md,
// "Retries and request ids").
//
// Committed ops: the last kRememberedOps that committed, by request id, in
// log order. Their results (what a retry is answered with) are kept up to
// kRememberedResultBytes in all, the newest first; a record whose result
// went answers as one adopted from another daemon (below). Every daemon records
// the same ones (each runs every entry and the commit is agreed) and adopts the
// lowest-ranked veteran's list when the group forms (Membership::JoinInStep),
// so every daemon decides alike whether an entry is a retry: an entry whose id
// committed already is not run again, and its coordinator answers with the
// first outcome. The result is kept where the op ran; a daemon that adopted the
// record answers a retried create or reshard with the tensor as it is now (same
// tensor id), and otherwise FAILED_PRECONDITION saying the op committed.
// The same id with another request is INVALID_ARGUMENT, on every daemon.
//
// Failed ops (the last kRememberedOps, this daemon's own view) are only
// reported (Find): a failed op changed nothing, so a retry runs it again.
//
// Ops without a client request id, and Gather (it changes nothing), are
// not remembered.
//
// Thread-safety: every method may be called from any thread. Ownership:
// the control core owns it; the table it points at outlives it.
#ifndef TESSERA_SERVER_DAEMON_OP_OUTCOMES_H_
#define TESSERA_SERVER_DAEMON_OP_OUTCOMES_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "server/daemon/pending_call.h"
#include "server/daemon/tensor_table.h"
#include "tessera/v1/control.pb.h"
#include "tessera/v1/control_internal.pb.h"

namespace tessera::control_internal {

// How many committed (and, apart, failed) ops are remembered: a retry
// later than this many commits runs again.
inline constexpr size_t kRememberedOps = 4096;
// The most bytes of results kept for retries, serialized (a create of a
// million shards answers with megabytes of metadata).
inline constexpr size_t kRememberedResultBytes = size_t{64} << 20;

// What a retried op is answered with.
struct Replayed {
  absl::Status status;
  OpResult result;
  // The log entry of the first outcome.
  int64_t first_entry = 0;
};

class OpOutcomes {
 public:
  explicit OpOutcomes(const TensorTable* table) : table_(table) {}
  OpOutcomes(const OpOutcomes&) = delete;
  OpOutcomes& operator=(const OpOutcomes&) = delete;

  // Whether `op` is remembered at all (it has a client request id and is
  // not a Gather).
  static bool Remembers(const v1::ControlOp& op);
  // XXH3-64 of `op`'s request, serialized deterministically.
  static uint64_t Digest(const v1::ControlOp& op);

  // The answer to `op` when its id committed already (OK and the first
  // result) or was used by another request (INVALID_ARGUMENT); nullopt
  // when it must run. Deterministic on every daemon.
  std::optional<Replayed> Replay(const v1::ControlOp& op) const;
  // Records that `op`, entry `n`, committed with `result`.
  void Committed(const v1::ControlOp& op, int64_t n, const OpResult& result);
  // Records that `op` (entry `n`; 0 when it never reached the log) failed
  // with `status` and changed nothing.
  void Failed(const v1::ControlOp& op, int64_t n, const absl::Status& status);

  // The committed records, oldest first (for v1::ResumeState).
  std::vector<v1::CommittedOp> Export() const;
  // Replaces the committed records by `records` (another daemon's
  // Export()) less those that left a tensor id in `dropped_tensor_ids`
  // (applied on some daemons only, then dropped), keeping the results of
  // those this daemon ran itself.
  void Adopt(const google::protobuf::RepeatedPtrField<v1::CommittedOp>& records,
             const absl::flat_hash_set<std::string>& dropped_tensor_ids);

  // What this daemon knows of `request_id`: COMMITTED or FAILED, else
  // nullopt (PENDING is the log's to tell).
  std::optional<v1::OperationStatus> Find(const std::string& request_id) const;

 private:
  // A result as kept: its messages serialized, parsed again for a retry.
  // As messages they take ten times or more (a shard's metadata is about
  // 15 bytes serialized and 200 as a message, with its repeated fields and
  // submessages), and kRememberedResultBytes bounds the memory itself.
  struct KeptResult {
    std::string info;
    std::vector<std::string> names;
    std::vector<std::string> infos;
    std::string group;
  };
  struct Record {
    v1::CommittedOp committed;
    std::optional<KeptResult> result;  // Where this daemon ran it.
    size_t result_bytes = 0;
  };
  // `result` serialized, and its bytes.
  static std::pair<KeptResult, size_t> Keep(const OpResult& result);
  // The result `kept` holds; nullopt if it does not parse (it always
  // should: this daemon serialized it).
  static std::optional<OpResult> Parse(const KeptResult& kept);
  // Drops the oldest records beyond kRememberedOps and the oldest results
  // beyond kRememberedResultBytes.
  void TrimLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The answer to a retry of `record` on a daemon that did not run it.
  Replayed WithoutResult(const v1::CommittedOp& record) const;

  const TensorTable* const table_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Record> committed_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> committed_order_ ABSL_GUARDED_BY(mu_);
  size_t result_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, v1::OperationStatus> failed_
      ABSL_GUARDED_BY(mu_);
  std::deque<std::string> failed_order_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::control_internal

#endif  // TESSERA_SERVER_DAEMON_OP_OUTCOMES_H_
