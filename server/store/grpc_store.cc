#include "server/store/grpc_store.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "wire/auth.h"
#include "wire/credentials.h"
#include "wire/grpc_status.h"
#include "wire/request_guard.h"

namespace tessera {
namespace grpc_store_internal {

constexpr char kShuttingDown[] = "the store service is shutting down";

// Orders the deadline queue; the sequence number breaks ties.
using DeadlineKey = std::pair<absl::Time, uint64_t>;

// One parked Get or Wait. Whoever claims it first (keys set, deadline,
// cancellation, shutdown) finishes its reactor; the others find nothing.
class ParkedCall {
 public:
  ParkedCall(grpc::ServerUnaryReactor* reactor, std::vector<std::string> keys,
             std::string* value, absl::Duration limit, DeadlineKey deadline)
      : keys_(std::move(keys)),
        value_(value),
        limit_(limit),
        deadline_(deadline),
        reactor_(reactor) {}

  // The reactor to finish, once; null afterwards. `watch` gets the watch to
  // cancel, if it is known yet.
  grpc::ServerUnaryReactor* Claim(std::optional<HashStore::WatchId>* watch) {
    absl::MutexLock lock(&mu_);
    *watch = watch_;
    return std::exchange(reactor_, nullptr);
  }

  // Records the call's watch; false when the call was claimed meanwhile,
  // and the caller must cancel the watch itself.
  bool SetWatch(HashStore::WatchId id) {
    absl::MutexLock lock(&mu_);
    watch_ = id;
    return reactor_ != nullptr;
  }

  bool claimed() {
    absl::MutexLock lock(&mu_);
    return reactor_ == nullptr;
  }

  const std::vector<std::string>& keys() const { return keys_; }
  std::string* value() const { return value_; }
  absl::Duration limit() const { return limit_; }
  const DeadlineKey& deadline() const { return deadline_; }

 private:
  const std::vector<std::string> keys_;
  std::string* const value_;    // Get's response value; null for Wait
  const absl::Duration limit_;  // how long the call may wait in all
  const DeadlineKey deadline_;
  absl::Mutex mu_;
  grpc::ServerUnaryReactor* reactor_ ABSL_GUARDED_BY(mu_);
  std::optional<HashStore::WatchId> watch_ ABSL_GUARDED_BY(mu_);
};

class WaitReactor;

// The parked calls of one StoreServiceImpl, in deadline order, and the
// thread that expires them.
class ParkingLot : public std::enable_shared_from_this<ParkingLot> {
 public:
  explicit ParkingLot(std::shared_ptr<HashStore> store)
      : store_(std::move(store)), timer_([this] { ExpireLoop(); }) {}
  ~ParkingLot() { Shutdown(); }

  // Parks `reactor` until `keys` are set or `timeout` (or the call's
  // deadline) passes; a Get's value goes to `value`.
  void Park(WaitReactor* reactor, std::vector<std::string> keys,
            absl::Duration timeout, absl::Time call_deadline,
            std::string* value);
  void Finish(const std::shared_ptr<ParkedCall>& call,
              const absl::Status& status,
              std::vector<std::string>* values = nullptr);
  void Shutdown();
  size_t size() const {
    absl::MutexLock lock(&mu_);
    return parked_.size();
  }

 private:
  void ExpireLoop();
  void Expire(const std::shared_ptr<ParkedCall>& call) {
    Finish(call,
           StoreTimeoutError(call->limit(), store_->MissingKeys(call->keys())));
  }

  const std::shared_ptr<HashStore> store_;
  mutable absl::Mutex mu_;
  absl::CondVar wake_timer_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<uint64_t> next_sequence_{0};
  std::map<DeadlineKey, std::shared_ptr<ParkedCall>> parked_
      ABSL_GUARDED_BY(mu_);
  std::thread timer_;  // last: starts once the members above exist
};

// The reactor of a parked call; needed (over the default reactor) to hear
// of cancellation.
class WaitReactor final : public grpc::ServerUnaryReactor {
 public:
  void Attach(std::weak_ptr<ParkingLot> lot, std::weak_ptr<ParkedCall> call) {
    lot_ = std::move(lot);
    call_ = std::move(call);
  }

