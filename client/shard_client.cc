#include "client/shard_client.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/grpc_status.h"
#include "client/local_fetch.h"
#include "common/cuda_util.h"
#include "common/proto_convert.h"
#include "common/region.h"
#include "common/status_macros.h"
#include "grpcpp/client_context.h"
#include "grpcpp/completion_queue.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack.
#include "xxhash.h"

namespace tessera {
namespace {

// Well above ShardServiceOptions::max_chunk_bytes plus the header, so any
// server configuration the service accepts can be read.
constexpr int kMaxReceiveMessageBytes = 64 << 20;

// A peer's malformed message is lost data as far as this client is
// concerned, not a bad argument of the caller's.
absl::Status Malformed(absl::string_view what, const absl::Status& status) {
  return absl::DataLossError(
      absl::StrCat(what, ": malformed: ", status.message()));
}

std::chrono::system_clock::time_point DeadlineAfter(absl::Duration timeout) {
  return absl::ToChronoTime(absl::Now() + timeout);
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

// ---- Wire parsing ----------------------------------------------------------

// Reads protobuf wire primitives across the slices of a message, handing
// out length-delimited fields as views into the slices (no copy).
class SliceReader {
 public:
  explicit SliceReader(const std::vector<grpc::Slice>& slices)
      : slices_(slices) {
    SkipEmptySlices();
  }

  bool done() const { return slice_ == slices_.size(); }

  bool ReadVarint(uint64_t* value) {
    *value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t byte;
      if (!ReadByte(&byte)) return false;
      *value |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) return true;
    }
    return false;
  }

  bool ReadFixed64(uint64_t* value) {
    *value = 0;
    for (int i = 0; i < 8; ++i) {
      uint8_t byte;
      if (!ReadByte(&byte)) return false;
      *value |= static_cast<uint64_t>(byte) << (8 * i);
    }
    return true;
  }

  // The next `size` bytes as views into the slices; null `views` skips.
  bool Read(uint64_t size, std::vector<absl::string_view>* views) {
    while (size > 0) {
      if (done()) return false;
      const grpc::Slice& slice = slices_[slice_];
      const size_t take = std::min<uint64_t>(size, slice.size() - pos_);
      if (views != nullptr) {
        views->emplace_back(reinterpret_cast<const char*>(slice.begin()) + pos_,
                            take);
      }
      Advance(take);
      size -= take;
    }
    return true;
  }

 private:
  bool ReadByte(uint8_t* byte) {
    if (done()) return false;
    *byte = slices_[slice_].begin()[pos_];
    Advance(1);
    return true;
  }

  void Advance(size_t n) {
    pos_ += n;
    if (pos_ == slices_[slice_].size()) {
      ++slice_;
      pos_ = 0;
      SkipEmptySlices();
    }
  }

  void SkipEmptySlices() {
    while (!done() && slices_[slice_].size() == 0) ++slice_;
  }

  const std::vector<grpc::Slice>& slices_;
  size_t slice_ = 0;
  size_t pos_ = 0;
};

}  // namespace

namespace internal_shard_client {

struct ParsedChunk {
  std::optional<v1::ShardHeader> header;
  int64_t offset = 0;
  uint64_t checksum = 0;
  // Views into the message's slices, in order.
  std::vector<absl::string_view> data;
  int64_t data_size = 0;
};

// Copies verified byte ranges of a pinned host staging tensor into a
// contiguous CUDA destination of the same size, asynchronously, on a
// stream of the destination's device. Holds both tensors, and its
// destructor waits for the copies in flight before letting them go.
class DeviceLanding {
 public:
  static absl::StatusOr<std::unique_ptr<DeviceLanding>> Create(
      const Tensor& staging, const Tensor& destination) {
    ASSIGN_OR_RETURN(
        CudaStream stream,
        CudaStream::Create(destination.device().index().value_or(0)));
    // The destination may still be being written on the legacy default
    // stream (a cudaMemset that zeroed it, say), which this stream does not
    // wait for by itself.
    RETURN_IF_ERROR(stream.WaitForLegacyStream());
    return std::unique_ptr<DeviceLanding>(
        new DeviceLanding(staging, destination, std::move(stream)));
  }

