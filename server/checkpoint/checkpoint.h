// Checkpoints of state dicts: named dense and sharded tensors saved to a
// directory that every rank can read (a local disk on one host, a shared
// filesystem across hosts), and loaded back with the same layout or resharded.
// Tessera's answer to torch.save/torch.load of a state dict holding
// ShardedTensors (PyTorch's ShardedTensor.__getstate__ / __setstate__), without
// pickles: the layout is proto/tessera/v1/checkpoint.proto — one manifest plus
// one raw data file per rank.
//
// Saving is collective over the sharded tensors' process group: every
// member calls SaveStateDict with the same names, dtypes, sizes and
// sharding (a member whose dict differs makes every member fail). Each
// member writes its own local shards into its own file; group rank 0 writes
// the dense tensors and then the manifest, the commit point. When
// SaveStateDict returns OK on any member, the checkpoint is complete on
// disk (files and directory fsynced). A failed or interrupted save leaves
// the previous checkpoint of the directory intact and removes what it
// wrote; a rank outside the group has nothing to save and returns OK at
// once, as c10d collectives do for non-members. With no rank at all (no
// default rank, none given), a dict of dense tensors only is saved by the
// calling process alone.
//
// Loading sends no message. With the same layout, each rank reads only its
// own shards; with a resharding target, each rank reads from whichever
// files hold them only the checksum blocks that cover the boxes its new
// shards need. Every byte read is verified (XXH3-64 per block of
// SaveOptions::block_bytes; the block size is the unit of verification and
// of partial reads).
//
// Failure (absl::Status codes):
//  - FAILED_PRECONDITION with PyTorch's wording: loading sharded tensors
//    with no rank and no group ("Need to initialize default process group
//    using "init_process_group" before loading ShardedTensor"); a same-layout
//    load on another group ("Local rank at save time was 1, but at load
//    time was -1", "Local world size at save time was 4, but at load time
//    was 3", "Global world size at save time was ...");
//  - DATA_LOSS naming the file and the shard: a checksum mismatch, a
//    truncated file, a manifest that does not parse or is inconsistent;
//  - NOT_FOUND naming the path: a missing manifest or data file, or a
//    resharding target naming no entry;
//  - INVALID_ARGUMENT: a manifest of a newer format version; empty or
//    duplicate names, undefined or meta tensors, sharded tensors of
//    different groups, state dicts that differ between members; a target
//    whose size or dtype differs from the saved tensor;
//  - errno-derived codes (RESOURCE_EXHAUSTED for a full disk,
//    PERMISSION_DENIED, ...) for I/O errors, naming the path;
//  - the collectives' errors (UNAVAILABLE, DEADLINE_EXCEEDED) when a peer
//    dies during a save.
//
// Files: every file is opened relative to the checkpoint directory, held
// open (io/directory.h), by a single name and never through a symbolic
// link; data files get fresh random names and are written as temporary
// files (O_EXCL | O_NOFOLLOW) renamed into place, so a save never writes
// through or over anything it did not create. The manifest ends with an
// XXH3-64 of its own bytes (format version 2), so a damaged manifest is
// DATA_LOSS, never a checkpoint that loads with shards moved. After a save
// commits, its writer removes the files the replaced manifest named, and a
// save or load removes the leftovers of a killed save: files of this
// format's names (and their temporary files) that the manifest does not
// name, owned by the calling process's user, last modified before the
// operation began. Nothing else in the directory is touched.
//
// Thread-safety: the functions are reentrant; a save's collectives follow
// the group's ordering rules (server/collective/process_group.h). A directory
// must not be saved to by two saves at once, nor loaded while a save replaces
// it (a load may then find the files of the previous checkpoint removed).
#ifndef TESSERA_SERVER_CHECKPOINT_CHECKPOINT_H_
#define TESSERA_SERVER_CHECKPOINT_CHECKPOINT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/sharding_spec.h"
#include "io/directory.h"
#include "server/collective/process_group.h"
#include "server/rank/rank.h"
#include "server/sharded/sharded_tensor.h"
#include "server/sharded/state_dict.h"
#include "tessera/v1/checkpoint.pb.h"

