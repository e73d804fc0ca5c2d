#include "server/checkpoint/checkpoint.h"

#include <fcntl.h>

#include <algorithm>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/checksum.h"
#include "common/int_math.h"
#include "common/proto_convert.h"
#include "common/region.h"
#include "common/shard_layout.h"
#include "common/status_macros.h"
#include "server/checkpoint/checkpoint_format.h"

namespace tessera {

using checkpoint_internal::File;
using checkpoint_internal::kBlockAlignment;
using checkpoint_internal::NamedFiles;
using checkpoint_internal::RemoveLeftovers;
using checkpoint_internal::ResolveOwners;
using checkpoint_internal::ShardWhat;

namespace {

constexpr char kNeedDefaultGroup[] =
    "Need to initialize default process group using \"init_process_group\" "
    "before loading ShardedTensor";

// ---------------------------------------------------------------------------
// Loading.

// `numel` elements of `element` bytes; nullopt when negative or past what
// a checkpoint may hold (2^60 bytes), so that no offset computed from it
// overflows.
std::optional<int64_t> RunBytes(int64_t numel, int64_t element) {
  constexpr int64_t kMaxRunBytes = int64_t{1} << 60;
  if (numel < 0 || numel > kMaxRunBytes / element) return std::nullopt;
  return numel * element;
}

// A manifest run checked against what it should hold, so that reads stay
// inside it and every block has its checksum.
absl::Status ValidateExtent(const v1::DataExtent& extent, int64_t length,
                            absl::string_view what) {
  const int64_t block = extent.block_bytes();
  const char* problem = nullptr;
  if (!CheckSingleComponent(extent.file()).ok()) {
    problem = "a bad file name";
  } else if (extent.offset() < 0 || extent.length() != length) {
    problem = "a bad offset or length";
  } else if (block <= 0 || block % kBlockAlignment != 0 ||
             extent.block_xxh3_size() != CeilDiv(length, block)) {
    problem = "bad checksum blocks";
  }
  if (problem == nullptr) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat("checkpoint manifest: ", what,
                                          " has ", problem, " (file \"",
                                          extent.file(), "\")"));
}

// Reads verified element ranges of a checkpoint's data files, opening each
// file once.
class CheckpointReader {
 public:
  explicit CheckpointReader(Directory dir) : dir_(std::move(dir)) {}

  // Elements [first, first + count) of the run `extent` holds, as a 1-d CPU
  // tensor of `dtype`. Reads and verifies only the blocks that hold them.
  absl::StatusOr<Tensor> Read(const v1::DataExtent& extent, DType dtype,
                              int64_t first, int64_t count,
                              absl::string_view what) {
    const TensorOptions options = TensorOptions().WithDType(dtype);
    if (count == 0) return Tensor::Empty({0}, options);
    const int64_t element = static_cast<int64_t>(ElementSize(dtype));
    const int64_t block = extent.block_bytes();
    const int64_t first_block = first * element / block;
    const int64_t end_block = CeilDiv((first + count) * element, block);
    const int64_t begin = first_block * block;
    const int64_t end = std::min(end_block * block, extent.length());
    // The file must hold the run before anything is allocated for it: a
    // manifest's sizes are not to be trusted with memory.
    ASSIGN_OR_RETURN(const File* file, Open(extent.file(), what));
    ASSIGN_OR_RETURN(const int64_t file_size, file->Size());
    if (extent.offset() > file_size || end > file_size - extent.offset()) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint file ", file->path(), " is truncated: ", what,
          " needs bytes [", extent.offset() + begin, ", ",
          extent.offset() + end, ") of its ", file_size));
    }
    ASSIGN_OR_RETURN(Tensor raw,
                     Tensor::Empty({(end - begin) / element}, options));
    char* data = static_cast<char*>(raw.data_ptr());
    RETURN_IF_ERROR(file->ReadAt(extent.offset() + begin, data,
                                 static_cast<size_t>(end - begin), what));
    for (int64_t k = first_block; k < end_block; ++k) {
      const int64_t at = k * block;
      const int64_t n = std::min(block, extent.length() - at);
      if (Checksum64(data + (at - begin), static_cast<size_t>(n)) !=
          extent.block_xxh3(static_cast<int>(k))) {
        return absl::DataLossError(absl::StrCat(
            "checkpoint file ", file->path(), " is corrupt: ", what,
            " fails the XXH3 checksum of its block ", k, " (file bytes [",
            extent.offset() + at, ", ", extent.offset() + at + n, "))"));
      }
    }
    return raw.Narrow(0, first - begin / element, count);
  }

 private:
  absl::StatusOr<const File*> Open(const std::string& name,
                                   absl::string_view what) {
    auto it = files_.find(name);
    if (it == files_.end()) {
      absl::StatusOr<File> file = File::Open(dir_, name, O_RDONLY);
      if (!file.ok()) {
        return Annotate(file.status(), absl::StrCat("reading ", what));
      }
      it = files_.emplace(name, std::move(*file)).first;
    }
    return &it->second;
  }

  Directory dir_;
  std::map<std::string, File> files_;
};

