#include "client/shard_client.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/lanes.h"
#include "client/local_path.h"
#include "common/checksum.h"
#include "common/proto_convert.h"
#include "common/region.h"
#include "common/status_macros.h"
#include "common/tensor/cuda_util.h"
#include "grpcpp/client_context.h"
#include "grpcpp/completion_queue.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "wire/auth.h"
#include "wire/call_deadline.h"
#include "wire/chunk_checksums.h"
#include "wire/chunk_codec.h"
#include "wire/fork_guard.h"
#include "wire/grpc_status.h"
#include "wire/replicas.h"
#include "wire/request_id.h"
#include "wire/version_id.h"

namespace tessera {
namespace {

// The largest message a daemon's answer may be, on its control and shard
// channels: well above ShardServiceOptions::max_chunk_bytes plus the
// header, so any server configuration the service accepts can be read, and
// four times the largest request a daemon takes (kMaxRequestBytes,
// wire/request_limit.h). An answer is at most about 1.3 times its
// request (a create's shard metadata, with each shard's rank, against its
// spec's placements), so an op the daemon took and applied is never
// answered with a message the client must refuse, which would leave it
// unsure whether the op ran.
constexpr int kMaxReceiveMessageBytes = 256 << 20;

// A peer's malformed message is lost data as far as this client is
// concerned, not a bad argument of the caller's.
absl::Status Malformed(absl::string_view what, const absl::Status& status) {
  return absl::DataLossError(
      absl::StrCat(what, ": malformed: ", status.message()));
}

// A server-streaming call read as raw messages, driven by the calling
// thread on a private completion queue (as gRPC's sync API does), so each
// read costs no thread hand-off. Ops never outlive the context's deadline,
// so no wait here can hang past it.
class RawStreamCall {
 public:
  // Starts the call; the request is sent while the first Read waits.
  RawStreamCall(grpc::GenericStub* stub, grpc::ClientContext* context,
                const std::string& method, const grpc::ByteBuffer& request) {
    // Initial metadata, the request and the half-close leave in one batch.
    context->set_initial_metadata_corked(true);
    call_ = stub->PrepareCall(context, method, &cq_);
    if (call_ == nullptr) return;
    call_->StartCall(nullptr);
    call_->Write(request, grpc::WriteOptions().set_last_message(), &write_);
  }

  // Every op has completed once Finish() returned, but some completions
  // (typically the request's write) may still sit in the queue, and
  // dequeuing one touches the op set inside call_: drain first, then free.
  ~RawStreamCall() {
    cq_.Shutdown();
    void* tag;
    bool ok;
    while (cq_.Next(&tag, &ok)) {
    }
    call_.reset();
  }

  // False once the stream has ended (normally or not).
  bool Read(grpc::ByteBuffer* message) {
    if (call_ == nullptr) return false;
    call_->Read(message, &read_);
    return Await(&read_);
  }

  grpc::Status Finish() {
    if (call_ == nullptr) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "the channel could not start the call");
    }
    grpc::Status status;
    call_->Finish(&status, &finish_);
    Await(&finish_);
    return status;
  }

 private:
  // Waits for the op tagged `tag`. Other completions are the request's
  // write, whose failure Finish() reports.
  bool Await(const void* tag) {
    void* got;
    bool ok = false;
    while (cq_.Next(&got, &ok)) {
      if (got == tag) return ok;
    }
    return false;
  }

  grpc::CompletionQueue cq_;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call_;
  // Distinct addresses that tag the three kinds of op.
  char write_ = 0, read_ = 0, finish_ = 0;
};

const std::string& FetchShardMethod() {
  static const auto* method = new std::string(
      absl::StrCat("/", v1::ShardService::service_full_name(), "/FetchShard"));
  return *method;
}

}  // namespace

// ---- ShardClient ------------------------------------------------------------

std::shared_ptr<grpc::Channel> NewShardChannel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxReceiveMessageBytes);
  return CreateTesseraChannel(address, args);
}

absl::Status AwaitPublished(absl::Time deadline, absl::string_view what,
                            int64_t number,
                            const std::function<bool()>& unpublished,
                            const std::function<absl::Status()>& again) {
  const absl::Time until = std::min(deadline, absl::Now() + absl::Seconds(1));
  absl::Duration pause = absl::Milliseconds(2);
  while (unpublished()) {
    if (absl::Now() + pause > until) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, ": version ", number,
          " is not published (still open, or aborted); a read by number "
          "reads published versions only"));
    }
    absl::SleepFor(pause);
    pause = std::min(pause * 2, absl::Milliseconds(100));
    RETURN_IF_ERROR(again());
  }
  return absl::OkStatus();
}

absl::Status ReceiveChunkStream(const std::shared_ptr<grpc::Channel>& channel,
                                const std::string& method,
                                const google::protobuf::MessageLite& request,
                                absl::Time deadline, absl::string_view what,
                                ShardAssembler* assembler,
                                const std::string& request_id) {
  grpc::ByteBuffer serialized;
  bool own_buffer;
  RETURN_IF_ERROR(FromGrpcStatus(
      grpc::SerializationTraits<google::protobuf::MessageLite>::Serialize(
          request, &serialized, &own_buffer)));
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  SetCallDeadline(context, deadline);
  if (!request_id.empty()) SetRequestId(context, request_id);
  // Cancelling the fetch ends a Read blocked on a stalled owner too.
  const Cancellation::Registration interrupt =
      OnCancel(assembler->cancel(), [&context] { context.TryCancel(); });
  RawStreamCall call(&stub, &context, method, serialized);
  grpc::ByteBuffer message;
  absl::Status status;
  while (status.ok() && call.Read(&message)) {
    status = assembler->Consume(message);
  }
  if (status.ok()) status = assembler->CheckCancel();
  if (!status.ok()) {
    context.TryCancel();
    while (call.Read(&message)) {
    }
  }
  const absl::Status rpc_status = FromGrpcStatus(call.Finish());
  RETURN_IF_ERROR(status);
  RETURN_IF_ERROR(Annotate(rpc_status, what));
  return assembler->Finish();
}

