#include "server/store/etcd_store.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "wire/grpc_status.h"

namespace tessera {
namespace {

using ::etcdserverpb::Compare;

// An endpoint "host:port" with a port in range; INVALID_ARGUMENT otherwise.
absl::Status ValidateEndpoint(absl::string_view endpoint) {
  const size_t colon = endpoint.rfind(':');
  int port = 0;
  if (colon == absl::string_view::npos || colon == 0 ||
      !absl::SimpleAtoi(endpoint.substr(colon + 1), &port) || port < 1 ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd endpoint '", endpoint,
                     "' is not host:port with a port in 1..65535"));
  }
  return absl::OkStatus();
}

// How long to pause after every endpoint failed once, before the next
// round.
constexpr absl::Duration kRoundPause = absl::Milliseconds(50);

}  // namespace

absl::StatusOr<EtcdStoreOptions> ParseEtcdUrl(absl::string_view url) {
  absl::string_view rest = url;
  if (!absl::ConsumePrefix(&rest, "etcd://")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "store URL '", url,
        "' does not start with etcd:// (etcd://host:port[,host:port...]"
        "[/prefix])"));
  }
  const size_t slash = rest.find('/');
  const absl::string_view hosts = rest.substr(0, slash);
  EtcdStoreOptions options;
  for (absl::string_view endpoint : absl::StrSplit(hosts, ',')) {
    RETURN_IF_ERROR(ValidateEndpoint(endpoint));
    options.endpoints.emplace_back(endpoint);
  }
  if (slash != absl::string_view::npos) {
    absl::string_view path = rest.substr(slash);
    if (path != "/") {
      options.prefix = std::string(path);
      if (options.prefix.back() != '/') options.prefix += '/';
    }
  }
  return options;
}

struct EtcdStore::Endpoint {
  std::string address;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<etcdserverpb::KV::Stub> kv;
  std::unique_ptr<etcdserverpb::Watch::Stub> watch;
  std::unique_ptr<etcdserverpb::Lease::Stub> lease;
};

EtcdStore::EtcdStore(EtcdStoreOptions options) : options_(std::move(options)) {
  grpc::ChannelArguments args;
  // A member that restarts is noticed within a second, rather than after
  // gRPC's default backoff that grows to two minutes.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // A connection attempt that hangs (a partitioned member) is given up
  // after the time a call gives one endpoint (default: 20 s).
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS,
              absl::ToInt64Milliseconds(EtcdStore::kAttemptTimeout));
  for (const std::string& address : options_.endpoints) {
    auto endpoint = std::make_unique<Endpoint>();
    endpoint->address = address;
    endpoint->channel = grpc::CreateCustomChannel(
        address,
        options_.tls.enabled() ? ChannelCredentialsFor(options_.tls)
                               : grpc::InsecureChannelCredentials(),
        args);
    endpoint->kv = etcdserverpb::KV::NewStub(endpoint->channel);
    endpoint->watch = etcdserverpb::Watch::NewStub(endpoint->channel);
    endpoint->lease = etcdserverpb::Lease::NewStub(endpoint->channel);
    endpoints_.push_back(std::move(endpoint));
  }
}

EtcdStore::~EtcdStore() = default;

absl::StatusOr<std::shared_ptr<EtcdStore>> EtcdStore::Connect(
    EtcdStoreOptions options) {
  if (options.endpoints.empty()) {
    return absl::InvalidArgumentError("the etcd store needs an endpoint");
  }
  for (const std::string& endpoint : options.endpoints) {
    RETURN_IF_ERROR(ValidateEndpoint(endpoint));
  }
  if (options.tls.enabled()) {
    RETURN_IF_ERROR(ValidateTlsConfig(options.tls, /*server=*/false));
  }
  if (options.prefix.empty() || options.prefix.front() != '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        "the etcd key prefix must start with '/', got '", options.prefix, "'"));
  }
  std::shared_ptr<EtcdStore> store(new EtcdStore(std::move(options)));
  const absl::Time deadline = absl::Now() + store->options_.connect_timeout;
  absl::Status answered;
  do {
    // Any read proves a member answers (and has a leader: a linearizable
    // range needs one).
    answered = store->Read("connect", deadline).status();
    if (answered.ok() || !absl::IsUnavailable(answered)) break;
    absl::SleepFor(absl::Milliseconds(200));
  } while (absl::Now() < deadline);
  if (!answered.ok()) {
    return absl::UnavailableError(
        absl::StrCat(store->description(), " did not answer for ",
                     absl::FormatDuration(store->options_.connect_timeout),
                     ": ", answered.message()));
  }
  return store;
}

