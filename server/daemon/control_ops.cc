#include "server/daemon/control_ops.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "client/region_transfer.h"
#include "common/proto_convert.h"
#include "common/status_macros.h"
#include "common/tensor_name.h"
#include "io/file.h"
#include "server/checkpoint/checkpoint.h"
#include "server/daemon/agreement.h"
#include "server/daemon/region_io.h"
#include "server/daemon/replica_copies.h"
#include "server/daemon/version_set.h"
#include "server/sharded/sharded_tensor.h"
#include "tessera/v1/control_internal.pb.h"
#include "wire/replicas.h"
#include "wire/version_id.h"

namespace tessera::control_internal {
namespace {

absl::Status NameTaken(absl::string_view name) {
  return absl::AlreadyExistsError(
      absl::StrCat("a tensor named \"", name, "\" already exists"));
}

absl::Time DeadlineOf(const v1::ControlOp& op) {
  return op.deadline_unix_nanos() == 0
             ? absl::InfiniteFuture()
             : absl::FromUnixNanos(op.deadline_unix_nanos());
}

// Whether the op may still run: its call gives up at the deadline, so
// running it later would only hold up the ops behind it.
absl::Status CheckDeadline(const v1::ControlOp& op) {
  if (absl::Now() < DeadlineOf(op)) return absl::OkStatus();
  return absl::DeadlineExceededError(absl::StrCat(
      OpName(op), ": the call's deadline passed before the operation ran"));
}

// Tensor sizes a request may name: non-negative, with an element and a byte
// count that fit in int64. Checked before the spec, so that absurd sizes
// never reach an allocation.
absl::Status ValidateSizes(absl::Span<const int64_t> sizes, DType dtype) {
  for (int64_t size : sizes) {
    if (size < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("negative size in [", absl::StrJoin(sizes, ", "), "]"));
    }
  }
  const std::optional<int64_t> numel = CheckedProduct(sizes);
  int64_t nbytes = 0;
  if (!numel.has_value() ||
      __builtin_mul_overflow(*numel, static_cast<int64_t>(ElementSize(dtype)),
                             &nbytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a tensor of sizes [", absl::StrJoin(sizes, ", "),
                     "] has more bytes than int64 counts"));
  }
  return absl::OkStatus();
}

absl::StatusOr<DType> DTypeOf(v1::DType dtype) {
  if (dtype == v1::DTYPE_UNSPECIFIED) return DType::kFloat32;
  return FromProto(dtype);
}

// Rank r draws its local shards from its own stream, so that shards on
// different ranks differ while the same seed (and layout) always gives the
// same values.
uint64_t SeedFor(uint64_t seed, int rank) {
  return seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(rank);
}

// Bytes of `numel` elements of `dtype`; ValidateSizes has ruled out
// overflow for any part of a validated tensor.
// Saturates at INT64_MAX (more than any budget): sizes come from requests
// and manifests, which may be crafted to overflow.
int64_t BytesOf(int64_t numel, DType dtype) {
  int64_t bytes = 0;
  if (numel < 0 ||
      __builtin_mul_overflow(numel, static_cast<int64_t>(ElementSize(dtype)),
                             &bytes)) {
    return std::numeric_limits<int64_t>::max();
  }
  return bytes;
}

int64_t SaturatingAdd(int64_t a, int64_t b) {
  int64_t sum = 0;
  return __builtin_add_overflow(a, b, &sum)
             ? std::numeric_limits<int64_t>::max()
             : sum;
}

// The most tensors one CreateTensors call may create.
constexpr int kMaxCreateTensors = 4096;
// The most tensors one DeleteTensor call may delete.
constexpr int kMaxDeleteTensors = 4096;

// The tensors a DeleteTensor request names: `name`, then `names`; just
// `name` (even empty: no such tensor) when `names` is empty.
std::vector<std::string> DeletedNames(const v1::DeleteTensorRequest& request) {
  std::vector<std::string> names;
  if (!request.name().empty() || request.names().empty()) {
    names.push_back(request.name());
  }
  names.insert(names.end(), request.names().begin(), request.names().end());
  return names;
}

// A request's versions field (CreateTensor, LoadCheckpoint): 0 and 1 mean
// in place, 2 to kMaxKeptVersions a versioned tensor.
absl::Status CheckVersionsKept(int32_t versions, absl::string_view what) {
  if (versions >= 0 && versions <= kMaxKeptVersions) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": versions must be between 1 and ", kMaxKeptVersions,
                   ", not ", versions));
}

}  // namespace

const char* OpName(const v1::ControlOp& op) {
  switch (op.request_case()) {
    case v1::ControlOp::kCreateTensor:
      return "CreateTensor";
    case v1::ControlOp::kCreateTensors:
      return "CreateTensors";
    case v1::ControlOp::kDeleteTensor:
      return "DeleteTensor";
    case v1::ControlOp::kReshard:
      return "Reshard";
    case v1::ControlOp::kGather:
      return "Gather";
    case v1::ControlOp::kSaveCheckpoint:
      return "SaveCheckpoint";
    case v1::ControlOp::kLoadCheckpoint:
      return "LoadCheckpoint";
    case v1::ControlOp::kBeginVersion:
      return "BeginVersion";
    case v1::ControlOp::kPublishVersion:
      return "PublishVersion";
    case v1::ControlOp::kAbortVersion:
      return "AbortVersion";
    case v1::ControlOp::kPinVersions:
      return "PinVersions";
    case v1::ControlOp::kUnpinVersions:
      return "UnpinVersions";
    case v1::ControlOp::REQUEST_NOT_SET:
      break;
  }
  return "unknown operation";
}

std::string OpTensor(const v1::ControlOp& op) {
  switch (op.request_case()) {
    case v1::ControlOp::kCreateTensor:
      return ShownName(op.create_tensor().name());
    case v1::ControlOp::kCreateTensors: {
      std::vector<std::string> names;
      for (const v1::CreateTensorRequest& request :
           op.create_tensors().tensors()) {
        names.push_back(request.name());
      }
      return ShownNames(names, ",");
    }
    case v1::ControlOp::kDeleteTensor:
      return ShownNames(DeletedNames(op.delete_tensor()), ",");
    case v1::ControlOp::kReshard:
      return ShownName(op.reshard().name());
    case v1::ControlOp::kGather:
      return ShownName(op.gather().name());
    case v1::ControlOp::kSaveCheckpoint:
      return ShownNames(op.save_checkpoint().names(), ",");
    case v1::ControlOp::kLoadCheckpoint:
      return ShownNames(op.load_checkpoint().names(), ",");
    case v1::ControlOp::kBeginVersion:
      return ShownNames(op.begin_version().names(), ",");
    case v1::ControlOp::kPublishVersion:
      return VersionHandleNames(op.publish_version().versions());
    case v1::ControlOp::kAbortVersion:
      return VersionHandleNames(op.abort_version().versions());
    case v1::ControlOp::kPinVersions:
      return ShownNames(op.pin_versions().names(), ",");
    case v1::ControlOp::kUnpinVersions:
      return "";
    case v1::ControlOp::REQUEST_NOT_SET:
      break;
  }
  return "";
}

ControlOps::ControlOps(std::shared_ptr<Rank> rank,
                       std::shared_ptr<ProcessGroup> group,
                       const ControlOptions& options,
                       std::shared_ptr<MemoryBudget> budget, TensorTable* table,
                       Replication* replication, const Membership* membership,
                       VersionWatch* watch)
    : rank_(std::move(rank)),
      group_(std::move(group)),
      options_(options),
      budget_(std::move(budget)),
      table_(table),
      replication_(replication),
      membership_(membership),
      watch_(watch) {}

absl::Status ControlOps::Agree(const absl::Status& local, bool* agreed) {
  return control_internal::Agree(*group_, local, agreed);
}

OpOutcome ControlOps::AgreeThenCommit(const absl::Status& local,
                                      std::function<OpResult()> commit,
                                      std::function<void()> give_up) {
  OpOutcome outcome;
  outcome.status = Agree(local, &outcome.agreed);
  if (outcome.status.ok()) {
    outcome.result = commit();
  } else if (local.ok() && !outcome.agreed) {
    outcome.late = LateCommit{std::move(commit), std::move(give_up)};
  } else if (give_up) {
    give_up();
  }
  return outcome;
}

void ControlOps::ResyncTensorIds() {
  control_internal::ResyncTensorIds(*rank_, *group_);
}