std::shared_ptr<ShardClient> ShardClient::Create(const std::string& address,
                                                 std::string data_plane_address,
                                                 std::string local_address,
                                                 int lanes) {
  return std::make_shared<ShardClient>(NewShardChannel(address),
                                       std::move(data_plane_address),
                                       std::move(local_address), lanes);
}

ShardClient::ShardClient(std::shared_ptr<grpc::Channel> channel,
                         std::string data_plane_address,
                         std::string local_address, int lanes)
    : channel_(std::move(channel)),
      data_plane_address_(std::move(data_plane_address)),
      local_(local_address.empty()
                 ? nullptr
                 : std::make_unique<LocalPathClient>(std::move(local_address))),
      lanes_(lanes),
      stub_(v1::ShardService::NewStub(channel_)) {}

ShardClient::~ShardClient() = default;

bool ShardClient::same_host() const {
  return local_ != nullptr && local_->same_host();
}

namespace {

v1::FetchShardRequest FetchRequest(absl::string_view tensor_id,
                                   int64_t shard_index,
                                   const FetchOptions& options) {
  v1::FetchShardRequest request;
  request.set_tensor_id(std::string(tensor_id));
  request.set_shard_index(shard_index);
  request.set_chunk_bytes(options.chunk_bytes);
  return request;
}

// FetchRequest for the box at `offsets` (in the shard) of `sizes`.
v1::FetchShardRequest RegionRequest(absl::string_view tensor_id,
                                    int64_t shard_index,
                                    absl::Span<const int64_t> offsets,
                                    absl::Span<const int64_t> sizes,
                                    const FetchOptions& options) {
  v1::FetchShardRequest request = FetchRequest(tensor_id, shard_index, options);
  request.mutable_region_offsets()->Add(offsets.begin(), offsets.end());
  request.mutable_region_sizes()->Add(sizes.begin(), sizes.end());
  return request;
}

// Runs lane(i, cancel) for each of `count` lanes at once, lane 0 on the
// calling thread, under a cancellation of their own: cancelled when the
// caller's `cancel` is, and when a lane fails, so that the others stop at
// once. Returns the first failure (never a CANCELLED it caused), or OK.
template <typename Lane>
absl::Status RunLanes(size_t count, const std::shared_ptr<Cancellation>& cancel,
                      const Lane& lane) {
  auto lanes = std::make_shared<Cancellation>();
  const Cancellation::Registration follow =
      OnCancel(cancel, [lanes] { lanes->Cancel(); });
  absl::Mutex mu;
  absl::Status first;
  const auto run = [&](size_t i) {
    absl::Status status = lane(i, lanes);
    if (status.ok()) return;
    {
      absl::MutexLock lock(&mu);
      if (!first.ok()) return;
      first = std::move(status);
    }
    lanes->Cancel();
  };
  std::vector<std::thread> threads;
  threads.reserve(count);
  for (size_t i = 1; i < count; ++i) threads.emplace_back(run, i);
  run(0);
  for (std::thread& thread : threads) thread.join();
  return first;
}

// A data-plane reply (BulkFetchReply, BulkWriteReply, DescribeDigestReply:
// each carries a status code and message) from `frame`; DATA_LOSS when it
// does not parse or carries no valid code.
template <typename Reply>
absl::StatusOr<Reply> ParseReply(const std::string& frame,
                                 absl::string_view what) {
  Reply reply;
  if (!reply.ParseFromString(frame) || reply.code() < 0 ||
      reply.code() > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    return absl::DataLossError(absl::StrCat(what, ": malformed reply"));
  }
  return reply;
}

// The status a reply carries.
template <typename Reply>
absl::Status ReplyStatus(const Reply& reply) {
  return absl::Status(static_cast<absl::StatusCode>(reply.code()),
                      reply.message());
}

// `on_chunk` made safe to call from every lane at once (null stays null).
std::function<void(int64_t)> Serialized(std::function<void(int64_t)> on_chunk,
                                        absl::Mutex* mu) {
  if (!on_chunk) return nullptr;
  return [on_chunk = std::move(on_chunk), mu](int64_t bytes) {
    absl::MutexLock lock(mu);
    on_chunk(bytes);
  };
}

std::string FetchWhat(const v1::FetchShardRequest& request) {
  std::string what = absl::StrCat("fetching shard ", request.shard_index(),
                                  " of tensor ", request.tensor_id());
  if (!request.region_sizes().empty()) {
    absl::StrAppend(&what, " (region offsets [",
                    absl::StrJoin(request.region_offsets(), ", "), "] sizes [",
                    absl::StrJoin(request.region_sizes(), ", "), "])");
  }
  return what;
}

}  // namespace

int64_t HostShardBytes(const v1::ShardedTensorMetadata& metadata,
                       size_t shard) {
  if (shard >= static_cast<size_t>(metadata.shards_metadata_size())) return -1;
  const v1::ShardMetadata& placed =
      metadata.shards_metadata(static_cast<int>(shard));
  if (placed.placement().device().type() != v1::DEVICE_TYPE_CPU) return -1;
  absl::StatusOr<DType> dtype = FromProto(metadata.tensor_properties().dtype());
  if (!dtype.ok()) return -1;
  int64_t bytes = static_cast<int64_t>(ElementSize(*dtype));
  for (const int64_t size : placed.shard_sizes()) {
    if (size < 0 || __builtin_mul_overflow(bytes, size, &bytes)) return -1;
  }
  return bytes;
}