  void OnCancel() override {
    std::shared_ptr<ParkingLot> lot = lot_.lock();
    std::shared_ptr<ParkedCall> call = call_.lock();
    if (lot == nullptr || call == nullptr) return;
    lot->Finish(call, absl::CancelledError("the store wait was cancelled"));
  }
  void OnDone() override { delete this; }

 private:
  // Set before the handler returns, read only by OnCancel(), which gRPC
  // runs after it.
  std::weak_ptr<ParkingLot> lot_;
  std::weak_ptr<ParkedCall> call_;
};

void ParkingLot::Park(WaitReactor* reactor, std::vector<std::string> keys,
                      absl::Duration timeout, absl::Time call_deadline,
                      std::string* value) {
  const absl::Time now = absl::Now();
  const absl::Duration limit =
      std::max(std::min(timeout, call_deadline - now), absl::ZeroDuration());
  auto call = std::make_shared<ParkedCall>(
      reactor, keys, value, limit, DeadlineKey(now + limit, next_sequence_++));
  reactor->Attach(weak_from_this(), call);
  // Watch before the deadline is queued, so that keys already set win over
  // a zero timeout.
  const HashStore::WatchId watch = store_->Watch(
      std::move(keys),
      [lot = shared_from_this(), call](std::vector<std::string> values) {
        lot->Finish(call, absl::OkStatus(), &values);
      });
  if (!call->SetWatch(watch)) {
    store_->Unwatch(watch);
    return;
  }
  bool shut_down;
  {
    absl::MutexLock lock(&mu_);
    shut_down = shut_down_;
    // Finish() erases under mu_ after claiming, so a call claimed by now is
    // never queued, and one queued here is erased when it is claimed.
    if (!shut_down && !call->claimed()) {
      parked_.emplace(call->deadline(), call);
      if (parked_.begin()->second == call) wake_timer_.Signal();
    }
  }
  if (shut_down) {
    Finish(call, absl::UnavailableError(kShuttingDown));
  }
}

void ParkingLot::Finish(const std::shared_ptr<ParkedCall>& call,
                        const absl::Status& status,
                        std::vector<std::string>* values) {
  std::optional<HashStore::WatchId> watch;
  grpc::ServerUnaryReactor* reactor = call->Claim(&watch);
  if (reactor == nullptr) return;
  if (watch.has_value()) store_->Unwatch(*watch);
  {
    absl::MutexLock lock(&mu_);
    parked_.erase(call->deadline());
  }
  if (status.ok() && call->value() != nullptr) {
    *call->value() = std::move(values->front());
  }
  reactor->Finish(ToGrpcStatus(status));
}

void ParkingLot::Shutdown() {
  std::map<DeadlineKey, std::shared_ptr<ParkedCall>> parked;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
    parked.swap(parked_);
    wake_timer_.Signal();
  }
  timer_.join();
  for (auto& [deadline, call] : parked) {
    Finish(call, absl::UnavailableError(kShuttingDown));
  }
}

void ParkingLot::ExpireLoop() {
  absl::MutexLock lock(&mu_);
  while (!shut_down_) {
    if (parked_.empty()) {
      wake_timer_.Wait(&mu_);
      continue;
    }
    auto first = parked_.begin();
    if (first->first.first > absl::Now()) {
      wake_timer_.WaitWithDeadline(&mu_, first->first.first);
      continue;
    }
    std::shared_ptr<ParkedCall> call = first->second;
    parked_.erase(first);
    mu_.Unlock();
    Expire(call);
    mu_.Lock();
  }
}

}  // namespace grpc_store_internal

