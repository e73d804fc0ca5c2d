// The Store over etcd's v3 gRPC API: the production store, which outlives
// any daemon. `--store etcd://h1:2379,h2:2379,h3:2379/tessera/job7` points
// every daemon of a cluster at the same etcd cluster and key prefix; the
// operation log, the generations and the workers' addresses then survive
// the death of any daemon, rank 0 included (docs/control_log.md).
//
// How each call maps onto etcd:
//   Set          Put;
//   Get, Wait    a Range, then a Watch of the missing keys from the
//                revision after it, so no Put between the two is missed;
//   Add,         a Range, then a Txn that writes only if the key's
//   CompareSet   mod_revision (or absence) is unchanged, retried on a
//                conflict: every write is one atomic revision;
//   Delete       DeleteRange; Check: one Txn of Ranges (a snapshot);
//   SetLive      LeaseGrant (whole seconds, at least 1; etcd may raise it
//                to its minimum TTL) and a Put bound to the lease;
//   Renew        one round of LeaseKeepAlive.
// Every key is stored as prefix + key, so clusters sharing an etcd keep
// apart; values are bytes, as etcd stores them.
//
// Endpoints and failure: calls go to one endpoint; one that is unreachable,
// or does not answer within kAttemptTimeout (a partitioned member, a
// cluster without quorum), is left for the next, so the death of a minority
// of members costs a reconnection, not an error (nor does a leader
// election: the endpoints are tried for two rounds at least). When no
// endpoint answers for kReconnectWait and two rounds, the call fails with
// UNAVAILABLE naming the endpoints.
// A write retried on another endpoint after a lost answer may have been
// applied already: Set is idempotent, Add may then count twice (Tessera's
// counters tolerate a gap), CompareSet returns the value it left.
//
// TLS: with options.tls set, every endpoint is dialled over TLS, verifying
// etcd's certificate against tls.ca_file and presenting tls.cert_file when
// etcd asks for client certificates (its --client-cert-auth); otherwise in
// plain text.
//
// Thread-safety: safe to call from any number of threads.
#ifndef TESSERA_SERVER_STORE_ETCD_STORE_H_
#define TESSERA_SERVER_STORE_ETCD_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/store/store.h"
#include "wire/credentials.h"

namespace etcdserverpb {
class KV;
class Lease;
class Watch;
class ResponseHeader;
}  // namespace etcdserverpb
namespace mvccpb {
class KeyValue;
}  // namespace mvccpb
namespace grpc {
class Channel;
class ClientContext;
class Status;
}  // namespace grpc

namespace tessera {

struct EtcdStoreOptions {
  // "host:port" of each member's client URL.
  std::vector<std::string> endpoints;
  // Prepended to every key: one per cluster ("/tessera/job7/").
  std::string prefix = "/tessera/";
  // How long Connect waits for a first member to answer.
  absl::Duration connect_timeout = absl::Seconds(60);
  // Client TLS (wire/credentials.h); disabled: plain text.
  TlsConfig tls;
};

// Parses "etcd://host:port[,host:port...][/prefix]": the endpoints, and the
// prefix (the path, with a trailing '/'; "/tessera/" without one).
// INVALID_ARGUMENT naming what is wrong.
absl::StatusOr<EtcdStoreOptions> ParseEtcdUrl(absl::string_view url);

class EtcdStore : public Store {
 public:
  // How long one endpoint is given to answer one call.
  static constexpr absl::Duration kAttemptTimeout = absl::Seconds(2);
  // How long a call keeps trying the endpoints before it fails.
  static constexpr absl::Duration kReconnectWait = absl::Seconds(2);

  // Connects, waiting up to options.connect_timeout for a member to answer
  // (UNAVAILABLE naming the endpoints after that).
  static absl::StatusOr<std::shared_ptr<EtcdStore>> Connect(
      EtcdStoreOptions options);
  ~EtcdStore() override;

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key,
                                  absl::Duration timeout) override;
  using Store::Get;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;
  absl::StatusOr<std::string> CompareSet(absl::string_view key,
                                         absl::string_view expected,
                                         absl::string_view desired) override;
  absl::StatusOr<bool> Delete(absl::string_view key) override;
  absl::Status Wait(absl::Span<const std::string> keys,
                    absl::Duration timeout) override;
  using Store::Wait;
  absl::StatusOr<bool> Check(absl::Span<const std::string> keys) override;
  absl::StatusOr<int64_t> SetLive(absl::string_view key,
                                  absl::string_view value,
                                  absl::Duration ttl) override;
  absl::Status Renew(int64_t lease) override;

  // "etcd at h1:2379,h2:2379 (prefix /tessera/job7/)", for messages.
  std::string description() const;
  const EtcdStoreOptions& options() const { return options_; }

 private:
  struct Endpoint;
  // A key's value and the revision that last changed it.
  struct Versioned {
    std::string value;
    int64_t mod_revision = 0;
  };
  // What a snapshot of some keys found: each key's value (nullopt when
  // absent), as of `revision`.
  struct Snapshot {
    std::vector<std::optional<std::string>> values;
    int64_t revision = 0;
  };
  using Attempt = std::function<grpc::Status(Endpoint&, grpc::ClientContext*)>;

  explicit EtcdStore(EtcdStoreOptions options);

  // Runs `attempt` on the current endpoint, moving on to the next one on a
  // transport failure, until it answers, `deadline` passes or no endpoint
  // answered for kReconnectWait.
  absl::Status Call(const Attempt& attempt, absl::Time deadline);
  // Whether `endpoint` is connected, or connects by `deadline`; false at
  // once after a refused connection.
  static bool Connected(Endpoint& endpoint, absl::Time deadline);
  // The key's value and revision; by `deadline` (default: the store's
  // timeout from now).
  absl::StatusOr<std::optional<Versioned>> Read(
      absl::string_view key, absl::Time deadline = absl::InfiniteFuture());
  absl::StatusOr<Snapshot> Take(absl::Span<const std::string> keys);
  // Writes `value` only if the key still holds `seen` (nullopt: absent);
  // false on a conflict.
  absl::StatusOr<bool> WriteIf(absl::string_view key,
                               const std::optional<Versioned>& seen,
                               absl::string_view value);
  // Waits until every key is set; the value of keys[0] in `first`.
  absl::Status Await(absl::Span<const std::string> keys, absl::Duration timeout,
                     std::string* first);
  // Watches the absent keys of `snapshot` from the revision after it; OK
  // once all are set. CANCELLED when the watch ended early (compaction, a
  // lost endpoint): take a new snapshot.
  absl::Status WatchUntilSet(absl::Span<const std::string> keys,
                             Snapshot& snapshot, absl::Time deadline);
  std::string Key(absl::string_view key) const;
  Endpoint& Current() ABSL_LOCKS_EXCLUDED(mu_);

  const EtcdStoreOptions options_;
  std::vector<std::unique_ptr<Endpoint>> endpoints_;
  mutable absl::Mutex mu_;
  size_t current_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_STORE_ETCD_STORE_H_