  // Enqueues the copy of bytes [offset, offset + size); `what` names the
  // chunk in errors.
  absl::Status Land(int64_t offset, int64_t size, absl::string_view what) {
    return Annotate(
        CudaMemcpyAsync(static_cast<char*>(destination_.data_ptr()) + offset,
                        static_cast<const char*>(staging_.data_ptr()) + offset,
                        static_cast<size_t>(size), stream_),
        absl::StrCat(what, ": copying to ", destination_.device().ToString()));
  }

  // Waits for every copy enqueued; the first error among them.
  absl::Status Synchronize(absl::string_view what) {
    return Annotate(
        stream_.Synchronize(),
        absl::StrCat(what, ": copying to ", destination_.device().ToString()));
  }

 private:
  DeviceLanding(Tensor staging, Tensor destination, CudaStream stream)
      : staging_(std::move(staging)),
        destination_(std::move(destination)),
        stream_(std::move(stream)) {}

  const Tensor staging_;
  const Tensor destination_;
  // Last, so that it is destroyed first: its destructor waits for the
  // copies that use the tensors.
  CudaStream stream_;
};

}  // namespace internal_shard_client

namespace {

using internal_shard_client::ParsedChunk;

enum WireType : uint64_t { kVarint = 0, kFixed64 = 1, kDelimited = 2 };
constexpr uint64_t kFixed32 = 5;

// Parses one field into `chunk` (proto3 semantics: later scalars win,
// messages merge, unknown fields are skipped). False when malformed.
bool ParseField(SliceReader& reader, ParsedChunk& chunk) {
  uint64_t tag;
  if (!reader.ReadVarint(&tag)) return false;
  const uint64_t field = tag >> 3;
  uint64_t value;
  switch (tag & 7) {
    case kVarint:
      if (!reader.ReadVarint(&value)) return false;
      if (field == v1::ShardChunk::kOffsetFieldNumber) {
        chunk.offset = static_cast<int64_t>(value);
      }
      return true;
    case kFixed64:
      if (!reader.ReadFixed64(&value)) return false;
      if (field == v1::ShardChunk::kChecksumFieldNumber) chunk.checksum = value;
      return true;
    case kDelimited: {
      if (!reader.ReadVarint(&value)) return false;
      std::vector<absl::string_view> views;
      const bool wanted = field == v1::ShardChunk::kHeaderFieldNumber ||
                          field == v1::ShardChunk::kDataFieldNumber;
      if (!reader.Read(value, wanted ? &views : nullptr)) return false;
      if (field == v1::ShardChunk::kDataFieldNumber) {
        chunk.data = std::move(views);
        chunk.data_size = static_cast<int64_t>(value);
      } else if (field == v1::ShardChunk::kHeaderFieldNumber) {
        if (!chunk.header.has_value()) chunk.header.emplace();
        if (!chunk.header->MergeFromString(absl::StrJoin(views, ""))) {
          return false;
        }
      }
      return true;
    }
    case kFixed32:
      return reader.Read(4, nullptr);
    default:
      return false;
  }
}

// Copies and hashes in pieces small enough to stay in cache between the
// two passes over them.
constexpr size_t kHashCopyPieceBytes = 256 << 10;

}  // namespace

// ---- ShardAssembler ---------------------------------------------------------

ShardAssembler::ShardAssembler(absl::string_view tensor_id, int64_t shard_index,
                               Tensor destination)
    : tensor_id_(tensor_id),
      shard_index_(shard_index),
      destination_(std::move(destination)) {}

ShardAssembler::ShardAssembler(absl::string_view tensor_id, int64_t shard_index,
                               Device device, bool pin_memory)
    : tensor_id_(tensor_id),
      shard_index_(shard_index),
      allocate_(TensorOptions().WithDevice(device).WithPinMemory(pin_memory)) {}

// Out of line, where DeviceLanding is complete; waits for its copies.
ShardAssembler::~ShardAssembler() = default;

void ShardAssembler::ExpectRegion(absl::Span<const int64_t> offsets,
                                  absl::Span<const int64_t> sizes) {
  region_offsets_.emplace(offsets.begin(), offsets.end());
  region_sizes_.assign(sizes.begin(), sizes.end());
}

std::string ShardAssembler::ShardName() const {
  if (!name_.empty()) return name_;
  return absl::StrCat("shard ", shard_index_, " of tensor ", tensor_id_);
}

std::string ShardAssembler::ChunkName(int64_t offset) const {
  return absl::StrCat("chunk at offset ", offset, " of ", ShardName());
}