namespace {

using grpc_store_internal::ParkingLot;
using grpc_store_internal::WaitReactor;

// Finishes a call that needs no waiting.
grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* context,
                               const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

// OK when the caller's token may call StoreService/`method` (wire/auth.h).
absl::Status Authorize(const grpc::CallbackServerContext& context,
                       absl::string_view method) {
  return AuthorizeCall(
      context,
      absl::StrCat(v1::StoreService::service_full_name(), "/", method));
}

grpc::ServerUnaryReactor* ParkWait(ParkingLot& lot,
                                   grpc::CallbackServerContext* context,
                                   std::vector<std::string> keys,
                                   int64_t timeout_ms, std::string* value) {
  const absl::Duration timeout = absl::Milliseconds(timeout_ms);
  if (absl::Status status = ValidateStoreWait(keys, timeout); !status.ok()) {
    return Done(context, status);
  }
  auto* reactor = new WaitReactor();
  lot.Park(reactor, std::move(keys), timeout,
           absl::FromChrono(context->deadline()), value);
  return reactor;
}

std::vector<std::string> KeysOf(
    const google::protobuf::RepeatedPtrField<std::string>& keys) {
  return {keys.begin(), keys.end()};
}

// The host clients dial for a server listening on `listen_address`.
std::string DialHost(absl::string_view listen_address) {
  const size_t colon = listen_address.rfind(':');
  absl::string_view host = listen_address.substr(
      0, colon == absl::string_view::npos ? listen_address.size() : colon);
  if (host.empty() || host == "0.0.0.0" || host == "[::]" || host == "::") {
    return "127.0.0.1";
  }
  return std::string(host);
}

int64_t ToTimeoutMs(absl::Duration timeout) {
  return absl::Ceil(timeout, absl::Milliseconds(1)) / absl::Milliseconds(1);
}

}  // namespace

StoreServiceImpl::StoreServiceImpl(std::shared_ptr<HashStore> store)
    : store_(std::move(store)), lot_(std::make_shared<ParkingLot>(store_)) {}

StoreServiceImpl::~StoreServiceImpl() { Shutdown(); }

void StoreServiceImpl::Shutdown() { lot_->Shutdown(); }

size_t StoreServiceImpl::parked_calls() const { return lot_->size(); }

grpc::ServerUnaryReactor* StoreServiceImpl::Set(
    grpc::CallbackServerContext* context, const v1::StoreSetRequest* request,
    v1::StoreSetResponse* response) {
  if (absl::Status allowed = Authorize(*context, "Set"); !allowed.ok()) {
    return Done(context, allowed);
  }
  return Done(context, store_->Set(request->key(), request->value()));
}

grpc::ServerUnaryReactor* StoreServiceImpl::Get(
    grpc::CallbackServerContext* context, const v1::StoreGetRequest* request,
    v1::StoreGetResponse* response) {
  if (absl::Status allowed = Authorize(*context, "Get"); !allowed.ok()) {
    return Done(context, allowed);
  }
  return ParkWait(*lot_, context, {request->key()}, request->timeout_ms(),
                  response->mutable_value());
}

grpc::ServerUnaryReactor* StoreServiceImpl::Add(
    grpc::CallbackServerContext* context, const v1::StoreAddRequest* request,
    v1::StoreAddResponse* response) {
  if (absl::Status allowed = Authorize(*context, "Add"); !allowed.ok()) {
    return Done(context, allowed);
  }
  absl::StatusOr<int64_t> value = store_->Add(request->key(), request->delta());
  if (value.ok()) response->set_value(*value);
  return Done(context, value.status());
}

grpc::ServerUnaryReactor* StoreServiceImpl::CompareSet(
    grpc::CallbackServerContext* context,
    const v1::StoreCompareSetRequest* request,
    v1::StoreCompareSetResponse* response) {
  if (absl::Status allowed = Authorize(*context, "CompareSet"); !allowed.ok()) {
    return Done(context, allowed);
  }
  absl::StatusOr<std::string> value = store_->CompareSet(
      request->key(), request->expected(), request->desired());
  if (value.ok()) response->set_value(*std::move(value));
  return Done(context, value.status());
}

grpc::ServerUnaryReactor* StoreServiceImpl::Delete(
    grpc::CallbackServerContext* context, const v1::StoreDeleteRequest* request,
    v1::StoreDeleteResponse* response) {
  if (absl::Status allowed = Authorize(*context, "Delete"); !allowed.ok()) {
    return Done(context, allowed);
  }
  absl::StatusOr<bool> deleted = store_->Delete(request->key());
  if (deleted.ok()) response->set_deleted(*deleted);
  return Done(context, deleted.status());
}