namespace {

// Whether a kAuto fetch or a write of `destination_bytes` (-1: an
// allocating fetch, whose size is the shard's) of a shard of `shard_bytes`
// (-1: unknown) is too small for the local path (kLocalPathMinBytes).
bool TooSmallForLocal(int64_t shard_bytes, int64_t destination_bytes,
                      int64_t local_min_bytes) {
  const int64_t judged = shard_bytes >= 0 ? shard_bytes : destination_bytes;
  return judged >= 0 && judged < local_min_bytes;
}

}  // namespace

absl::Status ShardClient::Fetch(const v1::FetchShardRequest& request,
                                const FetchOptions& options,
                                ShardAssembler* assembler) const {
  assembler->set_on_chunk(options.on_chunk);
  assembler->set_cancel(options.cancel);
  const bool required = options.local_path == LocalPath::kRequired;
  const Tensor& destination = assembler->destination();
  const bool small = TooSmallForLocal(
      options.shard_bytes,
      destination.defined() ? static_cast<int64_t>(destination.nbytes()) : -1,
      options.local_min_bytes);
  if (options.local_path == LocalPath::kOff ||
      (!required && (local_ == nullptr || !local_->same_host() || small))) {
    return FetchStream(request, options, assembler);
  }
  const absl::Time deadline = absl::Now() + options.timeout;
  const LocalAttempt local =
      local_ != nullptr
          ? local_->Fetch(request, deadline,
                          /*skip_after_failure=*/!required, assembler)
          : LocalAttempt{absl::FailedPreconditionError(
                             "the owner publishes no local address"),
                         true};
  if (!local.fall_back) return local.status;
  if (required) {
    return absl::FailedPreconditionError(
        absl::StrCat(FetchWhat(request),
                     ": the local path is required but cannot be taken: ",
                     local.status.message()));
  }
  // The stream gets what is left of the fetch's time.
  FetchOptions rest = options;
  rest.timeout = std::max(deadline - absl::Now(), absl::ZeroDuration());
  return FetchStream(request, rest, assembler);
}

absl::Status ShardClient::FetchStream(const v1::FetchShardRequest& request,
                                      const FetchOptions& options,
                                      ShardAssembler* assembler) const {
  return data_plane_address_.empty()
             ? Stream(request, options, assembler)
             : DataPlaneStream(request, options, assembler);
}

absl::Status ShardClient::Stream(const v1::FetchShardRequest& request,
                                 const FetchOptions& options,
                                 ShardAssembler* assembler) const {
  return ReceiveChunkStream(channel_, FetchShardMethod(), request,
                            absl::Now() + options.timeout, FetchWhat(request),
                            assembler);
}

absl::StatusOr<Shard> ShardClient::FetchShard(
    absl::string_view tensor_id, int64_t shard_index,
    const FetchOptions& options) const {
  ShardAssembler assembler(tensor_id, shard_index, options.device,
                           options.pin_memory);
  RETURN_IF_ERROR(Fetch(FetchRequest(tensor_id, shard_index, options), options,
                        &assembler));
  if (options.served_version != nullptr) {
    *options.served_version = assembler.version();
  }
  return Shard{assembler.destination(), *assembler.metadata()};
}

absl::Status ShardClient::FetchShardInto(absl::string_view tensor_id,
                                         int64_t shard_index,
                                         const Tensor& destination,
                                         const FetchOptions& options) const {
  if (!destination.defined()) {
    return absl::InvalidArgumentError("FetchShardInto: undefined destination");
  }
  const int lanes = FetchLanes(options, destination.nbytes());
  if (lanes > 1 && destination.dim() > 0) {
    // Striped as boxes of the whole shard; each part checks it lies in the
    // shard, the shard's sizes are checked here.
    const std::vector<int64_t> origin(destination.dim(), 0);
    std::optional<ShardMetadata> metadata;
    RETURN_IF_ERROR(FetchStriped(tensor_id, shard_index, origin, destination,
                                 options, lanes, options.served_version,
                                 &metadata));
    if (metadata.has_value() &&
        metadata->shard_sizes() != destination.sizes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "fetching shard ", shard_index, " of tensor ", tensor_id,
          ": the destination's sizes [",
          absl::StrJoin(destination.sizes(), ", "), "] are not the shard's [",
          absl::StrJoin(metadata->shard_sizes(), ", "), "]"));
    }
    return absl::OkStatus();
  }
  ShardAssembler assembler(tensor_id, shard_index, destination);
  RETURN_IF_ERROR(Fetch(FetchRequest(tensor_id, shard_index, options), options,
                        &assembler));
  if (options.served_version != nullptr) {
    *options.served_version = assembler.version();
  }
  return absl::OkStatus();
}

absl::Status ShardClient::FetchRegionInto(
    absl::string_view tensor_id, int64_t shard_index,
    absl::Span<const int64_t> region_offsets, const Tensor& destination,
    const FetchOptions& options) const {
  if (!destination.defined()) {
    return absl::InvalidArgumentError("FetchRegionInto: undefined destination");
  }
  const int lanes = FetchLanes(options, destination.nbytes());
  if (lanes > 1 && destination.dim() > 0 &&
      region_offsets.size() == destination.sizes().size()) {
    return FetchStriped(tensor_id, shard_index, region_offsets, destination,
                        options, lanes, options.served_version, nullptr);
  }
  const v1::FetchShardRequest request = RegionRequest(
      tensor_id, shard_index, region_offsets, destination.sizes(), options);
  ShardAssembler assembler(tensor_id, shard_index, destination);
  assembler.ExpectRegion(region_offsets, destination.sizes());
  RETURN_IF_ERROR(Fetch(request, options, &assembler));
  if (options.served_version != nullptr) {
    *options.served_version = assembler.version();
  }
  return absl::OkStatus();
}

