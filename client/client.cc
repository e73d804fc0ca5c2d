#include "client/client.h"
#include "client/cluster.h"
#include "client/read_plan.h"
#include "client/snapshot.h"
#include "client/version_watcher.h"
#include "client/version_writer.h"

#include <limits.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/types/span.h"
#include "client/region_transfer.h"
#include "client/shard_client.h"
#include "common/proto_convert.h"
#include "common/region.h"
#include "common/shard_layout.h"
#include "common/shard_metadata.h"
#include "common/status_macros.h"
#include "common/tensor_name.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/client_context.h"
#include "tessera/v1/control.grpc.pb.h"
#include "wire/call_deadline.h"
#include "wire/grpc_status.h"
#include "wire/message_digest.h"
#include "wire/replicas.h"
#include "wire/request_id.h"
#include "wire/request_limit.h"
#include "wire/version_id.h"

namespace tessera {

namespace {

using internal_client::Cluster;
using internal_client::Worker;

// For messages: a checkpoint path as given, or its first 256 bytes and its
// length when it is longer than any path can be.
std::string ShownPath(absl::string_view path) {
  return ShownText(path, PATH_MAX, 256);
}

// For messages: a group id ("name@number,...", wire/version_id.h) cut to
// its first few versions.
std::string SomeOfGroup(const std::string& id) {
  const std::vector<std::string> parts = absl::StrSplit(id, ',');
  return ShownNames(parts);
}

// A renewed lease (BeginOptions::lease, Client::Pin) ends this long after
// its last renewal unless the caller says otherwise; a joiner renews every
// kJoinedRenewal.
constexpr absl::Duration kRenewedLease = absl::Seconds(30);
constexpr absl::Duration kJoinedRenewal = absl::Seconds(2);

// The first pause between attempts of a logged call; it doubles.
constexpr absl::Duration kFirstRetryPause = absl::Milliseconds(200);
// A retry needs this much time left after its pause: one that cannot get
// an answer in time would turn a certain "was not applied" into the
// client's own deadline.
constexpr absl::Duration kRetryRoom = absl::Seconds(1);

// Runs one unary control call on the coordinator under the control
// deadline (or `by`, when sooner); errors keep the daemon's code, prefixed
// with `what`. A logged call (its op goes through the operation log)
// carries one request id for every attempt and retries attempts answered
// UNAVAILABLE (Client::Delete).
template <typename Request, typename Response>
absl::Status Control(const Cluster& cluster,
                     grpc::Status (v1::ControlService::Stub::*method)(
                         grpc::ClientContext*, const Request&, Response*),
                     const Request& request, Response* response,
                     absl::string_view what, bool logged = false,
                     absl::Time by = absl::InfiniteFuture()) {
  // Refused here, not sent: a daemon would refuse it, and one beyond 2 GiB
  // would abort this process in gRPC's serializer.
  RETURN_IF_ERROR(Annotate(CheckRequestSize(request), what));
  const std::string id = logged ? cluster.LoggedCallId() : cluster.CallId();
  const absl::Time deadline =
      std::min(by, absl::Now() + cluster.options().timeout);
  const int attempts = logged ? kLoggedCallAttempts : 1;
  absl::Duration pause = kFirstRetryPause;
  absl::Status status;
  for (int attempt = 1;; ++attempt) {
    grpc::ClientContext context;
    SetCallDeadline(context, deadline);
    SetRequestId(context, id);
    status = FromGrpcStatus(((*cluster.coordinator().control).*method)(
        &context, request, response));
    if (!absl::IsUnavailable(status) || attempt >= attempts ||
        absl::Now() + pause + kRetryRoom >= deadline) {
      break;
    }
    absl::SleepFor(pause);
    pause *= 2;
  }
  // The daemon names the id when the outcome is open; a deadline the
  // client saw first (a stalled daemon) or a lost connection does not.
  if (logged &&
      (absl::IsDeadlineExceeded(status) || absl::IsUnavailable(status)) &&
      !absl::StrContains(status.message(), id) &&
      !absl::StrContains(status.message(), "was not applied")) {
    status = absl::Status(
        status.code(),
        absl::StrCat(status.message(), " (request id ", id, ": `tessera op ",
                     id, "` tells whether it ran)"));
  }
  return Annotate(status, what);
}

// Every tensor of `names` that exists (each once; empty `names`: every
// tensor), sorted by name, read in ListTensors pages of about
// ClientOptions::list_page_bytes, all within one control deadline. Pages
// are read one after another, not at one point of the log: a tensor
// created or deleted meanwhile may be in the list or not. A daemon too old
// to page answers everything at once, which is taken as the last page.
absl::StatusOr<v1::ListTensorsResponse> ListPaged(
    const Cluster& cluster, std::vector<std::string> names,
    absl::string_view what) {
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  const absl::Time by = absl::Now() + cluster.options().timeout;
  v1::ListTensorsResponse all;
  auto from = names.begin();
  std::string after;
  for (int page = 1;; ++page) {
    v1::ListTensorsRequest request;
    request.set_after(after);
    request.set_page_bytes(cluster.options().list_page_bytes);
    for (auto it = from; it != names.end(); ++it) request.add_names(*it);
    v1::ListTensorsResponse reply;
    RETURN_IF_ERROR(Control(
        cluster, &v1::ControlService::Stub::ListTensors, request, &reply,
        page == 1 ? std::string(what)
                  : absl::StrCat(what, " (page ", page, ", after ", after, ")"),
        /*logged=*/false, by));
    for (v1::TensorInfo& info : *reply.mutable_tensors()) {
      if (info.name() <= after && !after.empty()) {
        return absl::DataLossError(absl::StrCat(
            what, ": page ", page, " of the daemon's list holds tensor ",
            info.name(), ", which does not sort after ", after));
      }
      all.add_tensors()->Swap(&info);
    }
    if (!reply.more() || reply.tensors_size() == 0) return all;
    after = all.tensors(all.tensors_size() - 1).name();
    if (!names.empty()) {
      from = std::upper_bound(from, names.end(), after);
      // None left to ask for (an empty list would ask for every tensor).
      if (from == names.end()) return all;
    }
  }
}

// The model of a TensorInfo a daemon sent, checked.
absl::StatusOr<ShardedTensorMetadata> MetadataOf(const v1::TensorInfo& info) {
  absl::StatusOr<ShardedTensorMetadata> metadata = FromProto(info.metadata());
  if (!metadata.ok()) {
    return absl::DataLossError(
        absl::StrCat("tensor ", info.name(),
                     ": malformed metadata: ", metadata.status().message()));
  }
  if (static_cast<size_t>(info.shard_ranks_size()) !=
      metadata->shards_metadata.size()) {
    return absl::DataLossError(absl::StrCat(
        "tensor ", info.name(), ": ", info.shard_ranks_size(), " owners for ",
        metadata->shards_metadata.size(), " shards"));
  }
  return metadata;
}

// A control call answered with one TensorInfo, and the info's model.
struct Described {
  v1::TensorInfo info;
  ShardedTensorMetadata metadata;
};

template <typename Request>
absl::StatusOr<Described> Describe(
    const Cluster& cluster,
    grpc::Status (v1::ControlService::Stub::*method)(grpc::ClientContext*,
                                                     const Request&,
                                                     v1::TensorInfo*),
    const Request& request, absl::string_view what, bool logged = false,
    absl::Time by = absl::InfiniteFuture()) {
  Described described;
  RETURN_IF_ERROR(
      Control(cluster, method, request, &described.info, what, logged, by));
  ASSIGN_OR_RETURN(described.metadata, MetadataOf(described.info));
  return described;
}

// The tensor named `name` as the cluster describes it now.
absl::StatusOr<Described> DescribeNamed(const Cluster& cluster,
                                        const std::string& name) {
  v1::DescribeNamedTensorRequest request;
  request.set_name(name);
  return Describe(cluster, &v1::ControlService::Stub::DescribeTensor, request,
                  absl::StrCat("opening tensor ", ShownName(name)));
}

// What became of a view's tensor (of id `view_id`) that is `now`
// another.
std::string MovedSince(const std::string& view_id, const Described& now) {
  return absl::StrCat(
      "it was resharded or created again since this view was made: it is "
      "now ",
      now.info.tensor_id(), ", not ", view_id);
}

// FAILED_PRECONDITION (`what` names the call) when `now`, the tensor named
// as a view (of id `view_id`, laid out as `view`) is now, has other sizes
// or another dtype: the view cannot stand for it.
absl::Status CheckSameSizesAndDType(absl::string_view what,
                                    const std::string& view_id,
                                    const ShardedTensorMetadata& view,
                                    const Described& now) {
  const DType was = view.tensor_properties.dtype;
  const DType is = now.metadata.tensor_properties.dtype;
  if (now.metadata.size == view.size && is == was) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(what, ": ", MovedSince(view_id, now), ", of sizes [",
                   absl::StrJoin(now.metadata.size, ", "), "] ", DTypeName(is),
                   " where this view has [", absl::StrJoin(view.size, ", "),
                   "] ", DTypeName(was), "; open it again"));
}

v1::InitKind InitKindOf(TensorInit init) {
  switch (init) {
    case TensorInit::kEmpty:
      return v1::INIT_KIND_EMPTY;
    case TensorInit::kZeros:
      return v1::INIT_KIND_ZEROS;
    case TensorInit::kOnes:
      return v1::INIT_KIND_ONES;
    case TensorInit::kFull:
      return v1::INIT_KIND_FULL;
    case TensorInit::kRand:
      return v1::INIT_KIND_RAND;
    case TensorInit::kRandn:
      return v1::INIT_KIND_RANDN;
  }
  return v1::INIT_KIND_UNSPECIFIED;
}

absl::Status CheckDType(const Tensor& tensor, DType dtype,
                        absl::string_view what) {
  if (!tensor.defined()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": undefined tensor"));
  }
  if (tensor.dtype() != dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", tensor.DebugString(),
                     " is not of the tensor's dtype ", DTypeName(dtype)));
  }
  return absl::OkStatus();
}