grpc::ServerUnaryReactor* StoreServiceImpl::Wait(
    grpc::CallbackServerContext* context, const v1::StoreWaitRequest* request,
    v1::StoreWaitResponse* response) {
  if (absl::Status allowed = Authorize(*context, "Wait"); !allowed.ok()) {
    return Done(context, allowed);
  }
  return ParkWait(*lot_, context, KeysOf(request->keys()),
                  request->timeout_ms(), nullptr);
}

grpc::ServerUnaryReactor* StoreServiceImpl::Check(
    grpc::CallbackServerContext* context, const v1::StoreCheckRequest* request,
    v1::StoreCheckResponse* response) {
  if (absl::Status allowed = Authorize(*context, "Check"); !allowed.ok()) {
    return Done(context, allowed);
  }
  absl::StatusOr<bool> ready = store_->Check(KeysOf(request->keys()));
  if (ready.ok()) response->set_ready(*ready);
  return Done(context, ready.status());
}

absl::StatusOr<std::unique_ptr<StoreServer>> StoreServer::Start(
    const std::string& listen_address, HashStoreLimits limits) {
  auto service =
      std::make_unique<StoreServiceImpl>(std::make_shared<HashStore>(limits));
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen_address, ServerCredentialsFor(ProcessTls()),
                           &port);
  // Two stores sharing a port (gRPC's default SO_REUSEPORT) would split the
  // world: a busy port fails instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  AddRequestGuard(builder);
  builder.RegisterService(service.get());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    if (server != nullptr) server->Shutdown();
    return absl::UnavailableError(
        absl::StrCat("store server cannot listen on ", listen_address));
  }
  return std::unique_ptr<StoreServer>(new StoreServer(
      DialHost(listen_address), port, std::move(service), std::move(server)));
}

StoreServer::StoreServer(std::string host, int port,
                         std::unique_ptr<StoreServiceImpl> service,
                         std::unique_ptr<grpc::Server> server)
    : host_(std::move(host)),
      port_(port),
      service_(std::move(service)),
      server_(std::move(server)) {}

StoreServer::~StoreServer() { Shutdown(); }

std::string StoreServer::address() const {
  return absl::StrCat(host_, ":", port_);
}

void StoreServer::Shutdown() {
  absl::MutexLock lock(&mu_);
  if (server_ == nullptr) return;
  // Parked calls first: the server's Shutdown() waits for running calls.
  service_->Shutdown();
  server_->Shutdown(absl::ToChronoTime(absl::Now() + kShutdownGrace));
  server_->Wait();
  server_.reset();
}

absl::StatusOr<std::shared_ptr<GrpcStore>> GrpcStore::Connect(
    const std::string& address, absl::Duration connect_timeout) {
  grpc::ChannelArguments args;
  // A server that starts late is noticed within a second, rather than
  // after gRPC's default backoff that grows to two minutes.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  std::shared_ptr<grpc::Channel> channel = CreateTesseraChannel(address, args);
  if (!channel->WaitForConnected(
          absl::ToChronoTime(absl::Now() + connect_timeout))) {
    return absl::UnavailableError(
        absl::StrCat("store server at ", address, " unreachable for ",
                     absl::FormatDuration(connect_timeout)));
  }
  return std::shared_ptr<GrpcStore>(
      new GrpcStore(address, channel, v1::StoreService::NewStub(channel)));
}

template <typename Request, typename Response>
absl::Status GrpcStore::Call(grpc::Status (Stub::*method)(grpc::ClientContext*,
                                                          const Request&,
                                                          Response*),
                             const Request& request, Response* response,
                             absl::Time deadline) {
  // A lost connection: wait a little for it to come back (a server
  // restarting), but do not wait out the whole deadline for a server that
  // is gone.
  if (channel_->GetState(/*try_to_connect=*/true) != GRPC_CHANNEL_READY &&
      !channel_->WaitForConnected(absl::ToChronoTime(
          std::min(deadline, absl::Now() + kReconnectWait)))) {
    return absl::UnavailableError(
        absl::StrCat("store server at ", address_, " is unreachable"));
  }
  grpc::ClientContext context;
  // Fail fast: a connection lost during the call is UNAVAILABLE now, not a
  // wait for a reconnection until the (possibly long) deadline; the check
  // above rides out a short outage for the next call.
  context.set_wait_for_ready(false);
  context.set_deadline(absl::ToChronoTime(deadline));
  absl::Status status =
      FromGrpcStatus((stub_.get()->*method)(&context, request, response));
  if (absl::IsUnavailable(status) &&
      !absl::StrContains(status.message(),
                         grpc_store_internal::kShuttingDown)) {
    // The connection dropped during the call: name the store.
    return absl::UnavailableError(absl::StrCat(
        "store server at ", address_, " is unreachable: ", status.message()));
  }
  return status;
}

