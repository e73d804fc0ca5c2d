// The checkpoint directory's format as the saver and the loader share it
// (checkpoint.h has the public API): the manifest's name, block alignment,
// checkpoint files opened for reading, which names a save creates, and how
// shard owners are resolved. Internal to server/checkpoint/.
#ifndef TESSERA_SERVER_CHECKPOINT_CHECKPOINT_FORMAT_H_
#define TESSERA_SERVER_CHECKPOINT_CHECKPOINT_FORMAT_H_

#include <fcntl.h>

#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/device.h"
#include "common/sharded_tensor_metadata.h"
#include "common/status_macros.h"
#include "io/directory.h"
#include "io/file.h"
#include "io/unique_fd.h"
#include "server/collective/process_group.h"
#include "server/rank/rank.h"
#include "tessera/v1/checkpoint.pb.h"

namespace tessera::checkpoint_internal {

inline constexpr char kManifestName[] = "manifest.pb";
// Blocks start on element boundaries when their size is a multiple of the
// largest element (complex128).
inline constexpr int64_t kBlockAlignment = 16;
// Larger block sizes asked for are clamped (block offsets stay far from
// int64's limit).
inline constexpr int64_t kMaxBlockBytes = int64_t{1} << 40;

// A checkpoint file open for reading.
class File {
 public:
  static absl::StatusOr<File> Open(const Directory& dir, absl::string_view name,
                                   int flags) {
    absl::StatusOr<UniqueFd> fd = dir.OpenFile(name, flags);
    if (!fd.ok()) return Annotate(fd.status(), "checkpoint");
    return File(*std::move(fd), dir.PathOf(name));
  }

  const std::string& path() const { return path_; }

  // Exactly `size` bytes at `offset`; DATA_LOSS when the file ends first.
  absl::Status ReadAt(int64_t offset, char* out, size_t size,
                      absl::string_view what) const {
    absl::StatusOr<size_t> got = PreadAll(fd_.get(), out, size, offset, path_);
    if (!got.ok()) return Annotate(got.status(), "checkpoint");
    if (*got < size) {
      return absl::DataLossError(
          absl::StrCat("checkpoint file ", path_, " is truncated: ", what,
                       " needs bytes [", offset, ", ", offset + size, ")"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<int64_t> Size() const {
    absl::StatusOr<int64_t> size = FileSize(fd_.get(), path_);
    if (!size.ok()) return Annotate(size.status(), "checkpoint");
    return size;
  }

 private:
  File(UniqueFd fd, std::string path)
      : fd_(std::move(fd)), path_(std::move(path)) {}

  UniqueFd fd_;
  std::string path_;
};

// "shard 3 of \"w\"", for messages.
std::string ShardWhat(absl::string_view name, int64_t shard);
// Whether `name` is a file a save of this format creates: manifest.pb,
// rank<r>.<16 hex digits>.shards, dense.<16 hex digits>.bin, or the
// temporary file of one.
bool IsCheckpointFile(absl::string_view name);
// Best effort, after a commit or a load: removes from `dir` the regular
// files owned by this process's user, not in `keep`, that are either
// checkpoint files named in `replaced` (the manifest a save replaced), or
// checkpoint files last modified before `before_ns` (leftovers of a killed
// save). Never anything else.
void RemoveLeftovers(const Directory& dir, const std::set<std::string>& keep,
                     const std::set<std::string>& replaced, int64_t before_ns);
// The files a manifest names, itself included.
std::set<std::string> NamedFiles(const v1::CheckpointManifest& manifest);
// Each shard's owner (global rank) and device, resolved against `group` as
// ShardedTensor does (worker names need the rank's RPC).
absl::StatusOr<std::vector<std::pair<int, Device>>> ResolveOwners(
    const ShardedTensorMetadata& metadata, const ProcessGroup& group,
    const Rank& rank);

}  // namespace tessera::checkpoint_internal

#endif  // TESSERA_SERVER_CHECKPOINT_CHECKPOINT_FORMAT_H_