OpOutcome ControlOps::Run(const v1::ControlOp& op) {
  OpOutcome outcome;
  switch (op.request_case()) {
    case v1::ControlOp::kCreateTensor:
      outcome = RunCreate(op);
      break;
    case v1::ControlOp::kCreateTensors:
      outcome = RunCreateMany(op);
      break;
    case v1::ControlOp::kDeleteTensor:
      outcome = RunDelete(op);
      break;
    case v1::ControlOp::kReshard:
      outcome = RunReshard(op);
      break;
    case v1::ControlOp::kGather:
      outcome = RunGather(op);
      break;
    case v1::ControlOp::kSaveCheckpoint:
      outcome = RunSave(op);
      break;
    case v1::ControlOp::kLoadCheckpoint:
      outcome = RunLoad(op);
      break;
    case v1::ControlOp::kBeginVersion:
      outcome = RunBeginVersion(op);
      break;
    case v1::ControlOp::kPublishVersion:
      outcome = RunPublishVersion(op);
      break;
    case v1::ControlOp::kAbortVersion:
      outcome = RunAbortVersion(op);
      break;
    case v1::ControlOp::kPinVersions:
      outcome = RunPinVersions(op);
      break;
    case v1::ControlOp::kUnpinVersions:
      outcome = RunUnpinVersions(op);
      break;
    case v1::ControlOp::REQUEST_NOT_SET:
      break;
  }
  return outcome;
}

absl::StatusOr<int64_t> ControlOps::LocalHostBytes(
    const ShardedTensorMetadata& metadata, bool version) const {
  int64_t host_bytes = 0;
  for (const ShardMetadata& shard : metadata.shards_metadata) {
    ASSIGN_OR_RETURN(auto placement, ParseAndValidateRemoteDevice(
                                         group_->global_ranks(),
                                         shard.placement(), rank_.get()));
    if (placement.first == rank_->rank() && placement.second.is_cpu()) {
      host_bytes = SaturatingAdd(
          host_bytes, BytesOf(shard.numel(), metadata.tensor_properties.dtype));
    }
  }
  if (version) {
    host_bytes = SaturatingAdd(
        host_bytes, VersionMetadataBytes(metadata.shards_metadata.size()));
  }
  return host_bytes;
}

absl::StatusOr<MemoryBudget::Reservation> ControlOps::ReserveMetadata(
    const ShardedTensorMetadata& metadata, absl::string_view what) const {
  const size_t shards = metadata.shards_metadata.size();
  return budget_->Reserve(
      EntryMetadataBytes(shards),
      absl::StrCat(what, " (the metadata of its ", shards, " shard",
                   shards == 1 ? "" : "s",
                   ", which every daemon holds, on rank ", rank(), ")"));
}

absl::StatusOr<ShardingSpec> ControlOps::SpecOf(bool has_spec,
                                                const v1::ShardingSpec& proto,
                                                absl::string_view what) const {
  if (!has_spec) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": spec is required"));
  }
  ASSIGN_OR_RETURN(ShardingSpec spec, FromProto(proto));
  std::vector<std::optional<RemoteDevice>> placements;
  if (const auto* chunk = std::get_if<ChunkShardingSpec>(&spec)) {
    placements.assign(chunk->placements().begin(), chunk->placements().end());
  } else {
    for (const ShardMetadata& shard :
         std::get<EnumerableShardingSpec>(spec).shards()) {
      placements.push_back(shard.placement());
    }
  }
  const std::vector<std::string> devices = membership_->devices();
  for (size_t i = 0; i < placements.size(); ++i) {
    RETURN_IF_ERROR(Annotate(CheckPlacement(placements[i], devices),
                             absl::StrCat(what, ": placement ", i)));
  }
  return spec;
}

absl::Status ControlOps::CheckPlacement(
    const std::optional<RemoteDevice>& placement,
    absl::Span<const std::string> devices) const {
  if (!placement.has_value()) {
    return absl::InvalidArgumentError("the shard has no placement");
  }
  const std::string text = placement->ToString();
  if (!placement->rank().has_value() && !placement->worker_name().has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        text,
        " names no owner: a placement needs a rank or a worker, as in "
        "\"rank:0/cpu\" or \"worker0/cpu\""));
  }
  // PyTorch's checks and wording ("Global rank 7 does not exist in input
  // process group", "Invalid worker name: w").
  ASSIGN_OR_RETURN(const auto resolved,
                   ParseAndValidateRemoteDevice(group_->global_ranks(),
                                                placement, rank_.get()));
  const int owner = resolved.first;
  const Device& device = placement->device();
  if (device.is_meta()) {
    return absl::InvalidArgumentError(absl::StrCat(
        text,
        ": the meta device holds no data, so the tensor's values would "
        "be lost"));
  }
  if (device.is_cuda() && static_cast<size_t>(owner) < devices.size() &&
      !absl::StartsWith(devices[owner], "cuda")) {
    return absl::InvalidArgumentError(
        absl::StrCat(text, ": rank ", owner, " serves ", devices[owner],
                     " and cannot hold CUDA shards"));
  }
  return absl::OkStatus();
}

absl::StatusOr<TableEntry> ControlOps::PrepareCreate(
    const v1::ControlOp& op, const v1::CreateTensorRequest& request,
    bool* checked) {
  const std::vector<int64_t> sizes(request.sizes().begin(),
                                   request.sizes().end());
  // Deterministic checks: they pass or fail alike on every daemon.
  RETURN_IF_ERROR(ValidateTensorName(request.name()));
  if (table_->Holds(request.name())) return NameTaken(request.name());
  ASSIGN_OR_RETURN(DType dtype, DTypeOf(request.dtype()));
  RETURN_IF_ERROR(ValidateSizes(sizes, dtype));
  ASSIGN_OR_RETURN(ShardingSpec spec,
                   SpecOf(request.has_spec(), request.spec(), "CreateTensor"));
  if (!v1::InitKind_IsValid(request.init())) {
    return absl::InvalidArgumentError(
        absl::StrCat("CreateTensor: unknown init kind ", request.init()));
  }
  if (request.init() == v1::INIT_KIND_FULL) {
    RETURN_IF_ERROR(Tensor::CheckFillValue(request.fill_value(), dtype));
  }
  RETURN_IF_ERROR(CheckVersionsKept(request.versions(), "CreateTensor"));
  // 0 is the field's default: one copy.
  if (request.copies() < 0 || request.copies() > rank_->world_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CreateTensor: copies must be between 1 and the ", rank_->world_size(),
        " daemons of the cluster, not ", request.copies()));
  }
  TensorProperties properties;
  properties.dtype = dtype;
  ASSIGN_OR_RETURN(ShardedTensorMetadata metadata,
                   BuildMetadata(spec, sizes, properties));
  // A versioned tensor's first version, as each later one, holds its own
  // copy of the metadata with its shards.
  ASSIGN_OR_RETURN(const int64_t host_bytes,
                   LocalHostBytes(metadata, request.versions() >= 2));
  *checked = true;
  // This daemon's own work: it may fail here alone.
  RETURN_IF_ERROR(CheckDeadline(op));
  ASSIGN_OR_RETURN(
      MemoryBudget::Reservation metadata_held,
      ReserveMetadata(metadata,
                      absl::StrCat("CreateTensor \"", request.name(), "\"")));
  ASSIGN_OR_RETURN(
      MemoryBudget::Reservation held,
      budget_->Reserve(host_bytes,
                       absl::StrCat("CreateTensor \"", request.name(),
                                    "\" (its shards on rank ", rank(), ")")));
  ASSIGN_OR_RETURN(ShardedTensor tensor,
                   NewTensor(request, dtype, spec, sizes));
  ASSIGN_OR_RETURN(v1::TensorInfo info,
                   TensorInfoOf(*rank_, request.name(), tensor));
  TableEntry made;
  if (request.versions() >= 2) {
    // Version 1 is the tensor as created (version_set.h).
    made.versions = std::make_shared<VersionSet>(
        rank_, info.name(), info.tensor_id(), request.versions());
    made.versions->AddFirst(tensor, std::move(held));
  } else {
    made.held = std::move(held);
  }
  made.tensor = std::move(tensor);
  made.info = std::move(info);
  made.metadata = std::move(metadata_held);
  return made;
}