absl::Status ShardAssembler::Consume(const v1::ShardChunk& chunk) {
  grpc::ByteBuffer message;
  bool own_buffer;
  grpc::Status serialized =
      grpc::SerializationTraits<v1::ShardChunk>::Serialize(chunk, &message,
                                                           &own_buffer);
  if (!serialized.ok()) return FromGrpcStatus(serialized);
  return Consume(message);
}

absl::Status ShardAssembler::Consume(const grpc::ByteBuffer& message) {
  std::vector<grpc::Slice> slices;
  if (message.Valid() && !message.Dump(&slices).ok()) {
    return absl::DataLossError(
        absl::StrCat(ShardName(), ": unreadable message"));
  }
  SliceReader reader(slices);
  ParsedChunk chunk;
  while (!reader.done()) {
    if (!ParseField(reader, chunk)) {
      return absl::DataLossError(absl::StrCat(
          ShardName(), ": malformed chunk after offset ", received_bytes_));
    }
  }
  if (!metadata_.has_value()) {
    RETURN_IF_ERROR(StartFromHeader(chunk));
  } else if (chunk.header.has_value()) {
    return absl::DataLossError(
        absl::StrCat(ChunkName(chunk.offset), ": header repeated"));
  }
  RETURN_IF_ERROR(CheckPlacement(chunk.offset, chunk.data_size));
  if (!WriteAndVerify(chunk)) {
    return absl::DataLossError(
        absl::StrCat(ChunkName(chunk.offset), ": checksum mismatch"));
  }
  if (landing_ != nullptr && chunk.data_size > 0) {
    RETURN_IF_ERROR(
        landing_->Land(chunk.offset, chunk.data_size, ChunkName(chunk.offset)));
  }
  received_bytes_ += chunk.data_size;
  if (on_chunk_ && chunk.data_size > 0) on_chunk_(chunk.data_size);
  return absl::OkStatus();
}

absl::Status ShardAssembler::StartFromHeader(const ParsedChunk& chunk) {
  if (!chunk.header.has_value()) {
    return absl::DataLossError(
        absl::StrCat(ShardName(), ": first chunk carries no header"));
  }
  return Start(*chunk.header);
}

absl::Status ShardAssembler::Start(const v1::ShardHeader& header) {
  if (metadata_.has_value()) {
    return absl::DataLossError(absl::StrCat(ShardName(), ": header repeated"));
  }
  ASSIGN_OR_RETURN(CheckedHeader checked, CheckHeader(header));
  RETURN_IF_ERROR(PrepareDestination(checked.dtype, checked.sizes));
  total_bytes_ = header.total_bytes();
  metadata_ = std::move(checked.metadata);
  return absl::OkStatus();
}

absl::Status ShardAssembler::FillFrom(const v1::ShardHeader& header,
                                      const Fill& fill) {
  if (metadata_.has_value()) {
    return absl::DataLossError(absl::StrCat(ShardName(), ": header repeated"));
  }
  ASSIGN_OR_RETURN(CheckedHeader checked, CheckHeader(header));
  Tensor destination = destination_;
  if (allocate_.has_value()) {
    ASSIGN_OR_RETURN(
        destination,
        Tensor::Empty(checked.sizes,
                      TensorOptions(*allocate_).WithDType(checked.dtype)));
  } else if (!destination.defined() || destination.dtype() != checked.dtype ||
             destination.sizes() != checked.sizes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "destination ", destination.DebugString(), " does not match ",
        ShardName(), ", which is ", DTypeName(checked.dtype), " [",
        absl::StrJoin(checked.sizes, ", "), "]"));
  }
  RETURN_IF_ERROR(fill(destination));
  destination_ = std::move(destination);
  total_bytes_ = header.total_bytes();
  received_bytes_ = total_bytes_;
  metadata_ = std::move(checked.metadata);
  if (on_chunk_ && total_bytes_ > 0) on_chunk_(total_bytes_);
  return absl::OkStatus();
}