std::string EtcdStore::description() const {
  return absl::StrCat("etcd at ", absl::StrJoin(options_.endpoints, ","),
                      " (prefix ", options_.prefix, ")");
}

std::string EtcdStore::Key(absl::string_view key) const {
  return absl::StrCat(options_.prefix, key);
}

EtcdStore::Endpoint& EtcdStore::Current() {
  absl::MutexLock lock(&mu_);
  return *endpoints_[current_];
}

absl::Status EtcdStore::Call(const Attempt& attempt, absl::Time deadline) {
  const size_t count = endpoints_.size();
  absl::Time first_failure = absl::InfiniteFuture();
  std::string failures;
  for (size_t tried = 1;; ++tried) {
    size_t index;
    {
      absl::MutexLock lock(&mu_);
      index = current_;
    }
    Endpoint& endpoint = *endpoints_[index];
    const absl::Time started = absl::Now();
    const absl::Time attempt_deadline =
        std::min(deadline, started + kAttemptTimeout);
    absl::Status status;
    if (!Connected(endpoint, attempt_deadline)) {
      status = absl::UnavailableError("not connected");
    } else {
      grpc::ClientContext context;
      // A connection lost now fails the call at once; the loop tries the
      // next member.
      context.set_wait_for_ready(false);
      context.set_deadline(absl::ToChronoTime(attempt_deadline));
      status = FromGrpcStatus(attempt(endpoint, &context));
    }
    const absl::Time now = absl::Now();
    // A member that is unreachable, has no leader or does not answer in
    // time (partitioned, no quorum): try another. Any other answer is the
    // cluster's.
    const bool next = absl::IsUnavailable(status) ||
                      (absl::IsDeadlineExceeded(status) && now < deadline);
    if (!next) {
      if (absl::IsDeadlineExceeded(status)) {
        return absl::DeadlineExceededError(absl::StrCat(
            description(), " did not answer in time: ", status.message()));
      }
      if (absl::StrContains(status.message(), "request is too large") ||
          absl::StrContains(status.message(), "larger than max")) {
        // etcd's limit (--max-request-bytes, 1.5 MiB by default; gRPC's
        // own a little above it), not a malformed request.
        return absl::ResourceExhaustedError(
            absl::StrCat(description(), " refused a write: ", status.message(),
                         " (etcd's --max-request-bytes)"));
      }
      if (absl::StrContains(status.message(), "database space exceeded")) {
        return absl::ResourceExhaustedError(
            absl::StrCat(description(), " is full: ", status.message(),
                         " (compact and defragment it; run etcd with "
                         "--auto-compaction-retention)"));
      }
      return status;
    }
    if (first_failure == absl::InfiniteFuture()) first_failure = started;
    if (tried <= count) {
      absl::StrAppend(&failures, failures.empty() ? "" : "; ", endpoint.address,
                      ": ", status.message());
    }
    {
      absl::MutexLock lock(&mu_);
      if (current_ == index) current_ = (index + 1) % count;
    }
    if (tried % count != 0) continue;
    // Two rounds at least: one attempt that waits out kAttemptTimeout (a
    // member whose cluster is electing a leader) must not use up the
    // reconnect window alone.
    if ((now - first_failure >= kReconnectWait && tried >= 2 * count) ||
        now >= deadline) {
      return absl::UnavailableError(
          absl::StrCat(description(), " is unreachable (", failures, ")"));
    }
    // Pause, polling every channel so that reconnections make progress.
    for (const std::unique_ptr<Endpoint>& each : endpoints_) {
      each->channel->WaitForStateChange(
          each->channel->GetState(/*try_to_connect=*/true),
          absl::ToChronoTime(absl::Now() + kRoundPause / count));
    }
  }
}

bool EtcdStore::Connected(Endpoint& endpoint, absl::Time deadline) {
  // Connecting needs a thread polling the channel (this one): a channel
  // left alone moves on only at gRPC's backup poll, seconds later. A
  // connection refused (TRANSIENT_FAILURE) gives up at once.
  grpc_connectivity_state state =
      endpoint.channel->GetState(/*try_to_connect=*/true);
  while (state != GRPC_CHANNEL_READY &&
         state != GRPC_CHANNEL_TRANSIENT_FAILURE) {
    if (!endpoint.channel->WaitForStateChange(state,
                                              absl::ToChronoTime(deadline))) {
      return false;
    }
    state = endpoint.channel->GetState(/*try_to_connect=*/true);
  }
  return state == GRPC_CHANNEL_READY;
}

