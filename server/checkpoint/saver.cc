#include "server/checkpoint/checkpoint.h"

#include <algorithm>
#include <optional>
#include <set>
#include <utility>
#include <variant>
#include <vector>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/checksum.h"
#include "common/int_math.h"
#include "common/nonce.h"
#include "common/proto_convert.h"
#include "common/status_macros.h"
#include "io/file.h"
#include "server/checkpoint/checkpoint_format.h"

namespace tessera {

using checkpoint_internal::kBlockAlignment;
using checkpoint_internal::kManifestName;
using checkpoint_internal::kMaxBlockBytes;
using checkpoint_internal::NamedFiles;
using checkpoint_internal::RemoveLeftovers;
using checkpoint_internal::ResolveOwners;
using checkpoint_internal::ShardWhat;

namespace {

// A checkpoint file written atomically (io/file.h's AtomicFile) under its
// name in the checkpoint directory.
class CheckpointFile {
 public:
  static absl::StatusOr<std::unique_ptr<CheckpointFile>> Create(
      const Directory& dir, const std::string& name) {
    absl::StatusOr<AtomicFile> file = AtomicFile::CreateIn(dir, name);
    if (!file.ok()) return Annotate(file.status(), "checkpoint");
    return absl::WrapUnique(new CheckpointFile(name, *std::move(file)));
  }

  const std::string& name() const { return name_; }
  int64_t size() const { return file_.size(); }

  absl::Status Append(const void* data, size_t size) {
    return Annotate(file_.Append(data, size), "checkpoint");
  }
  absl::Status Commit() { return Annotate(file_.Commit(), "checkpoint"); }

 private:
  CheckpointFile(std::string name, AtomicFile file)
      : name_(std::move(name)), file_(std::move(file)) {}

  std::string name_;
  AtomicFile file_;
};

// A random id for this save's data files: files of the checkpoint being
// replaced are never overwritten.
std::string NewFileId() { return absl::StrFormat("%016x", RandomNonce()); }

// Appends the tensor's elements, row-major, to `file` and describes where
// they went, with one checksum per block.
absl::StatusOr<v1::DataExtent> AppendTensor(CheckpointFile& file,
                                            const Tensor& tensor,
                                            int64_t block_bytes) {
  Tensor host = tensor;
  if (!tensor.device().is_cpu()) {
    ASSIGN_OR_RETURN(host, tensor.To(Device::Cpu()));
  } else {
    ASSIGN_OR_RETURN(host, tensor.Contiguous());
  }
  const char* data = static_cast<const char*>(host.data_ptr());
  const int64_t length = static_cast<int64_t>(host.nbytes());
  v1::DataExtent extent;
  extent.set_file(file.name());
  extent.set_offset(file.size());
  extent.set_length(length);
  extent.set_block_bytes(block_bytes);
  for (int64_t at = 0; at < length; at += block_bytes) {
    extent.add_block_xxh3(Checksum64(
        data + at, static_cast<size_t>(std::min(block_bytes, length - at))));
  }
  RETURN_IF_ERROR(file.Append(data, static_cast<size_t>(length)));
  return extent;
}

// ---------------------------------------------------------------------------
// Saving.

// The group that saves a state dict; null in no-rank mode.
absl::StatusOr<std::shared_ptr<ProcessGroup>> ResolveSaveGroup(
    const StateDict& state_dict, const SaveOptions& options) {
  std::shared_ptr<ProcessGroup> group;
  for (const auto& [name, value] : state_dict) {
    const ShardedTensor* st = std::get_if<ShardedTensor>(&value);
    if (st == nullptr) continue;
    if (st->process_group() == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("Need to initialize default process group before "
                       "saving ShardedTensor \"",
                       name, "\""));
    }
    if (group == nullptr) group = st->process_group();
    if (st->process_group() != group) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the sharded tensors of one checkpoint must share a process group: "
          "\"",
          name, "\" is on group ", st->process_group()->name(),
          ", an earlier one on group ", group->name()));
    }
  }
  if (group != nullptr) {
    if (options.process_group != nullptr && options.process_group != group) {
      return absl::InvalidArgumentError(absl::StrCat(
          "SaveOptions names process group ", options.process_group->name(),
          " but the sharded tensors are on group ", group->name()));
    }
    return group;
  }
  if (options.process_group != nullptr) return options.process_group;
  std::shared_ptr<Rank> rank =
      options.rank != nullptr ? options.rank : DefaultRank();
  if (rank != nullptr) return rank->default_group();
  return nullptr;
}