OpOutcome ControlOps::RunCreate(const v1::ControlOp& op) {
  const v1::CreateTensorRequest& request = op.create_tensor();
  bool checked = false;
  absl::StatusOr<TableEntry> made = PrepareCreate(op, request, &checked);
  OpOutcome outcome;
  outcome.status = Agree(made.status(), &outcome.agreed);
  if (outcome.status.ok()) {
    table_->Put(request.name(), *std::move(made));
    if (request.copies() > 1) {
      outcome.status = replication_->Replicate(request.name(), request.copies(),
                                               &request, &outcome.agreed);
    }
    if (outcome.status.ok()) {
      absl::StatusOr<v1::TensorInfo> info = table_->Info(request.name());
      outcome.status = info.status();
      if (info.ok()) outcome.result.info = *std::move(info);
    } else {
      table_->Remove(request.name());
    }
  } else if (checked) {
    ResyncTensorIds();
  }
  return outcome;
}

OpOutcome ControlOps::RunCreateMany(const v1::ControlOp& op) {
  const auto& requests = op.create_tensors().tensors();
  std::vector<TableEntry> made;
  bool checked = false;
  absl::Status local;
  if (requests.empty()) {
    local =
        absl::InvalidArgumentError("CreateTensors: name at least one tensor");
  } else if (requests.size() > kMaxCreateTensors) {
    local = absl::InvalidArgumentError(
        absl::StrCat("CreateTensors: ", requests.size(), " tensors; at most ",
                     kMaxCreateTensors, " per call"));
  } else {
    std::set<std::string> seen;
    for (const v1::CreateTensorRequest& request : requests) {
      if (!seen.insert(request.name()).second) {
        local = absl::InvalidArgumentError(
            absl::StrCat("CreateTensors: tensor ", ShownName(request.name()),
                         " is named twice"));
        break;
      }
    }
  }
  // Every tensor made here first: all of them are created, or none.
  for (int i = 0; local.ok() && i < requests.size(); ++i) {
    bool this_checked = false;
    absl::StatusOr<TableEntry> entry =
        PrepareCreate(op, requests[i], &this_checked);
    checked = checked || this_checked;
    if (!entry.ok()) {
      local = Annotate(entry.status(),
                       absl::StrCat("CreateTensors: tensor ", i, " (",
                                    requests[i].name(), "); none created"));
      break;
    }
    made.push_back(*std::move(entry));
  }
  OpOutcome outcome;
  outcome.status = Agree(local, &outcome.agreed);
  if (!outcome.status.ok()) {
    if (checked) ResyncTensorIds();
    return outcome;
  }
  for (int i = 0; i < requests.size(); ++i) {
    table_->Put(requests[i].name(), std::move(made[i]));
  }
  for (const v1::CreateTensorRequest& request : requests) {
    if (!outcome.status.ok()) break;
    if (request.copies() > 1) {
      outcome.status = replication_->Replicate(request.name(), request.copies(),
                                               &request, &outcome.agreed);
    }
  }
  for (const v1::CreateTensorRequest& request : requests) {
    if (!outcome.status.ok()) break;
    absl::StatusOr<v1::TensorInfo> info = table_->Info(request.name());
    outcome.status = info.status();
    if (info.ok()) outcome.result.infos.push_back(*std::move(info));
  }
  if (!outcome.status.ok()) {
    outcome.result.infos.clear();
    for (const v1::CreateTensorRequest& request : requests) {
      table_->Remove(request.name());
    }
  }
  return outcome;
}

absl::StatusOr<ShardedTensor> ControlOps::NewTensor(
    const v1::CreateTensorRequest& request, DType dtype,
    const ShardingSpec& spec, absl::Span<const int64_t> sizes) {
  ShardedTensorOptions options =
      ShardedTensorOptions().WithDType(dtype).WithRank(rank_);
  switch (request.init()) {
    case v1::INIT_KIND_ZEROS:
      return ShardedTensor::Zeros(spec, sizes, options);
    case v1::INIT_KIND_ONES:
      return ShardedTensor::Ones(spec, sizes, options);
    case v1::INIT_KIND_FULL:
      return ShardedTensor::Full(spec, sizes, request.fill_value(), options);
    case v1::INIT_KIND_RAND: {
      Generator generator(SeedFor(request.seed(), rank_->rank()));
      return ShardedTensor::Rand(spec, sizes, options, &generator);
    }
    case v1::INIT_KIND_RANDN: {
      Generator generator(SeedFor(request.seed(), rank_->rank()));
      return ShardedTensor::Randn(spec, sizes, options, &generator);
    }
    default:
      // "empty" promises no values, but a daemon never hands out bytes its
      // memory held before (another tensor's): zeros, free of cost for the
      // memory files shards live in.
      return ShardedTensor::Zeros(spec, sizes, options);
  }
}

OpOutcome ControlOps::RunDelete(const v1::ControlOp& op) {
  const std::vector<std::string> names = DeletedNames(op.delete_tensor());
  // Each tensor with the id it has here; every daemon decides alike.
  std::vector<std::pair<std::string, std::string>> deleted;
  const absl::Status local = [&]() -> absl::Status {
    if (names.size() > static_cast<size_t>(kMaxDeleteTensors)) {
      return absl::InvalidArgumentError(
          absl::StrCat("DeleteTensor: ", names.size(), " tensors; at most ",
                       kMaxDeleteTensors, " per call"));
    }
    std::set<std::string> seen;
    for (const std::string& name : names) {
      if (!seen.insert(name).second) {
        return absl::InvalidArgumentError(absl::StrCat(
            "DeleteTensor: tensor ", ShownName(name), " is named twice"));
      }
      absl::StatusOr<v1::TensorInfo> held = table_->Info(name);
      if (!held.ok()) return UnknownTensor(name);
      deleted.emplace_back(name, held->tensor_id());
    }
    return CheckDeadline(op);
  }();
  return AgreeThenCommit(local, [this, deleted = std::move(deleted)]() {
    for (const auto& [name, tensor_id] : deleted) {
      // The tensor the daemons agreed on (a late commit finds it still).
      absl::StatusOr<v1::TensorInfo> now = table_->Info(name);
      if (now.ok() && now->tensor_id() == tensor_id) {
        const std::optional<TableEntry> removed = table_->Remove(name);
        if (removed.has_value() && removed->versions != nullptr) {
          watch_->Deleted(name);
        }
      }
    }
    return OpResult();
  });
}

absl::StatusOr<v1::TensorInfo> ControlOps::LayoutInfo(
    const std::string& name, const ShardedTensorMetadata& metadata) const {
  v1::TensorInfo info;
  info.set_name(name);
  *info.mutable_metadata() = ToProto(metadata);
  for (const ShardMetadata& shard : metadata.shards_metadata) {
    ASSIGN_OR_RETURN(auto placement, ParseAndValidateRemoteDevice(
                                         group_->global_ranks(),
                                         shard.placement(), rank_.get()));
    info.add_shard_ranks(placement.first);
  }
  return info;
}