absl::StatusOr<std::optional<EtcdStore::Versioned>> EtcdStore::Read(
    absl::string_view key, absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) deadline = absl::Now() + timeout();
  etcdserverpb::RangeRequest request;
  request.set_key(Key(key));
  etcdserverpb::RangeResponse response;
  RETURN_IF_ERROR(Call(
      [&](Endpoint& endpoint, grpc::ClientContext* context) {
        return endpoint.kv->Range(context, request, &response);
      },
      deadline));
  if (response.kvs_size() == 0) return std::nullopt;
  return Versioned{response.kvs(0).value(), response.kvs(0).mod_revision()};
}

absl::StatusOr<EtcdStore::Snapshot> EtcdStore::Take(
    absl::Span<const std::string> keys) {
  // One transaction of ranges: every key as of the same revision.
  etcdserverpb::TxnRequest request;
  for (const std::string& key : keys) {
    request.add_success()->mutable_request_range()->set_key(Key(key));
  }
  etcdserverpb::TxnResponse response;
  RETURN_IF_ERROR(Call(
      [&](Endpoint& endpoint, grpc::ClientContext* context) {
        return endpoint.kv->Txn(context, request, &response);
      },
      absl::Now() + timeout()));
  if (response.responses_size() != static_cast<int>(keys.size())) {
    return absl::DataLossError(
        absl::StrCat(description(), " answered a snapshot of ", keys.size(),
                     " keys with ", response.responses_size(), " ranges"));
  }
  Snapshot snapshot;
  snapshot.revision = response.header().revision();
  for (const etcdserverpb::ResponseOp& op : response.responses()) {
    const etcdserverpb::RangeResponse& range = op.response_range();
    snapshot.values.push_back(
        range.kvs_size() == 0
            ? std::nullopt
            : std::optional<std::string>(range.kvs(0).value()));
  }
  return snapshot;
}

absl::StatusOr<bool> EtcdStore::WriteIf(absl::string_view key,
                                        const std::optional<Versioned>& seen,
                                        absl::string_view value) {
  etcdserverpb::TxnRequest request;
  Compare* unchanged = request.add_compare();
  unchanged->set_key(Key(key));
  unchanged->set_result(Compare::EQUAL);
  if (seen.has_value()) {
    unchanged->set_target(Compare::MOD);
    unchanged->set_mod_revision(seen->mod_revision);
  } else {
    // Absent: no version yet.
    unchanged->set_target(Compare::VERSION);
    unchanged->set_version(0);
  }
  etcdserverpb::PutRequest* put = request.add_success()->mutable_request_put();
  put->set_key(Key(key));
  put->set_value(std::string(value));
  etcdserverpb::TxnResponse response;
  RETURN_IF_ERROR(Call(
      [&](Endpoint& endpoint, grpc::ClientContext* context) {
        return endpoint.kv->Txn(context, request, &response);
      },
      absl::Now() + timeout()));
  return response.succeeded();
}

absl::Status EtcdStore::Set(absl::string_view key, absl::string_view value) {
  RETURN_IF_ERROR(ValidateStoreKey(key));
  etcdserverpb::PutRequest request;
  request.set_key(Key(key));
  request.set_value(std::string(value));
  etcdserverpb::PutResponse response;
  return Call(
      [&](Endpoint& endpoint, grpc::ClientContext* context) {
        return endpoint.kv->Put(context, request, &response);
      },
      absl::Now() + timeout());
}

absl::StatusOr<std::string> EtcdStore::Get(absl::string_view key,
                                           absl::Duration timeout) {
  const std::string keys[] = {std::string(key)};
  std::string value;
  RETURN_IF_ERROR(Await(keys, timeout, &value));
  return value;
}