absl::Status ValidateForSave(const StateDict& state_dict) {
  std::set<absl::string_view> names;
  for (const auto& [name, value] : state_dict) {
    if (name.empty()) {
      return absl::InvalidArgumentError("state dict names must be non-empty");
    }
    if (!names.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("state dict name \"", name, "\" appears twice"));
    }
    const Tensor* tensor = std::get_if<Tensor>(&value);
    if (tensor != nullptr && !tensor->defined()) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", name, "\" is an undefined tensor"));
    }
    const bool meta = tensor != nullptr
                          ? tensor->device().is_meta()
                          : std::get<ShardedTensor>(value).device().is_meta();
    if (meta) {
      return absl::InvalidArgumentError(absl::StrCat(
          "\"", name, "\" is on the meta device: it has no data to save"));
    }
  }
  return absl::OkStatus();
}

// The manifest every member can build on its own: names, dtypes, sizes and
// sharded metadata, without data extents. Equal on every member saving the
// same state dict, so its digest detects members that disagree.
v1::CheckpointManifest Skeleton(
    const StateDict& state_dict,
    const std::map<std::string, SaveOptions::Keeping>& keeping) {
  v1::CheckpointManifest manifest;
  manifest.set_format_version(kCheckpointFormatVersion);
  for (const auto& [name, value] : state_dict) {
    v1::CheckpointEntry& entry = *manifest.add_entries();
    entry.set_name(name);
    if (const Tensor* tensor = std::get_if<Tensor>(&value)) {
      v1::DenseTensorEntry& dense = *entry.mutable_dense();
      dense.set_dtype(ToProto(tensor->dtype()));
      for (int64_t size : tensor->sizes()) dense.add_sizes(size);
      continue;
    }
    const ShardedTensor& st = std::get<ShardedTensor>(value);
    v1::ShardedTensorEntry& sharded = *entry.mutable_sharded();
    *sharded.mutable_metadata() = ToProto(st.metadata());
    for (int r : st.process_group()->global_ranks()) {
      sharded.add_group_global_ranks(r);
    }
    sharded.set_world_size(st.rank()->world_size());
    *sharded.mutable_sharding_spec() = ToProto(st.sharding_spec());
    if (auto kept = keeping.find(name); kept != keeping.end()) {
      sharded.set_versions_kept(kept->second.versions_kept);
      sharded.set_copies(kept->second.copies);
    }
    for (size_t i = 0; i < st.metadata().shards_metadata.size(); ++i) {
      sharded.add_shards();
    }
  }
  return manifest;
}

v1::CheckpointSavePiece StatusPiece(const absl::Status& status) {
  v1::CheckpointSavePiece piece;
  piece.set_code(static_cast<int>(status.code()));
  piece.set_message(std::string(status.message()));
  return piece;
}

absl::Status PieceStatus(const v1::CheckpointSavePiece& piece) {
  return absl::Status(static_cast<absl::StatusCode>(piece.code()),
                      piece.message());
}

// One member's part of a save: write, exchange, commit (on the writer),
// agree on the outcome. In no-rank mode the process is a group of one and
// exchanges nothing.
class Saver {
 public:
  Saver(const StateDict& state_dict,
        absl::FunctionRef<absl::StatusOr<Directory>()> open_dir,
        std::shared_ptr<ProcessGroup> group, const SaveOptions& options)
      : state_dict_(state_dict),
        open_dir_(open_dir),
        group_(std::move(group)),
        overwrite_(options.overwrite),
        keeping_(options.keeping),
        start_ns_(absl::GetCurrentTimeNanos()),
        block_bytes_(
            CeilDiv(std::clamp<int64_t>(options.block_bytes, 1, kMaxBlockBytes),
                    kBlockAlignment) *
            kBlockAlignment) {}

  // Files are removed only when the save is known to have failed on every
  // member; after a transport error the writer may have committed them, and
  // the next save removes them if it did not.
  absl::Status Run() {
    absl::Status local = WriteLocal();
    v1::CheckpointSavePiece piece = local.ok() ? piece_ : StatusPiece(local);
    ASSIGN_OR_RETURN(std::vector<v1::CheckpointSavePiece> pieces,
                     Exchange(piece.SerializeAsString()));
    // Every member knows every piece, so all stop here together.
    absl::Status outcome = CheckPieces(pieces);
    if (outcome.ok()) {
      outcome = writer() ? Commit(pieces) : absl::OkStatus();
      if (group_ != nullptr) {
        ASSIGN_OR_RETURN(outcome, AgreeOnOutcome(outcome));
      }
    }
    if (!outcome.ok()) RemoveWritten();
    return outcome;
  }

 private:
  bool writer() const { return group_ == nullptr || group_->rank() == 0; }
  int group_rank() const { return group_ == nullptr ? 0 : group_->rank(); }