// A region's bytes: product(sizes) * element size (the region is inside
// the tensor, so this cannot overflow for a real tensor).
int64_t RegionBytes(absl::Span<const int64_t> sizes, DType dtype) {
  return CheckedProduct(sizes).value_or(0) *
         static_cast<int64_t>(ElementSize(dtype));
}

}  // namespace

// ---- ShardedTensorView ------------------------------------------------------

ShardedTensorView::ShardedTensorView(std::shared_ptr<Cluster> cluster,
                                     v1::TensorInfo info,
                                     ShardedTensorMetadata metadata)
    : cluster_(std::move(cluster)),
      info_(std::move(info)),
      metadata_(std::move(metadata)) {}

std::vector<RemoteShard> ShardedTensorView::remote_shards() const {
  std::vector<RemoteShard> shards;
  shards.reserve(metadata_.shards_metadata.size());
  for (size_t i = 0; i < metadata_.shards_metadata.size(); ++i) {
    const int owner = owner_rank(i);
    WorkerInfo worker;
    worker.id = owner;
    std::shared_ptr<ShardClient> client;
    absl::StatusOr<std::shared_ptr<const Worker>> connection =
        cluster_->worker(owner);
    if (connection.ok()) {
      worker.name = (*connection)->address.name();
      worker.address = (*connection)->address.address();
      if (cluster_->options().data_plane) {
        worker.data_plane_address = (*connection)->address.data_address();
      }
      if (cluster_->options().use_local_path) {
        worker.local_address = (*connection)->address.local_address();
      }
      client = (*connection)->shards;
    }
    shards.emplace_back(std::move(worker), DataId(), static_cast<int64_t>(i),
                        metadata_.shards_metadata[i], std::move(client),
                        open_version_ ? 0 : at_version_);
  }
  return shards;
}

absl::Status ShardedTensorView::CheckNotLost(absl::Span<const int64_t> offsets,
                                             absl::Span<const int64_t> sizes,
                                             absl::string_view what) const {
  if (info_.lost_shards().empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(const ShardMetadata region,
                   ShardMetadata::Create(offsets, sizes));
  std::vector<std::string> lost;
  for (const RegionOverlap& overlap :
       Overlaps(metadata_.shards_metadata, region)) {
    const int shard = static_cast<int>(overlap.shard);
    if (std::find(info_.lost_shards().begin(), info_.lost_shards().end(),
                  shard) == info_.lost_shards().end()) {
      continue;
    }
    lost.push_back(absl::StrCat("shard ", shard, " ",
                                BoxString(metadata_.shards_metadata[shard]),
                                " of rank ", owner_rank(shard)));
  }
  if (lost.empty()) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(
      what, ": the tensor is degraded: ", absl::StrJoin(lost, ", "),
      " lost when the owner restarted; load it from a checkpoint (with "
      "replace) or delete it"));
}

absl::StatusOr<Tensor> ShardedTensorView::ReadRegion(
    absl::Span<const int64_t> offsets, absl::Span<const int64_t> sizes,
    const TransferOptions& options) const {
  RETURN_IF_ERROR(ValidateRegion(offsets, sizes, metadata_.size,
                                 absl::StrCat("tensor ", name()), "tensor"));
  ASSIGN_OR_RETURN(Tensor destination,
                   Tensor::Empty(sizes, TensorOptions().WithDType(dtype())));
  RETURN_IF_ERROR(ReadRegionInto(offsets, destination, options));
  return destination;
}

std::string ShardedTensorView::DataId() const {
  return at_version_ > 0 ? VersionId(tensor_id(), at_version_) : tensor_id();
}

absl::StatusOr<ShardedTensorView> ShardedTensorView::Relocated(
    const absl::Status& read) const {
  const std::string what = absl::StrCat("reading tensor ", name());
  const auto not_kept = [&](absl::string_view why) {
    return absl::NotFoundError(
        absl::StrCat(what, ": version ", at_version_, " is not kept (", why,
                     "; `tessera versions ", name(),
                     "` lists the kept ones): ", read.message()));
  };
  absl::StatusOr<Described> now = DescribeNamed(*cluster_, name());
  if (absl::IsNotFound(now.status())) {
    return absl::NotFoundError(
        absl::StrCat(what, ": it was deleted since this view was made (",
                     read.message(), ")"));
  }
  if (!now.ok() || now->info.tensor_id() == tensor_id()) {
    return at_version_ > 0 ? not_kept("it was freed, or never published")
                           : read;
  }
  // Resharded (or deleted and created again) since this view was made.
  RETURN_IF_ERROR(CheckSameSizesAndDType(what, tensor_id(), metadata_, *now));
  const auto& kept = now->info.kept_versions();
  if (at_version_ > 0 &&
      (!Versioned(now->info) ||
       std::find(kept.begin(), kept.end(), at_version_) == kept.end())) {
    return not_kept(MovedSince(tensor_id(), *now));
  }
  ShardedTensorView view(cluster_, std::move(now->info),
                         std::move(now->metadata));
  view.at_version_ = at_version_;
  return view;
}

absl::StatusOr<ShardedTensorView> ShardedTensorView::AtVersion(
    int64_t number) const {
  if (!versioned()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "tensor ", name(),
        " has no versions (it was created without versions >= 2)"));
  }
  if (number < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor ", name(), ": version numbers start at 1, not ", number));
  }
  ShardedTensorView view = *this;
  view.at_version_ = number;
  view.open_version_ = false;
  return view;
}

absl::Status ShardedTensorView::ReadPieces(
    absl::Span<const int64_t> offsets, const Tensor& destination,
    const TransferOptions& options, const std::string& id,
    const std::function<bool(size_t shard)>& wanted,
    std::vector<int64_t>* versions, ProgressCounter* progress) const {
  const std::string what = absl::StrCat("reading tensor ", name());
  const absl::Time deadline = absl::Now() + options.timeout;
  // A holder given up on for one shard is not asked for the others.
  internal_client::PassedOver passed_over;
  return ForEachRegionPiece(
      metadata_.shards_metadata, offsets, destination, options.parallelism,
      [&](const RegionPiece& piece) -> absl::Status {
        if (!wanted(piece.shard)) return absl::OkStatus();
        FetchOptions fetch;
        fetch.chunk_bytes = options.chunk_bytes;
        fetch.on_chunk = [progress](int64_t bytes) { progress->Add(bytes); };
        fetch.cancel = options.cancel;
        fetch.served_version = &(*versions)[piece.shard];
        return internal_client::FetchFromHolders(
            *cluster_, info_, id, piece.shard, piece.offsets_in_shard,
            piece.view, std::move(fetch), deadline, what, &passed_over);
      });
}