OpOutcome ControlOps::RunReshard(const v1::ControlOp& op) {
  const v1::ReshardRequest& request = op.reshard();
  const std::string& name = request.name();
  OpOutcome outcome;
  absl::StatusOr<ShardedTensor> tensor = table_->Lookup(name);
  absl::StatusOr<ShardingSpec> spec =
      SpecOf(request.has_spec(), request.spec(), "Reshard");
  // The new layout: its metadata and info (without its id until the
  // agreement), this daemon's new shards and copies, and their budget.
  ShardedTensorMetadata metadata;
  v1::TensorInfo info;
  std::vector<Shard> shards;
  MemoryBudget::Reservation held;
  MemoryBudget::Reservation metadata_held;
  Replication::PlacedCopies copies;
  bool unchanged = false;
  // A versioned tensor's versions, the number of its latest published one
  // (which the new layout holds) and the number its next begin takes.
  std::shared_ptr<VersionSet> versions;
  int64_t version = 0;
  int64_t next_version = 0;
  // The tensor as it is, and each box of the new layout this daemon fills
  // (its shards and copies) with the tensor it goes into.
  v1::TensorInfo old_info;
  std::vector<std::pair<const ShardMetadata*, Tensor>> targets;
  MemoryBudget::Reservation staging;
  absl::Status local = [&]() -> absl::Status {
    // Deterministic first: every daemon holds the same tensor.
    RETURN_IF_ERROR(tensor.status());
    RETURN_IF_ERROR(table_->Update(
        name, [&](TableEntry& entry) { versions = entry.versions; }));
    if (versions != nullptr) {
      // A versioned tensor is resharded as its latest published version
      // (docs/versions.md, "Resharding"): no writer may be filling one.
      versions->Expire(absl::Now(), /*renewed=*/false);
    }
    ASSIGN_OR_RETURN(old_info, table_->Info(name));
    if (versions != nullptr && old_info.open_versions_size() > 0) {
      // ABORTED: a conflict with writers that ends by itself (the client
      // asks again; Client::Reshard).
      return absl::AbortedError(absl::StrCat(
          "Reshard: tensor ", name, " has open version",
          old_info.open_versions_size() > 1 ? "s " : " ",
          absl::StrJoin(old_info.open_versions(), ", "), ": publish or abort ",
          old_info.open_versions_size() > 1 ? "them" : "it",
          " first (a reshard keeps only the latest published version, ",
          old_info.version(), ")"));
    }
    if (versions != nullptr) {
      version = old_info.version();
      next_version = old_info.next_version();
    }
    RETURN_IF_ERROR(spec.status());
    RETURN_IF_ERROR(CheckDeadline(op));
    const ShardedTensorMetadata& old_metadata = tensor->metadata();
    ASSIGN_OR_RETURN(metadata, BuildMetadata(*spec, tensor->size(),
                                             old_metadata.tensor_properties));
    if (metadata == old_metadata) {
      unchanged = true;
      return absl::OkStatus();
    }
    ASSIGN_OR_RETURN(info, LayoutInfo(name, metadata));
    if (versions != nullptr) info.set_versions_kept(old_info.versions_kept());
    const int count = CopiesOf(old_info);
    // Then this daemon's part, reserved before anything is allocated: its
    // new shards, its copies of others' new shards, and the staging of the
    // strided pieces it fetches for them.
    ASSIGN_OR_RETURN(const int64_t host_bytes,
                     LocalHostBytes(metadata, versions != nullptr));
    ASSIGN_OR_RETURN(metadata_held,
                     ReserveMetadata(metadata, absl::StrCat("Reshard \"", name,
                                                            "\" (its new "
                                                            "layout)")));
    ASSIGN_OR_RETURN(
        held,
        budget_->Reserve(host_bytes, absl::StrCat("Reshard \"", name,
                                                  "\" (its new shards on rank ",
                                                  rank(), ")")));
    if (count > 1) {
      ASSIGN_OR_RETURN(copies,
                       replication_->PlaceCopies(&info, metadata, count));
    }
    const TensorProperties& p = old_metadata.tensor_properties;
    int64_t staging_bytes = 0;
    for (size_t j = 0; j < metadata.shards_metadata.size(); ++j) {
      const ShardMetadata& box = metadata.shards_metadata[j];
      if (info.shard_ranks(static_cast<int>(j)) != rank()) continue;
      const Device device = box.placement()->device();
      staging_bytes = SaturatingAdd(
          staging_bytes, BoxStagingBytes(*rank_, old_info, old_metadata, box));
      ASSIGN_OR_RETURN(
          Tensor shard,
          Tensor::Empty(box.shard_sizes(),
                        TensorOptions()
                            .WithDType(p.dtype)
                            .WithDevice(device)
                            .WithPinMemory(p.pin_memory && device.is_cpu())
                            .WithRequiresGrad(p.requires_grad)));
      targets.emplace_back(&box, shard);
      shards.push_back(Shard{std::move(shard), box});
    }
    if (copies.mine != nullptr) {
      for (const LocalShard& copy : copies.mine->local_shards) {
        const ShardMetadata& box = metadata.shards_metadata[copy.index];
        staging_bytes =
            SaturatingAdd(staging_bytes,
                          BoxStagingBytes(*rank_, old_info, old_metadata, box));
        targets.emplace_back(&box, copy.tensor);
      }
    }
    ASSIGN_OR_RETURN(
        staging,
        budget_->Reserve(staging_bytes,
                         absl::StrCat("Reshard \"", name,
                                      "\" (staging its strided pieces on rank ",
                                      rank(), ")")));
    return absl::OkStatus();
  }();
  const absl::Time deadline =
      std::min(DeadlineOf(op), absl::Now() + options_.op_timeout);
  // No write may land in the old layout once a daemon has copied from it
  // (it would be lost): every daemon fences writes to its part of an
  // unversioned tensor (whose published versions take none) and waits for
  // those in flight before any daemon copies. The fence lasts while the
  // old layout is registered, or until the reshard fails.
  std::vector<std::string> fenced;
  if (local.ok() && !unchanged && versions == nullptr) {
    std::vector<std::string> ids = {old_info.tensor_id()};
    if (CopiesOf(old_info) > 1) ids.push_back(ReplicaTensorId(ids[0]));
    for (const std::string& id : ids) {
      if (rank_->registry().Find(id) == nullptr) continue;
      fenced.push_back(id);
      local = rank_->registry().Fence(
          id, absl::StrCat("tensor ", name, " is being resharded"), deadline);
      if (!local.ok()) break;
    }
  }
  const std::shared_ptr<Rank> rank = rank_;
  const auto lift = [rank, fenced]() {
    for (const std::string& id : fenced) rank->registry().Lift(id);
  };
  outcome.status = Agree(local, &outcome.agreed);
  if (!outcome.status.ok()) {  // Nothing changed.
    lift();
    return outcome;
  }
  if (unchanged) {
    absl::StatusOr<v1::TensorInfo> same = table_->Info(name);
    outcome.status = same.status();
    if (same.ok()) outcome.result.info = *std::move(same);
    return outcome;
  }
  // Every box from the old layout's holders (copied where this daemon
  // holds it), while the old layout still serves: no daemon drops it
  // before every daemon agreed that its boxes are filled.
  constexpr int kParallelism = 4;
  local = RunInParallel(
      targets.size(), kParallelism, [&](size_t k) -> absl::Status {
        return ReadBoxInto(*rank_, old_info, tensor->metadata(),
                           *targets[k].first, targets[k].second, kParallelism,
                           deadline, "Reshard");
      });
  staging = MemoryBudget::Reservation();
  outcome.status = Agree(local, &outcome.agreed);
  if (!outcome.status.ok()) {
    lift();
    return outcome;
  }

  // The new layout under a new id (each daemon draws exactly one, so the
  // ids stay aligned whatever follows), registered but not yet named.
  const std::string id = rank_->NextTensorId(*tensor->process_group());
  info.set_tensor_id(id);
  // A versioned tensor's new layout is its latest version, under that
  // version's own id (version_set.h), in a new set of versions.
  const std::string registration =
      versions != nullptr ? RegistrationId(id, version) : id;
  std::optional<ShardedTensor> made;
  std::shared_ptr<ReplicaCopies> registered;
  std::shared_ptr<VersionSet> new_versions;
  local = [&]() -> absl::Status {
    ShardedTensorOptions options = tensor->options();
    options.tensor_id = registration;
    ASSIGN_OR_RETURN(made, ShardedTensor::InitFromLocalShardsWithSpec(
                               std::move(shards), metadata, *spec, options));
    if (copies.mine != nullptr) {
      ASSIGN_OR_RETURN(
          registered,
          ReplicaCopies::Register(rank_, registration, std::move(copies.mine),
                                  std::move(copies.held)));
    }
    if (versions != nullptr) {
      new_versions = std::make_shared<VersionSet>(rank_, info.name(), id,
                                                  info.versions_kept());
      new_versions->AddPublished(version, *made, std::move(registered),
                                 std::move(held), next_version);
      // A snapshot of the latest keeps it, under the new layout; the older
      // versions (and their pins) end with the old layout.
      for (const VersionSet::PinState& pin : versions->Pins()) {
        if (pin.number == version) {
          new_versions->Pin(pin.id, pin.number, pin.until, pin.renewal);
        }
      }
    }
    return absl::OkStatus();
  }();
  // The commit: the name moves to the new layout at once for every reader
  // of the table. The old layout leaves the registry once every daemon
  // has committed (OpOutcome::retired); fetches in flight then keep its
  // bytes, later ones of the old id get NOT_FOUND. In doubt, it waits for
  // the re-formed group (in_doubt.h); otherwise a failure drops the new
  // layout.
  struct Retired {
    // Declared first, so that the reservation goes back to the budget
    // only after the shards and copies are freed.
    MemoryBudget::Reservation held;
    MemoryBudget::Reservation metadata;
    std::optional<ShardedTensor> tensor;
    std::shared_ptr<ReplicaCopies> copies;
    std::shared_ptr<VersionSet> versions;
  };
  struct NewLayout {
    std::optional<ShardedTensor> made;
    v1::TensorInfo info;
    MemoryBudget::Reservation held;
    MemoryBudget::Reservation metadata;
    std::shared_ptr<ReplicaCopies> registered;
    std::shared_ptr<VersionSet> versions;
    // Kept by a commit on time until every daemon confirmed it.
    std::shared_ptr<Retired> retired = std::make_shared<Retired>();
  };
  auto layout = std::make_shared<NewLayout>();
  layout->made = std::move(made);
  layout->info = std::move(info);
  layout->held = std::move(held);
  layout->metadata = std::move(metadata_held);
  layout->registered = std::move(registered);
  layout->versions = std::move(new_versions);
  outcome = AgreeThenCommit(
      local,
      [this, name, layout]() {
        table_
            ->Update(name,
                     [&](TableEntry& entry) {
                       Retired& retired = *layout->retired;
                       retired.held = std::move(entry.held);
                       retired.metadata = std::move(entry.metadata);
                       retired.tensor = std::move(entry.tensor);
                       retired.copies = std::move(entry.replicas);
                       retired.versions = std::move(entry.versions);
                       entry.tensor = std::move(layout->made);
                       entry.info = layout->info;
                       entry.held = std::move(layout->held);
                       entry.metadata = std::move(layout->metadata);
                       entry.replicas = std::move(layout->registered);
                       entry.versions = std::move(layout->versions);
                     })
            .IgnoreError();  // Looked up above; only the executor removes.
        OpResult result;
        // With the versions a versioned tensor keeps (as Describe tells).
        absl::StatusOr<v1::TensorInfo> info = table_->Info(name);
        result.info = info.ok() ? *std::move(info) : layout->info;
        return result;
      },
      lift);
  if (outcome.status.ok()) outcome.retired = std::move(layout->retired);
  return outcome;
}

