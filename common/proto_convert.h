// Conversion between the model (common/) and the wire contract
// (tessera.v1 protobuf messages). ToProto never fails. FromProto validates
// everything a peer could have got wrong (unspecified enums, negative
// sizes, mismatched offset/size counts, malformed devices) and returns
// INVALID_ARGUMENT naming the field, so a malformed request can never
// reach the model. Pure functions; thread-safe.
#ifndef TESSERA_COMMON_PROTO_CONVERT_H_
#define TESSERA_COMMON_PROTO_CONVERT_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/device.h"
#include "common/dtype.h"
#include "common/shard_metadata.h"
#include "common/sharded_tensor_metadata.h"
#include "common/sharding_spec.h"
#include "common/tensor_properties.h"
#include "tessera/v1/sharding.pb.h"
#include "tessera/v1/tensor.pb.h"

namespace tessera {

v1::DType ToProto(DType dtype);
absl::StatusOr<DType> FromProto(v1::DType dtype);

v1::Device ToProto(const Device& device);
absl::StatusOr<Device> FromProto(const v1::Device& device);

v1::RemoteDevice ToProto(const RemoteDevice& device);
absl::StatusOr<RemoteDevice> FromProto(const v1::RemoteDevice& device);

v1::TensorProperties ToProto(const TensorProperties& properties);
absl::StatusOr<TensorProperties> FromProto(const v1::TensorProperties& p);

v1::ShardMetadata ToProto(const ShardMetadata& metadata);
absl::StatusOr<ShardMetadata> FromProto(const v1::ShardMetadata& metadata);

v1::ShardedTensorMetadata ToProto(const ShardedTensorMetadata& metadata);
absl::StatusOr<ShardedTensorMetadata> FromProto(
    const v1::ShardedTensorMetadata& metadata);

v1::ShardingSpec ToProto(const ShardingSpec& spec);
absl::StatusOr<ShardingSpec> FromProto(const v1::ShardingSpec& spec);

// Serialized bytes of ShardedTensorMetadata and back: what ranks exchange
// (a v1::PackedShardedTensorMetadata). Anything malformed, including bytes
// from a peer that describe shards badly, is INVALID_ARGUMENT naming the
// field.
std::string SerializeMetadata(const ShardedTensorMetadata& metadata);
absl::StatusOr<ShardedTensorMetadata> DeserializeMetadata(
    absl::string_view bytes);

// DeserializeMetadata in two steps, for a caller that merges several ranks'
// shards into one list without building each rank's list first: Parse
// checks the bytes and the tensor's size and properties; AppendShardsTo
// decodes the shards onto the end of `shards` (on an error, the shards
// appended so far stay). Thread-compatible value type.
class PackedMetadata {
 public:
  static absl::StatusOr<PackedMetadata> Parse(absl::string_view bytes);

  // The tensor's size and properties; shards_metadata is empty.
  const ShardedTensorMetadata& header() const { return header_; }
  size_t shard_count() const {
    return static_cast<size_t>(proto_.shard_dims_size());
  }
  absl::Status AppendShardsTo(std::vector<ShardMetadata>* shards) const;

 private:
  v1::PackedShardedTensorMetadata proto_;
  ShardedTensorMetadata header_;
};

}  // namespace tessera

#endif  // TESSERA_COMMON_PROTO_CONVERT_H_