// A sharded entry of the manifest, converted and checked.
struct SavedTensor {
  std::string name;
  const v1::ShardedTensorEntry* entry;
  ShardedTensorMetadata metadata;
};

absl::StatusOr<SavedTensor> ParseSaved(const std::string& name,
                                       const v1::ShardedTensorEntry& entry) {
  absl::StatusOr<ShardedTensorMetadata> metadata = FromProto(entry.metadata());
  absl::Status status = metadata.status();
  if (status.ok()) {
    status = ValidateShardLayout(metadata->shards_metadata, metadata->size);
  }
  if (!status.ok()) {
    return absl::DataLossError(
        absl::StrCat("checkpoint manifest: \"", name,
                     "\" has bad metadata: ", status.message()));
  }
  const auto& shards = metadata->shards_metadata;
  if (static_cast<int>(shards.size()) != entry.shards_size()) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint manifest: \"", name, "\" lists ", entry.shards_size(),
        " saved shards for ", shards.size(), " shards"));
  }
  const int64_t element = ElementSize(metadata->tensor_properties.dtype);
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string what = ShardWhat(name, static_cast<int64_t>(i));
    const std::optional<int64_t> bytes = RunBytes(shards[i].numel(), element);
    if (!bytes.has_value()) {
      return absl::DataLossError(
          absl::StrCat("checkpoint manifest: ", what, " is too large"));
    }
    RETURN_IF_ERROR(
        ValidateExtent(entry.shards(static_cast<int>(i)).data(), *bytes, what));
  }
  return SavedTensor{name, &entry, *std::move(metadata)};
}

// Copies `box` (global coordinates) of saved shard `i` into `dst`, the
// tensor of the shard `target`. Reads the rows of the saved shard the box
// spans along dimension 0 (a contiguous run), rounded out to whole
// checksum blocks.
absl::Status CopySavedBox(CheckpointReader& reader, const SavedTensor& saved,
                          int i, const ShardMetadata& box,
                          const ShardMetadata& target, const Tensor& dst) {
  const ShardMetadata& shard = saved.metadata.shards_metadata[i];
  std::vector<int64_t> src_offsets =
      OffsetsWithin(box.shard_offsets(), shard.shard_offsets());
  std::vector<int64_t> slab(shard.shard_sizes().begin(),
                            shard.shard_sizes().end());
  int64_t first = 0;
  int64_t count = 1;
  if (!slab.empty()) {
    const int64_t row = shard.numel() / slab[0];
    first = src_offsets[0] * row;
    count = box.shard_sizes()[0] * row;
    slab[0] = box.shard_sizes()[0];
    src_offsets[0] = 0;
  }
  ASSIGN_OR_RETURN(Tensor raw,
                   reader.Read(saved.entry->shards(i).data(),
                               saved.metadata.tensor_properties.dtype, first,
                               count, ShardWhat(saved.name, i)));
  ASSIGN_OR_RETURN(Tensor rows, raw.View(slab));
  return CopyBox(rows, src_offsets, dst,
                 OffsetsWithin(box.shard_offsets(), target.shard_offsets()),
                 box.shard_sizes());
}