absl::Status ShardedTensorView::ReadRegionInto(
    absl::Span<const int64_t> offsets, const Tensor& destination,
    const TransferOptions& options) const {
  absl::Status read = ReadFromThisLayout(offsets, destination, options);
  // This layout is gone: read the tensor's new one (again when that one
  // was resharded too while it was read; each time takes a reshard).
  constexpr int kRelocations = 8;
  std::optional<ShardedTensorView> moved;
  for (int k = 0; k < kRelocations && absl::IsNotFound(read) && !open_version_;
       ++k) {
    absl::StatusOr<ShardedTensorView> now =
        (moved.has_value() ? *moved : *this).Relocated(read);
    if (!now.ok()) return now.status();
    moved = *std::move(now);
    read = moved->ReadFromThisLayout(offsets, destination, options);
  }
  return read;
}

absl::Status ShardedTensorView::ReadFromThisLayout(
    absl::Span<const int64_t> offsets, const Tensor& destination,
    const TransferOptions& options) const {
  const std::string what = absl::StrCat("reading tensor ", name());
  RETURN_IF_ERROR(CheckDType(destination, dtype(), what));
  if (!destination.device().is_cpu()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the destination ",
                                                   destination.DebugString(),
                                                   " is not on the CPU"));
  }
  const std::vector<int64_t>& sizes = destination.sizes();
  RETURN_IF_ERROR(ValidateRegion(offsets, sizes, metadata_.size,
                                 absl::StrCat("tensor ", name()), "tensor"));
  RETURN_IF_ERROR(CheckNotLost(offsets, sizes, what));
  ProgressCounter progress(RegionBytes(sizes, dtype()), options.progress);
  const size_t shards = metadata_.shards_metadata.size();
  const auto all = [](size_t) { return true; };
  std::vector<int64_t> versions(shards, 0);
  if (!versioned() || at_version_ > 0) {
    // One id for every piece: an unversioned tensor, a pinned version or
    // an open one.
    std::fill(versions.begin(), versions.end(), int64_t{-1});
    absl::Status read = ReadPieces(offsets, destination, options, DataId(), all,
                                   &versions, &progress);
    RETURN_IF_ERROR(read);
    if (at_version_ > 0 && !open_version_) {
      // The pieces read (versions[shard] >= 0) whose holder served the
      // version unpublished.
      const auto unpublished = [&](size_t shard) {
        return versions[shard] >= 0 && versions[shard] != at_version_;
      };
      RETURN_IF_ERROR(AwaitPublished(
          absl::Now() + options.timeout,
          absl::StrCat("reading tensor ", name()), at_version_,
          [&] {
            for (size_t shard = 0; shard < shards; ++shard) {
              if (unpublished(shard)) return true;
            }
            return false;
          },
          [&] {
            return ReadPieces(offsets, destination, options, DataId(),
                              unpublished, &versions, &progress);
          }));
    }
    if (options.version != nullptr)
      *options.version = open_version_ ? 0 : at_version_;
    progress.Finish();
    return absl::OkStatus();
  }
  // The latest version: each owner serves the one it has published. While
  // a publish is being applied they may differ; the pieces that are older
  // than the newest seen are read again by that version's id, which every
  // owner serves once any daemon has published it (docs/versions.md).
  // Should the newest be freed meanwhile (K newer publishes), start over.
  // Asked for as at least the newest this client saw (wire/version_id.h),
  // so that the daemons still applying that publish serve it, not the one
  // before; a daemon without it (restarted since) is asked for its latest.
  constexpr int kAttempts = 8;
  absl::Status status;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    std::fill(versions.begin(), versions.end(), int64_t{0});
    const int64_t seen = cluster_->SeenVersion(tensor_id());
    absl::Status read;
    if (seen >= 2) {
      read =
          ReadPieces(offsets, destination, options,
                     AtLeastId(tensor_id(), seen), all, &versions, &progress);
    }
    if (seen < 2 || absl::IsNotFound(read)) {
      std::fill(versions.begin(), versions.end(), int64_t{0});
      read = ReadPieces(offsets, destination, options, tensor_id(), all,
                        &versions, &progress);
    }
    RETURN_IF_ERROR(read);
    // Never older than what this client already read.
    const int64_t newest =
        std::max(*std::max_element(versions.begin(), versions.end()),
                 cluster_->SeenVersion(tensor_id()));
    const std::vector<int64_t> first = versions;
    // Shards outside the region kept 0 (a read piece is version 1 or more).
    const bool uniform =
        std::all_of(first.begin(), first.end(),
                    [&](int64_t v) { return v == 0 || v == newest; });
    status = uniform ? absl::OkStatus()
                     : ReadPieces(
                           offsets, destination, options,
                           VersionId(tensor_id(), newest),
                           [&](size_t shard) { return first[shard] != newest; },
                           &versions, &progress);
    if (status.ok()) {
      cluster_->SawVersion(tensor_id(), newest);
      if (options.version != nullptr) *options.version = newest;
      progress.Finish();
      return absl::OkStatus();
    }
    if (!absl::IsNotFound(status)) return status;
  }
  return status;
}

absl::StatusOr<Tensor> ShardedTensorView::Read(
    const TransferOptions& options) const {
  const std::vector<int64_t> origin(metadata_.size.size(), 0);
  return ReadRegion(origin, metadata_.size, options);
}

namespace {

// Whether a write was refused because the tensor's layout is moving: a
// reshard fences the old layout's writes (nothing applied), then the old
// layout goes (its id refused, then unknown).
bool RefusedByAReshard(const absl::Status& status) {
  return (absl::IsAborted(status) &&
          absl::StrContains(status.message(), "takes no writes now")) ||
         (absl::IsFailedPrecondition(status) &&
          absl::StrContains(status.message(), "resharded or re-created")) ||
         (absl::IsNotFound(status) &&
          absl::StrContains(status.message(), "unknown tensor"));
}

}  // namespace

absl::Status ShardedTensorView::Write(absl::Span<const int64_t> offsets,
                                      const Tensor& data,
                                      const TransferOptions& options) const {
  const absl::Time deadline = absl::Now() + options.timeout;
  absl::Status written = WriteToThisLayout(offsets, data, options);
  // Refused while the tensor is resharded: written again, whole, into the
  // tensor as it is once the reshard ends (or fails), within the deadline.
  std::optional<ShardedTensorView> moved;
  absl::Duration wait = absl::Milliseconds(10);
  while (!written.ok() && !open_version_ && at_version_ == 0 &&
         RefusedByAReshard(written) && absl::Now() + wait < deadline) {
    absl::SleepFor(wait);
    wait = std::min(2 * wait, absl::Milliseconds(200));
    absl::StatusOr<ShardedTensorView> now =
        (moved.has_value() ? *moved : *this).Reopened();
    if (!now.ok()) return now.status();
    moved = *std::move(now);
    TransferOptions rest = options;
    rest.timeout = deadline - absl::Now();
    written = moved->WriteToThisLayout(offsets, data, rest);
  }
  return written;
}

absl::StatusOr<ShardedTensorView> ShardedTensorView::Reopened() const {
  ASSIGN_OR_RETURN(Described now, DescribeNamed(*cluster_, name()));
  RETURN_IF_ERROR(CheckSameSizesAndDType(
      absl::StrCat("writing tensor ", name()), tensor_id(), metadata_, now));
  return ShardedTensorView(cluster_, std::move(now.info),
                           std::move(now.metadata));
}

