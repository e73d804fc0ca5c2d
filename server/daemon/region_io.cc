#include "server/daemon/region_io.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/region_transfer.h"
#include "client/shard_client.h"
#include "client/stall_watchdog.h"
#include "common/checksum.h"
#include "common/proto_convert.h"
#include "common/region.h"
#include "common/status_macros.h"
#include "common/tensor/tensor.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "server/metrics/metrics.h"
#include "server/serve/fetch.h"
#include "server/serve/shard_registry.h"
#include "tessera/v1/control.grpc.pb.h"
#include "wire/auth.h"
#include "wire/call_deadline.h"
#include "wire/chunk_assembler.h"
#include "wire/grpc_status.h"
#include "wire/replicas.h"
#include "wire/version_id.h"

namespace tessera {
namespace {

// A region of a named tensor, checked against the daemon's table.
struct ResolvedRegion {
  std::string name;
  v1::TensorInfo info;
  ShardedTensorMetadata metadata;
  // The region's offsets and sizes (no placement).
  ShardMetadata region;
  int64_t nbytes = 0;
  // The published version it reads (0: unversioned, or a version not yet
  // published).
  int64_t version = 0;
};

// Looks `name` up and checks the region against it, before anything is
// allocated. `op` prefixes errors ("ReadRegion").
absl::StatusOr<ResolvedRegion> Resolve(const RegionEnv& env,
                                       const std::string& name,
                                       const std::string& pinned_id,
                                       absl::Span<const int64_t> offsets,
                                       absl::Span<const int64_t> sizes,
                                       absl::string_view op) {
  if (env.rank == nullptr || !env.resolve) {
    return absl::FailedPreconditionError(
        absl::StrCat(op, ": this daemon serves no tensors yet"));
  }
  ASSIGN_OR_RETURN(v1::TensorInfo info, env.resolve(name));
  int64_t version = 0;
  if (IsVersionOf(pinned_id, info.tensor_id())) {
    // A version of the tensor (docs/versions.md): its own registration.
    info.set_tensor_id(pinned_id);
    version = VersionNumber(pinned_id);
  } else if (Versioned(info) &&
             (pinned_id.empty() || pinned_id == info.tensor_id())) {
    // The latest version as this daemon's table says, for every piece:
    // the owners that have not applied its publish yet serve it by its id.
    version = info.version();
    info.set_tensor_id(VersionId(info.tensor_id(), version));
  } else if (!pinned_id.empty() && pinned_id != info.tensor_id()) {
    return absl::FailedPreconditionError(
        absl::StrCat(op, ": tensor ", name, " is now ", info.tensor_id(),
                     ", not ", pinned_id, " (it was resharded or re-created)"));
  }
  absl::StatusOr<ShardedTensorMetadata> metadata = FromProto(info.metadata());
  if (!metadata.ok()) {
    return absl::InternalError(
        absl::StrCat(op, ": the metadata of tensor ", name,
                     " is invalid: ", metadata.status().message()));
  }
  if (static_cast<size_t>(info.shard_ranks_size()) !=
      metadata->shards_metadata.size()) {
    return absl::InternalError(absl::StrCat(
        op, ": tensor ", name, " lists ", info.shard_ranks_size(),
        " owners for ", metadata->shards_metadata.size(), " shards"));
  }
  RETURN_IF_ERROR(
      Annotate(ValidateRegion(offsets, sizes, metadata->size,
                              absl::StrCat("tensor ", name), "tensor"),
               op));
  const int64_t element =
      static_cast<int64_t>(ElementSize(metadata->tensor_properties.dtype));
  const std::optional<int64_t> numel = CheckedProduct(sizes);
  if (!numel.has_value() ||
      *numel > std::numeric_limits<int64_t>::max() / element) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": region sizes [", absl::StrJoin(sizes, ", "),
                     "] of tensor ", name, " overflow"));
  }
  const int64_t nbytes = *numel * element;
  if (nbytes > env.max_region_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat(op, ": the region of ", nbytes, " bytes of tensor ", name,
                     " exceeds this daemon's limit of ", env.max_region_bytes,
                     " bytes per call; split it"));
  }
  ASSIGN_OR_RETURN(ShardMetadata region, ShardMetadata::Create(offsets, sizes));
  return ResolvedRegion{
      name,   std::move(info), *std::move(metadata), std::move(region),
      nbytes, version};
}

