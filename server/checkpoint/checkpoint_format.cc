#include "server/checkpoint/checkpoint_format.h"

#include <fcntl.h>

#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "io/file.h"
#include "server/checkpoint/checkpoint.h"

namespace tessera {
namespace checkpoint_internal {

std::string JoinPath(const std::string& dir, absl::string_view name) {
  return absl::StrCat(dir, "/", name);
}

std::string ShardWhat(absl::string_view name, int64_t shard) {
  return absl::StrCat("shard ", shard, " of \"", name, "\"");
}

// Whether `name` is a file a save of this format creates, so that files
// the current manifest no longer names can be removed.
bool IsCheckpointFile(absl::string_view name) {
  name = AtomicFileTarget(name);
  return name == kManifestName ||
         (absl::StartsWith(name, "rank") && absl::EndsWith(name, ".shards")) ||
         (absl::StartsWith(name, "dense.") && absl::EndsWith(name, ".bin"));
}

// Each shard's owner (global rank) and device, resolved against `group` as
// ShardedTensor does (worker names need the rank's RPC).
absl::StatusOr<std::vector<std::pair<int, Device>>> ResolveOwners(
    const ShardedTensorMetadata& metadata, const ProcessGroup& group,
    const Rank& rank) {
  const WorkerResolver* resolver = rank.rpc_initialized() ? &rank : nullptr;
  std::vector<std::pair<int, Device>> owners;
  owners.reserve(metadata.shards_metadata.size());
  for (const ShardMetadata& shard : metadata.shards_metadata) {
    ASSIGN_OR_RETURN(
        owners.emplace_back(),
        ParseAndValidateRemoteDevice(group.global_ranks(), shard.placement(),
                                     resolver, group.is_member()));
  }
  return owners;
}

}  // namespace checkpoint_internal

using checkpoint_internal::File;
using checkpoint_internal::JoinPath;
using checkpoint_internal::kManifestName;

absl::StatusOr<v1::CheckpointManifest> ReadCheckpointManifest(
    const std::string& dir) {
  const std::string path = JoinPath(dir, kManifestName);
  ASSIGN_OR_RETURN(File file, File::Open(path, O_RDONLY));
  ASSIGN_OR_RETURN(int64_t size, file.Size());
  std::string bytes(static_cast<size_t>(size), '\0');
  RETURN_IF_ERROR(file.ReadAt(0, bytes.data(), bytes.size(), "the manifest"));
  v1::CheckpointManifest manifest;
  if (!manifest.ParseFromString(bytes) || manifest.format_version() == 0) {
    return absl::DataLossError(
        absl::StrCat("checkpoint manifest ", path, " is corrupt"));
  }
  if (manifest.format_version() > kCheckpointFormatVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint manifest ", path, " has format version ",
        manifest.format_version(), ", newer than the newest this build reads (",
        kCheckpointFormatVersion, ")"));
  }
  return manifest;
}

}  // namespace tessera
