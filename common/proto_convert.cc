#include "common/proto_convert.h"

#include <cstdint>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/status_macros.h"

namespace tessera {
namespace {

struct DTypePair {
  DType dtype;
  v1::DType proto;
};

constexpr DTypePair kDTypes[] = {
    {DType::kFloat32, v1::DTYPE_FLOAT32},
    {DType::kFloat64, v1::DTYPE_FLOAT64},
    {DType::kComplex64, v1::DTYPE_COMPLEX64},
    {DType::kComplex128, v1::DTYPE_COMPLEX128},
    {DType::kFloat16, v1::DTYPE_FLOAT16},
    {DType::kBFloat16, v1::DTYPE_BFLOAT16},
    {DType::kUInt8, v1::DTYPE_UINT8},
    {DType::kInt8, v1::DTYPE_INT8},
    {DType::kInt16, v1::DTYPE_INT16},
    {DType::kInt32, v1::DTYPE_INT32},
    {DType::kInt64, v1::DTYPE_INT64},
    {DType::kBool, v1::DTYPE_BOOL},
};

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

// Prefixes a nested message's error with the field that held it.
absl::Status InField(absl::string_view field, const absl::Status& status) {
  return absl::Status(status.code(),
                      absl::StrCat(field, ".", status.message()));
}

}  // namespace

v1::DType ToProto(DType dtype) {
  return kDTypes[static_cast<size_t>(dtype)].proto;
}

absl::StatusOr<DType> FromProto(v1::DType dtype) {
  for (const DTypePair& pair : kDTypes) {
    if (pair.proto == dtype) return pair.dtype;
  }
  return Invalid("dtype", absl::StrCat("unknown or unspecified dtype ",
                                       static_cast<int>(dtype)));
}

v1::Device ToProto(const Device& device) {
  v1::Device proto;
  switch (device.type()) {
    case Device::Type::kCpu:
      proto.set_type(v1::DEVICE_TYPE_CPU);
      break;
    case Device::Type::kCuda:
      proto.set_type(v1::DEVICE_TYPE_CUDA);
      break;
    case Device::Type::kMeta:
      proto.set_type(v1::DEVICE_TYPE_META);
      break;
  }
  if (device.index().has_value()) proto.set_index(*device.index());
  return proto;
}

absl::StatusOr<Device> FromProto(const v1::Device& device) {
  std::optional<int> index;
  if (device.has_index()) index = device.index();
  Device::Type type;
  switch (device.type()) {
    case v1::DEVICE_TYPE_CPU:
      type = Device::Type::kCpu;
      break;
    case v1::DEVICE_TYPE_CUDA:
      type = Device::Type::kCuda;
      break;
    case v1::DEVICE_TYPE_META:
      type = Device::Type::kMeta;
      break;
    default:
      return Invalid("type", absl::StrCat("unknown or unspecified device type ",
                                          static_cast<int>(device.type())));
  }
  absl::StatusOr<Device> result = Device::Create(type, index);
  if (!result.ok()) return Invalid("index", result.status().message());
  return result;
}

v1::RemoteDevice ToProto(const RemoteDevice& device) {
  v1::RemoteDevice proto;
  if (device.rank().has_value()) proto.set_rank(*device.rank());
  if (device.worker_name().has_value()) {
    proto.set_worker_name(*device.worker_name());
  }
  *proto.mutable_device() = ToProto(device.device());
  return proto;
}

absl::StatusOr<RemoteDevice> FromProto(const v1::RemoteDevice& device) {
  if (!device.has_device()) return Invalid("device", "missing");
  absl::StatusOr<Device> local = FromProto(device.device());
  if (!local.ok()) return InField("device", local.status());
  switch (device.owner_case()) {
    case v1::RemoteDevice::kRank:
      if (device.rank() < 0) {
        return Invalid("rank",
                       absl::StrCat("must be >= 0, got ", device.rank()));
      }
      return RemoteDevice::ForRank(device.rank(), *local);
    case v1::RemoteDevice::kWorkerName:
      if (device.worker_name().empty() ||
          device.worker_name().find('/') != std::string::npos) {
        return Invalid("worker_name",
                       absl::StrCat("must be non-empty and contain no '/', "
                                    "got '",
                                    device.worker_name(), "'"));
      }
      return RemoteDevice::ForWorker(device.worker_name(), *local);
    case v1::RemoteDevice::OWNER_NOT_SET:
      break;
  }
  return RemoteDevice::Local(*local);
}

v1::TensorProperties ToProto(const TensorProperties& properties) {
  v1::TensorProperties proto;
  proto.set_dtype(ToProto(properties.dtype));
  proto.set_layout(properties.layout == Layout::kStrided
                       ? v1::LAYOUT_STRIDED
                       : v1::LAYOUT_SPARSE_COO);
  proto.set_requires_grad(properties.requires_grad);
  switch (properties.memory_format) {
    case MemoryFormat::kContiguous:
      proto.set_memory_format(v1::MEMORY_FORMAT_CONTIGUOUS);
      break;
    case MemoryFormat::kChannelsLast:
      proto.set_memory_format(v1::MEMORY_FORMAT_CHANNELS_LAST);
      break;
    case MemoryFormat::kPreserve:
      proto.set_memory_format(v1::MEMORY_FORMAT_PRESERVE);
      break;
  }
  proto.set_pin_memory(properties.pin_memory);
  return proto;
}

absl::StatusOr<TensorProperties> FromProto(const v1::TensorProperties& p) {
  TensorProperties properties;
  ASSIGN_OR_RETURN(properties.dtype, FromProto(p.dtype()));
  switch (p.layout()) {
    case v1::LAYOUT_STRIDED:
      properties.layout = Layout::kStrided;
      break;
    case v1::LAYOUT_SPARSE_COO:
      properties.layout = Layout::kSparseCoo;
      break;
    default:
      return Invalid("layout", absl::StrCat("unknown or unspecified layout ",
                                            static_cast<int>(p.layout())));
  }
  switch (p.memory_format()) {
    case v1::MEMORY_FORMAT_CONTIGUOUS:
      properties.memory_format = MemoryFormat::kContiguous;
      break;
    case v1::MEMORY_FORMAT_CHANNELS_LAST:
      properties.memory_format = MemoryFormat::kChannelsLast;
      break;
    case v1::MEMORY_FORMAT_PRESERVE:
      properties.memory_format = MemoryFormat::kPreserve;
      break;
    default:
      return Invalid("memory_format",
                     absl::StrCat("unknown or unspecified memory format ",
                                  static_cast<int>(p.memory_format())));
  }
  properties.requires_grad = p.requires_grad();
  properties.pin_memory = p.pin_memory();
  return properties;
}

v1::ShardMetadata ToProto(const ShardMetadata& metadata) {
  v1::ShardMetadata proto;
  proto.mutable_shard_offsets()->Add(metadata.shard_offsets().begin(),
                                     metadata.shard_offsets().end());
  proto.mutable_shard_sizes()->Add(metadata.shard_sizes().begin(),
                                   metadata.shard_sizes().end());
  if (metadata.placement().has_value()) {
    *proto.mutable_placement() = ToProto(*metadata.placement());
  }
  return proto;
}

absl::StatusOr<ShardMetadata> FromProto(const v1::ShardMetadata& metadata) {
  std::optional<RemoteDevice> placement;
  if (metadata.has_placement()) {
    absl::StatusOr<RemoteDevice> device = FromProto(metadata.placement());
    if (!device.ok()) return InField("placement", device.status());
    placement = *std::move(device);
  }
  return ShardMetadata::Create(
      absl::MakeConstSpan(metadata.shard_offsets().data(),
                          metadata.shard_offsets_size()),
      absl::MakeConstSpan(metadata.shard_sizes().data(),
                          metadata.shard_sizes_size()),
      std::move(placement));
}

v1::ShardedTensorMetadata ToProto(const ShardedTensorMetadata& metadata) {
  v1::ShardedTensorMetadata proto;
  proto.mutable_shards_metadata()->Reserve(
      static_cast<int>(metadata.shards_metadata.size()));
  for (const ShardMetadata& shard : metadata.shards_metadata) {
    *proto.add_shards_metadata() = ToProto(shard);
  }
  proto.mutable_size()->Add(metadata.size.begin(), metadata.size.end());
  *proto.mutable_tensor_properties() = ToProto(metadata.tensor_properties);
  return proto;
}

namespace {

// The size and properties of a ShardedTensorMetadata or its packed form,
// checked, into `out`.
template <typename Message>
absl::Status SizeAndProperties(const Message& proto,
                               ShardedTensorMetadata* out) {
  out->size.assign(proto.size().begin(), proto.size().end());
  for (int64_t size : out->size) {
    if (size < 0) {
      return Invalid("size", absl::StrCat("must be >= 0, got ", size));
    }
  }
  if (!proto.has_tensor_properties()) {
    return Invalid("tensor_properties", "missing");
  }
  absl::StatusOr<TensorProperties> properties =
      FromProto(proto.tensor_properties());
  if (!properties.ok()) {
    return InField("tensor_properties", properties.status());
  }
  out->tensor_properties = *properties;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ShardedTensorMetadata> FromProto(
    const v1::ShardedTensorMetadata& metadata) {
  ShardedTensorMetadata result;
  RETURN_IF_ERROR(SizeAndProperties(metadata, &result));
  result.shards_metadata.reserve(metadata.shards_metadata_size());
  for (int i = 0; i < metadata.shards_metadata_size(); ++i) {
    absl::StatusOr<ShardMetadata> shard =
        FromProto(metadata.shards_metadata(i));
    if (!shard.ok()) {
      return InField(absl::StrCat("shards_metadata[", i, "]"), shard.status());
    }
    result.shards_metadata.push_back(*std::move(shard));
  }
  return result;
}

v1::ShardingSpec ToProto(const ShardingSpec& spec) {
  v1::ShardingSpec proto;
  if (const auto* chunk = std::get_if<ChunkShardingSpec>(&spec)) {
    v1::ChunkShardingSpec* out = proto.mutable_chunk();
    out->set_dim_index(chunk->dim());
    for (const RemoteDevice& placement : chunk->placements()) {
      *out->add_placements() = ToProto(placement);
    }
  } else {
    v1::EnumerableShardingSpec* out = proto.mutable_enumerable();
    for (const ShardMetadata& shard :
         std::get<EnumerableShardingSpec>(spec).shards()) {
      *out->add_shards() = ToProto(shard);
    }
  }
  return proto;
}

absl::StatusOr<ShardingSpec> FromProto(const v1::ShardingSpec& spec) {
  switch (spec.spec_case()) {
    case v1::ShardingSpec::kChunk: {
      const v1::ChunkShardingSpec& chunk = spec.chunk();
      if (chunk.dim_case() == v1::ChunkShardingSpec::kDimName) {
        return ChunkShardingSpec::CreateNamed(chunk.dim_name(), {});
      }
      if (chunk.dim_case() == v1::ChunkShardingSpec::DIM_NOT_SET) {
        return Invalid("chunk.dim", "missing");
      }
      std::vector<RemoteDevice> placements;
      for (int i = 0; i < chunk.placements_size(); ++i) {
        absl::StatusOr<RemoteDevice> device = FromProto(chunk.placements(i));
        if (!device.ok()) {
          return InField(absl::StrCat("chunk.placements[", i, "]"),
                         device.status());
        }
        placements.push_back(*std::move(device));
      }
      ASSIGN_OR_RETURN(
          ChunkShardingSpec result,
          ChunkShardingSpec::Create(chunk.dim_index(), std::move(placements)));
      return result;
    }
    case v1::ShardingSpec::kEnumerable: {
      std::vector<ShardMetadata> shards;
      const v1::EnumerableShardingSpec& enumerable = spec.enumerable();
      for (int i = 0; i < enumerable.shards_size(); ++i) {
        absl::StatusOr<ShardMetadata> shard = FromProto(enumerable.shards(i));
        if (!shard.ok()) {
          return InField(absl::StrCat("enumerable.shards[", i, "]"),
                         shard.status());
        }
        shards.push_back(*std::move(shard));
      }
      ASSIGN_OR_RETURN(EnumerableShardingSpec result,
                       EnumerableShardingSpec::Create(std::move(shards)));
      return result;
    }
    case v1::ShardingSpec::SPEC_NOT_SET:
      break;
  }
  return Invalid("spec", "missing: set chunk or enumerable");
}

std::string SerializeMetadata(const ShardedTensorMetadata& metadata) {
  v1::PackedShardedTensorMetadata packed;
  packed.mutable_size()->Add(metadata.size.begin(), metadata.size.end());
  *packed.mutable_tensor_properties() = ToProto(metadata.tensor_properties);
  const int count = static_cast<int>(metadata.shards_metadata.size());
  packed.mutable_shard_dims()->Reserve(count);
  packed.mutable_placement_index()->Reserve(count);
  // Placements repeat (usually one per rank, in runs): each is listed
  // once, and a shard placed like the one before needs no lookup.
  absl::flat_hash_map<std::string, uint32_t> index_of;
  const RemoteDevice* last_placement = nullptr;
  uint32_t last = 0;
  for (const ShardMetadata& shard : metadata.shards_metadata) {
    packed.add_shard_dims(static_cast<uint32_t>(shard.dim()));
    packed.mutable_shard_offsets()->Add(shard.shard_offsets().begin(),
                                        shard.shard_offsets().end());
    packed.mutable_shard_sizes()->Add(shard.shard_sizes().begin(),
                                      shard.shard_sizes().end());
    if (!shard.placement().has_value()) {
      packed.add_placement_index(0);
      continue;
    }
    const RemoteDevice& placement = *shard.placement();
    if (last_placement == nullptr || !(*last_placement == placement)) {
      auto [it, added] = index_of.try_emplace(
          placement.ToString(),
          static_cast<uint32_t>(packed.placements_size() + 1));
      if (added) *packed.add_placements() = ToProto(placement);
      last = it->second;
      last_placement = &placement;
    }
    packed.add_placement_index(last);
  }
  return packed.SerializeAsString();
}

absl::StatusOr<PackedMetadata> PackedMetadata::Parse(absl::string_view bytes) {
  PackedMetadata parsed;
  v1::PackedShardedTensorMetadata& proto = parsed.proto_;
  if (bytes.size() > static_cast<size_t>(std::numeric_limits<int>::max()) ||
      !proto.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Malformed ShardedTensorMetadata (", bytes.size(),
        " bytes): not a valid tessera.v1.PackedShardedTensorMetadata"));
  }
  RETURN_IF_ERROR(SizeAndProperties(proto, &parsed.header_));
  if (proto.placement_index_size() != proto.shard_dims_size()) {
    return Invalid("placement_index",
                   absl::StrCat(proto.placement_index_size(), " entries for ",
                                proto.shard_dims_size(), " shards"));
  }
  uint64_t entries = 0;
  for (uint32_t dims : proto.shard_dims()) entries += dims;
  if (entries != static_cast<uint64_t>(proto.shard_offsets_size()) ||
      entries != static_cast<uint64_t>(proto.shard_sizes_size())) {
    return Invalid("shard_offsets",
                   absl::StrCat("the shards have ", entries,
                                " dimensions in all, but there are ",
                                proto.shard_offsets_size(), " offsets and ",
                                proto.shard_sizes_size(), " sizes"));
  }
  for (int i = 0; i < proto.placement_index_size(); ++i) {
    if (proto.placement_index(i) >
        static_cast<uint32_t>(proto.placements_size())) {
      return Invalid(absl::StrCat("placement_index[", i, "]"),
                     absl::StrCat(proto.placement_index(i), " is past the ",
                                  proto.placements_size(), " placements"));
    }
  }
  return parsed;
}

absl::Status PackedMetadata::AppendShardsTo(
    std::vector<ShardMetadata>* shards) const {
  std::vector<RemoteDevice> placements;
  placements.reserve(proto_.placements_size());
  for (int k = 0; k < proto_.placements_size(); ++k) {
    absl::StatusOr<RemoteDevice> device = FromProto(proto_.placements(k));
    if (!device.ok()) {
      return InField(absl::StrCat("placements[", k, "]"), device.status());
    }
    placements.push_back(*std::move(device));
  }
  const absl::Span<const int64_t> offsets = absl::MakeConstSpan(
      proto_.shard_offsets().data(), proto_.shard_offsets_size());
  const absl::Span<const int64_t> sizes = absl::MakeConstSpan(
      proto_.shard_sizes().data(), proto_.shard_sizes_size());
  size_t next = 0;  // Parse checked that the dimensions add up.
  for (int i = 0; i < proto_.shard_dims_size(); ++i) {
    const size_t dims = proto_.shard_dims(i);
    const uint32_t k = proto_.placement_index(i);
    absl::StatusOr<ShardMetadata> shard = ShardMetadata::Create(
        offsets.subspan(next, dims), sizes.subspan(next, dims),
        k == 0 ? std::nullopt : std::optional<RemoteDevice>(placements[k - 1]));
    if (!shard.ok()) {
      return InField(absl::StrCat("shards_metadata[", i, "]"), shard.status());
    }
    shards->push_back(*std::move(shard));
    next += dims;
  }
  return absl::OkStatus();
}

absl::StatusOr<ShardedTensorMetadata> DeserializeMetadata(
    absl::string_view bytes) {
  absl::StatusOr<PackedMetadata> packed = PackedMetadata::Parse(bytes);
  if (!packed.ok()) return packed.status();
  ShardedTensorMetadata metadata = packed->header();
  metadata.shards_metadata.reserve(packed->shard_count());
  absl::Status status = packed->AppendShardsTo(&metadata.shards_metadata);
  if (!status.ok()) return status;
  return metadata;
}

}  // namespace tessera
