// A registered tensor with one local shard, for shard-server tests that
// serve a tensor without ranks.
#ifndef TESSERA_TESTS_TESTING_LOCAL_SHARD_H_
#define TESSERA_TESTS_TESTING_LOCAL_SHARD_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/shard_metadata.h"
#include "common/sharded_tensor_metadata.h"
#include "common/tensor/tensor.h"
#include "gtest/gtest.h"
#include "server/serve/shard_registry.h"

namespace tessera::testing {

// `tensor` as shard `index` of a tensor cut along dim 0 into `num_shards`
// shards of its shape, shard i on rank i (on tensor's device); only shard
// `index` is local.
inline std::shared_ptr<RegisteredTensor> AsLocalShard(const Tensor& tensor,
                                                      int64_t index,
                                                      int num_shards) {
  auto registered = std::make_shared<RegisteredTensor>();
  auto metadata_ptr = std::make_shared<ShardedTensorMetadata>();
  ShardedTensorMetadata& metadata = *metadata_ptr;
  metadata.tensor_properties.dtype = tensor.dtype();
  metadata.size = tensor.sizes();
  metadata.size[0] *= num_shards;
  for (int rank = 0; rank < num_shards; ++rank) {
    std::vector<int64_t> offsets(tensor.dim(), 0);
    offsets[0] = rank * tensor.sizes()[0];
    absl::StatusOr<ShardMetadata> shard = ShardMetadata::Create(
        offsets, tensor.sizes(), RemoteDevice::ForRank(rank, tensor.device()));
    EXPECT_TRUE(shard.ok()) << shard.status();
    metadata.shards_metadata.push_back(*shard);
  }
  registered->metadata = std::move(metadata_ptr);
  registered->local_shards.push_back(LocalShard{index, tensor});
  return registered;
}

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TESTING_LOCAL_SHARD_H_