// The deadline of the work a call does (forwards to other owners): the
// call's deadline, capped at env.max_call_time from now, less a margin for
// the answer, so that the caller hears which owner failed rather than only
// its own deadline passing.
absl::Time CallDeadline(const RegionEnv& env,
                        const grpc::CallbackServerContext* context) {
  constexpr absl::Duration kAnswerMargin = absl::Milliseconds(500);
  const absl::Time now = absl::Now();
  const absl::Time deadline =
      std::min(CallDeadlineOf(*context, now), now + env.max_call_time);
  return deadline - std::min(kAnswerMargin, (deadline - now) / 10);
}

// The registered shard `shard` of the tensor, or null when this daemon does
// not hold it.
const LocalShard* Mine(
    const std::shared_ptr<const RegisteredTensor>& registered, size_t shard) {
  return registered == nullptr
             ? nullptr
             : registered->FindShard(static_cast<int64_t>(shard));
}

// Whether a box of `piece` sizes is one run of the row-major bytes of a
// box of `whole` sizes: past its first dimension longer than 1, it spans
// `whole` (as Tensor::is_contiguous judges the view).
bool IsOneRun(absl::Span<const int64_t> piece,
              absl::Span<const int64_t> whole) {
  size_t d = 0;
  while (d < piece.size() && piece[d] == 1) ++d;
  for (size_t e = d + 1; e < piece.size(); ++e) {
    if (piece[e] != whole[e]) return false;
  }
  return true;
}

// The bytes staged besides a box of `metadata`: every piece that is
// strided within the box and that `moves` (to or from another daemon)
// passes through a contiguous buffer of its own: a read's lands there
// before it is copied into the box (ShardAssembler), a write's is packed
// there once for all its holders. At most the box's size again.
int64_t StagedBytes(const ShardedTensorMetadata& metadata,
                    const ShardMetadata& box,
                    const std::function<bool(size_t shard)>& moves) {
  const int64_t element =
      static_cast<int64_t>(ElementSize(metadata.tensor_properties.dtype));
  int64_t bytes = 0;
  for (const RegionOverlap& overlap : Overlaps(metadata.shards_metadata, box)) {
    if (IsOneRun(overlap.box.shard_sizes(), box.shard_sizes()) ||
        !moves(overlap.shard)) {
      continue;
    }
    // Within the box, whose product was checked.
    bytes += CheckedProduct(overlap.box.shard_sizes()).value_or(0) * element;
  }
  return bytes;
}

// StagedBytes of a call's region.
int64_t StagedPieceBytes(const ResolvedRegion& resolved,
                         const std::function<bool(size_t shard)>& moves) {
  return StagedBytes(resolved.metadata, resolved.region, moves);
}

// What a call's reservation is, for the budget's refusals: the call, the
// tensor and the region, and what besides the region it stages.
std::string StagingWhat(absl::string_view op, const ResolvedRegion& resolved,
                        int64_t pieces) {
  std::string what = absl::StrCat(op, " of tensor ", resolved.name, " ",
                                  BoxString(resolved.region));
  if (pieces > 0) {
    absl::StrAppend(&what, " (", resolved.nbytes, " bytes of region and ",
                    pieces, " to stage its strided pieces on other daemons)");
  }
  return what;
}

}  // namespace

int64_t BoxStagingBytes(const Rank& rank, const v1::TensorInfo& info,
                        const ShardedTensorMetadata& metadata,
                        const ShardMetadata& box) {
  const std::shared_ptr<const RegisteredTensor> registered =
      rank.registry().Resolve(info.tensor_id()).tensor;
  const std::shared_ptr<const RegisteredTensor> copies =
      rank.registry().Resolve(ReplicaTensorId(info.tensor_id())).tensor;
  return StagedBytes(metadata, box, [&](size_t shard) {
    return Mine(registered, shard) == nullptr && Mine(copies, shard) == nullptr;
  });
}

