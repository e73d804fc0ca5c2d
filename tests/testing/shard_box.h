// A shard's box as ShardMetadata, for tests that build layouts by hand:
//   ShardBox({0, 5}, {10, 10})       // no placement
//   ShardBox({0, 0}, {4, 8}, 2)      // on rank 2's CPU
// The box must be valid (ShardMetadata::Create); a test that passes an
// invalid one dies on the dereference, as a failed assumption should.
#ifndef TESSERA_TESTS_TESTING_SHARD_BOX_H_
#define TESSERA_TESTS_TESTING_SHARD_BOX_H_

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "common/device.h"
#include "common/shard_metadata.h"

namespace tessera::testing {

inline ShardMetadata ShardBox(std::vector<int64_t> offsets,
                              std::vector<int64_t> sizes, int rank = -1) {
  std::optional<RemoteDevice> placement;
  if (rank >= 0) placement = RemoteDevice::ForRank(rank, Device::Cpu());
  return *ShardMetadata::Create(std::move(offsets), std::move(sizes),
                                placement);
}

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TESTING_SHARD_BOX_H_
