#include "server/checkpoint/checkpoint_format.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/checksum.h"
#include "common/status_macros.h"
#include "io/file.h"
#include "server/checkpoint/checkpoint.h"

namespace tessera {
namespace checkpoint_internal {
namespace {

// The manifest's last field: tag of field 15, wire type 1 (fixed64), then
// the checksum, little-endian.
constexpr char kChecksumTag = 0x79;
constexpr size_t kChecksumTrailer = 1 + 8;

bool IsHexId(absl::string_view id) {
  if (id.size() != 16) return false;
  for (char c : id) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c)) ||
        absl::ascii_isupper(static_cast<unsigned char>(c))) {
      return false;
    }
  }
  return true;
}

uint64_t LoadLittle64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

void StoreLittle64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

}  // namespace

std::string ShardWhat(absl::string_view name, int64_t shard) {
  return absl::StrCat("shard ", shard, " of \"", name, "\"");
}

bool IsCheckpointFile(absl::string_view name) {
  name = AtomicFileTarget(name);
  if (name == kManifestName) return true;
  if (absl::ConsumePrefix(&name, "dense.") &&
      absl::ConsumeSuffix(&name, ".bin")) {
    return IsHexId(name);
  }
  if (!absl::ConsumePrefix(&name, "rank") ||
      !absl::ConsumeSuffix(&name, ".shards")) {
    return false;
  }
  const size_t dot = name.find('.');
  if (dot == 0 || dot == absl::string_view::npos || dot > 10) return false;
  for (size_t i = 0; i < dot; ++i) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(name[i]))) return false;
  }
  return IsHexId(name.substr(dot + 1));
}

std::set<std::string> NamedFiles(const v1::CheckpointManifest& manifest) {
  std::set<std::string> named = {kManifestName};
  for (const v1::CheckpointEntry& entry : manifest.entries()) {
    if (entry.has_dense()) named.insert(entry.dense().data().file());
    for (const v1::SavedShard& shard : entry.sharded().shards()) {
      named.insert(shard.data().file());
    }
  }
  return named;
}

void RemoveLeftovers(const Directory& dir, const std::set<std::string>& keep,
                     const std::set<std::string>& replaced, int64_t before_ns) {
  absl::StatusOr<std::vector<Directory::Entry>> entries = dir.List();
  if (!entries.ok()) return;
  const uid_t me = ::geteuid();
  for (const Directory::Entry& entry : *entries) {
    if (!entry.regular_file || entry.uid != me || keep.count(entry.name) != 0 ||
        !IsCheckpointFile(entry.name)) {
      continue;
    }
    if (replaced.count(entry.name) != 0 || entry.mtime_ns < before_ns) {
      dir.Remove(entry.name).IgnoreError();
    }
  }
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
using checkpoint_internal::kChecksumTag;
using checkpoint_internal::kChecksumTrailer;
using checkpoint_internal::kManifestName;
using checkpoint_internal::LoadLittle64;
using checkpoint_internal::StoreLittle64;

absl::StatusOr<v1::CheckpointManifest> ReadCheckpointManifest(
    const Directory& dir) {
  const std::string path = dir.PathOf(kManifestName);
  ASSIGN_OR_RETURN(File file, File::Open(dir, kManifestName, O_RDONLY));
  ASSIGN_OR_RETURN(int64_t size, file.Size());
  // A manifest lists metadata, not data: far below this.
  constexpr int64_t kMaxManifestBytes = int64_t{1} << 30;
  if (size > kMaxManifestBytes) {
    return absl::DataLossError(absl::StrCat("checkpoint manifest ", path,
                                            " is corrupt: ", size, " bytes"));
  }
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
  if (manifest.format_version() >= 2) {
    const size_t body = bytes.size() - std::min(bytes.size(), kChecksumTrailer);
    if (bytes.size() < kChecksumTrailer || bytes[body] != kChecksumTag ||
        LoadLittle64(bytes.data() + body + 1) !=
            Checksum64(bytes.data(), body)) {
      return absl::DataLossError(
          absl::StrCat("checkpoint manifest ", path,
                       " is corrupt: it fails its own XXH3 checksum"));
    }
  }
  return manifest;
}

absl::StatusOr<v1::CheckpointManifest> ReadCheckpointManifest(
    const std::string& dir) {
  ASSIGN_OR_RETURN(Directory opened, Directory::Open(dir));
  return ReadCheckpointManifest(opened);
}

absl::Status WriteCheckpointManifest(const Directory& dir,
                                     const v1::CheckpointManifest& manifest) {
  v1::CheckpointManifest body = manifest;
  body.clear_manifest_xxh3();
  std::string bytes = body.SerializeAsString();
  if (manifest.format_version() >= 2) {
    char trailer[kChecksumTrailer];
    trailer[0] = kChecksumTag;
    StoreLittle64(trailer + 1, Checksum64(bytes.data(), bytes.size()));
    bytes.append(trailer, sizeof(trailer));
  }
  absl::StatusOr<AtomicFile> file = AtomicFile::CreateIn(dir, kManifestName);
  if (!file.ok()) return Annotate(file.status(), "checkpoint");
  RETURN_IF_ERROR(
      Annotate(file->Append(bytes.data(), bytes.size()), "checkpoint"));
  return Annotate(file->Commit(), "checkpoint");
}

}  // namespace tessera