  absl::Status WriteLocal() {
    RETURN_IF_ERROR(ValidateForSave(state_dict_));
    manifest_ = Skeleton(state_dict_, keeping_);
    const std::string plan = manifest_.SerializeAsString();
    piece_.set_plan_digest(Checksum64(plan.data(), plan.size()));
    absl::StatusOr<Directory> dir = open_dir_();
    if (!dir.ok()) return Annotate(dir.status(), "checkpoint");
    dir_ = *std::move(dir);
    if (writer()) RETURN_IF_ERROR(CheckReplaced());
    RETURN_IF_ERROR(WriteShards());
    return writer() ? WriteDense() : absl::OkStatus();
  }

  // A checkpoint already in the directory is replaced only with overwrite;
  // the files its manifest names are removed after the commit.
  absl::Status CheckReplaced() {
    absl::StatusOr<Directory::Entry> existing = dir_->Stat(kManifestName);
    if (absl::IsNotFound(existing.status())) return absl::OkStatus();
    if (!existing.ok()) return Annotate(existing.status(), "checkpoint");
    if (!overwrite_) {
      return absl::AlreadyExistsError(
          absl::StrCat("checkpoint ", dir_->path(),
                       " exists; save with overwrite to replace it"));
    }
    absl::StatusOr<v1::CheckpointManifest> old = ReadCheckpointManifest(*dir_);
    if (old.ok()) replaced_ = NamedFiles(*old);
    return absl::OkStatus();
  }

  // This member's local shards, in state-dict and shard order, into
  // rank<r>.<id>.shards.
  absl::Status WriteShards() {
    std::unique_ptr<CheckpointFile> file;
    for (size_t e = 0; e < state_dict_.size(); ++e) {
      const ShardedTensor* st =
          std::get_if<ShardedTensor>(&state_dict_[e].second);
      if (st == nullptr || st->local_shards().empty()) continue;
      if (file == nullptr) {
        ASSIGN_OR_RETURN(
            file, CheckpointFile::Create(*dir_,
                                         absl::StrCat("rank", group_rank(), ".",
                                                      NewFileId(), ".shards")));
      }
      RETURN_IF_ERROR(AppendLocalShards(*st, static_cast<int>(e), *file));
    }
    return CommitFile(file.get());
  }

  absl::Status AppendLocalShards(const ShardedTensor& st, int entry,
                                 CheckpointFile& file) {
    ASSIGN_OR_RETURN(
        auto owners,
        ResolveOwners(st.metadata(), *st.process_group(), *st.rank()));
    std::vector<int> mine;
    for (size_t i = 0; i < owners.size(); ++i) {
      if (owners[i].first == st.rank()->rank()) {
        mine.push_back(static_cast<int>(i));
      }
    }
    if (mine.size() != st.local_shards().size()) {
      return absl::InternalError(absl::StrCat(
          "the local shards of \"", state_dict_[entry].first,
          "\" do not match the shards its metadata places on rank ",
          st.rank()->rank()));
    }
    for (size_t k = 0; k < mine.size(); ++k) {
      v1::CheckpointSavePiece::Written& written = *piece_.add_shards();
      written.set_entry(entry);
      written.set_shard(mine[k]);
      ASSIGN_OR_RETURN(
          *written.mutable_data(),
          AppendTensor(file, st.local_shards()[k].tensor, block_bytes_));
    }
    return absl::OkStatus();
  }

  // The dense tensors, once, into dense.<id>.bin.
  absl::Status WriteDense() {
    std::unique_ptr<CheckpointFile> file;
    for (size_t e = 0; e < state_dict_.size(); ++e) {
      const Tensor* tensor = std::get_if<Tensor>(&state_dict_[e].second);
      if (tensor == nullptr) continue;
      if (file == nullptr) {
        ASSIGN_OR_RETURN(
            file, CheckpointFile::Create(
                      *dir_, absl::StrCat("dense.", NewFileId(), ".bin")));
      }
      ASSIGN_OR_RETURN(*manifest_.mutable_entries(static_cast<int>(e))
                            ->mutable_dense()
                            ->mutable_data(),
                       AppendTensor(*file, *tensor, block_bytes_));
    }
    return CommitFile(file.get());
  }