OpOutcome ControlOps::RunGather(const v1::ControlOp& op) {
  const v1::GatherRequest& request = op.gather();
  const bool destination = op.coordinator() == rank_->rank();
  OpOutcome outcome;
  absl::StatusOr<ShardedTensor> tensor = table_->Lookup(request.name());
  Tensor out;
  MemoryBudget::Reservation gathering;
  absl::Status ready = [&]() -> absl::Status {
    RETURN_IF_ERROR(tensor.status());
    if (request.chunk_bytes() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("Gather: negative chunk_bytes ", request.chunk_bytes()));
    }
    RETURN_IF_ERROR(CheckDeadline(op));
    if (destination) {
      ASSIGN_OR_RETURN(
          gathering,
          budget_->Reserve(BytesOf(CheckedProduct(tensor->size()).value_or(0),
                                   tensor->dtype()),
                           absl::StrCat("Gather \"", request.name(),
                                        "\" (on rank ", rank(), ")")));
      ASSIGN_OR_RETURN(
          out,
          Tensor::Empty(tensor->size(),
                        TensorOptions().WithDType(tensor->dtype()).Private()));
    }
    return absl::OkStatus();
  }();
  outcome.status = Agree(ready, &outcome.agreed);
  if (!outcome.status.ok()) return outcome;

  outcome.status =
      Agree(tensor->Gather(op.coordinator(), out), &outcome.agreed);
  if (outcome.status.ok() && destination) {
    absl::StatusOr<v1::TensorInfo> info = table_->Info(request.name());
    if (info.ok()) outcome.result.info = *std::move(info);
    outcome.result.gathered = std::move(out);
    outcome.result.gathered_reservation =
        std::make_shared<MemoryBudget::Reservation>(std::move(gathering));
  }
  return outcome;
}

OpOutcome ControlOps::RunSave(const v1::ControlOp& op) {
  const v1::SaveCheckpointRequest& request = op.save_checkpoint();
  OpOutcome outcome;
  StateDict dict;
  std::optional<Directory> dir;
  absl::Status ready = [&]() -> absl::Status {
    if (request.path().empty()) {
      return absl::InvalidArgumentError("SaveCheckpoint: path is required");
    }
    if (request.names().empty()) {
      std::vector<std::string> degraded;
      RETURN_IF_ERROR(table_->ForEach(
          [&](const std::string& name, const TableEntry& entry) {
            if (entry.info.lost_shards_size() > 0) {
              degraded.push_back(name);
              return absl::OkStatus();
            }
            if (!entry.tensor.has_value()) {
              return RefillingError(rank(), name, entry);
            }
            dict.emplace_back(name, *entry.tensor);
            return absl::OkStatus();
          }));
      if (!degraded.empty()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "SaveCheckpoint: tensors [", absl::StrJoin(degraded, ", "),
            "] are degraded (shards lost when their owner restarted); name "
            "the tensors to save, or delete or reload the degraded ones"));
      }
    }
    std::set<std::string> seen;
    for (const std::string& name : request.names()) {
      if (!table_->Holds(name)) return UnknownTensor(name);
      if (!seen.insert(name).second) {
        return absl::InvalidArgumentError(absl::StrCat(
            "SaveCheckpoint: \"", ShownName(name), "\" is named twice"));
      }
      // Degraded or refilling: refused as Lookup says.
      ASSIGN_OR_RETURN(ShardedTensor tensor, table_->Lookup(name));
      dict.emplace_back(name, std::move(tensor));
    }
    // Older versions: the ShardedTensor this daemon keeps for each (its
    // bytes stay alive while the save holds it, even if its pin ends).
    for (const auto& [name, number] : request.versions()) {
      auto saved = std::find_if(
          dict.begin(), dict.end(),
          [&name = name](const auto& entry) { return entry.first == name; });
      if (saved == dict.end()) {
        if (!table_->Holds(name)) return UnknownTensor(name);
        return absl::InvalidArgumentError(
            absl::StrCat("SaveCheckpoint: a version is given for \"", name,
                         "\", which is not among the tensors saved"));
      }
      ASSIGN_OR_RETURN(std::shared_ptr<VersionSet> versions,
                       VersionsOf(name, "SaveCheckpoint"));
      ASSIGN_OR_RETURN(saved->second, versions->Published(name, number));
    }
    // Last: a refused save creates no directory.
    ASSIGN_OR_RETURN(dir, options_.checkpoint_roots.Resolve(request.path(),
                                                            /*create=*/true));
    return absl::OkStatus();
  }();
  if (ready.ok()) ready = CheckDeadline(op);
  outcome.status = Agree(ready, &outcome.agreed);
  if (!outcome.status.ok()) return outcome;

  SaveOptions options;
  options.rank = rank_;
  options.overwrite = request.overwrite();
  // How each tensor is held, for a load to restore (its versions, copies).
  for (const auto& [name, value] : dict) {
    absl::StatusOr<v1::TensorInfo> info = table_->Info(name);
    if (!info.ok()) continue;
    options.keeping[name] = SaveOptions::Keeping{
        Versioned(*info) ? info->versions_kept() : 0, CopiesOf(*info)};
  }
  outcome.status =
      Agree(SaveStateDict(
                dict, [&dir]() -> absl::StatusOr<Directory> { return *dir; },
                options),
            &outcome.agreed);
  if (outcome.status.ok()) {
    for (const auto& [name, value] : dict) outcome.result.names.push_back(name);
  }
  return outcome;
}