namespace {

// INVALID_ARGUMENT when two boxes of `writes` share elements of one
// tensor's data (its in-place bytes or one of its versions): WriteMany
// writes them in no order, so those elements would end with either's
// bytes. Boxes Write itself refuses (another rank, negative offsets) are
// left to it. O(n log n): the sweep that checks shard layouts.
absl::Status CheckWritesApart(absl::Span<const BoxWrite> writes) {
  absl::flat_hash_map<std::pair<std::string, int64_t>, std::vector<size_t>>
      by_data;
  for (size_t i = 0; i < writes.size(); ++i) {
    const BoxWrite& write = writes[i];
    if (!write.data.defined() ||
        write.offsets.size() != write.view.sizes().size() ||
        write.data.sizes().size() != write.view.sizes().size()) {
      continue;
    }
    by_data[{write.view.tensor_id(), write.view.at_version()}].push_back(i);
  }
  for (const auto& [data, which] : by_data) {
    if (which.size() < 2) continue;
    std::vector<ShardMetadata> boxes;
    std::vector<size_t> index;  // Of each box's write.
    boxes.reserve(which.size());
    index.reserve(which.size());
    for (const size_t i : which) {
      absl::StatusOr<ShardMetadata> box =
          ShardMetadata::Create(writes[i].offsets, writes[i].data.sizes());
      if (!box.ok()) continue;
      boxes.push_back(*std::move(box));
      index.push_back(i);
    }
    absl::StatusOr<std::optional<std::pair<size_t, size_t>>> pair =
        FindOverlappingShards(boxes);
    if (!pair.ok() || !pair->has_value()) continue;  // Ranks: Write's say.
    const size_t first = index[(*pair)->first];
    const size_t second = index[(*pair)->second];
    const auto box = [&](size_t i) {
      return absl::StrCat("box ", i, " (offsets [",
                          absl::StrJoin(writes[i].offsets, ", "), "], sizes [",
                          absl::StrJoin(writes[i].data.sizes(), ", "), "])");
    };
    std::string version;
    if (data.second > 0) version = absl::StrCat(" version ", data.second);
    return absl::InvalidArgumentError(absl::StrCat(
        "writing ", writes.size(), " boxes at once: ", box(first), " and ",
        box(second), " of tensor ", writes[first].view.name(), version,
        " overlap; they are written in no order, so the elements they share "
        "would end with either's bytes: write one after the other"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteMany(absl::Span<const BoxWrite> writes,
                       const TransferOptions& options) {
  RETURN_IF_ERROR(CheckWritesApart(writes));
  const absl::Time deadline = absl::Now() + options.timeout;
  return RunInParallel(
      writes.size(), options.parallelism, [&](size_t i) -> absl::Status {
        TransferOptions one = options;
        one.timeout = std::max(deadline - absl::Now(), absl::ZeroDuration());
        one.progress = nullptr;
        one.version = nullptr;
        const BoxWrite& write = writes[i];
        return write.view.Write(write.offsets, write.data, one);
      });
}

absl::Status ShardedTensorView::WriteToThisLayout(
    absl::Span<const int64_t> offsets, const Tensor& data,
    const TransferOptions& options) const {
  const std::string what = absl::StrCat("writing tensor ", name());
  RETURN_IF_ERROR(CheckDType(data, dtype(), what));
  RETURN_IF_ERROR(ValidateRegion(offsets, data.sizes(), metadata_.size,
                                 absl::StrCat("tensor ", name()), "tensor"));
  RETURN_IF_ERROR(CheckNotLost(offsets, data.sizes(), what));
  RegionWriteOptions write;
  write.chunk_bytes = options.chunk_bytes;
  write.deadline = absl::Now() + options.timeout;
  write.cancel = options.cancel;
  write.local_min_bytes = cluster_->options().local_min_bytes;
  ProgressCounter progress(RegionBytes(data.sizes(), dtype()),
                           options.progress);
  write.on_chunk = [&progress](int64_t bytes) { progress.Add(bytes); };
  // Every owner is tried even after one failed, so that the error can say
  // exactly which boxes were written.
  RETURN_IF_ERROR(WriteEveryRegionPiece(
      metadata_.shards_metadata, offsets, data, options.parallelism, what,
      [&](const RegionPiece& piece, std::string* owner_name) -> absl::Status {
        // Each holder (the owner, then every replica) gets only what the
        // shard holds, pinned to this view's tensor id, so it writes
        // locally and never into a new layout.
        const std::vector<int> holders =
            HoldersOf(info_, static_cast<int>(piece.shard));
        HolderWriteOptions each;
        each.cancel = write.cancel;
        each.patience = cluster_->options().holder_patience;
        if (!Versioned(info_)) {
          // Holders that missed the piece must not serve the old bytes.
          each.mark_stale = [&](const std::vector<size_t>& missed) {
            return MarkStale(holders, missed, write.deadline);
          };
        }
        return WriteToHolders(
            holders.size(), each,
            [&](size_t k, const std::shared_ptr<Cancellation>& cancel,
                std::string* holder_name) -> absl::Status {
              *holder_name =
                  absl::StrCat(k == 0 ? "rank " : "replica rank ", holders[k]);
              RegionWriteOptions to_holder = write;
              to_holder.cancel = cancel;
              to_holder.replica = k > 0;
              to_holder.shard_bytes =
                  HostShardBytes(info_.metadata(), piece.shard);
              // Progress counts the owner's bytes only.
              if (k > 0) to_holder.on_chunk = nullptr;
              absl::Status status;
              for (int attempt = 0; attempt < 2; ++attempt) {
                ASSIGN_OR_RETURN(std::shared_ptr<const Worker> worker,
                                 cluster_->worker(holders[k]));
                *holder_name =
                    absl::StrCat(k == 0 ? "rank " : "replica rank ", holders[k],
                                 " (", worker->address.address(), ")");
                // Over the data plane, straight into the shard, when the
                // holder can take it there; else through WriteRegion.
                absl::StatusOr<bool> direct = worker->shards->WriteRegion(
                    DataId(), static_cast<int64_t>(piece.shard),
                    piece.offsets_in_shard, piece.view, to_holder);
                status = direct.status();
                if (direct.ok() && !*direct) {
                  status = WriteRegion(*worker->control, name(), DataId(),
                                       piece.box->shard_offsets(), piece.view,
                                       to_holder)
                               .status();
                }
                // A holder that restarted elsewhere: where is it now?
                if (!absl::IsUnavailable(status) || attempt > 0 ||
                    !cluster_->Reconnect(holders[k], worker)) {
                  break;
                }
              }
              return status;
            },
            owner_name);
      }));
  progress.Finish();
  return absl::OkStatus();
}

absl::Status ShardedTensorView::MarkStale(const std::vector<int>& holders,
                                          const std::vector<size_t>& missed,
                                          absl::Time deadline) const {
  v1::MarkStaleRequest request;
  request.set_tensor_id(tensor_id());
  for (const size_t k : missed) request.add_ranks(holders[k]);
  // Asked of a holder that took the piece (any daemon would do).
  absl::Status status = absl::UnavailableError("no holder took the piece");
  for (size_t k = 0; k < holders.size(); ++k) {
    if (std::find(missed.begin(), missed.end(), k) != missed.end()) continue;
    absl::StatusOr<std::shared_ptr<const Worker>> worker =
        cluster_->worker(holders[k]);
    if (!worker.ok()) {
      status = worker.status();
      continue;
    }
    grpc::ClientContext context;
    SetCallDeadline(context, deadline);
    v1::MarkStaleResponse response;
    status = FromGrpcStatus(
        (*worker)->control->MarkStale(&context, request, &response));
    if (!absl::IsUnavailable(status)) break;
  }
  return status;
}

// ---- Client -----------------------------------------------------------------

absl::StatusOr<std::shared_ptr<Client>> Client::Connect(
    const std::string& address, const ClientOptions& options) {
  ASSIGN_OR_RETURN(std::shared_ptr<Cluster> cluster,
                   Cluster::Connect(address, options));
  return std::shared_ptr<Client>(new Client(std::move(cluster)));
}

Client::Client(std::shared_ptr<Cluster> cluster)
    : cluster_(std::move(cluster)) {}

Client::~Client() = default;

const v1::ClusterInfo& Client::cluster() const { return cluster_->info(); }

namespace {

// The request that creates `name`; INVALID_ARGUMENT for copies below 1
// (0 would read as the default, one copy, on the daemons).
absl::StatusOr<v1::CreateTensorRequest> CreateRequestOf(
    const Cluster& cluster, const std::string& name,
    absl::Span<const int64_t> sizes, const ShardingSpec& spec,
    const CreateOptions& options) {
  if (options.copies < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "creating tensor ", ShownName(name),
        ": copies must be between 1 and the ", cluster.info().world_size(),
        " daemons of the cluster, not ", options.copies));
  }
  v1::CreateTensorRequest request;
  request.set_name(name);
  request.mutable_sizes()->Add(sizes.begin(), sizes.end());
  request.set_dtype(tessera::ToProto(options.dtype));
  *request.mutable_spec() = tessera::ToProto(spec);
  request.set_init(InitKindOf(options.init));
  request.set_fill_value(options.fill_value);
  request.set_seed(options.seed);
  request.set_copies(options.copies);
  request.set_versions(options.versions);
  return request;
}

}  // namespace

absl::StatusOr<std::vector<ShardedTensorView>> Client::CreateMany(
    const std::vector<TensorToCreate>& tensors) {
  v1::CreateTensorsRequest request;
  std::vector<std::string> names;
  for (const TensorToCreate& tensor : tensors) {
    ASSIGN_OR_RETURN(*request.add_tensors(),
                     CreateRequestOf(*cluster_, tensor.name, tensor.sizes,
                                     tensor.spec, tensor.options));
    names.push_back(tensor.name);
  }
  std::string what = absl::StrCat("creating ", tensors.size(), " tensors (",
                                  ShownNames(names), ")");
  v1::ListTensorsResponse response;
  RETURN_IF_ERROR(Control(*cluster_, &v1::ControlService::Stub::CreateTensors,
                          request, &response, what, /*logged=*/true));
  if (response.tensors_size() != request.tensors_size()) {
    return absl::DataLossError(absl::StrCat(what, ": ", response.tensors_size(),
                                            " tensors in the answer"));
  }
  std::vector<ShardedTensorView> views;
  views.reserve(tensors.size());
  for (v1::TensorInfo& info : *response.mutable_tensors()) {
    ASSIGN_OR_RETURN(ShardedTensorMetadata metadata, MetadataOf(info));
    views.push_back(
        ShardedTensorView(cluster_, std::move(info), std::move(metadata)));
  }
  return views;
}

absl::StatusOr<ShardedTensorView> Client::Create(const std::string& name,
                                                 std::vector<int64_t> sizes,
                                                 const ShardingSpec& spec,
                                                 const CreateOptions& options) {
  ASSIGN_OR_RETURN(const v1::CreateTensorRequest request,
                   CreateRequestOf(*cluster_, name, sizes, spec, options));
  ASSIGN_OR_RETURN(
      Described created,
      Describe(*cluster_, &v1::ControlService::Stub::CreateTensor, request,
               absl::StrCat("creating tensor ", ShownName(name)),
               /*logged=*/true));
  return ShardedTensorView(cluster_, std::move(created.info),
                           std::move(created.metadata));
}

absl::string_view OperationStateName(v1::OperationStatus::State state) {
  switch (state) {
    case v1::OperationStatus::STATE_COMMITTED:
      return "committed";
    case v1::OperationStatus::STATE_FAILED:
      return "failed";
    case v1::OperationStatus::STATE_PENDING:
      return "pending";
    default:
      return "unknown";
  }
}

absl::StatusOr<v1::OperationStatus> Client::Operation(
    const std::string& request_id) const {
  v1::GetOperationRequest request;
  request.set_request_id(request_id);
  v1::OperationStatus status;
  const std::string what = absl::StrCat("asking for operation ", request_id);
  RETURN_IF_ERROR(Control(*cluster_, &v1::ControlService::Stub::GetOperation,
                          request, &status, what));
  if (status.state() != v1::OperationStatus::STATE_UNKNOWN) return status;
  // Another daemon may have coordinated the call (and hold it pending), or
  // remember it from before the connected one restarted.
  for (const std::shared_ptr<const Worker>& worker : cluster_->workers()) {
    if (worker.get() == &cluster_->coordinator()) continue;
    grpc::ClientContext context;
    SetCallDeadline(context, absl::Now() + std::min(cluster_->options().timeout,
                                                    absl::Seconds(5)));
    v1::OperationStatus there;
    if (worker->control->GetOperation(&context, request, &there).ok() &&
        there.state() != v1::OperationStatus::STATE_UNKNOWN) {
      return there;
    }
  }
  return status;
}

absl::StatusOr<std::vector<ShardedTensorView>> Client::List() const {
  ASSIGN_OR_RETURN(v1::ListTensorsResponse response,
                   ListPaged(*cluster_, {}, "listing tensors"));
  std::vector<ShardedTensorView> views;
  for (v1::TensorInfo& info : *response.mutable_tensors()) {
    ASSIGN_OR_RETURN(ShardedTensorMetadata metadata, MetadataOf(info));
    views.push_back(
        ShardedTensorView(cluster_, std::move(info), std::move(metadata)));
  }
  std::sort(views.begin(), views.end(),
            [](const ShardedTensorView& a, const ShardedTensorView& b) {
              return a.name() < b.name();
            });
  return views;
}

absl::StatusOr<ShardedTensorView> Client::Open(const std::string& name) const {
  std::shared_ptr<const Opened> cached;
  {
    absl::MutexLock lock(&opened_mu_);
    auto it = opened_.find(name);
    if (it != opened_.end()) cached = it->second;
  }
  if (cached != nullptr) {
    // What the daemon would answer now, digested, over the data plane: the
    // same as what this client holds, it is used again. Anything else (a
    // change, an error, no data plane) asks the daemon through gRPC.
    const absl::StatusOr<uint64_t> digest =
        cluster_->coordinator().shards->DescribeDigest(
            name, absl::Now() + cluster_->options().timeout);
    if (digest.ok() && *digest == cached->digest) {
      return ShardedTensorView(cluster_, cached->info, cached->metadata);
    }
    // A daemon that did not answer within the call's deadline (stalled)
    // has spent it: asking again through gRPC would wait a second one.
    if (absl::IsDeadlineExceeded(digest.status())) {
      return Annotate(digest.status(),
                      absl::StrCat("opening tensor ", ShownName(name)));
    }
  }
  absl::StatusOr<Described> opened = DescribeNamed(*cluster_, name);
  if (!opened.ok()) {
    absl::MutexLock lock(&opened_mu_);
    opened_.erase(name);
    return opened.status();
  }
  auto entry = std::make_shared<Opened>(
      Opened{MessageDigest(opened->info), opened->info, opened->metadata});
  {
    absl::MutexLock lock(&opened_mu_);
    if (opened_.size() >= kMaxOpenedCache && !opened_.count(name)) {
      opened_.clear();
    }
    opened_[name] = std::move(entry);
  }
  return ShardedTensorView(cluster_, std::move(opened->info),
                           std::move(opened->metadata));
}

namespace {

// Up to this many tensors are opened one by one (through Open's cache);
// more, by one list.
constexpr size_t kOpenEach = 2;

}  // namespace

absl::StatusOr<std::vector<ShardedTensorView>> Client::OpenMany(
    const std::vector<std::string>& names) const {
  if (names.size() > kOpenEach) return OpenNamed(cluster_, names);
  std::vector<ShardedTensorView> views;
  for (const std::string& name : names) {
    ASSIGN_OR_RETURN(ShardedTensorView view, Open(name));
    views.push_back(std::move(view));
  }
  return views;
}

absl::StatusOr<std::vector<ShardedTensorView>> Client::OpenNamed(
    const std::shared_ptr<Cluster>& cluster,
    const std::vector<std::string>& names) {
  std::vector<ShardedTensorView> views;
  views.reserve(names.size());
  ASSIGN_OR_RETURN(v1::ListTensorsResponse response,
                   ListPaged(*cluster, names, "listing tensors"));
  absl::flat_hash_map<std::string, v1::TensorInfo*> index;
  for (v1::TensorInfo& info : *response.mutable_tensors()) {
    index[info.name()] = &info;
  }
  for (const std::string& name : names) {
    auto it = index.find(name);
    if (it == index.end()) {
      return absl::NotFoundError(
          absl::StrCat("opening tensor ", ShownName(name), ": no tensor named ",
                       ShownName(name)));
    }
    ASSIGN_OR_RETURN(ShardedTensorMetadata metadata, MetadataOf(*it->second));
    views.push_back(
        ShardedTensorView(cluster, *it->second, std::move(metadata)));
  }
  return views;
}

namespace {

// The views of a group's versions from `opened`, the views of their
// tensors in the group's order: each at its version (open for writes with
// `open`).
absl::StatusOr<std::vector<ShardedTensorView>> ViewsAtVersions(
    const v1::VersionGroup& group, std::vector<ShardedTensorView> opened,
    bool open) {
  std::vector<ShardedTensorView> views;
  views.reserve(group.versions_size());
  for (int i = 0; i < group.versions_size(); ++i) {
    const v1::VersionHandle& handle = group.versions(i);
    ShardedTensorView view = std::move(opened[i]);
    if (handle.tensor_id() != VersionId(view.tensor_id(), handle.number())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "tensor ", handle.name(), " is now ", view.tensor_id(), ", not ",
          VersionBase(handle.tensor_id()), " (deleted and created again)"));
    }
    ASSIGN_OR_RETURN(view, view.AtVersion(handle.number()));
    if (open) view = view.AsOpenVersion();
    views.push_back(std::move(view));
  }
  return views;
}

// The views of a group's versions: each tensor opened (Client::OpenMany),
// at its version.
absl::StatusOr<std::vector<ShardedTensorView>> GroupViews(
    const Client& client, const v1::VersionGroup& group, bool open) {
  std::vector<std::string> names;
  names.reserve(group.versions_size());
  for (const v1::VersionHandle& handle : group.versions()) {
    names.push_back(handle.name());
  }
  ASSIGN_OR_RETURN(std::vector<ShardedTensorView> opened,
                   client.OpenMany(names));
  return ViewsAtVersions(group, std::move(opened), open);
}

using ViewIndex = absl::flat_hash_map<std::string, size_t>;

// Each view's position by name.
std::shared_ptr<const ViewIndex> IndexViews(
    const std::vector<ShardedTensorView>& views) {
  auto index = std::make_shared<ViewIndex>();
  for (size_t i = 0; i < views.size(); ++i) index->emplace(views[i].name(), i);
  return index;
}

absl::StatusOr<ShardedTensorView> ViewNamed(
    const std::vector<ShardedTensorView>& views,
    const std::shared_ptr<const ViewIndex>& index, const std::string& name,
    absl::string_view what) {
  if (index != nullptr) {
    auto it = index->find(name);
    if (it != index->end()) return views[it->second];
  }
  return absl::NotFoundError(
      absl::StrCat("tensor ", ShownName(name), " is not in this ", what));
}

}  // namespace

absl::StatusOr<ShardedTensorView> VersionWriter::view(
    const std::string& name) const {
  return ViewNamed(views_, index_, name, "version group");
}

namespace {

// Ends `lease` (when renewed) after a call that settled its versions or
// pin: published, aborted or released, or refused since they are not there
// to settle. A call whose outcome is unknown (the daemons unreachable,
// the deadline passed) leaves it renewed, for the caller to try again.
void EndLeaseAfter(const absl::Status& status,
                   internal_client::LeaseKeeper::Lease* lease) {
  if (lease == nullptr) return;
  if (status.ok() || absl::IsFailedPrecondition(status) ||
      absl::IsNotFound(status) || absl::IsInvalidArgument(status) ||
      absl::IsPermissionDenied(status) || absl::IsUnauthenticated(status)) {
    lease->End();
  }
}

}  // namespace

absl::StatusOr<v1::VersionGroup> VersionWriter::Publish() const {
  v1::PublishVersionRequest request;
  *request.mutable_versions() = group_.versions();
  v1::VersionGroup published;
  const absl::Status status = Control(
      *cluster_, &v1::ControlService::Stub::PublishVersion, request, &published,
      absl::StrCat("publishing versions ", SomeOfGroup(group_.id())),
      /*logged=*/true);
  EndLeaseAfter(status, lease_.get());
  RETURN_IF_ERROR(status);
  return published;
}

absl::Status VersionWriter::Abort() const {
  v1::AbortVersionRequest request;
  *request.mutable_versions() = group_.versions();
  v1::AbortVersionResponse response;
  const absl::Status status = Control(
      *cluster_, &v1::ControlService::Stub::AbortVersion, request, &response,
      absl::StrCat("aborting versions ", SomeOfGroup(group_.id())),
      /*logged=*/true);
  EndLeaseAfter(status, lease_.get());
  return status;
}

int64_t Snapshot::version(const std::string& name) const {
  if (index_ == nullptr) return 0;
  auto it = index_->find(name);
  if (it == index_->end()) return 0;
  return group_.versions(static_cast<int>(it->second)).number();
}

absl::StatusOr<ShardedTensorView> Snapshot::view(
    const std::string& name) const {
  return ViewNamed(views_, index_, name, "snapshot");
}

absl::Status Snapshot::Release() const {
  v1::UnpinVersionsRequest request;
  request.set_id(group_.id());
  v1::UnpinVersionsResponse response;
  const absl::Status status = Control(
      *cluster_, &v1::ControlService::Stub::UnpinVersions, request, &response,
      absl::StrCat("releasing snapshot ", SomeOfGroup(group_.id())),
      /*logged=*/true);
  EndLeaseAfter(status, lease_.get());
  return status;
}

absl::StatusOr<VersionWriter> Client::Begin(
    const std::vector<std::string>& names, const BeginOptions& options) {
  v1::BeginVersionRequest request;
  for (const std::string& name : names) request.add_names(name);
  request.set_empty(options.empty);
  request.set_skip_zeroing(options.skip_zeroing);
  const bool renewed = options.lease <= absl::ZeroDuration() || options.renew;
  const absl::Duration lease =
      options.lease > absl::ZeroDuration() ? options.lease : kRenewedLease;
  request.set_renewed(renewed);
  request.set_lease_ms(std::max<int64_t>(1, absl::ToInt64Milliseconds(lease)));
  VersionWriter writer;
  writer.cluster_ = cluster_;
  RETURN_IF_ERROR(
      Control(*cluster_, &v1::ControlService::Stub::BeginVersion, request,
              &writer.group_,
              absl::StrCat("beginning a version of ", ShownNames(names)),
              /*logged=*/true));
  if (renewed) {
    writer.lease_ = cluster_->leases().Keep(
        {writer.group_.versions().begin(), writer.group_.versions().end()}, "",
        lease / 6);
  }
  ASSIGN_OR_RETURN(writer.views_, GroupViews(*this, writer.group_, true));
  writer.index_ = IndexViews(writer.views_);
  return writer;
}

absl::StatusOr<VersionWriter> Client::Join(const std::string& id) {
  VersionWriter writer;
  writer.cluster_ = cluster_;
  writer.group_.set_id(id);
  std::vector<std::string> names;
  std::vector<int64_t> numbers;
  for (absl::string_view part : absl::StrSplit(id, ',')) {
    // Each part is a version id of a name (wire/version_id.h).
    const int64_t number = VersionNumber(part);
    if (number < 1 || VersionBase(part).empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "joining versions ", SomeOfGroup(id), ": \"", ShownName(part),
          "\" is not a version id (a group id is \"name@number,...\")"));
    }
    names.emplace_back(VersionBase(part));
    numbers.push_back(number);
  }
  // One call for the whole group (a state dict's may name tens of
  // thousands of tensors).
  ASSIGN_OR_RETURN(std::vector<ShardedTensorView> opened, OpenMany(names));
  for (size_t i = 0; i < opened.size(); ++i) {
    const ShardedTensorView& view = opened[i];
    const auto& open_versions = view.info().open_versions();
    if (std::find(open_versions.begin(), open_versions.end(), numbers[i]) ==
        open_versions.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "joining versions ", SomeOfGroup(id), ": version ", numbers[i],
          " of tensor ", ShownName(names[i]),
          " is not open (it was published or aborted, or its lease ended; "
          "latest published: ",
          view.version(), ")"));
    }
    v1::VersionHandle* handle = writer.group_.add_versions();
    handle->set_name(names[i]);
    handle->set_number(numbers[i]);
    handle->set_tensor_id(VersionId(view.tensor_id(), numbers[i]));
  }
  // The daemons renew only a lease begun as renewed; this process does not
  // know how long it is, so it renews often.
  writer.lease_ = cluster_->leases().Keep(
      {writer.group_.versions().begin(), writer.group_.versions().end()}, "",
      kJoinedRenewal);
  ASSIGN_OR_RETURN(writer.views_,
                   ViewsAtVersions(writer.group_, std::move(opened), true));
  writer.index_ = IndexViews(writer.views_);
  return writer;
}