// Fills `dst`, the tensor of shard `target`, from every saved shard it
// overlaps. The saved shards tile the tensor, so every element is written.
absl::Status FillShard(CheckpointReader& reader, const SavedTensor& saved,
                       const ShardMetadata& target, const Tensor& dst) {
  const auto& shards = saved.metadata.shards_metadata;
  for (size_t i = 0; i < shards.size(); ++i) {
    std::optional<ShardMetadata> box = Intersect(shards[i], target);
    if (!box.has_value()) continue;
    RETURN_IF_ERROR(
        CopySavedBox(reader, saved, static_cast<int>(i), *box, target, dst));
  }
  return absl::OkStatus();
}

// PyTorch's ShardedTensor.__setstate__ checks, for a load with the saved
// layout. A process is identified by its global rank: its rank in the
// saving group is its position among the group's global ranks.
absl::Status CheckSameGroup(const v1::ShardedTensorEntry& entry,
                            const Rank& rank, const ProcessGroup& group) {
  const auto& saved = entry.group_global_ranks();
  const auto it = std::find(saved.begin(), saved.end(), rank.rank());
  const int saved_rank =
      it == saved.end() ? -1 : static_cast<int>(it - saved.begin());
  if (saved_rank != group.rank()) {
    return absl::FailedPreconditionError(
        absl::StrCat("Local rank at save time was ", saved_rank,
                     ", but at load time was ", group.rank()));
  }
  if (saved.size() != group.size()) {
    return absl::FailedPreconditionError(
        absl::StrCat("Local world size at save time was ", saved.size(),
                     ", but at load time was ", group.size()));
  }
  if (entry.world_size() != rank.world_size()) {
    return absl::FailedPreconditionError(
        absl::StrCat("Global world size at save time was ", entry.world_size(),
                     ", but at load time was ", rank.world_size()));
  }
  return absl::OkStatus();
}

// Loads one checkpoint's entries, sharing open files between them.
class Loader {
 public:
  Loader(const Directory& dir, const LoadOptions& options)
      : reader_(dir), options_(options) {}