OpOutcome ControlOps::RunLoad(const v1::ControlOp& op) {
  const v1::LoadCheckpointRequest& request = op.load_checkpoint();
  // Deterministic checks first.
  std::optional<ShardingSpec> spec;
  absl::Status valid = [&]() -> absl::Status {
    if (request.path().empty()) {
      return absl::InvalidArgumentError("LoadCheckpoint: path is required");
    }
    if (!request.as_names().empty() && request.names().empty()) {
      return absl::InvalidArgumentError(
          "LoadCheckpoint: as_names renames the entries listed in names, and "
          "no names are given");
    }
    if (!request.as_names().empty() &&
        request.as_names_size() != request.names_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("LoadCheckpoint: ", request.as_names_size(),
                       " as_names for ", request.names_size(), " names"));
    }
    if (request.has_spec()) {
      ASSIGN_OR_RETURN(spec, SpecOf(true, request.spec(), "LoadCheckpoint"));
    }
    RETURN_IF_ERROR(CheckVersionsKept(request.versions(), "LoadCheckpoint"));
    return absl::OkStatus();
  }();
  // Then what depends on the files and the daemon: the entries, the names
  // they get, and the load itself.
  std::vector<std::pair<std::string, std::string>> wanted;  // entry, name
  // Per wanted entry: the versions it keeps and its copies (the request's
  // versions, else as saved).
  std::vector<std::pair<int, int>> keeping;
  std::vector<std::pair<std::string, ShardedTensor>> loaded;
  std::vector<v1::TensorInfo> infos;
  std::vector<MemoryBudget::Reservation> held;  // One per wanted entry.
  std::vector<MemoryBudget::Reservation> metadata_held;  // Likewise.
  absl::Status local = valid;
  if (valid.ok()) {
    local = [&]() -> absl::Status {
      ASSIGN_OR_RETURN(Directory dir,
                       options_.checkpoint_roots.Resolve(request.path(),
                                                         /*create=*/false));
      ASSIGN_OR_RETURN(v1::CheckpointManifest manifest,
                       ReadCheckpointManifest(dir));
      std::map<std::string, const v1::CheckpointEntry*> entries;
      for (const v1::CheckpointEntry& entry : manifest.entries()) {
        entries.emplace(entry.name(), &entry);
      }
      if (request.names().empty()) {
        for (const v1::CheckpointEntry& entry : manifest.entries()) {
          wanted.emplace_back(entry.name(), entry.name());
        }
      }
      for (int i = 0; i < request.names_size(); ++i) {
        wanted.emplace_back(request.names(i), request.as_names().empty()
                                                  ? request.names(i)
                                                  : request.as_names(i));
      }
      std::set<std::string> targets;
      for (const auto& [entry_name, name] : wanted) {
        auto it = entries.find(entry_name);
        if (it == entries.end()) {
          return absl::NotFoundError(absl::StrCat("checkpoint ", request.path(),
                                                  " has no entry \"",
                                                  entry_name, "\""));
        }
        if (!it->second->has_sharded()) {
          return absl::FailedPreconditionError(absl::StrCat(
              "checkpoint entry \"", entry_name,
              "\" is a dense tensor; the cluster holds sharded tensors only"));
        }
        RETURN_IF_ERROR(ValidateTensorName(name));
        if (!targets.insert(name).second) {
          return absl::InvalidArgumentError(absl::StrCat(
              "LoadCheckpoint: two entries would be named \"", name, "\""));
        }
        if (!request.replace() && table_->Holds(name)) {
          return NameTaken(name);
        }
      }
      RETURN_IF_ERROR(CheckDeadline(op));
      // Every loaded tensor's shards here, reserved before they are read.
      for (const auto& [entry_name, name] : wanted) {
        const v1::ShardedTensorEntry& saved = entries.at(entry_name)->sharded();
        const int versions =
            request.versions() > 0 ? request.versions() : saved.versions_kept();
        RETURN_IF_ERROR(CheckVersionsKept(
            versions, absl::StrCat("LoadCheckpoint of \"", entry_name, "\"")));
        const int copies = std::max(saved.copies(), 1);
        if (copies > rank_->world_size()) {
          return absl::FailedPreconditionError(absl::StrCat(
              "LoadCheckpoint: entry \"", entry_name, "\" was saved with ",
              copies, " copies of each shard, more than the ",
              rank_->world_size(), " daemons of this cluster"));
        }
        keeping.emplace_back(versions, copies);
        absl::StatusOr<ShardedTensorMetadata> metadata =
            FromProto(saved.metadata());
        if (!metadata.ok()) {
          return absl::DataLossError(absl::StrCat(
              "checkpoint ", request.path(), ": entry \"", entry_name,
              "\" has bad metadata: ", metadata.status().message()));
        }
        if (spec.has_value()) {
          ASSIGN_OR_RETURN(metadata,
                           BuildMetadata(*spec, metadata->size,
                                         metadata->tensor_properties));
        }
        ASSIGN_OR_RETURN(const int64_t host_bytes,
                         LocalHostBytes(*metadata, versions >= 2));
        ASSIGN_OR_RETURN(
            metadata_held.emplace_back(),
            ReserveMetadata(*metadata,
                            absl::StrCat("LoadCheckpoint \"", name, "\"")));
        ASSIGN_OR_RETURN(
            held.emplace_back(),
            budget_->Reserve(host_bytes, absl::StrCat("LoadCheckpoint \"", name,
                                                      "\" (its shards "
                                                      "on rank ",
                                                      rank(), ")")));
      }
      LoadOptions options;
      options.rank = rank_;
      if (spec.has_value()) {
        for (const auto& [entry_name, name] : wanted) {
          options.reshard.emplace(entry_name, LoadTarget::Spec(*spec));
        }
      }
      ASSIGN_OR_RETURN(StateDict dict, LoadStateDict(dir, options));
      std::map<std::string, const ShardedTensor*> by_entry;
      for (const auto& [entry_name, value] : dict) {
        if (const auto* tensor = std::get_if<ShardedTensor>(&value)) {
          by_entry.emplace(entry_name, tensor);
        }
      }
      for (const auto& [entry_name, name] : wanted) {
        auto it = by_entry.find(entry_name);
        if (it == by_entry.end()) {
          return absl::DataLossError(
              absl::StrCat("checkpoint ", request.path(), ": entry \"",
                           entry_name, "\" did not load as a sharded tensor"));
        }
        loaded.emplace_back(name, *it->second);
        ASSIGN_OR_RETURN(infos.emplace_back(),
                         TensorInfoOf(*rank_, name, *it->second));
      }
      return absl::OkStatus();
    }();
  }
  OpOutcome outcome;
  outcome.status = Agree(local, &outcome.agreed);
  if (outcome.status.ok()) {
    // The tensors a replacing load takes the names of, back in the table
    // if the load fails after all.
    std::vector<std::pair<std::string, TableEntry>> replaced;
    for (size_t i = 0; i < loaded.size(); ++i) {
      if (std::optional<TableEntry> old = table_->Remove(loaded[i].first)) {
        replaced.emplace_back(loaded[i].first, *std::move(old));
      }
      TableEntry entry;
      entry.tensor = loaded[i].second;
      entry.info = infos[i];
      entry.metadata = std::move(metadata_held[i]);
      if (keeping[i].first >= 2) {
        // Version 1 is the checkpoint's values (version_set.h).
        entry.versions = std::make_shared<VersionSet>(
            rank_, infos[i].name(), infos[i].tensor_id(), keeping[i].first);
        entry.versions->AddFirst(loaded[i].second, std::move(held[i]));
      } else {
        entry.held = std::move(held[i]);
      }
      table_->Put(loaded[i].first, std::move(entry));
    }
    // Then the copies each was saved with, filled from their owners; a
    // load that cannot place them (memory) loads nothing and replaces
    // nothing.
    for (size_t i = 0; i < loaded.size() && outcome.status.ok(); ++i) {
      if (keeping[i].second > 1) {
        outcome.status = replication_->Replicate(
            loaded[i].first, keeping[i].second, nullptr, &outcome.agreed);
      }
    }
    if (!outcome.status.ok()) {
      for (const auto& [name, tensor] : loaded) table_->Remove(name);
      for (auto& [name, entry] : replaced) table_->Put(name, std::move(entry));
      return outcome;
    }
    // As the table tells them: with their versions and copies.
    for (size_t i = 0; i < loaded.size(); ++i) {
      absl::StatusOr<v1::TensorInfo> info = table_->Info(loaded[i].first);
      if (info.ok()) infos[i] = *std::move(info);
    }
    outcome.result.infos = std::move(infos);
  } else if (valid.ok()) {
    ResyncTensorIds();
  }
  return outcome;
}

}  // namespace tessera::control_internal