int ShardClient::FetchLanes(const FetchOptions& options, int64_t bytes) const {
  if (data_plane_address_.empty() ||
      options.local_path == LocalPath::kRequired) {
    return 1;
  }
  // A fetch the local path will take is not striped; one whose owner's
  // socket could not be reached lately (another network namespace) is.
  const bool local =
      options.local_path == LocalPath::kAuto && local_ != nullptr &&
      local_->Usable(true).ok() &&
      !TooSmallForLocal(options.shard_bytes, bytes, options.local_min_bytes);
  if (local) return 1;
  return LanesFor(bytes, options.lanes);
}

int ShardClient::LanesFor(int64_t bytes, int asked) const {
  return LaneCount(bytes, asked > 0 ? asked : lanes_);
}

absl::Status ShardClient::FetchStriped(
    absl::string_view tensor_id, int64_t shard_index,
    absl::Span<const int64_t> region_offsets, const Tensor& destination,
    const FetchOptions& options, int lanes, int64_t* version,
    std::optional<ShardMetadata>* metadata) const {
  const std::vector<LanePart> parts =
      SplitIntoLanes(region_offsets, destination.sizes(), lanes);
  std::vector<Tensor> outs;
  outs.reserve(parts.size());
  for (const LanePart& part : parts) {
    ASSIGN_OR_RETURN(Tensor out,
                     destination.Narrow(part.dim, part.start, part.length));
    outs.push_back(std::move(out));
  }
  const absl::Time deadline = absl::Now() + options.timeout;
  absl::Mutex chunk_mu;
  const std::function<void(int64_t)> on_chunk =
      Serialized(options.on_chunk, &chunk_mu);
  std::vector<int64_t> versions(parts.size(), 0);
  const auto fetch_part = [&](size_t i, absl::string_view id,
                              const std::shared_ptr<Cancellation>& cancel) {
    const v1::FetchShardRequest request = RegionRequest(
        id, shard_index, parts[i].offsets, outs[i].sizes(), options);
    ShardAssembler assembler(id, shard_index, outs[i]);
    assembler.ExpectRegion(parts[i].offsets, outs[i].sizes());
    assembler.set_on_chunk(on_chunk);
    assembler.set_cancel(cancel);
    FetchOptions lane = options;
    lane.timeout = std::max(deadline - absl::Now(), absl::ZeroDuration());
    RETURN_IF_ERROR(DataPlaneStream(request, lane, &assembler));
    versions[i] = assembler.version();
    if (i == 0 && metadata != nullptr) *metadata = assembler.metadata();
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(
      RunLanes(parts.size(), options.cancel,
               [&](size_t i, const std::shared_ptr<Cancellation>& cancel) {
                 return fetch_part(i, tensor_id, cancel);
               }));
  const int64_t newest = *std::max_element(versions.begin(), versions.end());
  std::vector<size_t> lagging;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (versions[i] != newest) lagging.push_back(i);
  }
  if (!lagging.empty() && VersionNumber(tensor_id) == 0) {
    // A version was published while the lanes read: the parts that got an
    // older one are read again at the newest (a kept version is served
    // until it falls out of the kept window; then this fails NOT_FOUND).
    const std::optional<AtLeast> at_least = ParseAtLeast(tensor_id);
    const std::string id =
        VersionId(at_least.has_value() ? absl::string_view(at_least->latest_id)
                                       : tensor_id,
                  newest);
    RETURN_IF_ERROR(
        RunLanes(lagging.size(), options.cancel,
                 [&](size_t k, const std::shared_ptr<Cancellation>& cancel) {
                   return fetch_part(lagging[k], id, cancel);
                 }));
  }
  if (version != nullptr) *version = newest;
  return absl::OkStatus();
}

absl::StatusOr<DataConnection> ShardClient::TakeConnection(
    absl::Time deadline, bool reuse,
    const std::shared_ptr<Cancellation>& cancel) const {
  // Pooled connections may be the parent's (wire/fork_guard.h).
  RETURN_IF_ERROR(CheckNotForkedAfterGrpc(
      absl::StrCat("connecting to data plane ", data_plane_address_)));
  if (reuse) {
    absl::MutexLock lock(&pool_mu_);
    if (!idle_.empty()) {
      DataConnection connection = std::move(idle_.back());
      idle_.pop_back();
      return connection;
    }
  }
  ASSIGN_OR_RETURN(UniqueFd socket, ConnectTcp(data_plane_address_, deadline));
  DataConnection connection = DataConnection::Plain(UniqueFd());
  // A stalled server accepts (the kernel does) but never handshakes.
  // Declared after the socket's owners, so unregistered before they close.
  const Cancellation::Registration interrupt =
      OnCancel(cancel, [fd = socket.get()] { InterruptSocket(fd); });
  ASSIGN_OR_RETURN(std::shared_ptr<TlsContext> tls, ProcessClientTlsContext());
  if (tls != nullptr) {
    const size_t colon = data_plane_address_.rfind(':');
    std::string host = data_plane_address_.substr(0, colon);
    if (host.size() >= 2 && host.front() == '[') {
      host = host.substr(1, host.size() - 2);
    }
    ASSIGN_OR_RETURN(connection, DataConnection::Connect(std::move(socket),
                                                         host, *tls, deadline));
  } else {
    connection = DataConnection::Plain(std::move(socket));
  }
  ASSIGN_OR_RETURN(const std::string token,
                   ProcessTokenFor(data_plane_address_));
  if (token.empty()) {
    RETURN_IF_ERROR(connection.WriteFull(kDataPlaneRequestMagic.data(),
                                         kDataPlaneRequestMagic.size(),
                                         deadline, true));
  } else {
    RETURN_IF_ERROR(connection.WriteFull(kDataPlaneRequestTokenMagic.data(),
                                         kDataPlaneRequestTokenMagic.size(),
                                         deadline, true));
    RETURN_IF_ERROR(connection.WriteFrame(token, deadline, true));
  }
  return connection;
}

