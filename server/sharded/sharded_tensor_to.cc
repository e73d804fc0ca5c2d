// ShardedTensor::To / Cuda / Cpu: a converted copy of the local shards,
// with metadata and spec rewritten for the new device, built by
// InitFromLocalShardsWithSpec (no message is sent).
#include <utility>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/sharded/sharded_tensor.h"

namespace tessera {
namespace {

// The CUDA device of global rank `rank`: the one Rank::Init gives it by
// default (rank mod visible devices), so every rank computes the same
// placements for every other rank without asking.
absl::StatusOr<Device> RankCudaDevice(int rank) {
  const int count = CudaDeviceCount();
  if (count == 0) {
    return absl::FailedPreconditionError(
        "ShardedTensor: cannot move to CUDA: Tessera was built without CUDA "
        "or no CUDA device is visible");
  }
  return Device::Cuda(rank % count);
}

int OwnRank(const ShardedTensor& st) {
  return st.rank() != nullptr ? st.rank()->rank() : 0;
}

// The global rank owning `placement`; a placement without an owner (no
// process group mode) is this rank's.
absl::StatusOr<int> OwnerOf(const RemoteDevice& placement,
                            const ShardedTensor& st) {
  if (placement.rank().has_value()) return *placement.rank();
  if (!placement.worker_name().has_value()) return OwnRank(st);
  std::optional<int> owner;
  if (st.rank() != nullptr) owner = st.rank()->RankOf(*placement.worker_name());
  if (!owner.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Invalid worker name: ", *placement.worker_name()));
  }
  return *owner;
}

// Where rank `owner` keeps tensors of device type `type`.
absl::StatusOr<Device> DeviceOn(Device::Type type, int owner) {
  if (type == Device::Type::kCuda) return RankCudaDevice(owner);
  return type == Device::Type::kMeta ? Device::Meta() : Device::Cpu();
}

// `placement` with the same owner, on that owner's device of `type`.
absl::StatusOr<RemoteDevice> MovePlacement(const RemoteDevice& placement,
                                           Device::Type type,
                                           const ShardedTensor& st) {
  ASSIGN_OR_RETURN(int owner, OwnerOf(placement, st));
  ASSIGN_OR_RETURN(Device device, DeviceOn(type, owner));
  if (placement.rank().has_value()) {
    return RemoteDevice::ForRank(*placement.rank(), device);
  }
  if (placement.worker_name().has_value()) {
    return RemoteDevice::ForWorker(*placement.worker_name(), device);
  }
  return RemoteDevice::Local(device);
}

absl::StatusOr<ShardMetadata> MoveShard(ShardMetadata shard, Device::Type type,
                                        const ShardedTensor& st) {
  if (shard.placement().has_value()) {
    ASSIGN_OR_RETURN(RemoteDevice moved,
                     MovePlacement(*shard.placement(), type, st));
    shard.set_placement(std::move(moved));
  }
  return shard;
}

absl::StatusOr<std::vector<ShardMetadata>> MoveShards(
    std::vector<ShardMetadata> shards, Device::Type type,
    const ShardedTensor& st) {
  for (ShardMetadata& shard : shards) {
    ASSIGN_OR_RETURN(shard, MoveShard(std::move(shard), type, st));
  }
  return shards;
}

absl::StatusOr<ShardingSpec> MoveSpec(Device::Type type,
                                      const ShardedTensor& st) {
  const ShardingSpec& spec = st.sharding_spec();
  if (const auto* chunk = std::get_if<ChunkShardingSpec>(&spec)) {
    std::vector<RemoteDevice> placements;
    for (const RemoteDevice& placement : chunk->placements()) {
      ASSIGN_OR_RETURN(RemoteDevice moved, MovePlacement(placement, type, st));
      placements.push_back(std::move(moved));
    }
    ASSIGN_OR_RETURN(ChunkShardingSpec moved,
                     ChunkShardingSpec::Create(chunk->dim(), placements));
    return ShardingSpec(std::move(moved));
  }
  ASSIGN_OR_RETURN(
      std::vector<ShardMetadata> shards,
      MoveShards(std::get<EnumerableShardingSpec>(spec).shards(), type, st));
  ASSIGN_OR_RETURN(EnumerableShardingSpec moved,
                   EnumerableShardingSpec::Create(std::move(shards)));
  return ShardingSpec(std::move(moved));
}

// torch.Tensor.to(device, dtype, copy): `tensor` itself when nothing
// changes and no copy is asked for. Elements are converted on the host
// side of a move.
absl::StatusOr<Tensor> ConvertTensor(const Tensor& tensor, DType dtype,
                                     const Device& device, bool copy) {
  const bool moves = tensor.device() != device;
  const bool casts = tensor.dtype() != dtype;
  if (!moves && !casts) return copy ? tensor.Clone() : tensor;
  Tensor out = tensor;
  if (moves && !tensor.device().is_cpu()) {
    ASSIGN_OR_RETURN(out, out.To(device));
  }
  if (casts) {
    ASSIGN_OR_RETURN(out, out.ToDType(dtype));
  }
  if (moves && tensor.device().is_cpu()) {
    ASSIGN_OR_RETURN(out, out.To(device));
  }
  return out;
}

struct Target {
  DType dtype;
  Device::Type device_type;
  std::shared_ptr<ProcessGroup> group;  // Null: keep.
  bool copy = false;
};

// The new tensor: every shard placed on its owner's device of the target
// type, local shards converted.
absl::StatusOr<ShardedTensor> Convert(const ShardedTensor& st,
                                      const Target& target) {
  ASSIGN_OR_RETURN(ShardingSpec spec, MoveSpec(target.device_type, st));
  ShardedTensorMetadata metadata = st.metadata();
  ASSIGN_OR_RETURN(
      metadata.shards_metadata,
      MoveShards(std::move(metadata.shards_metadata), target.device_type, st));
  metadata.tensor_properties.dtype = target.dtype;
  // Only host memory is pinned; staying on the host keeps it.
  if (target.device_type != Device::Type::kCpu) {
    metadata.tensor_properties.pin_memory = false;
  }
  ASSIGN_OR_RETURN(const Device own_device,
                   DeviceOn(target.device_type, OwnRank(st)));
  std::vector<Shard> shards;
  for (const Shard& shard : st.local_shards()) {
    ASSIGN_OR_RETURN(ShardMetadata moved,
                     MoveShard(shard.metadata, target.device_type, st));
    const Device device = moved.placement().has_value()
                              ? moved.placement()->device()
                              : own_device;
    ASSIGN_OR_RETURN(Tensor tensor, ConvertTensor(shard.tensor, target.dtype,
                                                  device, target.copy));
    shards.push_back(Shard{std::move(tensor), std::move(moved)});
  }
  ShardedTensorOptions options = st.options();
  options.dtype = target.dtype;
  options.pin_memory = metadata.tensor_properties.pin_memory;
  if (target.group != nullptr) options.process_group = target.group;
  return ShardedTensor::InitFromLocalShardsWithSpec(
      std::move(shards), std::move(metadata), std::move(spec), options);
}

// PyTorch's "current device" of a ShardedTensor: its first local shard's,
// else the device its group moves.
absl::StatusOr<Device> CurrentDevice(const ShardedTensor& st) {
  if (!st.local_shards().empty()) return st.device();
  if (st.process_group() == nullptr ||
      st.process_group()->device_type() == Device::Type::kCpu) {
    return Device::Cpu();
  }
  return RankCudaDevice(OwnRank(st));
}

bool KeepsGroup(const ShardedTensor& st,
                const std::shared_ptr<ProcessGroup>& group) {
  return group == nullptr || group == st.process_group();
}

}  // namespace

absl::StatusOr<Device> ShardedTensor::DeviceArg::Resolve() const {
  Device device;
  if (device_.has_value()) {
    device = *device_;
  } else if (index_.has_value()) {
    ASSIGN_OR_RETURN(device, Device::Create(Device::Type::kCuda, *index_));
  } else {
    ASSIGN_OR_RETURN(device, Device::Parse(text_));
  }
  // "cpu:0" is the CPU, as tensors report it.
  return device.is_cpu() ? Device::Cpu() : device;
}

absl::StatusOr<ShardedTensor> ShardedTensor::To(
    const ToOptions& options) const {
  ASSIGN_OR_RETURN(const Device current, CurrentDevice(*this));
  Device device = current;
  if (options.device.has_value()) {
    ASSIGN_OR_RETURN(device, options.device->Resolve());
  }
  if (device.is_cuda()) {
    ASSIGN_OR_RETURN(device, RankCudaDevice(OwnRank(*this)));
  }
  const DType target_dtype = options.dtype.value_or(dtype());
  if (!options.copy && target_dtype == dtype() && device == current &&
      KeepsGroup(*this, options.process_group)) {
    return *this;
  }
  return Convert(*this, Target{target_dtype, device.type(),
                               options.process_group, options.copy});
}

absl::StatusOr<ShardedTensor> ShardedTensor::To(DType dtype) const {
  ToOptions options;
  options.dtype = dtype;
  return To(options);
}

absl::StatusOr<ShardedTensor> ShardedTensor::To(
    DeviceArg device, std::optional<DType> dtype) const {
  ToOptions options;
  options.device = std::move(device);
  options.dtype = dtype;
  return To(options);
}

absl::StatusOr<ShardedTensor> ShardedTensor::To(const Tensor& other) const {
  return To(other.device(), other.dtype());
}

absl::StatusOr<ShardedTensor> ShardedTensor::Cuda(
    std::optional<int> device,
    std::shared_ptr<ProcessGroup> process_group) const {
  ASSIGN_OR_RETURN(const Device mine, RankCudaDevice(OwnRank(*this)));
  if (device.has_value() && *device != mine.index()) {
    return absl::InvalidArgumentError(
        "Only device without device id (e.g. \"cpu\" or \"cuda\") is expected "
        "for ShardedTensor!");
  }
  return Convert(*this, Target{dtype(), Device::Type::kCuda,
                               std::move(process_group), /*copy=*/false});
}

absl::StatusOr<ShardedTensor> ShardedTensor::Cpu(
    std::shared_ptr<ProcessGroup> process_group) const {
  bool all_on_cpu = true;
  for (const ShardMetadata& shard : metadata().shards_metadata) {
    all_on_cpu &=
        !shard.placement().has_value() || shard.placement()->device().is_cpu();
  }
  if (all_on_cpu && KeepsGroup(*this, process_group)) return *this;
  return Convert(*this, Target{dtype(), Device::Type::kCpu,
                               std::move(process_group), /*copy=*/false});
}

}  // namespace tessera