namespace tessera::control_internal {

// ---- Versions (docs/versions.md).

namespace {

// Open versions are dropped unless published within this (BeginVersion's
// default lease), and pins end after kDefaultPinLease.
constexpr absl::Duration kDefaultVersionLease = absl::Minutes(10);
constexpr absl::Duration kDefaultPinLease = absl::Minutes(5);
// A renewed lease (BeginVersion's or PinVersions' `renewed`) ends this long
// after its last renewal, unless the request says otherwise.
constexpr absl::Duration kDefaultRenewedLease = absl::Seconds(30);
// The most tensors one version op may name.
constexpr int kMaxVersionGroup = 100000;

absl::Duration LeaseOf(int64_t lease_ms, absl::Duration fallback) {
  return lease_ms > 0 ? absl::Milliseconds(lease_ms) : fallback;
}

// Zeros every byte of this daemon's shards of `tensor` (host memory, as a
// spare's is: VersionSet::TakeSpare). A shard in a memory file is zeroed
// by pwrite: its writers wrote it through mappings of their own, and
// filling this daemon's page tables of it for a memset cost more than the
// zeroing (28 MiB per daemon: 200-240 ms against 10-30 ms on a 2-core VM).
void ZeroLocalShards(const ShardedTensor& tensor) {
  for (const Shard& shard : tensor.local_shards()) {
    const auto& storage = shard.tensor.storage();
    if (storage->shared_memory_fd() >= 0 &&
        PwriteZeros(storage->shared_memory_fd(),
                    static_cast<int64_t>(storage->nbytes()), 0,
                    "a reused shard's memory file")
            .ok()) {
      continue;
    }
    std::memset(storage->data(), 0, storage->nbytes());
  }
}

// The names of a version op: 1 to kMaxVersionGroup, none repeated.
absl::Status CheckVersionNames(const std::vector<std::string>& names,
                               absl::string_view what) {
  if (names.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": name at least one tensor"));
  }
  if (names.size() > static_cast<size_t>(kMaxVersionGroup)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": ", names.size(), " tensors; at most ", kMaxVersionGroup));
  }
  std::set<std::string> seen;
  for (const std::string& name : names) {
    if (!seen.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": tensor ", ShownName(name), " is named twice"));
    }
  }
  return absl::OkStatus();
}

std::vector<std::string> HandleNamesOf(
    const google::protobuf::RepeatedPtrField<v1::VersionHandle>& handles) {
  std::vector<std::string> names;
  names.reserve(handles.size());
  for (const v1::VersionHandle& handle : handles)
    names.push_back(handle.name());
  return names;
}

// "a@5,b@3": the id of a group of versions (a client joins it by this id).
std::string GroupIdOf(const v1::VersionGroup& group) {
  std::vector<std::string> parts;
  parts.reserve(group.versions_size());
  for (const v1::VersionHandle& handle : group.versions()) {
    parts.push_back(absl::StrCat(handle.name(), "@", handle.number()));
  }
  return absl::StrJoin(parts, ",");
}

// Adds version `number` of `name` (registered as `tensor_id`) to `group`.
void AddHandle(v1::VersionGroup* group, const std::string& name, int64_t number,
               const std::string& tensor_id) {
  v1::VersionHandle* handle = group->add_versions();
  handle->set_name(name);
  handle->set_number(number);
  handle->set_tensor_id(VersionId(tensor_id, number));
}

}  // namespace

std::string VersionHandleNames(
    const google::protobuf::RepeatedPtrField<v1::VersionHandle>& handles) {
  return ShownNames(HandleNamesOf(handles), ",");
}

absl::StatusOr<std::shared_ptr<VersionSet>> ControlOps::VersionsOf(
    const std::string& name, absl::string_view what) const {
  RETURN_IF_ERROR(Annotate(table_->Lookup(name).status(), what));
  std::shared_ptr<VersionSet> versions;
  RETURN_IF_ERROR(table_->Update(
      name, [&](TableEntry& entry) { versions = entry.versions; }));
  if (versions == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": tensor ", name,
        " has no versions (it is written in place): create it with "
        "versions >= 2 to write it by versions"));
  }
  return versions;
}

absl::Status ControlOps::CopyLatest(const std::string& name,
                                    const ShardedTensor& latest,
                                    const ShardedTensor& to,
                                    const std::string& tensor_id,
                                    const RegisteredTensor* copies) const {
  const std::vector<Shard>& from = latest.local_shards();
  const std::vector<Shard>& into = to.local_shards();
  if (from.size() != into.size()) {
    return absl::InternalError(
        absl::StrCat("BeginVersion of ", name, ": the new version has ",
                     into.size(), " local shards, the latest ", from.size()));
  }
  for (size_t i = 0; i < from.size(); ++i) {
    const std::vector<int64_t> origin(from[i].tensor.dim(), 0);
    RETURN_IF_ERROR(CopyBox(from[i].tensor, origin, into[i].tensor, origin,
                            from[i].tensor.sizes()));
  }
  if (copies == nullptr) return absl::OkStatus();
  const std::shared_ptr<const RegisteredTensor> latest_copies =
      rank_->registry().Resolve(ReplicaTensorId(tensor_id)).tensor;
  for (const LocalShard& copy : copies->local_shards) {
    const LocalShard* source = latest_copies == nullptr
                                   ? nullptr
                                   : latest_copies->FindShard(copy.index);
    if (source == nullptr) {
      return absl::InternalError(absl::StrCat(
          "BeginVersion of ", name, ": rank ", rank(),
          " holds no copy of shard ", copy.index, " of the latest version"));
    }
    const std::vector<int64_t> origin(copy.tensor.dim(), 0);
    RETURN_IF_ERROR(CopyBox(source->tensor, origin, copy.tensor, origin,
                            copy.tensor.sizes()));
  }
  return absl::OkStatus();
}

OpOutcome ControlOps::RunBeginVersion(const v1::ControlOp& op) {
  const v1::BeginVersionRequest& request = op.begin_version();
  const std::vector<std::string> names(request.names().begin(),
                                       request.names().end());
  struct Begun {
    std::string name;
    std::shared_ptr<VersionSet> versions;
    std::optional<ShardedTensor> tensor;
    // This daemon's copies of others' shards of it (replicas), or null.
    std::shared_ptr<ReplicaCopies> copies;
    MemoryBudget::Reservation held;
  };
  // Shared with the commit, which may run later (in_doubt.h).
  auto begun = std::make_shared<std::vector<Begun>>();
  absl::Status local = [&]() -> absl::Status {
    RETURN_IF_ERROR(CheckVersionNames(names, "BeginVersion"));
    if (request.lease_ms() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("BeginVersion: negative lease_ms ", request.lease_ms()));
    }
    if (request.skip_zeroing() && !request.empty()) {
      return absl::InvalidArgumentError(
          "BeginVersion: skip_zeroing without empty (a version begun from "
          "the latest starts as its copy: there is nothing to zero)");
    }
    for (const std::string& name : names) {
      ASSIGN_OR_RETURN(std::shared_ptr<VersionSet> versions,
                       VersionsOf(name, "BeginVersion"));
      begun->push_back(
          Begun{name, std::move(versions), std::nullopt, nullptr, {}});
    }
    RETURN_IF_ERROR(CheckDeadline(op));
    // This daemon's part: each new version's shards, in the budget first.
    for (Begun& one : *begun) {
      one.versions->Expire(absl::Now(), /*renewed=*/false);
      const ShardedTensor latest = one.versions->Latest();
      const int64_t number = one.versions->next();
      ASSIGN_OR_RETURN(const v1::TensorInfo info, table_->Info(one.name));
      ShardedTensorOptions options =
          ShardedTensorOptions()
              .WithDType(latest.metadata().tensor_properties.dtype)
              .WithRank(rank_)
              .WithTensorId(VersionId(one.versions->tensor_id(), number));
      // The memory of a freed version when the set kept it (version_set.h,
      // "Reuse"), else new memory within the budget.
      std::optional<VersionSet::Spare> spare;
      if (info.replicas_size() == 0) spare = one.versions->TakeSpare();
      if (spare.has_value()) {
        one.held = std::move(spare->held);
        ASSIGN_OR_RETURN(one.tensor,
                         ShardedTensor::InitFromLocalShardsWithSpec(
                             std::move(spare->shards), latest.metadata(),
                             latest.sharding_spec(), options));
        // An empty version is zeros until written, as a new one is,
        // unless its writers write every element (skip_zeroing).
        if (request.empty() && !request.skip_zeroing()) {
          ZeroLocalShards(*one.tensor);
        }
      } else {
        ASSIGN_OR_RETURN(const int64_t host_bytes,
                         LocalHostBytes(latest.metadata(), /*version=*/true));
        ASSIGN_OR_RETURN(
            one.held,
            budget_->Reserve(
                host_bytes,
                absl::StrCat("BeginVersion of \"", one.name, "\" (version ",
                             number, ": its shards and metadata on rank ",
                             rank(), ")")));
        // An empty version is zeros until written (see NewTensor): a shard
        // its writers miss never shows older bytes of this daemon's memory.
        ASSIGN_OR_RETURN(one.tensor,
                         request.empty()
                             ? ShardedTensor::Zeros(latest.sharding_spec(),
                                                    latest.size(), options)
                             : ShardedTensor::Empty(latest.sharding_spec(),
                                                    latest.size(), options));
      }
      std::shared_ptr<RegisteredTensor> copies;
      MemoryBudget::Reservation copies_held;
      if (info.replicas_size() > 0) {
        // Its copies of others' shards, each version with its own.
        ASSIGN_OR_RETURN(
            Replication::PlacedCopies placed,
            replication_->CopiesFor(
                info, latest.metadata(),
                absl::StrCat("BeginVersion of \"", one.name, "\" (version ",
                             number, ": its replicas on rank ", rank(), ")")));
        copies = std::move(placed.mine);
        copies_held = std::move(placed.held);
      }
      if (!request.empty()) {
        RETURN_IF_ERROR(CopyLatest(one.name, latest, *one.tensor,
                                   one.versions->tensor_id(), copies.get()));
      }
      if (copies != nullptr && !copies->local_shards.empty()) {
        ASSIGN_OR_RETURN(
            one.copies, ReplicaCopies::Register(
                            rank_, VersionId(one.versions->tensor_id(), number),
                            std::move(copies), std::move(copies_held)));
      }
    }
    return absl::OkStatus();
  }();
  const absl::Duration lease =
      LeaseOf(request.lease_ms(),
              request.renewed() ? kDefaultRenewedLease : kDefaultVersionLease);
  const absl::Duration renewal =
      request.renewed() ? lease : absl::ZeroDuration();
  return AgreeThenCommit(local, [begun, lease, renewal]() {
    const absl::Time lease_end = absl::Now() + lease;
    OpResult result;
    for (Begun& one : *begun) {
      const int64_t number =
          one.versions->Open(*std::move(one.tensor), std::move(one.copies),
                             std::move(one.held), lease_end, renewal);
      AddHandle(&result.group, one.name, number, one.versions->tensor_id());
    }
    result.group.set_id(GroupIdOf(result.group));
    return result;
  });
}

