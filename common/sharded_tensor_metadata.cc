#include "common/sharded_tensor_metadata.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tessera {

std::string ShardedTensorMetadata::ToString() const {
  return absl::StrCat(
      "ShardedTensorMetadata(shards_metadata=[",
      absl::StrJoin(shards_metadata, ", ",
                    [](std::string* out, const ShardMetadata& shard) {
                      absl::StrAppend(out, shard.ToString());
                    }),
      "], size=[", absl::StrJoin(size, ", "),
      "], tensor_properties=", tensor_properties.ToString(), ")");
}

std::ostream& operator<<(std::ostream& os, const ShardedTensorMetadata& m) {
  return os << m.ToString();
}

}  // namespace tessera