void ShardClient::ReturnConnection(DataConnection socket) const {
  absl::MutexLock lock(&pool_mu_);
  idle_.push_back(std::move(socket));
}

void ShardClient::DropIdleConnections() const {
  std::vector<DataConnection> closing;
  absl::MutexLock lock(&pool_mu_);
  closing.swap(idle_);
}

absl::Status ShardClient::DataPlaneStream(const v1::FetchShardRequest& request,
                                          const FetchOptions& options,
                                          ShardAssembler* assembler) const {
  const std::string what = FetchWhat(request);
  const absl::Time deadline = absl::Now() + options.timeout;
  const std::shared_ptr<Cancellation>& cancel = assembler->cancel();
  // A cancelled fetch says so, whatever its interrupted wait returned.
  const auto failed = [&](const absl::Status& status) {
    return Cancelled(cancel) ? assembler->CheckCancel()
                             : Annotate(status, what);
  };
  v1::DataPlaneRequest framed;
  *framed.mutable_fetch() = request;
  RETURN_IF_ERROR(assembler->CheckCancel());
  absl::StatusOr<Exchange> exchange =
      Request(framed.SerializeAsString(), deadline, cancel);
  if (!exchange.ok()) return failed(exchange.status());
  ASSIGN_OR_RETURN(const v1::BulkFetchReply reply,
                   ParseReply<v1::BulkFetchReply>(exchange->reply, what));
  if (reply.code() != 0) {
    Release(*std::move(exchange), cancel);
    return Annotate(ReplyStatus(reply), what);
  }
  RETURN_IF_ERROR(assembler->Start(reply.header()));
  absl::Status received =
      ReceiveChunks(exchange->connection, deadline, assembler);
  if (!received.ok() && !absl::IsDataLoss(received)) {
    return failed(received);
  }
  RETURN_IF_ERROR(received);
  RETURN_IF_ERROR(assembler->Finish());
  Release(*std::move(exchange), cancel);
  return absl::OkStatus();
}

std::vector<absl::Status> ShardClient::FetchRegionsPipelined(
    absl::Span<const RegionFetch> boxes, const FetchOptions& options) const {
  std::vector<absl::Status> results(
      boxes.size(), absl::UnavailableError(
                        "not answered: the batch's connection failed first"));
  if (data_plane_address_.empty()) {
    std::fill(results.begin(), results.end(),
              absl::FailedPreconditionError("no data plane to pipeline on"));
    return results;
  }
  const size_t count = std::min(boxes.size(), kMaxPipelinedFetches);
  for (size_t i = count; i < boxes.size(); ++i) {
    results[i] = absl::InvalidArgumentError(
        absl::StrCat("at most ", kMaxPipelinedFetches, " boxes per batch"));
  }
  if (count == 0) return results;
  const absl::Time deadline = absl::Now() + options.timeout;
  const std::shared_ptr<Cancellation>& cancel = options.cancel;
  if (Cancelled(cancel)) return results;
  // A pooled connection the server closed while idle fails the first
  // answer: the batch is then sent once more on a new one.
  for (int attempt = 0; attempt < 2; ++attempt) {
    absl::StatusOr<DataConnection> taken =
        TakeConnection(deadline, attempt == 0, cancel);
    if (!taken.ok()) {
      std::fill(results.begin(), results.begin() + count, taken.status());
      return results;
    }
    DataConnection connection = *std::move(taken);
    const Cancellation::Registration interrupt =
        OnCancel(cancel, [fd = connection.fd()] { InterruptSocket(fd); });
    absl::Status sent;
    for (size_t i = 0; i < count && sent.ok(); ++i) {
      const RegionFetch& box = boxes[i];
      v1::DataPlaneRequest framed;
      *framed.mutable_fetch() =
          RegionRequest(box.tensor_id, box.shard_index, box.region_offsets,
                        box.destination.sizes(), options);
      sent = connection.WriteFrame(framed.SerializeAsString(), deadline,
                                   /*more=*/i + 1 < count);
    }
    if (!sent.ok()) {
      // A pooled connection the server closed: once more on a new one.
      if (attempt == 0 && !Cancelled(cancel)) {
        DropIdleConnections();
        continue;
      }
      std::fill(results.begin(), results.begin() + count,
                Annotate(sent, "sending pipelined fetches"));
      return results;
    }
    bool broken = false;
    // The first answer never came on a pooled connection the server had
    // closed while it idled: the batch goes once more on a new one.
    bool stale_pool = false;
    size_t answered = 0;
    for (; answered < count && !broken; ++answered) {
      const RegionFetch& box = boxes[answered];
      const std::string what =
          absl::StrCat("fetching shard ", box.shard_index, " of tensor ",
                       box.tensor_id, " (pipelined)");
      absl::StatusOr<std::string> frame = connection.ReadFrame(deadline);
      if (!frame.ok()) {
        broken = true;
        if (attempt == 0 && answered == 0 &&
            absl::IsUnavailable(frame.status()) && !Cancelled(cancel)) {
          stale_pool = true;
          DropIdleConnections();
          break;
        }
        results[answered] = Annotate(frame.status(), what);
        break;
      }
      absl::StatusOr<v1::BulkFetchReply> reply =
          ParseReply<v1::BulkFetchReply>(*frame, what);
      if (!reply.ok()) {
        results[answered] = reply.status();
        broken = true;
        break;
      }
      if (reply->code() != 0) {
        // Refused; nothing of it follows on the connection.
        results[answered] = Annotate(ReplyStatus(*reply), what);
        continue;
      }
      ShardAssembler assembler(box.tensor_id, box.shard_index, box.destination);
      assembler.ExpectRegion(box.region_offsets, box.destination.sizes());
      absl::Status received = assembler.Start(reply->header());
      if (received.ok()) {
        received = ReceiveChunks(connection, deadline, &assembler);
      }
      if (received.ok()) received = assembler.Finish();
      if (!received.ok()) {
        results[answered] = Annotate(received, what);
        broken = true;
        break;
      }
      if (box.served_version != nullptr) {
        *box.served_version = assembler.version();
      }
      results[answered] = absl::OkStatus();
    }
    if (!broken && !Cancelled(cancel)) {
      ReturnConnection(std::move(connection));
    }
    if (!stale_pool) return results;
  }
  return results;
}