absl::StatusOr<Snapshot> Client::Pin(const std::vector<std::string>& names,
                                     absl::Duration lease,
                                     const std::vector<int64_t>& numbers,
                                     bool renew) {
  v1::PinVersionsRequest request;
  for (const std::string& name : names) request.add_names(name);
  for (int64_t number : numbers) request.add_numbers(number);
  const bool renewed = lease <= absl::ZeroDuration() || renew;
  if (lease <= absl::ZeroDuration()) lease = kRenewedLease;
  request.set_renewed(renewed);
  request.set_lease_ms(std::max<int64_t>(1, absl::ToInt64Milliseconds(lease)));
  Snapshot snapshot;
  snapshot.cluster_ = cluster_;
  RETURN_IF_ERROR(Control(*cluster_, &v1::ControlService::Stub::PinVersions,
                          request, &snapshot.group_,
                          absl::StrCat("pinning ", ShownNames(names)),
                          /*logged=*/true));
  if (renewed) {
    snapshot.lease_ =
        cluster_->leases().Keep({}, snapshot.group_.id(), lease / 6);
  }
  ASSIGN_OR_RETURN(snapshot.views_, GroupViews(*this, snapshot.group_, false));
  snapshot.index_ = IndexViews(snapshot.views_);
  return snapshot;
}