template <typename Request, typename Response>
absl::Status GrpcStore::CallWait(
    grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&,
                                 Response*),
    const Request& request, Response* response,
    absl::Span<const std::string> keys, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout + kWaitSlack;
  absl::Status status = Call(method, request, response, deadline);
  if (absl::IsDeadlineExceeded(status) && absl::Now() >= deadline) {
    // Our deadline, not the server's answer: which keys are missing is
    // unknown, so name all of them.
    return StoreTimeoutError(timeout, keys);
  }
  return status;
}

absl::Status GrpcStore::Set(absl::string_view key, absl::string_view value) {
  v1::StoreSetRequest request;
  request.set_key(std::string(key));
  request.set_value(std::string(value));
  v1::StoreSetResponse response;
  return Call(&Stub::Set, request, &response, absl::Now() + timeout());
}

absl::StatusOr<std::string> GrpcStore::Get(absl::string_view key,
                                           absl::Duration timeout) {
  const std::string keys[] = {std::string(key)};
  RETURN_IF_ERROR(ValidateStoreWait(keys, timeout));
  v1::StoreGetRequest request;
  request.set_key(keys[0]);
  request.set_timeout_ms(ToTimeoutMs(timeout));
  v1::StoreGetResponse response;
  RETURN_IF_ERROR(CallWait(&Stub::Get, request, &response, keys, timeout));
  return std::move(*response.mutable_value());
}

absl::StatusOr<int64_t> GrpcStore::Add(absl::string_view key, int64_t delta) {
  v1::StoreAddRequest request;
  request.set_key(std::string(key));
  request.set_delta(delta);
  v1::StoreAddResponse response;
  RETURN_IF_ERROR(
      Call(&Stub::Add, request, &response, absl::Now() + timeout()));
  return response.value();
}

absl::StatusOr<std::string> GrpcStore::CompareSet(absl::string_view key,
                                                  absl::string_view expected,
                                                  absl::string_view desired) {
  v1::StoreCompareSetRequest request;
  request.set_key(std::string(key));
  request.set_expected(std::string(expected));
  request.set_desired(std::string(desired));
  v1::StoreCompareSetResponse response;
  RETURN_IF_ERROR(
      Call(&Stub::CompareSet, request, &response, absl::Now() + timeout()));
  return std::move(*response.mutable_value());
}

absl::StatusOr<bool> GrpcStore::Delete(absl::string_view key) {
  v1::StoreDeleteRequest request;
  request.set_key(std::string(key));
  v1::StoreDeleteResponse response;
  RETURN_IF_ERROR(
      Call(&Stub::Delete, request, &response, absl::Now() + timeout()));
  return response.deleted();
}

absl::Status GrpcStore::Wait(absl::Span<const std::string> keys,
                             absl::Duration timeout) {
  RETURN_IF_ERROR(ValidateStoreWait(keys, timeout));
  v1::StoreWaitRequest request;
  request.mutable_keys()->Add(keys.begin(), keys.end());
  request.set_timeout_ms(ToTimeoutMs(timeout));
  v1::StoreWaitResponse response;
  return CallWait(&Stub::Wait, request, &response, keys, timeout);
}

absl::StatusOr<bool> GrpcStore::Check(absl::Span<const std::string> keys) {
  v1::StoreCheckRequest request;
  request.mutable_keys()->Add(keys.begin(), keys.end());
  v1::StoreCheckResponse response;
  RETURN_IF_ERROR(
      Call(&Stub::Check, request, &response, absl::Now() + timeout()));
  return response.ready();
}

}  // namespace tessera