  absl::Status CommitFile(CheckpointFile* file) {
    if (file == nullptr) return absl::OkStatus();
    RETURN_IF_ERROR(file->Commit());
    written_.push_back(file->name());
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<v1::CheckpointSavePiece>> Exchange(
      const std::string& bytes) {
    std::vector<std::string> gathered = {bytes};
    if (group_ != nullptr) {
      ASSIGN_OR_RETURN(gathered, AllGatherBytes(*group_, bytes));
    }
    std::vector<v1::CheckpointSavePiece> pieces(gathered.size());
    for (size_t r = 0; r < gathered.size(); ++r) {
      if (!pieces[r].ParseFromString(gathered[r])) {
        return absl::InternalError(
            absl::StrCat("group rank ", r, " sent a malformed save piece"));
      }
    }
    return pieces;
  }

  // The first member's failure, or INVALID_ARGUMENT when members save
  // different state dicts. The same answer on every member.
  static absl::Status CheckPieces(
      const std::vector<v1::CheckpointSavePiece>& pieces) {
    for (size_t r = 0; r < pieces.size(); ++r) {
      absl::Status status = PieceStatus(pieces[r]);
      if (!status.ok()) {
        return Annotate(status, absl::StrCat("saving on group rank ", r));
      }
    }
    for (size_t r = 1; r < pieces.size(); ++r) {
      if (pieces[r].plan_digest() != pieces[0].plan_digest()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the state dict of group rank ", r,
            " differs from group rank 0's (names, dtypes, sizes or sharding); "
            "every member must save the same state dict"));
      }
    }
    return absl::OkStatus();
  }

  // Fills in where every member put its shards, writes the manifest (the
  // commit point) and removes files of the replaced checkpoint.
  absl::Status Commit(const std::vector<v1::CheckpointSavePiece>& pieces) {
    for (size_t r = 0; r < pieces.size(); ++r) {
      for (const auto& written : pieces[r].shards()) {
        if (written.entry() < 0 || written.entry() >= manifest_.entries_size())
          return absl::InternalError("a save piece names no entry");
        auto& shards = *manifest_.mutable_entries(written.entry())
                            ->mutable_sharded()
                            ->mutable_shards();
        if (written.shard() < 0 || written.shard() >= shards.size())
          return absl::InternalError("a save piece names no shard");
        shards[written.shard()].set_owner_rank(static_cast<int>(r));
        *shards[written.shard()].mutable_data() = written.data();
      }
    }
    for (const v1::CheckpointEntry& entry : manifest_.entries()) {
      for (int i = 0; i < entry.sharded().shards_size(); ++i) {
        if (!entry.sharded().shards(i).has_data()) {
          return absl::InternalError(
              absl::StrCat("no member saved ", ShardWhat(entry.name(), i)));
        }
      }
    }
    RETURN_IF_ERROR(WriteCheckpointManifest(*dir_, manifest_));
    // Best effort: the checkpoint is committed whether or not this succeeds.
    RemoveLeftovers(*dir_, NamedFiles(manifest_), replaced_, start_ns_);
    return absl::OkStatus();
  }

  // The writer's outcome, on every member; also the closing barrier, so
  // that no member returns before the manifest is in place. An error of its
  // own is the exchange's.
  absl::StatusOr<absl::Status> AgreeOnOutcome(const absl::Status& mine) {
    ASSIGN_OR_RETURN(
        std::vector<std::string> gathered,
        AllGatherBytes(*group_, writer() ? StatusPiece(mine).SerializeAsString()
                                         : std::string()));
    v1::CheckpointSavePiece outcome;
    if (!outcome.ParseFromString(gathered[0])) {
      return absl::InternalError("group rank 0 sent a malformed save outcome");
    }
    return PieceStatus(outcome);
  }

  void RemoveWritten() {
    for (const std::string& name : written_) dir_->Remove(name).IgnoreError();
  }

  const StateDict& state_dict_;
  absl::FunctionRef<absl::StatusOr<Directory>()> open_dir_;
  std::optional<Directory> dir_;
  std::shared_ptr<ProcessGroup> group_;
  const bool overwrite_;
  const std::map<std::string, SaveOptions::Keeping> keeping_;
  const int64_t start_ns_;
  std::set<std::string> replaced_;
  const int64_t block_bytes_;
  v1::CheckpointManifest manifest_;
  v1::CheckpointSavePiece piece_;
  std::vector<std::string> written_;
};

}  // namespace

absl::Status SaveStateDict(
    const StateDict& state_dict,
    absl::FunctionRef<absl::StatusOr<Directory>()> open_dir,
    const SaveOptions& options) {
  ASSIGN_OR_RETURN(std::shared_ptr<ProcessGroup> group,
                   ResolveSaveGroup(state_dict, options));
  if (group != nullptr && !group->is_member()) return absl::OkStatus();
  return Saver(state_dict, open_dir, std::move(group), options).Run();
}

absl::Status SaveStateDict(const StateDict& state_dict, const std::string& dir,
                           const SaveOptions& options) {
  return SaveStateDict(
      state_dict, [&dir] { return Directory::Open(dir, /*create=*/true); },
      options);
}

}  // namespace tessera
