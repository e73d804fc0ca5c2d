// What local_path_peer (a shard owner in another process) serves, shared
// by the peer and local_path_test. Its local path takes writes; its data
// plane does not (a write that succeeds went over the local path).
#ifndef TESSERA_TESTS_CLIENT_LOCAL_PATH_PEER_H_
#define TESSERA_TESTS_CLIENT_LOCAL_PATH_PEER_H_

#include <cstdint>
#include <vector>

namespace tessera::testing {

// The peer's sharing threshold.
inline constexpr int64_t kPeerSharingMinBytes = int64_t{64} << 10;

// Tensors (ids) and their value keys. Each is shard 0 of a one-shard int64
// tensor.
inline constexpr char kSharedId[] = "shared";    // Shared memory.
inline constexpr char kStridedId[] = "strided";  // Transposed shared memory.
inline constexpr char kHeapId[] = "heap";        // Large, heap memory.
inline constexpr char kTinyId[] = "tiny";        // Below the threshold.
inline constexpr char kCudaId[] = "cuda";  // With --cuda: kShared on cuda:0.
// Shared memory, large enough (over 16 MiB) that a dense read of it is
// copied by several threads.
inline constexpr char kLargeId[] = "large";
inline constexpr int kSharedKey = 1;
inline constexpr int kStridedKey = 2;
inline constexpr int kHeapKey = 3;
inline constexpr int kTinyKey = 4;
inline constexpr int kLargeKey = 5;

inline const std::vector<int64_t> kSharedSizes = {96, 160};
// The shard's sizes; its storage is the transpose's.
inline const std::vector<int64_t> kStridedSizes = {72, 120};
inline const std::vector<int64_t> kHeapSizes = {128, 128};
inline const std::vector<int64_t> kTinySizes = {4, 4};
inline const std::vector<int64_t> kLargeSizes = {2101, 1000};

// The element at row-major index `i` of the tensor allocated for `key`
// (for kStrided: of its backing storage, whose transpose is the shard).
inline int64_t PeerValue(int key, int64_t i) {
  return key * (int64_t{1} << 40) + i * 7 + 3;
}

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_CLIENT_LOCAL_PATH_PEER_H_