absl::StatusOr<std::shared_ptr<ReadPlan>> Client::PlanReads(
    std::vector<ReadItem> items) const {
  // A run's pin is renewed while the run lasts (ReadPlan releases it when
  // the run ends): a run may take as long as its bytes need, and a reader
  // that dies mid-run leaves it for kRenewedLease.
  struct RunLeases {
    absl::Mutex mu;
    absl::flat_hash_map<std::string,
                        std::shared_ptr<internal_client::LeaseKeeper::Lease>>
        by_pin ABSL_GUARDED_BY(mu);
  };
  auto leases = std::make_shared<RunLeases>();
  std::shared_ptr<Cluster> cluster = cluster_;
  ReadPlan::Control control;
  control.open = [cluster](const std::vector<std::string>& names) {
    return OpenNamed(cluster, names);
  };
  control.pin = [cluster, leases](const std::vector<std::string>& names)
      -> absl::StatusOr<v1::VersionGroup> {
    v1::PinVersionsRequest request;
    for (const std::string& name : names) request.add_names(name);
    request.set_lease_ms(absl::ToInt64Milliseconds(kRenewedLease));
    request.set_renewed(true);
    v1::VersionGroup group;
    RETURN_IF_ERROR(Control(*cluster, &v1::ControlService::Stub::PinVersions,
                            request, &group,
                            absl::StrCat("pinning ", ShownNames(names)),
                            /*logged=*/true));
    std::shared_ptr<internal_client::LeaseKeeper::Lease> lease =
        cluster->leases().Keep({}, group.id(), kRenewedLease / 6);
    absl::MutexLock lock(&leases->mu);
    leases->by_pin[group.id()] = std::move(lease);
    return group;
  };
  control.unpin = [cluster, leases](const v1::VersionGroup& group) {
    v1::UnpinVersionsRequest request;
    request.set_id(group.id());
    v1::UnpinVersionsResponse response;
    const absl::Status status = Control(
        *cluster, &v1::ControlService::Stub::UnpinVersions, request, &response,
        absl::StrCat("releasing pin ", SomeOfGroup(group.id())),
        /*logged=*/true);
    // Renewed no more, however the release ended: a pin left behind by a
    // failed one ends with its lease.
    absl::MutexLock lock(&leases->mu);
    leases->by_pin.erase(group.id());
    return status;
  };
  return ReadPlan::Make(cluster_, std::move(control), std::move(items));
}

