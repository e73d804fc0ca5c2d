// libFuzzer target: the text and JSON forms of a sharding spec and of a
// size list (common/sharding_spec_text.h), which the CLI parses from its
// users' flags. A spec that parses is converted to protobuf and back and
// laid out over a small tensor, which must agree with itself.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/proto_convert.h"
#include "common/shard_layout.h"
#include "common/sharding_spec.h"
#include "common/sharding_spec_text.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  (void)tessera::ParseSizes(text);
  (void)tessera::ShardingSpecFromJson(text);
  absl::StatusOr<tessera::ShardingSpec> spec = tessera::ParseShardingSpec(text);
  if (!spec.ok()) return 0;
  absl::StatusOr<tessera::ShardingSpec> back =
      tessera::FromProto(tessera::ToProto(*spec));
  if (!back.ok()) std::abort();  // What parsed must survive protobuf.
  tessera::TensorProperties properties;
  const std::vector<int64_t> sizes = {16, 16};
  absl::StatusOr<tessera::ShardedTensorMetadata> metadata =
      tessera::BuildMetadata(*spec, sizes, properties);
  if (metadata.ok() &&
      !tessera::ValidateShardLayout(metadata->shards_metadata, metadata->size)
           .ok()) {
    std::abort();  // A built layout tiles the tensor.
  }
  return 0;
}