absl::StatusOr<ShardClient::Exchange> ShardClient::Request(
    const std::string& frame, absl::Time deadline,
    const std::shared_ptr<Cancellation>& cancel) const {
  // A pooled connection may have been closed by the server meanwhile; a
  // fresh one is tried once before giving up. The retry must not take
  // another pooled connection: those idled at least as long, so after a
  // server's idle timeout they are all closed, and they are dropped.
  for (int attempt = 0;; ++attempt) {
    if (Cancelled(cancel)) return absl::CancelledError("cancelled");
    ASSIGN_OR_RETURN(DataConnection socket,
                     TakeConnection(deadline, attempt == 0, cancel));
    Exchange exchange{std::move(socket), {}, {}};
    // Cancelling interrupts any wait on the owner; such a connection is
    // never pooled again (the registration ends before it would be).
    exchange.interrupt = OnCancel(
        cancel, [fd = exchange.connection.fd()] { InterruptSocket(fd); });
    absl::Status sent = exchange.connection.WriteFrame(frame, deadline);
    absl::StatusOr<std::string> reply =
        sent.ok() ? exchange.connection.ReadFrame(deadline) : sent;
    if (reply.ok()) {
      exchange.reply = *std::move(reply);
      return exchange;
    }
    if (attempt > 0 || !absl::IsUnavailable(reply.status()) ||
        Cancelled(cancel)) {
      return reply.status();
    }
    DropIdleConnections();
  }
}

void ShardClient::Release(Exchange exchange,
                          const std::shared_ptr<Cancellation>& cancel) const {
  exchange.interrupt.Reset();
  if (!Cancelled(cancel)) ReturnConnection(std::move(exchange.connection));
}