absl::StatusOr<int64_t> EtcdStore::Add(absl::string_view key, int64_t delta) {
  RETURN_IF_ERROR(ValidateStoreKey(key));
  const absl::Time deadline = absl::Now() + timeout();
  while (true) {
    ASSIGN_OR_RETURN(std::optional<Versioned> seen, Read(key));
    ASSIGN_OR_RETURN(
        const int64_t value,
        StoreAddResult(key, seen.has_value() ? &seen->value : nullptr, delta));
    // Reading a counter (Add 0) writes only to create it.
    if (delta == 0 && seen.has_value()) return value;
    ASSIGN_OR_RETURN(const bool written,
                     WriteIf(key, seen, absl::StrCat(value)));
    if (written) return value;
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("adding to '", key, "' in ", description(),
                       ": every try conflicted with another writer for ",
                       absl::FormatDuration(timeout())));
    }
  }
}

absl::StatusOr<std::string> EtcdStore::CompareSet(absl::string_view key,
                                                  absl::string_view expected,
                                                  absl::string_view desired) {
  RETURN_IF_ERROR(ValidateStoreKey(key));
  const absl::Time deadline = absl::Now() + timeout();
  while (true) {
    ASSIGN_OR_RETURN(std::optional<Versioned> seen, Read(key));
    CompareSetOutcome outcome = StoreCompareSetResult(
        seen.has_value() ? &seen->value : nullptr, expected, desired);
    if (!outcome.write) return std::move(outcome.value);
    ASSIGN_OR_RETURN(const bool written, WriteIf(key, seen, desired));
    if (written) return std::move(outcome.value);
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("compare-and-set of '", key, "' in ", description(),
                       ": every try conflicted with another writer for ",
                       absl::FormatDuration(timeout())));
    }
  }
}

absl::StatusOr<bool> EtcdStore::Delete(absl::string_view key) {
  RETURN_IF_ERROR(ValidateStoreKey(key));
  etcdserverpb::DeleteRangeRequest request;
  request.set_key(Key(key));
  etcdserverpb::DeleteRangeResponse response;
  RETURN_IF_ERROR(Call(
      [&](Endpoint& endpoint, grpc::ClientContext* context) {
        return endpoint.kv->DeleteRange(context, request, &response);
      },
      absl::Now() + timeout()));
  return response.deleted() > 0;
}

absl::StatusOr<int64_t> EtcdStore::SetLive(absl::string_view key,
                                           absl::string_view value,
                                           absl::Duration ttl) {
  RETURN_IF_ERROR(ValidateStoreKey(key));
  if (ttl <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("a lease's ttl must be positive");
  }
  etcdserverpb::LeaseGrantRequest grant;
  grant.set_ttl(std::max<int64_t>(
      1, absl::ToInt64Seconds(absl::Ceil(ttl, absl::Seconds(1)))));
  etcdserverpb::LeaseGrantResponse granted;
  RETURN_IF_ERROR(Call(
      [&](Endpoint& endpoint, grpc::ClientContext* context) {
        return endpoint.lease->LeaseGrant(context, grant, &granted);
      },
      absl::Now() + timeout()));
  if (!granted.error().empty()) {
    return absl::UnavailableError(
        absl::StrCat(description(), " granted no lease: ", granted.error()));
  }
  etcdserverpb::PutRequest put;
  put.set_key(Key(key));
  put.set_value(std::string(value));
  put.set_lease(granted.id());
  etcdserverpb::PutResponse response;
  RETURN_IF_ERROR(Call(
      [&](Endpoint& endpoint, grpc::ClientContext* context) {
        return endpoint.kv->Put(context, put, &response);
      },
      absl::Now() + timeout()));
  return granted.id();
}

absl::Status EtcdStore::Renew(int64_t lease) {
  etcdserverpb::LeaseKeepAliveRequest request;
  request.set_id(lease);
  etcdserverpb::LeaseKeepAliveResponse response;
  RETURN_IF_ERROR(Call(
      [&](Endpoint& endpoint, grpc::ClientContext* context) {
        // One round of the keep-alive stream: a request, its answer.
        std::unique_ptr<
            grpc::ClientReaderWriter<etcdserverpb::LeaseKeepAliveRequest,
                                     etcdserverpb::LeaseKeepAliveResponse>>
            stream = endpoint.lease->LeaseKeepAlive(context);
        const bool answered = stream->Write(request) && stream->Read(&response);
        stream->WritesDone();
        grpc::Status finished = stream->Finish();
        if (!finished.ok()) return finished;
        return answered ? grpc::Status::OK
                        : grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                       "the keep-alive stream ended without "
                                       "an answer");
      },
      absl::Now() + timeout()));
  if (response.ttl() <= 0) {
    return absl::NotFoundError(
        absl::StrCat("lease ", lease, " ran out in ", description()));
  }
  return absl::OkStatus();
}