  absl::StatusOr<StateValue> Load(const v1::CheckpointEntry& entry) {
    if (entry.has_dense()) return LoadDense(entry.name(), entry.dense());
    if (!entry.has_sharded()) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint manifest: \"", entry.name(), "\" holds no tensor"));
    }
    ASSIGN_OR_RETURN(SavedTensor saved,
                     ParseSaved(entry.name(), entry.sharded()));
    auto target = options_.reshard.find(entry.name());
    if (target == options_.reshard.end()) return LoadSameLayout(saved);
    if (target->second.into.has_value()) {
      return FillInto(saved, *target->second.into);
    }
    return LoadResharded(saved, *target->second.spec,
                         target->second.process_group);
  }

 private:
  absl::StatusOr<Tensor> LoadDense(const std::string& name,
                                   const v1::DenseTensorEntry& dense) {
    absl::StatusOr<DType> dtype = FromProto(dense.dtype());
    std::vector<int64_t> sizes(dense.sizes().begin(), dense.sizes().end());
    std::optional<int64_t> numel;
    if (std::all_of(sizes.begin(), sizes.end(),
                    [](int64_t s) { return s >= 0; })) {
      numel = CheckedProduct(sizes);
    }
    std::optional<int64_t> bytes;
    if (dtype.ok() && numel.has_value()) {
      bytes = RunBytes(*numel, static_cast<int64_t>(ElementSize(*dtype)));
    }
    if (!bytes.has_value()) {
      return absl::DataLossError(absl::StrCat("checkpoint manifest: \"", name,
                                              "\" has a bad dtype or sizes"));
    }
    const std::string what = absl::StrCat("\"", name, "\"");
    RETURN_IF_ERROR(ValidateExtent(dense.data(), *bytes, what));
    ASSIGN_OR_RETURN(Tensor raw,
                     reader_.Read(dense.data(), *dtype, 0, *numel, what));
    return raw.View(sizes);
  }

  // The rank and group of loaded tensors (load_with_process_group).
  absl::Status ResolveContext() {
    rank_ = options_.rank != nullptr ? options_.rank : DefaultRank();
    if (rank_ == nullptr)
      return absl::FailedPreconditionError(kNeedDefaultGroup);
    group_ = options_.process_group != nullptr ? options_.process_group
                                               : rank_->default_group();
    return absl::OkStatus();
  }

  ShardedTensorOptions TensorOptionsOn(std::shared_ptr<ProcessGroup> group) {
    ShardedTensorOptions options;
    options.rank = rank_;
    options.process_group = std::move(group);
    return options;
  }

  // Each rank reads its own shards, whole.
  absl::StatusOr<ShardedTensor> LoadSameLayout(const SavedTensor& saved) {
    RETURN_IF_ERROR(ResolveContext());
    RETURN_IF_ERROR(CheckSameGroup(*saved.entry, *rank_, *group_));
    ASSIGN_OR_RETURN(auto owners,
                     ResolveOwners(saved.metadata, *group_, *rank_));
    std::vector<Shard> local;
    for (size_t i = 0; i < owners.size(); ++i) {
      if (owners[i].first != rank_->rank()) continue;
      ASSIGN_OR_RETURN(Tensor tensor, ReadWholeShard(saved, static_cast<int>(i),
                                                     owners[i].second));
      local.push_back(
          Shard{std::move(tensor), saved.metadata.shards_metadata[i]});
    }
    ASSIGN_OR_RETURN(ShardingSpec spec,
                     FromProto(saved.entry->sharding_spec()));
    return ShardedTensor::InitFromLocalShardsWithSpec(
        std::move(local), saved.metadata, std::move(spec),
        TensorOptionsOn(group_));
  }

  absl::StatusOr<Tensor> ReadWholeShard(const SavedTensor& saved, int i,
                                        const Device& device) {
    const ShardMetadata& shard = saved.metadata.shards_metadata[i];
    const TensorProperties& properties = saved.metadata.tensor_properties;
    if (shard.numel() == 0) return AllocateShard(saved, shard, device);
    ASSIGN_OR_RETURN(
        Tensor raw,
        reader_.Read(saved.entry->shards(i).data(), properties.dtype, 0,
                     shard.numel(), ShardWhat(saved.name, i)));
    ASSIGN_OR_RETURN(Tensor tensor, raw.View(shard.shard_sizes()));
    if (!device.is_cpu() || properties.pin_memory) {
      ASSIGN_OR_RETURN(tensor, tensor.To(device, properties.pin_memory));
    }
    tensor.set_requires_grad(properties.requires_grad);
    return tensor;
  }

  static absl::StatusOr<Tensor> AllocateShard(const SavedTensor& saved,
                                              const ShardMetadata& shard,
                                              const Device& device) {
    const TensorProperties& properties = saved.metadata.tensor_properties;
    TensorOptions options;
    options.dtype = properties.dtype;
    options.device = device;
    options.pin_memory = properties.pin_memory && device.is_cpu();
    options.requires_grad = properties.requires_grad;
    return Tensor::Empty(shard.shard_sizes(), options);
  }

  // Each rank reads the boxes its new shards need.
  absl::StatusOr<ShardedTensor> LoadResharded(
      const SavedTensor& saved, const ShardingSpec& spec,
      std::shared_ptr<ProcessGroup> group) {
    RETURN_IF_ERROR(ResolveContext());
    if (group == nullptr) group = group_;
    ASSIGN_OR_RETURN(ShardedTensorMetadata metadata,
                     BuildMetadata(spec, saved.metadata.size,
                                   saved.metadata.tensor_properties));
    ASSIGN_OR_RETURN(auto owners, ResolveOwners(metadata, *group, *rank_));
    std::vector<Shard> local;
    for (size_t i = 0; i < owners.size(); ++i) {
      if (owners[i].first != rank_->rank()) continue;
      const ShardMetadata& shard = metadata.shards_metadata[i];
      ASSIGN_OR_RETURN(Tensor tensor,
                       AllocateShard(saved, shard, owners[i].second));
      RETURN_IF_ERROR(FillShard(reader_, saved, shard, tensor));
      local.push_back(Shard{std::move(tensor), shard});
    }
    return ShardedTensor::InitFromLocalShardsWithSpec(
        std::move(local), std::move(metadata), spec,
        TensorOptionsOn(std::move(group)));
  }

  absl::StatusOr<ShardedTensor> FillInto(const SavedTensor& saved,
                                         const ShardedTensor& target) {
    const TensorProperties& properties = saved.metadata.tensor_properties;
    if (target.size() != saved.metadata.size ||
        target.dtype() != properties.dtype) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot load \"", saved.name, "\" (", DTypeName(properties.dtype),
          " [", absl::StrJoin(saved.metadata.size, ", "),
          "]) into a sharded tensor of ", DTypeName(target.dtype()), " [",
          absl::StrJoin(target.size(), ", "), "]"));
    }
    for (const Shard& shard : target.local_shards()) {
      RETURN_IF_ERROR(FillShard(reader_, saved, shard.metadata, shard.tensor));
    }
    return target;
  }

  CheckpointReader reader_;
  const LoadOptions& options_;
  std::shared_ptr<Rank> rank_;
  std::shared_ptr<ProcessGroup> group_;
};