absl::Status ShardClient::ReceiveChunks(DataConnection& stream,
                                        absl::Time deadline,
                                        ShardAssembler* assembler) const {
  char prefix[kDataPlaneChunkPrefixBytes];
  while (assembler->received_bytes() < assembler->total_bytes()) {
    RETURN_IF_ERROR(stream.ReadFull(prefix, sizeof(prefix), deadline));
    const ChunkPrefix chunk = DecodeChunkPrefix(prefix);
    ASSIGN_OR_RETURN(char* place, assembler->Place(chunk.offset, chunk.length));
    RETURN_IF_ERROR(stream.ReadIntoDestination(
        place, static_cast<size_t>(chunk.length), deadline));
    RETURN_IF_ERROR(assembler->Verify(
        chunk.offset, chunk.length,
        stream.authenticated() ? std::nullopt
                               : std::optional<uint64_t>(chunk.checksum)));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> ShardClient::WriteRegion(
    absl::string_view tensor_id, int64_t shard_index,
    absl::Span<const int64_t> region_offsets, const Tensor& data,
    const RegionWriteOptions& options) const {
  if (!data.defined()) {
    return absl::InvalidArgumentError("WriteRegion: undefined data");
  }
  const bool local = local_ != nullptr && local_->same_host() &&
                     !TooSmallForLocal(options.shard_bytes,
                                       static_cast<int64_t>(data.nbytes()),
                                       options.local_min_bytes);
  if (!local && data_plane_address_.empty()) return false;
  const std::string what = absl::StrCat(
      "writing ", options.replica ? "the replica of " : "", "shard ",
      shard_index, " of tensor ", tensor_id, " over the data plane");
  // The bytes to send, row-major in host memory.
  ASSIGN_OR_RETURN(const Tensor bytes, data.device().is_cpu()
                                           ? data.Contiguous()
                                           : data.To(Device::Cpu()));
  const int64_t total = static_cast<int64_t>(bytes.nbytes());
  const char* const base = static_cast<const char*>(bytes.data_ptr());
  v1::DataPlaneRequest framed;
  v1::BulkWriteRequest& request = *framed.mutable_write();
  request.set_tensor_id(std::string(tensor_id));
  request.set_shard_index(shard_index);
  request.set_replica(options.replica);
  request.mutable_region_offsets()->Add(region_offsets.begin(),
                                        region_offsets.end());
  request.mutable_region_sizes()->Add(data.sizes().begin(), data.sizes().end());
  request.set_dtype(ToProto(data.dtype()));
  request.set_total_bytes(total);
  request.set_chunk_bytes(options.chunk_bytes);
  const absl::Time deadline = options.deadline;
  const std::shared_ptr<Cancellation>& cancel = options.cancel;
  if (local) {
    // The owner on this host lends the shard's memory file writable.
    v1::FetchShardRequest box;
    box.set_tensor_id(options.replica ? ReplicaTensorId(tensor_id)
                                      : std::string(tensor_id));
    box.set_shard_index(shard_index);
    *box.mutable_region_offsets() = request.region_offsets();
    *box.mutable_region_sizes() = request.region_sizes();
    const LocalAttempt attempt = local_->Write(box, bytes, deadline, cancel);
    if (!attempt.fall_back) {
      RETURN_IF_ERROR(attempt.status);
      if (options.on_chunk && total > 0) options.on_chunk(total);
      return true;
    }
    if (data_plane_address_.empty()) return false;
  }
  const int lanes = LanesFor(total, options.lanes);
  if (lanes <= 1) {
    bool started = false;
    return WriteStream(framed, base, total, options, what, &started, nullptr);
  }
  // Striped: each part of the box goes over a connection of its own.
  const std::vector<LanePart> parts =
      SplitIntoLanes(region_offsets, data.sizes(), lanes);
  std::vector<Tensor> slabs;
  slabs.reserve(parts.size());
  for (const LanePart& part : parts) {
    ASSIGN_OR_RETURN(Tensor slab,
                     bytes.Narrow(part.dim, part.start, part.length));
    slabs.push_back(std::move(slab));
  }
  absl::Mutex chunk_mu;
  RegionWriteOptions lane_options = options;
  lane_options.on_chunk = Serialized(options.on_chunk, &chunk_mu);
  // What became of each lane: set by the lane itself, read once every lane
  // was joined.
  struct LaneOutcome {
    bool started = false;    // Bytes began to land.
    bool fell_back = false;  // The server left this part to gRPC.
    bool held_back = false;  // Sent nothing: another lane was refused.
    absl::Status status;
  };
  std::vector<LaneOutcome> outcomes(parts.size());
  // No lane sends a byte before every lane has the server's go-ahead: a
  // box one lane's part of is refused (out of range, a wrong dtype, a
  // part the server leaves to gRPC) is written by none.
  absl::Mutex gate_mu;
  size_t arrived = 0;
  bool refused = false;
  // A lane at the gate (`go`: with its go-ahead; false: refused or failed
  // before it): true once every lane has its go-ahead, false as soon as
  // one was refused.
  const auto arrive = [&](bool go) {
    absl::MutexLock lock(&gate_mu);
    ++arrived;
    if (!go) refused = true;
    const auto open = [&] { return refused || arrived == parts.size(); };
    gate_mu.Await(absl::Condition(&open));
    return !refused;
  };
  // Each lane's outcome is kept and weighed below, not just the first
  // failure.
  RunLanes(parts.size(), options.cancel,
           [&](size_t i, const std::shared_ptr<Cancellation>& cancel) {
             v1::DataPlaneRequest lane = framed;
             v1::BulkWriteRequest& part = *lane.mutable_write();
             part.mutable_region_offsets()->Clear();
             part.mutable_region_offsets()->Add(parts[i].offsets.begin(),
                                                parts[i].offsets.end());
             part.mutable_region_sizes()->Clear();
             part.mutable_region_sizes()->Add(slabs[i].sizes().begin(),
                                              slabs[i].sizes().end());
             part.set_total_bytes(static_cast<int64_t>(slabs[i].nbytes()));
             RegionWriteOptions own = lane_options;
             own.cancel = cancel;
             LaneOutcome& outcome = outcomes[i];
             bool at_gate = false;
             absl::StatusOr<bool> wrote = WriteStream(
                 lane, static_cast<const char*>(slabs[i].data_ptr()),
                 static_cast<int64_t>(slabs[i].nbytes()), own,
                 absl::StrCat(what, " (lane ", i + 1, " of ", parts.size(),
                              ": rows [", parts[i].start, ", ",
                              parts[i].start + parts[i].length,
                              ") of dimension ", parts[i].dim, ")"),
                 &outcome.started, [&] {
                   at_gate = true;
                   outcome.held_back = !arrive(true);
                   return !outcome.held_back;
                 });
             if (!at_gate) arrive(false);
             outcome.fell_back = wrote.ok() && !*wrote;
             outcome.status = wrote.status();
             // A lane held back at the gate is no failure of its own.
             return outcome.held_back ? absl::OkStatus() : wrote.status();
           })
      .IgnoreError();
  bool any_started = false;
  bool any_fell_back = false;
  absl::Status status;
  for (const LaneOutcome& outcome : outcomes) {
    any_started = any_started || outcome.started;
    any_fell_back = any_fell_back || outcome.fell_back;
    // The lane's own failure; a CANCELLED one only when no other lane
    // failed (it may have been cancelled because another did).
    if (!outcome.held_back && !outcome.status.ok() &&
        (status.ok() ||
         (absl::IsCancelled(status) && !absl::IsCancelled(outcome.status)))) {
      status = outcome.status;
    }
  }
  if (!status.ok()) {
    if (any_started &&
        !absl::StrContains(status.message(), "may be partly written")) {
      return Annotate(status, absl::StrCat(what,
                                           " (other lanes wrote: the box may "
                                           "be partly written)"));
    }
    return status;
  }
  // A part the server would not take here (nothing of the box was sent):
  // the caller writes the whole box through gRPC.
  return !any_fell_back;
}

absl::StatusOr<bool> ShardClient::WriteStream(
    const v1::DataPlaneRequest& framed, const char* base, int64_t total,
    const RegionWriteOptions& options, const std::string& what, bool* started,
    const std::function<bool()>& go_ahead) const {
  // A small box goes whole with the request: one round trip.
  const bool inline_box = total > 0 && total <= kInlineWriteBytes;
  std::string serialized;
  if (inline_box) {
    v1::DataPlaneRequest with_data = framed;
    v1::BulkWriteRequest& write = *with_data.mutable_write();
    write.set_data(base, static_cast<size_t>(total));
    write.set_data_checksum(Checksum64(base, static_cast<size_t>(total)));
    serialized = with_data.SerializeAsString();
  } else {
    serialized = framed.SerializeAsString();
  }
  const absl::Time deadline = options.deadline;
  const std::shared_ptr<Cancellation>& cancel = options.cancel;
  int64_t sent_bytes = 0;
  // After the go-ahead, bytes land in the shard as they arrive.
  *started = false;
  const auto failed = [&](const absl::Status& status) {
    const std::string partly =
        *started ? " (the box may be partly written)" : "";
    if (Cancelled(cancel)) {
      return absl::CancelledError(
          absl::StrCat(what, ": cancelled by the caller after ", sent_bytes,
                       " of ", total, " bytes", partly));
    }
    return Annotate(status, absl::StrCat(what, partly));
  };
  absl::StatusOr<Exchange> exchange = Request(serialized, deadline, cancel);
  if (!exchange.ok()) return failed(exchange.status());
  ASSIGN_OR_RETURN(const v1::BulkWriteReply go,
                   ParseReply<v1::BulkWriteReply>(exchange->reply, what));
  if (go.code() != 0 || go.fallback()) {
    Release(*std::move(exchange), cancel);
    if (go.code() != 0) return Annotate(ReplyStatus(go), what);
    return false;  // Nothing written: the caller takes gRPC.
  }
  if (inline_box && go.chunk_bytes() == 0) {
    // The last reply: the server wrote the box that came with the request
    // (one that predates inline boxes answers with a go-ahead instead).
    Release(*std::move(exchange), cancel);
    if (go.bytes_written() != total) {
      return absl::DataLossError(absl::StrCat(what, ": the server wrote ",
                                              go.bytes_written(), " of ", total,
                                              " bytes"));
    }
    if (options.on_chunk) options.on_chunk(total);
    return true;
  }
  if (go.chunk_bytes() <= 0) {
    return absl::DataLossError(absl::StrCat(
        what, ": the server allows chunks of ", go.chunk_bytes(), " bytes"));
  }
  if (go_ahead && !go_ahead()) {
    // Another lane of the write was refused: no byte of this one is sent,
    // and its connection is closed (the server, awaiting chunks, reads the
    // end of the stream and writes nothing).
    return absl::AbortedError(
        absl::StrCat(what, ": not sent, another lane was refused"));
  }
  *started = true;
  DataConnection& socket = exchange->connection;
  // Several chunks are hashed ahead on a helper (wire/chunk_checksums.h).
  ChunkChecksums checksums(!socket.authenticated(), base, total,
                           go.chunk_bytes());
  char prefix[kDataPlaneChunkPrefixBytes];
  while (sent_bytes < total) {
    const int64_t size = std::min(go.chunk_bytes(), total - sent_bytes);
    const char* chunk = base + sent_bytes;
    const uint64_t checksum = checksums.For(sent_bytes, chunk, size);
    EncodeChunkPrefix(ChunkPrefix{sent_bytes, size, checksum}, prefix);
    absl::Status wrote =
        socket.WriteFull(prefix, sizeof(prefix), deadline, /*more=*/true);
    if (wrote.ok()) {
      wrote = socket.WriteFull(chunk, static_cast<size_t>(size), deadline);
    }
    if (!wrote.ok()) return failed(wrote);
    sent_bytes += size;
    if (options.on_chunk) options.on_chunk(size);
  }
  absl::StatusOr<std::string> last = socket.ReadFrame(deadline);
  if (!last.ok()) return failed(last.status());
  ASSIGN_OR_RETURN(const v1::BulkWriteReply done,
                   ParseReply<v1::BulkWriteReply>(*last, what));
  // The server read the whole stream either way: the connection is in step.
  Release(*std::move(exchange), cancel);
  if (done.code() != 0) return failed(ReplyStatus(done));
  if (done.bytes_written() != total) {
    return absl::DataLossError(absl::StrCat(what, ": the server wrote ",
                                            done.bytes_written(), " of ", total,
                                            " bytes"));
  }
  return true;
}

absl::StatusOr<uint64_t> ShardClient::DescribeDigest(
    const std::string& name, absl::Time deadline) const {
  if (data_plane_address_.empty()) {
    return absl::FailedPreconditionError("no data plane to ask");
  }
  v1::DataPlaneRequest framed;
  framed.mutable_describe_digest()->set_name(name);
  ASSIGN_OR_RETURN(Exchange exchange,
                   Request(framed.SerializeAsString(), deadline, nullptr));
  const std::string what = absl::StrCat("the digest of tensor ", name);
  ASSIGN_OR_RETURN(const v1::DescribeDigestReply reply,
                   ParseReply<v1::DescribeDigestReply>(exchange.reply, what));
  Release(std::move(exchange), nullptr);
  if (reply.code() != 0) return Annotate(ReplyStatus(reply), what);
  return reply.digest();
}

absl::StatusOr<TensorDescription> ShardClient::DescribeTensor(
    absl::string_view tensor_id, absl::Duration timeout) const {
  grpc::ClientContext context;
  SetCallDeadline(context, absl::Now() + timeout);
  v1::DescribeTensorRequest request;
  request.set_tensor_id(std::string(tensor_id));
  v1::DescribeTensorResponse response;
  const std::string what = absl::StrCat("describing tensor ", tensor_id);
  RETURN_IF_ERROR(Annotate(
      FromGrpcStatus(stub_->DescribeTensor(&context, request, &response)),
      what));
  TensorDescription description;
  absl::StatusOr<ShardedTensorMetadata> metadata =
      FromProto(response.metadata());
  if (!metadata.ok()) return Malformed(what, metadata.status());
  description.metadata = *std::move(metadata);
  description.local_shard_indices.assign(response.local_shard_indices().begin(),
                                         response.local_shard_indices().end());
  return description;
}

}  // namespace tessera