absl::Status EtcdStore::Wait(absl::Span<const std::string> keys,
                             absl::Duration timeout) {
  return Await(keys, timeout, nullptr);
}

absl::StatusOr<bool> EtcdStore::Check(absl::Span<const std::string> keys) {
  for (const std::string& key : keys) RETURN_IF_ERROR(ValidateStoreKey(key));
  if (keys.empty()) return true;
  ASSIGN_OR_RETURN(Snapshot snapshot, Take(keys));
  return std::all_of(snapshot.values.begin(), snapshot.values.end(),
                     [](const std::optional<std::string>& value) {
                       return value.has_value();
                     });
}

absl::Status EtcdStore::Await(absl::Span<const std::string> keys,
                              absl::Duration timeout, std::string* first) {
  RETURN_IF_ERROR(ValidateStoreWait(keys, timeout));
  if (keys.empty()) return absl::OkStatus();
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    ASSIGN_OR_RETURN(Snapshot snapshot, Take(keys));
    absl::Status watched = absl::OkStatus();
    const bool complete =
        std::all_of(snapshot.values.begin(), snapshot.values.end(),
                    [](const std::optional<std::string>& value) {
                      return value.has_value();
                    });
    if (!complete) {
      if (absl::Now() >= deadline) {
        watched = absl::DeadlineExceededError("");
      } else {
        watched = WatchUntilSet(keys, snapshot, deadline);
      }
    }
    if (watched.ok()) {
      if (first != nullptr) *first = *snapshot.values[0];
      return absl::OkStatus();
    }
    if (absl::IsDeadlineExceeded(watched)) {
      std::vector<std::string> missing;
      for (size_t i = 0; i < keys.size(); ++i) {
        if (!snapshot.values[i].has_value()) missing.push_back(keys[i]);
      }
      return StoreTimeoutError(timeout, missing);
    }
    // The watch ended early: look again (on the next endpoint if this one
    // was lost; the snapshot fails when none answers).
    absl::SleepFor(absl::Milliseconds(10));
  }
}

absl::Status EtcdStore::WatchUntilSet(absl::Span<const std::string> keys,
                                      Snapshot& snapshot, absl::Time deadline) {
  Endpoint& endpoint = Current();
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  // A member that loses its leader ends the watch instead of keeping it
  // open without news (etcd's WithRequireLeader).
  context.AddMetadata("hasleader", "true");
  std::unique_ptr<grpc::ClientReaderWriter<etcdserverpb::WatchRequest,
                                           etcdserverpb::WatchResponse>>
      stream = endpoint.watch->Watch(&context);
  int missing = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (snapshot.values[i].has_value()) continue;
    ++missing;
    etcdserverpb::WatchRequest request;
    etcdserverpb::WatchCreateRequest* create = request.mutable_create_request();
    create->set_key(Key(keys[i]));
    create->set_start_revision(snapshot.revision + 1);
    if (!stream->Write(request)) break;
  }
  etcdserverpb::WatchResponse response;
  bool ended = false;
  while (missing > 0 && !ended && stream->Read(&response)) {
    // Cancelled (the revision was compacted, the member lost its leader):
    // start over from a new snapshot.
    ended = response.canceled() || response.compact_revision() != 0;
    for (const mvccpb::Event& event : response.events()) {
      for (size_t i = 0; i < keys.size(); ++i) {
        if (event.kv().key() != Key(keys[i])) continue;
        const bool was_set = snapshot.values[i].has_value();
        if (event.type() == mvccpb::Event::PUT) {
          snapshot.values[i] = event.kv().value();
          if (!was_set) --missing;
        } else {
          snapshot.values[i].reset();
          if (was_set) ++missing;
        }
      }
    }
  }
  context.TryCancel();
  const grpc::Status finished = stream->Finish();
  if (missing == 0) return absl::OkStatus();
  if (absl::Now() >= deadline) return absl::DeadlineExceededError("");
  if (finished.error_code() == grpc::StatusCode::UNAVAILABLE) {
    absl::MutexLock lock(&mu_);
    if (endpoints_[current_].get() == &endpoint) {
      current_ = (current_ + 1) % endpoints_.size();
    }
  }
  return absl::CancelledError("the watch ended early");
}

}  // namespace tessera