namespace tessera {

// The manifest format this build writes, and the newest it reads. Version 1
// (no manifest checksum) is still read.
inline constexpr uint32_t kCheckpointFormatVersion = 2;

struct SaveOptions {
  // The saving rank; null: DefaultRank().
  std::shared_ptr<Rank> rank;
  // The group that saves a dict without sharded tensors; null: the rank's
  // default group. A dict with sharded tensors is saved by their group
  // (they must all share one); naming another is INVALID_ARGUMENT.
  std::shared_ptr<ProcessGroup> process_group;
  // Checksum block size, clamped to [1 B, 1 TiB] and rounded up to a
  // multiple of 16 bytes. Smaller blocks make partial reads tighter and the
  // manifest larger (8 bytes per block); tests set it tiny so that small
  // shards span many blocks.
  int64_t block_bytes = int64_t{1} << 20;
  // Whether a save may replace a checkpoint already in the directory (as
  // torch.save replaces a file); false: ALREADY_EXISTS naming it. The
  // daemon's SaveCheckpoint defaults to false.
  bool overwrite = true;
  // How the daemons hold sharded entries, by name, recorded in the
  // manifest (ShardedTensorEntry.versions_kept and copies) for a load to
  // restore; entries not named record neither.
  struct Keeping {
    int versions_kept = 0;
    int copies = 0;
  };
  std::map<std::string, Keeping> keeping;
};

// Where a resharding load puts one sharded entry: new shards laid out by a
// spec on a group, or the local shards of an existing tensor (same size and
// dtype as saved), filled in place.
struct LoadTarget {
  static LoadTarget Spec(ShardingSpec spec,
                         std::shared_ptr<ProcessGroup> group = nullptr) {
    LoadTarget target;
    target.spec = std::move(spec);
    target.process_group = std::move(group);
    return target;
  }
  static LoadTarget Into(ShardedTensor tensor) {
    LoadTarget target;
    target.into = std::move(tensor);
    return target;
  }

  std::optional<ShardingSpec> spec;
  // The group of a Spec target; null: LoadOptions::process_group.
  std::shared_ptr<ProcessGroup> process_group;
  std::optional<ShardedTensor> into;
};

struct LoadOptions {
  // The loading rank; null: DefaultRank().
  std::shared_ptr<Rank> rank;
  // The group sharded tensors are loaded on (PyTorch's
  // load_with_process_group); null: the rank's default group.
  std::shared_ptr<ProcessGroup> process_group;
  // Entries to reshard, by name; the others keep their saved layout.
  std::map<std::string, LoadTarget> reshard;
};

// Saves `state_dict` into `dir` (created if missing), replacing any
// checkpoint there. Collective over the group (see above). A Tensor may be
// on any device and non-contiguous; its bytes are saved row-major.
absl::Status SaveStateDict(const StateDict& state_dict, const std::string& dir,
                           const SaveOptions& options = {});
// The same into the directory `open_dir` returns, called once by every
// member inside the collective (so that a member that cannot open it fails
// the save on every member instead of leaving them waiting).
absl::Status SaveStateDict(
    const StateDict& state_dict,
    absl::FunctionRef<absl::StatusOr<Directory>()> open_dir,
    const SaveOptions& options = {});

// Loads the checkpoint in `dir`, in saved order. Dense tensors come back as
// CPU tensors. Sharded entries are new ShardedTensors on the load group (or
// the target's), with their saved spec unless resharded; an Into target is
// returned as given, its local shards overwritten. On error nothing is
// returned (Into targets may have been partly written).
absl::StatusOr<StateDict> LoadStateDict(const std::string& dir,
                                        const LoadOptions& options = {});
absl::StatusOr<StateDict> LoadStateDict(const Directory& dir,
                                        const LoadOptions& options = {});

// The manifest of the checkpoint in `dir` (for tools and tests). NOT_FOUND,
// DATA_LOSS or INVALID_ARGUMENT (newer format version) as above.
absl::StatusOr<v1::CheckpointManifest> ReadCheckpointManifest(
    const std::string& dir);
absl::StatusOr<v1::CheckpointManifest> ReadCheckpointManifest(
    const Directory& dir);
// Replaces the manifest of `dir` with `manifest` (its format version as
// given), checksummed as a save writes it (for tools and tests).
absl::Status WriteCheckpointManifest(const Directory& dir,
                                     const v1::CheckpointManifest& manifest);

}  // namespace tessera

#endif  // TESSERA_SERVER_CHECKPOINT_CHECKPOINT_H_