absl::StatusOr<ShardAssembler::CheckedHeader> ShardAssembler::CheckHeader(
    const v1::ShardHeader& header) const {
  const std::string what = absl::StrCat("header of ", ShardName());
  absl::StatusOr<ShardMetadata> metadata = FromProto(header.metadata());
  if (!metadata.ok()) return Malformed(what, metadata.status());
  absl::StatusOr<DType> dtype = FromProto(header.dtype());
  if (!dtype.ok()) return Malformed(what, dtype.status());
  const std::vector<int64_t> sizes(header.sizes().begin(),
                                   header.sizes().end());
  if (region_offsets_.has_value()) {
    if (sizes != region_sizes_) {
      return absl::DataLossError(
          absl::StrCat(what, ": sizes [", absl::StrJoin(sizes, ", "),
                       "] differ from the requested region's [",
                       absl::StrJoin(region_sizes_, ", "), "]"));
    }
    const absl::Status inside =
        ValidateRegion(*region_offsets_, region_sizes_, metadata->shard_sizes(),
                       ShardName(), "shard");
    if (!inside.ok()) return Malformed(what, inside);
  } else if (sizes != metadata->shard_sizes()) {
    return absl::DataLossError(
        absl::StrCat(what, ": sizes [", absl::StrJoin(sizes, ", "),
                     "] differ from its metadata's [",
                     absl::StrJoin(metadata->shard_sizes(), ", "), "]"));
  }
  const std::optional<int64_t> numel = CheckedProduct(sizes);
  if (!numel.has_value() ||
      header.total_bytes() !=
          *numel * static_cast<int64_t>(ElementSize(*dtype))) {
    return absl::DataLossError(
        absl::StrCat(what, ": total_bytes ", header.total_bytes(),
                     " does not match its dtype and sizes"));
  }
  return CheckedHeader{*std::move(metadata), *dtype, sizes};
}

absl::Status ShardAssembler::PrepareDestination(
    DType dtype, const std::vector<int64_t>& sizes) {
  if (allocate_.has_value()) {
    ASSIGN_OR_RETURN(
        destination_,
        Tensor::Empty(sizes, TensorOptions(*allocate_).WithDType(dtype)));
  } else if (!destination_.defined() || destination_.dtype() != dtype ||
             destination_.sizes() != sizes) {
    return absl::InvalidArgumentError(
        absl::StrCat("destination ", destination_.DebugString(),
                     " does not match ", ShardName(), ", which is ",
                     DTypeName(dtype), " [", absl::StrJoin(sizes, ", "), "]"));
  }
  if (destination_.device().is_cpu() && destination_.is_contiguous()) {
    write_base_ = static_cast<char*>(destination_.data_ptr());
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(
      staging_,
      Tensor::Empty(sizes, TensorOptions().WithDType(dtype).WithPinMemory(
                               destination_.device().is_cuda())));
  write_base_ = static_cast<char*>(staging_.data_ptr());
  if (destination_.device().is_cuda() && destination_.is_contiguous() &&
      destination_.nbytes() > 0) {
    absl::StatusOr<std::unique_ptr<internal_shard_client::DeviceLanding>>
        landing = internal_shard_client::DeviceLanding::Create(staging_,
                                                               destination_);
    RETURN_IF_ERROR(Annotate(landing.status(),
                             absl::StrCat(ShardName(), ": preparing copies to ",
                                          destination_.device().ToString())));
    landing_ = *std::move(landing);
  }
  return absl::OkStatus();
}

absl::Status ShardAssembler::CheckPlacement(int64_t offset,
                                            int64_t size) const {
  if (offset != received_bytes_) {
    return absl::DataLossError(
        absl::StrCat(ChunkName(offset), ": expected offset ", received_bytes_,
                     " (chunks must be contiguous and in "
                     "order)"));
  }
  if (size < 0 || size > total_bytes_ - received_bytes_) {
    return absl::DataLossError(absl::StrCat(ChunkName(offset), ": ", size,
                                            " bytes overrun the shard's ",
                                            total_bytes_, " bytes"));
  }
  return absl::OkStatus();
}

absl::StatusOr<char*> ShardAssembler::Place(int64_t offset, int64_t length) {
  if (!metadata_.has_value()) {
    return absl::DataLossError(
        absl::StrCat(ShardName(), ": chunk before the header"));
  }
  if (length <= 0) {
    return absl::DataLossError(
        absl::StrCat(ChunkName(offset), ": empty chunk"));
  }
  RETURN_IF_ERROR(CheckPlacement(offset, length));
  return write_base_ + offset;
}

absl::Status ShardAssembler::Verify(int64_t offset, int64_t length,
                                    uint64_t checksum) {
  if (XXH3_64bits(write_base_ + offset, static_cast<size_t>(length)) !=
      checksum) {
    return absl::DataLossError(
        absl::StrCat(ChunkName(offset), ": checksum mismatch"));
  }
  if (landing_ != nullptr) {
    RETURN_IF_ERROR(landing_->Land(offset, length, ChunkName(offset)));
  }
  received_bytes_ += length;
  if (on_chunk_) on_chunk_(length);
  return absl::OkStatus();
}

bool ShardAssembler::WriteAndVerify(const ParsedChunk& chunk) {
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  char* out = write_base_ + chunk.offset;
  for (absl::string_view view : chunk.data) {
    while (!view.empty()) {
      const size_t piece = std::min(view.size(), kHashCopyPieceBytes);
      XXH3_64bits_update(&state, view.data(), piece);
      std::memcpy(out, view.data(), piece);
      out += piece;
      view.remove_prefix(piece);
    }
  }
  return XXH3_64bits_digest(&state) == chunk.checksum;
}

absl::Status ShardAssembler::Finish() {
  if (!metadata_.has_value()) {
    return absl::DataLossError(
        absl::StrCat(ShardName(), ": stream ended without a header"));
  }
  if (received_bytes_ != total_bytes_) {
    return absl::DataLossError(
        absl::StrCat(ShardName(), ": stream ended after ", received_bytes_,
                     " of ", total_bytes_, " bytes"));
  }
  if (landing_ != nullptr) return landing_->Synchronize(ShardName());
  if (staging_.defined()) return CopyInto(staging_, destination_);
  return absl::OkStatus();
}

// ---- ShardClient ------------------------------------------------------------

std::shared_ptr<grpc::Channel> NewShardChannel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxReceiveMessageBytes);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(),
                                   args);
}

