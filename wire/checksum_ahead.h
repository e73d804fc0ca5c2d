// ChecksumAhead: the XXH3-64 (common/checksum.h) of each chunk of a run of
// host bytes, computed on a helper thread a few chunks ahead of the thread
// that sends them (docs/data_plane.md, "Checksums ahead").
//
// Why: a data-plane sender (the daemon answering a fetch, the client
// writing a box) puts each chunk's checksum in the chunk's prefix, before
// its bytes, so one thread alternated hashing chunk k and writing it to
// the socket, and the connection sat idle while it hashed. Across two
// network-namespace hosts on a 2-core box one connection then read 256 MiB
// at 0.9-1.1 GB/s, against 1.5-1.8 GB/s with no checksums at all. Hashed
// ahead, chunk k+1's checksum is ready when chunk k is written.
//
// The chunks are [k * chunk_bytes, min(total, (k + 1) * chunk_bytes)) of
// `data`, k = 0, 1, ...; the helper runs at most `lead` chunks ahead of the
// last one taken, so that a chunk's bytes are still in the cache when they
// are written after being hashed. A checksum computed ahead covers the
// bytes as they were then: a write racing the transfer is detected by the
// receiver as a mismatch, as it is when the sender hashes just before
// writing.
//
// Ownership: `data` is the caller's and must stay valid until the
// ChecksumAhead is destroyed; the destructor stops the helper and waits
// for it (at most one chunk's hashing). Memory: `lead` + 1 checksums,
// however many chunks (a client asking for 4 KiB chunks of a large shard
// costs the server no more).
//
// Thread-safety: Take is called by one thread (the sender), for chunks in
// increasing order. Never fails.
#ifndef TESSERA_WIRE_CHECKSUM_AHEAD_H_
#define TESSERA_WIRE_CHECKSUM_AHEAD_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "io/thread_cache.h"

namespace tessera {

class ChecksumAhead {
 public:
  // Chunks hashed ahead of the one last taken, by default.
  static constexpr int kDefaultLead = 2;
  // A run of fewer chunks than this is not worth a helper: hash each chunk
  // on the sender's thread (Checksum64) instead.
  static constexpr int64_t kMinChunks = 2;
  static constexpr int kMaxLead = 16;

  // Starts hashing the chunks of [data, data + total_bytes) (total_bytes
  // >= 0, chunk_bytes >= 1; lead clamped to [1, kMaxLead]).
  ChecksumAhead(const char* data, int64_t total_bytes, int64_t chunk_bytes,
                int lead = kDefaultLead);
  ~ChecksumAhead();
  ChecksumAhead(const ChecksumAhead&) = delete;
  ChecksumAhead& operator=(const ChecksumAhead&) = delete;

  int64_t num_chunks() const { return num_chunks_; }
  // The checksum of chunk `k` (0 <= k < num_chunks(), not below the last
  // k taken), waiting for the helper to reach it.
  uint64_t Take(int64_t k);

 private:
  void Run();

  const char* const data_;
  const int64_t total_bytes_;
  const int64_t chunk_bytes_;
  const int64_t num_chunks_;
  const int64_t lead_;

  absl::Mutex mu_;
  // Chunk k's checksum in slot k % (lead_ + 1): the helper never runs
  // more than lead_ chunks past the one the sender takes.
  std::vector<uint64_t> sums_ ABSL_GUARDED_BY(mu_);
  // Chunks [0, hashed_) are in sums_.
  int64_t hashed_ ABSL_GUARDED_BY(mu_) = 0;
  // The helper may hash chunks below taken_ + lead_.
  int64_t taken_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<ThreadJob> helper_;
};

}  // namespace tessera

#endif  // TESSERA_WIRE_CHECKSUM_AHEAD_H_