absl::StatusOr<std::unique_ptr<VersionWatcher>> Client::Watch(
    const std::string& name, int64_t after) const {
  ASSIGN_OR_RETURN(const ShardedTensorView view, Open(name));
  if (!view.versioned()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "watching tensor ", ShownName(name),
        ": it has no versions (it was created without versions >= 2)"));
  }
  if (after < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "watching tensor ", ShownName(name), ": negative after ", after));
  }
  std::shared_ptr<v1::ControlService::Stub> stub =
      v1::ControlService::NewStub(cluster_->coordinator().channel);
  // What it yields is published: later reads return no older one.
  auto saw = [cluster = cluster_, tensor_id = view.tensor_id()](int64_t n) {
    cluster->SawVersion(tensor_id, n);
  };
  return std::make_unique<VersionWatcher>(std::move(stub), cluster_, name,
                                          after > 0 ? after : view.version(),
                                          std::move(saw));
}

absl::Status Client::Delete(const std::string& name) {
  v1::DeleteTensorRequest request;
  request.set_name(name);
  v1::DeleteTensorResponse response;
  return Control(*cluster_, &v1::ControlService::Stub::DeleteTensor, request,
                 &response, absl::StrCat("deleting tensor ", ShownName(name)),
                 /*logged=*/true);
}

absl::Status Client::DeleteMany(const std::vector<std::string>& names) {
  // A name given twice is refused before any call, also when its two
  // places fall in different calls (the second would find it gone).
  if (names.size() > kMaxDeleteTensors) {
    absl::flat_hash_set<absl::string_view> seen;
    for (const std::string& name : names) {
      if (!seen.insert(name).second) {
        return absl::InvalidArgumentError(absl::StrCat(
            "deleting ", names.size(), " tensors: tensor \"",
            absl::CHexEscape(ShownName(name)), "\" is named twice"));
      }
    }
  }
  for (size_t first = 0; first < names.size(); first += kMaxDeleteTensors) {
    const size_t end = std::min(names.size(), first + kMaxDeleteTensors);
    v1::DeleteTensorRequest request;
    request.mutable_names()->Add(names.begin() + first, names.begin() + end);
    v1::DeleteTensorResponse response;
    const absl::Status status = Control(
        *cluster_, &v1::ControlService::Stub::DeleteTensor, request, &response,
        absl::StrCat("deleting ", end - first, " tensors (",
                     ShownName(names[first]), end - first > 1 ? ", ..." : "",
                     ")"),
        /*logged=*/true);
    // The calls before this one were applied: the error says so.
    if (!status.ok() && first > 0) {
      return Annotate(status,
                      absl::StrCat("the first ", first, " of ", names.size(),
                                   " names were deleted, the rest not"));
    }
    RETURN_IF_ERROR(status);
  }
  return absl::OkStatus();
}

absl::StatusOr<ShardedTensorView> Client::Reshard(const std::string& name,
                                                  const ShardingSpec& spec) {
  v1::ReshardRequest request;
  request.set_name(name);
  *request.mutable_spec() = tessera::ToProto(spec);
  // A versioned tensor with an open version refuses the reshard, applying
  // nothing (ABORTED: its writers would lose their writes). Writers publish
  // or abort soon (a training loop's step, or the version's lease), so the
  // reshard is sent again, as a new call, until the deadline.
  const absl::Time started = absl::Now();
  const absl::Time deadline = started + cluster_->options().timeout;
  absl::Duration pause = absl::Milliseconds(20);
  while (true) {
    absl::StatusOr<Described> resharded =
        Describe(*cluster_, &v1::ControlService::Stub::Reshard, request,
                 absl::StrCat("resharding tensor ", ShownName(name)),
                 /*logged=*/true, deadline);
    if (resharded.ok()) {
      return ShardedTensorView(cluster_, std::move(resharded->info),
                               std::move(resharded->metadata));
    }
    if (!absl::IsAborted(resharded.status())) return resharded.status();
    if (absl::Now() + pause + kRetryRoom >= deadline) {
      return absl::AbortedError(
          absl::StrCat(resharded.status().message(), " (asked again for ",
                       absl::FormatDuration(absl::Trunc(absl::Now() - started,
                                                        absl::Milliseconds(1))),
                       ", until the deadline; nothing was applied)"));
    }
    absl::SleepFor(pause);
    pause = std::min(2 * pause, absl::Milliseconds(500));
  }
}