// Every resharding target names a sharded entry and says where it goes.
absl::Status CheckTargets(const v1::CheckpointManifest& manifest,
                          const LoadOptions& options, const Directory& dir) {
  for (const auto& [name, target] : options.reshard) {
    if (target.spec.has_value() == target.into.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the resharding target of \"", name,
                       "\" needs exactly one of a spec and a tensor to fill"));
    }
    const auto& entries = manifest.entries();
    auto it = std::find_if(entries.begin(), entries.end(),
                           [&wanted = name](const v1::CheckpointEntry& entry) {
                             return entry.name() == wanted;
                           });
    if (it == entries.end()) {
      return absl::NotFoundError(absl::StrCat("no entry named \"", name,
                                              "\" in checkpoint ", dir.path()));
    }
    if (!it->has_sharded()) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", name,
                       "\" is a dense tensor; only sharded tensors can be "
                       "resharded"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<StateDict> LoadStateDict(const Directory& dir,
                                        const LoadOptions& options) {
  const int64_t start_ns = absl::GetCurrentTimeNanos();
  ASSIGN_OR_RETURN(v1::CheckpointManifest manifest,
                   ReadCheckpointManifest(dir));
  // Best effort (the directory may be read-only to this process).
  RemoveLeftovers(dir, NamedFiles(manifest), {}, start_ns);
  RETURN_IF_ERROR(CheckTargets(manifest, options, dir));
  Loader loader(dir, options);
  StateDict state_dict;
  for (const v1::CheckpointEntry& entry : manifest.entries()) {
    ASSIGN_OR_RETURN(StateValue value, loader.Load(entry));
    state_dict.emplace_back(entry.name(), std::move(value));
  }
  return state_dict;
}

absl::StatusOr<StateDict> LoadStateDict(const std::string& dir,
                                        const LoadOptions& options) {
  ASSIGN_OR_RETURN(Directory opened, Directory::Open(dir));
  return LoadStateDict(opened, options);
}

}  // namespace tessera