OpOutcome ControlOps::RunPublishVersion(const v1::ControlOp& op) {
  const auto& handles = op.publish_version().versions();
  std::vector<std::shared_ptr<VersionSet>> sets;
  absl::Status local = [&]() -> absl::Status {
    RETURN_IF_ERROR(
        CheckVersionNames(HandleNamesOf(handles), "PublishVersion"));
    for (const v1::VersionHandle& handle : handles) {
      ASSIGN_OR_RETURN(std::shared_ptr<VersionSet> versions,
                       VersionsOf(handle.name(), "PublishVersion"));
      if (!handle.tensor_id().empty() &&
          handle.tensor_id() !=
              VersionId(versions->tensor_id(), handle.number())) {
        return absl::FailedPreconditionError(absl::StrCat(
            "PublishVersion: ", handle.tensor_id(), " is not a version of ",
            handle.name(), " (", versions->tensor_id(),
            "): was it deleted and created again?"));
      }
      versions->Expire(absl::Now(), /*renewed=*/false);
      // Claimed: the lease thread leaves it until this op ends.
      RETURN_IF_ERROR(Annotate(versions->Claim(handle.name(), handle.number()),
                               "PublishVersion"));
      sets.push_back(std::move(versions));
    }
    return CheckDeadline(op);
  }();
  // Every daemon agreed: each makes every named version the latest now,
  // at this log entry; none of these steps can fail.
  auto commit = [this, handles, sets]() {
    OpResult result;
    for (int i = 0; i < handles.size(); ++i) {
      sets[i]->Publish(handles[i].number());
      watch_->Published(handles[i].name(), handles[i].number());
      const ShardedTensor latest = sets[i]->Latest();
      table_
          ->Update(handles[i].name(),
                   [&](TableEntry& entry) { entry.tensor = latest; })
          .IgnoreError();
      AddHandle(&result.group, handles[i].name(), handles[i].number(),
                sets[i]->tensor_id());
    }
    result.group.set_id(GroupIdOf(result.group));
    return result;
  };
  auto give_up = [handles, sets]() {
    for (size_t i = 0; i < sets.size(); ++i) {
      sets[i]->Unclaim(handles[static_cast<int>(i)].number());
    }
  };
  return AgreeThenCommit(local, std::move(commit), std::move(give_up));
}

OpOutcome ControlOps::RunAbortVersion(const v1::ControlOp& op) {
  const auto& handles = op.abort_version().versions();
  std::vector<std::shared_ptr<VersionSet>> sets;
  absl::Status local = [&]() -> absl::Status {
    RETURN_IF_ERROR(CheckVersionNames(HandleNamesOf(handles), "AbortVersion"));
    for (const v1::VersionHandle& handle : handles) {
      ASSIGN_OR_RETURN(std::shared_ptr<VersionSet> versions,
                       VersionsOf(handle.name(), "AbortVersion"));
      sets.push_back(std::move(versions));
    }
    return absl::OkStatus();
  }();
  // Aborting a version that is no longer open (published, expired,
  // aborted) changes nothing.
  return AgreeThenCommit(local, [handles, sets]() {
    for (int i = 0; i < handles.size(); ++i) {
      sets[i]->Abort(handles[i].number());
    }
    return OpResult();
  });
}

OpOutcome ControlOps::RunPinVersions(const v1::ControlOp& op) {
  const v1::PinVersionsRequest& request = op.pin_versions();
  const std::vector<std::string> names(request.names().begin(),
                                       request.names().end());
  std::vector<std::shared_ptr<VersionSet>> sets;
  std::vector<int64_t> numbers;
  absl::Status local = [&]() -> absl::Status {
    RETURN_IF_ERROR(CheckVersionNames(names, "PinVersions"));
    if (request.numbers_size() > 0 &&
        request.numbers_size() != request.names_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "PinVersions: ", request.numbers_size(), " version numbers for ",
          request.names_size(), " tensors"));
    }
    if (request.lease_ms() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("PinVersions: negative lease_ms ", request.lease_ms()));
    }
    for (int i = 0; i < request.names_size(); ++i) {
      ASSIGN_OR_RETURN(std::shared_ptr<VersionSet> versions,
                       VersionsOf(names[i], "PinVersions"));
      versions->Expire(absl::Now(), /*renewed=*/false);
      int64_t number =
          request.numbers_size() > 0 ? request.numbers(i) : int64_t{0};
      if (number == 0) number = versions->latest();
      RETURN_IF_ERROR(Annotate(versions->Published(names[i], number).status(),
                               "PinVersions"));
      sets.push_back(std::move(versions));
      numbers.push_back(number);
    }
    return CheckDeadline(op);
  }();
  // The same id on every daemon: the log entry's coordinator and number.
  const std::string pin =
      absl::StrCat("pin.", op.coordinator(), ".", op.request_id());
  const absl::Duration lease =
      LeaseOf(request.lease_ms(),
              request.renewed() ? kDefaultRenewedLease : kDefaultPinLease);
  const absl::Duration renewal =
      request.renewed() ? lease : absl::ZeroDuration();
  return AgreeThenCommit(local, [pin, lease, renewal, names, numbers, sets]() {
    const absl::Time until = absl::Now() + lease;
    OpResult result;
    for (size_t i = 0; i < sets.size(); ++i) {
      sets[i]->Pin(pin, numbers[i], until, renewal);
      AddHandle(&result.group, names[i], numbers[i], sets[i]->tensor_id());
    }
    result.group.set_id(pin);
    return result;
  });
}

OpOutcome ControlOps::RunUnpinVersions(const v1::ControlOp& op) {
  const std::string& pin = op.unpin_versions().id();
  absl::Status local =
      pin.empty() ? absl::InvalidArgumentError("UnpinVersions: empty pin id")
                  : absl::OkStatus();
  // A pin that already expired is released alike: nothing to do.
  return AgreeThenCommit(local, [this, pin]() {
    const std::vector<std::shared_ptr<VersionSet>> sets = table_->VersionSets();
    for (const auto& versions : sets) {
      versions->Unpin(pin);
      versions->Expire(absl::Now(), /*renewed=*/false);
    }
    return OpResult();
  });
}

}  // namespace tessera::control_internal