absl::StatusOr<Tensor> Client::Gather(const std::string& name,
                                      const TransferOptions& options) const {
  static const auto* method = new std::string(
      absl::StrCat("/", v1::ControlService::service_full_name(), "/Gather"));
  v1::GatherRequest request;
  request.set_name(name);
  request.set_chunk_bytes(options.chunk_bytes);
  ShardAssembler assembler(name, -1, Device::Cpu(), /*pin_memory=*/false);
  assembler.set_name(absl::StrCat("gather of tensor ", ShownName(name)));
  // The size is known once the header arrived.
  ProgressCounter progress(0, options.progress);
  assembler.set_on_chunk([&progress, &assembler](int64_t bytes) {
    progress.SetTotal(assembler.total_bytes());
    progress.Add(bytes);
  });
  RETURN_IF_ERROR(
      ReceiveChunkStream(cluster_->coordinator().channel, *method, request,
                         absl::Now() + options.timeout,
                         absl::StrCat("gathering tensor ", ShownName(name)),
                         &assembler, cluster_->CallId()));
  progress.SetTotal(assembler.total_bytes());
  progress.Finish();
  return assembler.destination();
}

namespace {

absl::StatusOr<std::vector<std::string>> SaveCheckpoint(
    internal_client::Cluster& cluster, const std::string& path,
    const std::vector<std::string>& names, bool overwrite,
    const std::map<std::string, int64_t>& versions) {
  v1::SaveCheckpointRequest request;
  request.set_path(path);
  request.set_overwrite(overwrite);
  for (const std::string& name : names) request.add_names(name);
  request.mutable_versions()->insert(versions.begin(), versions.end());
  v1::SaveCheckpointResponse response;
  RETURN_IF_ERROR(Control(
      cluster, &v1::ControlService::Stub::SaveCheckpoint, request, &response,
      absl::StrCat("saving a checkpoint to ", ShownPath(path)),
      /*logged=*/true));
  return std::vector<std::string>(response.names().begin(),
                                  response.names().end());
}

}  // namespace

absl::StatusOr<std::vector<std::string>> Client::Save(
    const std::string& path, const std::vector<std::string>& names,
    bool overwrite, const std::map<std::string, int64_t>& versions) {
  return SaveCheckpoint(*cluster_, path, names, overwrite, versions);
}

absl::StatusOr<std::vector<std::string>> Snapshot::Save(const std::string& path,
                                                        bool overwrite) const {
  std::vector<std::string> names;
  std::map<std::string, int64_t> versions;
  for (const v1::VersionHandle& handle : group_.versions()) {
    names.push_back(handle.name());
    versions[handle.name()] = handle.number();
  }
  return SaveCheckpoint(*cluster_, path, names, overwrite, versions);
}

absl::StatusOr<std::vector<ShardedTensorView>> Client::Load(
    const v1::LoadCheckpointRequest& request) {
  v1::LoadCheckpointResponse response;
  RETURN_IF_ERROR(Control(
      *cluster_, &v1::ControlService::Stub::LoadCheckpoint, request, &response,
      absl::StrCat("loading the checkpoint ", ShownPath(request.path())),
      /*logged=*/true));
  std::vector<ShardedTensorView> views;
  for (v1::TensorInfo& info : *response.mutable_tensors()) {
    ASSIGN_OR_RETURN(ShardedTensorMetadata metadata, MetadataOf(info));
    views.push_back(
        ShardedTensorView(cluster_, std::move(info), std::move(metadata)));
  }
  return views;
}

// Daemons asked at once by Health() and Clusters(): one that hangs costs
// the timeout once per this many.
constexpr int kHealthParallelism = 64;

namespace {

// "daemon worker1 (rank 1) at HOST:PORT", as per-daemon answers name it.
std::string DaemonName(const Worker& worker, size_t rank) {
  return absl::StrCat("daemon ", worker.address.name(), " (rank ", rank,
                      ") at ", worker.address.address());
}

// How long a daemon's second ask waits for its channel to connect.
constexpr absl::Duration kReconnectPatience = absl::Seconds(1);

// `call` with a control context. A call gRPC fails at once because its
// channel's connection attempt failed (the first on a new channel, or one
// reset while it was made) is made once more, waiting up to
// kReconnectPatience for the channel to connect: a daemon is reported
// unreachable when it could not be reached twice, not after one glitch.
template <typename Call>
grpc::Status AskAllowingAReconnect(const internal_client::Cluster& cluster,
                                   Call call) {
  std::unique_ptr<grpc::ClientContext> context = cluster.ControlContext();
  const grpc::Status first = call(context.get());
  if (first.error_code() != grpc::StatusCode::UNAVAILABLE) return first;
  context = cluster.ControlContext(kReconnectPatience);
  context->set_wait_for_ready(true);
  return call(context.get());
}

}  // namespace

std::vector<absl::Status> Client::Health() const {
  const auto workers = cluster_->workers();
  std::vector<absl::Status> health(workers.size());
  RunInParallel(workers.size(), kHealthParallelism, [&](size_t r) {
    const Worker& worker = *workers[r];
    const std::string who = DaemonName(worker, r);
    grpc::health::v1::HealthCheckResponse response;
    const absl::Status called = FromGrpcStatus(
        AskAllowingAReconnect(*cluster_, [&](grpc::ClientContext* context) {
          return worker.health->Check(
              context, grpc::health::v1::HealthCheckRequest(), &response);
        }));
    if (!called.ok()) {
      health[r] =
          absl::UnavailableError(absl::StrCat(who, ": ", called.ToString()));
    } else if (response.status() !=
               grpc::health::v1::HealthCheckResponse::SERVING) {
      health[r] = absl::UnavailableError(absl::StrCat(
          who, ": ",
          grpc::health::v1::HealthCheckResponse::ServingStatus_Name(
              response.status())));
    }
    // Always OK, so that every daemon is asked.
    return absl::OkStatus();
  }).IgnoreError();
  return health;
}

namespace {

// `method` called on every daemon at once, in rank order; a failed call's
// entry is its error, naming the daemon.
template <typename Request, typename Response>
std::vector<absl::StatusOr<Response>> AskEveryDaemon(
    const internal_client::Cluster& cluster,
    grpc::Status (v1::ControlService::Stub::*method)(grpc::ClientContext*,
                                                     const Request&,
                                                     Response*)) {
  const auto workers = cluster.workers();
  std::vector<absl::StatusOr<Response>> answers(workers.size());
  RunInParallel(workers.size(), kHealthParallelism, [&](size_t r) {
    const Worker& worker = *workers[r];
    Response response;
    const absl::Status called = FromGrpcStatus(
        AskAllowingAReconnect(cluster, [&](grpc::ClientContext* context) {
          return ((*worker.control).*method)(context, Request(), &response);
        }));
    if (called.ok()) {
      answers[r] = std::move(response);
    } else {
      answers[r] = Annotate(called, DaemonName(worker, r));
    }
    return absl::OkStatus();
  }).IgnoreError();
  return answers;
}

}  // namespace

std::vector<absl::StatusOr<v1::ClusterInfo>> Client::Clusters() const {
  return AskEveryDaemon(*cluster_, &v1::ControlService::Stub::GetCluster);
}

std::vector<absl::StatusOr<v1::DaemonStats>> Client::Stats() const {
  return AskEveryDaemon(*cluster_, &v1::ControlService::Stub::GetStats);
}

}  // namespace tessera