absl::Status ReadBoxInto(const Rank& rank, const v1::TensorInfo& info,
                         const ShardedTensorMetadata& metadata,
                         const ShardMetadata& box, const Tensor& destination,
                         int parallelism, absl::Time deadline,
                         absl::string_view op) {
  std::shared_ptr<const RegisteredTensor> registered =
      rank.registry().Resolve(info.tensor_id()).tensor;
  std::shared_ptr<const RegisteredTensor> copies =
      rank.registry().Resolve(ReplicaTensorId(info.tensor_id())).tensor;
  // Copies this daemon may not serve now (stale, or not confirmed fresh:
  // server/daemon/stale_copies.h) are read from the other holders.
  if ((registered != nullptr || copies != nullptr) &&
      !rank.registry()
           .CheckServe(info.tensor_id(), /*write=*/false, deadline)
           .ok()) {
    registered.reset();
    copies.reset();
  }
  return ForEachRegionPiece(
      metadata.shards_metadata, box.shard_offsets(), destination, parallelism,
      [&](const RegionPiece& piece) -> absl::Status {
        const auto copy_from = [&](const LocalShard& local) {
          return CopyBox(local.tensor, piece.offsets_in_shard, piece.view,
                         std::vector<int64_t>(piece.view.dim(), 0),
                         piece.box->shard_sizes());
        };
        if (const LocalShard* mine = Mine(registered, piece.shard)) {
          return copy_from(*mine);
        }
        // The owner, then each replica (as the client library reads): a
        // try but the last that moves nothing for kDefaultHolderPatience
        // is given up for the next holder.
        const std::vector<int> holders =
            HoldersOf(info, static_cast<int>(piece.shard));
        absl::Status status = absl::UnavailableError(
            absl::StrCat(op, " of tensor ", info.name(), ": shard ",
                         piece.shard, ": no holder of it answers"));
        for (size_t k = 0; k < holders.size(); ++k) {
          const bool replica = k > 0;
          if (holders[k] == rank.rank()) {
            // This daemon's copy, or its own shard still being refilled.
            const LocalShard* copy =
                replica ? Mine(copies, piece.shard) : nullptr;
            if (copy != nullptr) return copy_from(*copy);
            continue;
          }
          const std::string what = absl::StrCat(
              op, " of tensor ", info.name(), ": shard ", piece.shard,
              replica ? " from replica rank " : " on rank ", holders[k]);
          FetchOptions options;
          options.shard_bytes = HostShardBytes(info.metadata(), piece.shard);
          options.timeout = deadline - absl::Now();
          if (options.timeout <= absl::ZeroDuration()) {
            return absl::DeadlineExceededError(
                absl::StrCat(what, ": deadline exceeded"));
          }
          absl::StatusOr<std::shared_ptr<ShardClient>> client =
              rank.ClientFor(holders[k]);
          const auto fetch = [&](const FetchOptions& watched) {
            return (*client)->FetchRegionInto(
                replica ? ReplicaTensorId(info.tensor_id()) : info.tensor_id(),
                static_cast<int64_t>(piece.shard), piece.offsets_in_shard,
                piece.view, watched);
          };
          status = client.ok() ? FetchWatched(options,
                                              k + 1 < holders.size()
                                                  ? kDefaultHolderPatience
                                                  : absl::ZeroDuration(),
                                              fetch)
                               : client.status();
          status = Annotate(status, what);
          if (status.ok() ||
              !(absl::IsUnavailable(status) ||
                absl::IsDeadlineExceeded(status) || absl::IsNotFound(status))) {
            return status;
          }
        }
        return status;
      });
}

