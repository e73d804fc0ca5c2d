// ShardedTensorMetadata: the global view of a sharded tensor (its size, its
// shards in placement order, and the properties they share). A plain value
// type: building one validates nothing; use shard_layout.h to check a
// layout against its tensor.
#ifndef TESSERA_COMMON_SHARDED_TENSOR_METADATA_H_
#define TESSERA_COMMON_SHARDED_TENSOR_METADATA_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "common/shard_metadata.h"
#include "common/tensor_properties.h"

namespace tessera {

struct ShardedTensorMetadata {
  std::vector<ShardMetadata> shards_metadata;
  std::vector<int64_t> size;
  TensorProperties tensor_properties;

  std::string ToString() const;

  friend bool operator==(const ShardedTensorMetadata& a,
                         const ShardedTensorMetadata& b) {
    return a.size == b.size && a.tensor_properties == b.tensor_properties &&
           a.shards_metadata == b.shards_metadata;
  }
  friend bool operator!=(const ShardedTensorMetadata& a,
                         const ShardedTensorMetadata& b) {
    return !(a == b);
  }
};

std::ostream& operator<<(std::ostream& os, const ShardedTensorMetadata& m);

}  // namespace tessera

#endif  // TESSERA_COMMON_SHARDED_TENSOR_METADATA_H_
