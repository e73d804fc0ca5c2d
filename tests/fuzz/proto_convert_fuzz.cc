// libFuzzer target: protobuf from clients and peers turned into Tessera's
// model (common/proto_convert.h): sharding specs, shard and tensor
// metadata, devices, and the requests that carry them. The first byte picks
// the message; the rest is its wire bytes. What converts is laid out or
// validated as the daemons would, and converting back must succeed.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "common/proto_convert.h"
#include "common/shard_layout.h"
#include "common/sharding_spec.h"
#include "tessera/v1/control.pb.h"
#include "tessera/v1/sharding.pb.h"

namespace {

using namespace tessera;  // NOLINT: a fuzz target's short names.

template <typename Message>
bool Parse(const uint8_t* data, size_t size, Message* message) {
  return message->ParseFromArray(data, static_cast<int>(size));
}

// A spec that converted, laid out over the request's sizes (bounded, so
// that a fuzzed size cannot ask for more shards than the input holds).
void LayOut(const ShardingSpec& spec, const std::vector<int64_t>& sizes) {
  if (sizes.size() > 8) return;
  TensorProperties properties;
  absl::StatusOr<ShardedTensorMetadata> metadata =
      BuildMetadata(spec, sizes, properties);
  if (!metadata.ok()) return;
  (void)ValidateShardLayout(metadata->shards_metadata, metadata->size);
  if (!FromProto(ToProto(*metadata)).ok()) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t kind = data[0] % 6;
  ++data;
  --size;
  switch (kind) {
    case 0: {
      v1::ShardingSpec proto;
      if (!Parse(data, size, &proto)) return 0;
      absl::StatusOr<ShardingSpec> spec = FromProto(proto);
      if (spec.ok()) {
        if (!FromProto(ToProto(*spec)).ok()) std::abort();
        LayOut(*spec, {16, 16});
      }
      break;
    }
    case 1: {
      v1::ShardedTensorMetadata proto;
      if (!Parse(data, size, &proto)) return 0;
      absl::StatusOr<ShardedTensorMetadata> metadata = FromProto(proto);
      if (metadata.ok()) {
        (void)ValidateShardLayout(metadata->shards_metadata, metadata->size);
      }
      // The same bytes as the packed form ranks exchange: what decodes
      // must encode and decode to itself.
      absl::StatusOr<ShardedTensorMetadata> packed = DeserializeMetadata(
          std::string(reinterpret_cast<const char*>(data), size));
      if (packed.ok()) {
        absl::StatusOr<ShardedTensorMetadata> again =
            DeserializeMetadata(SerializeMetadata(*packed));
        if (!again.ok() || !(*again == *packed)) std::abort();
      }
      break;
    }
    case 2: {
      v1::ShardMetadata proto;
      if (Parse(data, size, &proto)) (void)FromProto(proto);
      break;
    }
    case 3: {
      v1::RemoteDevice proto;
      if (Parse(data, size, &proto)) (void)FromProto(proto);
      break;
    }
    case 4: {
      v1::CreateTensorRequest request;
      if (!Parse(data, size, &request)) return 0;
      (void)FromProto(request.dtype());
      absl::StatusOr<ShardingSpec> spec = FromProto(request.spec());
      if (spec.ok()) {
        LayOut(*spec, std::vector<int64_t>(request.sizes().begin(),
                                           request.sizes().end()));
      }
      break;
    }
    case 5: {
      v1::ReshardRequest request;
      if (!Parse(data, size, &request)) return 0;
      absl::StatusOr<ShardingSpec> spec = FromProto(request.spec());
      if (spec.ok()) LayOut(*spec, {7, 5, 3});
      break;
    }
  }
  return 0;
}