absl::Status ReceiveChunkStream(const std::shared_ptr<grpc::Channel>& channel,
                                const std::string& method,
                                const google::protobuf::MessageLite& request,
                                absl::Time deadline, absl::string_view what,
                                ShardAssembler* assembler) {
  grpc::ByteBuffer serialized;
  bool own_buffer;
  RETURN_IF_ERROR(FromGrpcStatus(
      grpc::SerializationTraits<google::protobuf::MessageLite>::Serialize(
          request, &serialized, &own_buffer)));
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  RawStreamCall call(&stub, &context, method, serialized);
  grpc::ByteBuffer message;
  absl::Status status;
  while (status.ok() && call.Read(&message)) {
    status = assembler->Consume(message);
  }
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
                                                 std::string bulk_address,
                                                 std::string local_address) {
  return std::make_shared<ShardClient>(NewShardChannel(address),
                                       std::move(bulk_address),
                                       std::move(local_address));
}

ShardClient::ShardClient(std::shared_ptr<grpc::Channel> channel,
                         std::string bulk_address, std::string local_address)
    : channel_(std::move(channel)),
      bulk_address_(std::move(bulk_address)),
      local_(local_address.empty()
                 ? nullptr
                 : std::make_unique<LocalFetcher>(std::move(local_address))),
      stub_(v1::ShardService::NewStub(channel_)) {}

ShardClient::~ShardClient() = default;

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

absl::Status ShardClient::Fetch(const v1::FetchShardRequest& request,
                                const FetchOptions& options,
                                ShardAssembler* assembler) const {
  assembler->set_on_chunk(options.on_chunk);
  const bool required = options.local_path == LocalPath::kRequired;
  const Tensor& destination = assembler->destination();
  const bool small =
      destination.defined() &&
      static_cast<int64_t>(destination.nbytes()) < options.local_min_bytes;
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
  return bulk_address_.empty() ? Stream(request, options, assembler)
                               : BulkStream(request, options, assembler);
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
  return Shard{assembler.destination(), *assembler.metadata()};
}

absl::Status ShardClient::FetchShardInto(absl::string_view tensor_id,
                                         int64_t shard_index,
                                         const Tensor& destination,
                                         const FetchOptions& options) const {
  if (!destination.defined()) {
    return absl::InvalidArgumentError("FetchShardInto: undefined destination");
  }
  ShardAssembler assembler(tensor_id, shard_index, destination);
  return Fetch(FetchRequest(tensor_id, shard_index, options), options,
               &assembler);
}

absl::Status ShardClient::FetchRegionInto(
    absl::string_view tensor_id, int64_t shard_index,
    absl::Span<const int64_t> region_offsets, const Tensor& destination,
    const FetchOptions& options) const {
  if (!destination.defined()) {
    return absl::InvalidArgumentError("FetchRegionInto: undefined destination");
  }
  v1::FetchShardRequest request = FetchRequest(tensor_id, shard_index, options);
  request.mutable_region_offsets()->Add(region_offsets.begin(),
                                        region_offsets.end());
  request.mutable_region_sizes()->Add(destination.sizes().begin(),
                                      destination.sizes().end());
  ShardAssembler assembler(tensor_id, shard_index, destination);
  assembler.ExpectRegion(region_offsets, destination.sizes());
  return Fetch(request, options, &assembler);
}