absl::StatusOr<PreparedFetch> PrepareRegionRead(
    const RegionEnv& env, const v1::ReadRegionRequest& request,
    absl::Time deadline) {
  ASSIGN_OR_RETURN(const ResolvedRegion resolved,
                   Resolve(env, request.name(), request.tensor_id(),
                           request.offsets(), request.sizes(), "ReadRegion"));
  const ShardMetadata& region = resolved.region;
  std::shared_ptr<MemoryBudget::Reservation> staged;
  if (env.budget != nullptr) {
    // Every piece not served from a shard or copy registered here may come
    // from another daemon.
    const int64_t pieces =
        BoxStagingBytes(*env.rank, resolved.info, resolved.metadata, region);
    ASSIGN_OR_RETURN(
        MemoryBudget::Reservation reservation,
        env.budget->Reserve(resolved.nbytes + pieces,
                            StagingWhat("ReadRegion", resolved, pieces)));
    staged =
        std::make_shared<MemoryBudget::Reservation>(std::move(reservation));
  }
  ASSIGN_OR_RETURN(
      const Tensor box,
      Tensor::Empty(region.shard_sizes(),
                    TensorOptions()
                        .WithDType(resolved.metadata.tensor_properties.dtype)
                        .Private()));
  const absl::Status read =
      ReadBoxInto(*env.rank, resolved.info, resolved.metadata, region, box,
                  env.parallelism, deadline, "ReadRegion");
  if (!read.ok()) {
    // A reshard or a re-create that committed while the pieces moved took
    // the shards of the id this read resolved: say so, rather than the
    // NOT_FOUND of some holder.
    absl::StatusOr<v1::TensorInfo> now = env.resolve(request.name());
    if (now.ok() &&
        now->tensor_id() != VersionBase(resolved.info.tensor_id())) {
      return absl::FailedPreconditionError(
          absl::StrCat("ReadRegion: tensor ", request.name(), " is now ",
                       now->tensor_id(), ", not ", resolved.info.tensor_id(),
                       " (it was resharded or re-created during the read): ",
                       read.message()));
    }
    return read;
  }
  ASSIGN_OR_RETURN(const ShardMetadata where,
                   ShardMetadata::Create(
                       region.shard_offsets(), region.shard_sizes(),
                       RemoteDevice::ForRank(env.rank->rank(), Device::Cpu())));
  ASSIGN_OR_RETURN(PreparedFetch prepared, PrepareTensorFetch(box, where));
  prepared.header.set_version(resolved.version);
  prepared.keepalive = std::move(staged);
  return prepared;
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* StartReadRegion(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    RegionEnv env, const ShardServiceOptions& chunks) {
  grpc::ByteBuffer serialized(*request);
  v1::ReadRegionRequest parsed;
  if (!grpc::SerializationTraits<v1::ReadRegionRequest>::Deserialize(
           &serialized, &parsed)
           .ok()) {
    return NewFailedChunkStream(
        absl::InvalidArgumentError("ReadRegion: malformed request"));
  }
  if (parsed.chunk_bytes() < 0) {
    return NewFailedChunkStream(absl::InvalidArgumentError(absl::StrCat(
        "ReadRegion: negative chunk_bytes ", parsed.chunk_bytes())));
  }
  const absl::Time deadline = CallDeadline(env, context);
  const int64_t chunk_bytes = ChunkBytesFor(chunks, parsed.chunk_bytes());
  return NewDeferredChunkStream(
      [env = std::move(env), parsed = std::move(parsed), deadline] {
        return PrepareRegionRead(env, parsed, deadline);
      },
      chunk_bytes);
}

namespace {

// Receives a WriteRegion stream into a host buffer of the region (checked
// chunk by chunk), then applies it on a thread of its own: local overlaps
// are copied into the registered shards, remote ones forwarded to their
// owners. One read is in flight at a time; every path ends in exactly one
// Finish, then OnDone frees the reactor.
class WriteRegionReactor final
    : public grpc::ServerReadReactor<v1::WriteRegionChunk> {
 public:
  WriteRegionReactor(grpc::CallbackServerContext* context,
                     v1::WriteRegionResponse* response, RegionEnv env)
      : context_(context),
        response_(response),
        env_(std::move(env)),
        started_(absl::Now()),
        deadline_(CallDeadline(env_, context)) {
    StartRead(&chunk_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The client half-closed, or the call broke (End applies nothing of
      // a call its client gave up on).
      End();
      return;
    }
    const absl::Status status = Consume();
    if (!status.ok()) {
      Finish(ToGrpcStatus(status));
      return;
    }
    StartRead(&chunk_);
  }

  void OnDone() override {
    thread_.Join();
    delete this;
  }

 private:
  std::string What() const {
    return absl::StrCat("WriteRegion of tensor ", resolved_->name);
  }

  absl::Status Consume() {
    if (!resolved_.has_value()) {
      if (!chunk_.has_header()) {
        return absl::InvalidArgumentError(
            "WriteRegion: the first message carries no header");
      }
      RETURN_IF_ERROR(Begin(chunk_.header()));
    } else if (chunk_.has_header()) {
      return absl::InvalidArgumentError(absl::StrCat(
          What(), ": header repeated at offset ", chunk_.offset()));
    }
    const std::string& data = chunk_.data();
    const int64_t size = static_cast<int64_t>(data.size());
    const std::string chunk_name =
        absl::StrCat(What(), ": chunk at offset ", chunk_.offset());
    RETURN_IF_ERROR(sequence_.CheckNext(chunk_.offset(), size, chunk_name));
    if (absl::Status verified =
            ChunkSequence::CheckChecksum(Checksum64(data.data(), data.size()),
                                         chunk_.checksum(), chunk_name);
        !verified.ok()) {
      CountChecksumFailure(MetricsTransport::kGrpc);
      return verified;
    }
    if (size > 0) {
      std::memcpy(static_cast<char*>(buffer_.data_ptr()) + chunk_.offset(),
                  data.data(), data.size());
    }
    sequence_.Advance(size);
    return absl::OkStatus();
  }

  // Checks the header against the tensor, then allocates the buffer.
  absl::Status Begin(const v1::WriteRegionHeader& header) {
    ASSIGN_OR_RETURN(resolved_,
                     Resolve(env_, header.name(), header.tensor_id(),
                             header.offsets(), header.sizes(), "WriteRegion"));
    const DType dtype = resolved_->metadata.tensor_properties.dtype;
    RETURN_IF_ERROR(CheckWriteHeader(header.dtype(), header.total_bytes(),
                                     dtype, resolved_->nbytes, What(),
                                     "region"));
    replica_ = header.replica();
    if (env_.budget != nullptr) {
      // Pieces with a holder elsewhere are forwarded (not in a write to
      // this daemon's replicas only).
      const int64_t pieces =
          replica_ ? 0 : StagedPieceBytes(*resolved_, [&](size_t shard) {
            return Forwarded(shard);
          });
      ASSIGN_OR_RETURN(
          staged_,
          env_.budget->Reserve(resolved_->nbytes + pieces,
                               StagingWhat("WriteRegion", *resolved_, pieces)));
    }
    ASSIGN_OR_RETURN(buffer_,
                     Tensor::Empty(resolved_->region.shard_sizes(),
                                   TensorOptions().WithDType(dtype).Private()));
    sequence_.Start(resolved_->nbytes);
    return absl::OkStatus();
  }

  // Whether some holder of `shard` is another daemon.
  bool Forwarded(size_t shard) const {
    for (int holder : HoldersOf(resolved_->info, static_cast<int>(shard))) {
      if (holder != env_.rank->rank()) return true;
    }
    return false;
  }

  void End() {
    if (!resolved_.has_value()) {
      Finish(ToGrpcStatus(absl::InvalidArgumentError(
          "WriteRegion: the stream ended without a header")));
      return;
    }
    const absl::Status complete = sequence_.CheckComplete(What());
    if (!complete.ok()) {
      Finish(ToGrpcStatus(complete));
      return;
    }
    thread_.Start([this] {
      // A client cancelled (Ctrl-C) or past its deadline while this daemon
      // was stalled was told its write failed; its stream, complete in the
      // socket buffer, must not land now, over any write it made since.
      if (context_->IsCancelled()) {
        Finish(ToGrpcStatus(absl::CancelledError(
            absl::StrCat(What(),
                         ": the client gave up before the write was applied; "
                         "nothing written"))));
        return;
      }
      const absl::Status applied = Apply();
      if (applied.ok()) {
        response_->set_bytes_written(sequence_.total_bytes());
        CountTransfer(MetricsTransport::kGrpc, MetricsDirection::kWrite,
                      sequence_.total_bytes(), absl::Now() - started_);
      }
      Finish(ToGrpcStatus(applied));
    });
  }

  absl::Status Apply() {
    const ResolvedRegion& resolved = *resolved_;
    const ShardRegistry::Resolved target =
        env_.rank->registry().Resolve(resolved.info.tensor_id());
    if (!target.writable) {
      return ReadOnlyVersionError(resolved.info.tensor_id(), What());
    }
    const ShardMetadata& region = resolved.region;
    const auto& shards = resolved.metadata.shards_metadata;
    const std::shared_ptr<const RegisteredTensor>& registered = target.tensor;
    copies_ = env_.rank->registry()
                  .Resolve(ReplicaTensorId(resolved.info.tensor_id()))
                  .tensor;
    refill_ =
        env_.refilling ? env_.refilling(resolved.info.tensor_id()) : nullptr;
    if (replica_) {
      // Into this daemon's copies only: a holder of a replica was sent it.
      for (const RegionOverlap& overlap : Overlaps(shards, region)) {
        if (Mine(copies_, overlap.shard) == nullptr && refill_ == nullptr) {
          return absl::InvalidArgumentError(
              absl::StrCat(What(), ": rank ", env_.rank->rank(),
                           " holds no replica of shard ", overlap.shard,
                           " of tensor id ", resolved.info.tensor_id()));
        }
      }
      return WriteEveryRegionPiece(
          shards, region.shard_offsets(), buffer_, env_.parallelism, What(),
          [&](const RegionPiece& piece, std::string* name) {
            *name = absl::StrCat("replica rank ", env_.rank->rank(),
                                 " (this daemon)");
            return WriteHere(/*replica=*/true, piece);
          });
    }
    for (const RegionOverlap& overlap : Overlaps(shards, region)) {
      // The table says this rank owns it, yet it is not registered (nor
      // being refilled): a forward would come straight back.
      if (resolved.info.shard_ranks(overlap.shard) == env_.rank->rank() &&
          Mine(registered, overlap.shard) == nullptr && refill_ == nullptr) {
        if (const int64_t number = VersionNumber(resolved.info.tensor_id());
            number > 0 && registered == nullptr) {
          // A version's shards go when it ends unpublished.
          return absl::FailedPreconditionError(absl::StrCat(
              What(), ": version ", number,
              " is not open: it was aborted or its lease ended (begin a new "
              "one; docs/versions.md)"));
        }
        return absl::FailedPreconditionError(
            absl::StrCat(What(), ": shard ", overlap.shard, " of tensor id ",
                         resolved.info.tensor_id(),
                         " belongs to this rank but is not registered"));
      }
    }
    // Every owner is tried even after one failed, so that the error says
    // which boxes were written.
    return WriteEveryRegionPiece(
        shards, region.shard_offsets(), buffer_, env_.parallelism, What(),
        [&](const RegionPiece& piece, std::string* owner) {
          // To its owner and to every replica (wire/replicas.h).
          const std::vector<int> holders =
              HoldersOf(resolved.info, static_cast<int>(piece.shard));
          // A strided piece leaves from one contiguous copy, shared by its
          // holders (reserved with the region, StagedPieceBytes).
          Tensor packed = piece.view;
          if (!packed.is_contiguous() && Forwarded(piece.shard)) {
            ASSIGN_OR_RETURN(packed, piece.view.Contiguous());
          }
          HolderWriteOptions each;
          if (env_.mark_stale && !Versioned(resolved.info)) {
            // Holders that missed the piece must not serve the old bytes.
            each.mark_stale = [&](const std::vector<size_t>& missed) {
              std::vector<int> ranks;
              for (const size_t k : missed) ranks.push_back(holders[k]);
              return env_.mark_stale(resolved.info.tensor_id(), ranks,
                                     deadline_);
            };
          }
          return WriteToHolders(
              holders.size(), each,
              [&](size_t k, const std::shared_ptr<Cancellation>& cancel,
                  std::string* name) {
                return WritePiece(k == 0 ? registered : copies_, piece, packed,
                                  holders[k], k > 0, cancel, name);
              },
              owner);
        });
  }

  // Writes one piece: into this daemon's shard, or forwarded to its owner
  // from `packed` (its bytes, contiguous once it has a holder elsewhere).
  // Sets *owner to how errors name the owner.
  absl::Status WritePiece(
      const std::shared_ptr<const RegisteredTensor>& registered,
      const RegionPiece& piece, const Tensor& packed, int owner, bool replica,
      const std::shared_ptr<Cancellation>& cancel, std::string* owner_name) {
    const ResolvedRegion& resolved = *resolved_;
    *owner_name = absl::StrCat(replica ? "replica rank " : "rank ", owner);
    if (owner == env_.rank->rank() &&
        (Mine(registered, piece.shard) != nullptr || refill_ != nullptr)) {
      absl::StrAppend(owner_name, " (this daemon)");
      return WriteHere(replica, piece);
    }
    absl::StatusOr<WorkerInfo> worker = env_.rank->Worker(owner);
    RETURN_IF_ERROR(worker.status());
    absl::StrAppend(owner_name, " (", worker->address, ")");
    // gRPC shares one connection among channels to the same address with
    // the same arguments, so a channel per forward is cheap.
    std::unique_ptr<v1::ControlService::Stub> stub =
        v1::ControlService::NewStub(CreateTesseraChannel(worker->address));
    RegionWriteOptions options;
    options.deadline = deadline_;
    options.replica = replica;
    options.cancel = cancel;
    return WriteRegion(*stub, resolved.name, resolved.info.tensor_id(),
                       piece.box->shard_offsets(), packed, options)
        .status();
  }

  // Writes `piece` into this daemon's shard or copy of it: the refill's
  // while one is in progress (a restarted daemon's, whose shards are not
  // registered yet, or a stale copy's, whose registered bytes it replaces:
  // stale_copies.h), else the registered one.
  absl::Status WriteHere(bool replica, const RegionPiece& piece) {
    const std::string& id = resolved_->info.tensor_id();
    if (refill_ != nullptr) {
      // Taken unless it completed meanwhile (then the registered shard
      // holds the refilled bytes: write there).
      ASSIGN_OR_RETURN(const bool taken, refill_->Write(replica, piece));
      if (taken) return absl::OkStatus();
    }
    const std::string target_id = replica ? ReplicaTensorId(id) : id;
    const std::shared_ptr<const RegisteredTensor> target =
        env_.rank->registry().Resolve(target_id).tensor;
    if (const LocalShard* mine = Mine(target, piece.shard)) {
      // Held while the bytes change (a reshard fences them).
      ASSIGN_OR_RETURN(const ShardRegistry::WritePass pass,
                       env_.rank->registry().EnterWrite(target_id));
      return CopyBox(piece.view, std::vector<int64_t>(piece.view.dim(), 0),
                     mine->tensor, piece.offsets_in_shard,
                     piece.box->shard_sizes());
    }
    return absl::FailedPreconditionError(
        absl::StrCat(What(), ": rank ", env_.rank->rank(), " holds no ",
                     replica ? "replica" : "registered shard", " ", piece.shard,
                     " of tensor id ", id));
  }

  grpc::CallbackServerContext* const context_;
  v1::WriteRegionResponse* const response_;
  const RegionEnv env_;
  const absl::Time started_;
  const absl::Time deadline_;
  v1::WriteRegionChunk chunk_;
  // Set by the header.
  std::optional<ResolvedRegion> resolved_;
  MemoryBudget::Reservation staged_;  // Of buffer_.
  Tensor buffer_;
  // Whether the header asked for this daemon's replicas only; its copies.
  bool replica_ = false;
  std::shared_ptr<const RegisteredTensor> copies_;
  std::shared_ptr<Refill> refill_;  // This daemon refilling the tensor.
  // Chunks are the client's: out of order or too long is its mistake.
  ChunkSequence sequence_{absl::StatusCode::kInvalidArgument, "region"};
  ReactorThread thread_;
};

}  // namespace

grpc::ServerReadReactor<v1::WriteRegionChunk>* StartWriteRegion(
    grpc::CallbackServerContext* context, v1::WriteRegionResponse* response,
    RegionEnv env) {
  return new WriteRegionReactor(context, response, std::move(env));
}

}  // namespace tessera