absl::StatusOr<Socket> ShardClient::TakeConnection(absl::Time deadline,
                                                   bool reuse) const {
  if (reuse) {
    absl::MutexLock lock(&pool_mu_);
    if (!idle_.empty()) {
      Socket socket = std::move(idle_.back());
      idle_.pop_back();
      return socket;
    }
  }
  ASSIGN_OR_RETURN(Socket socket, ConnectTcp(bulk_address_, deadline));
  RETURN_IF_ERROR(
      WriteFull(socket.fd(), kBulkMagic.data(), kBulkMagic.size(), deadline));
  return socket;
}

void ShardClient::ReturnConnection(Socket socket) const {
  absl::MutexLock lock(&pool_mu_);
  idle_.push_back(std::move(socket));
}

void ShardClient::DropIdleConnections() const {
  std::vector<Socket> closing;
  absl::MutexLock lock(&pool_mu_);
  closing.swap(idle_);
}

absl::Status ShardClient::BulkStream(const v1::FetchShardRequest& request,
                                     const FetchOptions& options,
                                     ShardAssembler* assembler) const {
  const std::string what = FetchWhat(request);
  const absl::Time deadline = absl::Now() + options.timeout;
  // A pooled connection may have been closed by the server meanwhile; a
  // fresh one is tried once before giving up. The retry must not take
  // another pooled connection: those idled at least as long, so after a
  // server's idle timeout they are all closed, and they are dropped.
  for (int attempt = 0;; ++attempt) {
    absl::StatusOr<Socket> socket = TakeConnection(deadline, attempt == 0);
    if (!socket.ok()) return Annotate(socket.status(), what);
    absl::Status sent =
        WriteFrame(socket->fd(), request.SerializeAsString(), deadline);
    absl::StatusOr<std::string> frame =
        sent.ok() ? ReadFrame(socket->fd(), deadline) : sent;
    if (!frame.ok()) {
      if (attempt == 0 && absl::IsUnavailable(frame.status())) {
        DropIdleConnections();
        continue;
      }
      return Annotate(frame.status(), what);
    }
    v1::BulkFetchReply reply;
    if (!reply.ParseFromString(*frame) || reply.code() < 0 ||
        reply.code() > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
      return absl::DataLossError(absl::StrCat(what, ": malformed reply"));
    }
    if (reply.code() != 0) {
      ReturnConnection(*std::move(socket));
      return Annotate(absl::Status(static_cast<absl::StatusCode>(reply.code()),
                                   reply.message()),
                      what);
    }
    RETURN_IF_ERROR(assembler->Start(reply.header()));
    absl::Status received = ReceiveChunks(socket->fd(), deadline, assembler);
    if (!received.ok() && !absl::IsDataLoss(received)) {
      return Annotate(received, what);
    }
    RETURN_IF_ERROR(received);
    RETURN_IF_ERROR(assembler->Finish());
    ReturnConnection(*std::move(socket));
    return absl::OkStatus();
  }
}

absl::Status ShardClient::ReceiveChunks(int fd, absl::Time deadline,
                                        ShardAssembler* assembler) const {
  char prefix[kBulkChunkPrefixBytes];
  while (assembler->received_bytes() < assembler->total_bytes()) {
    RETURN_IF_ERROR(ReadFull(fd, prefix, sizeof(prefix), deadline));
    const int64_t offset = static_cast<int64_t>(LoadLe64(prefix));
    const int64_t length = static_cast<int64_t>(LoadLe64(prefix + 8));
    ASSIGN_OR_RETURN(char* place, assembler->Place(offset, length));
    RETURN_IF_ERROR(ReadFull(fd, place, static_cast<size_t>(length), deadline));
    RETURN_IF_ERROR(assembler->Verify(offset, length, LoadLe64(prefix + 16)));
  }
  return absl::OkStatus();
}

absl::StatusOr<TensorDescription> ShardClient::DescribeTensor(
    absl::string_view tensor_id, absl::Duration timeout) const {
  grpc::ClientContext context;
  context.set_deadline(DeadlineAfter(timeout));
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
