#include "server/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <utility>
#include <variant>
#include <vector>

#include "absl/memory/memory.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/proto_convert.h"
#include "common/region.h"
#include "common/shard_layout.h"
#include "common/status_macros.h"
#include "io/errno.h"
#include "io/file.h"
#include "io/unique_fd.h"
#include "xxhash.h"

namespace tessera {
namespace {

constexpr char kManifestName[] = "manifest.pb";
// Blocks start on element boundaries when their size is a multiple of the
// largest element (complex128).
constexpr int64_t kBlockAlignment = 16;

constexpr char kNeedDefaultGroup[] =
    "Need to initialize default process group using \"init_process_group\" "
    "before loading ShardedTensor";

std::string JoinPath(const std::string& dir, absl::string_view name) {
  return absl::StrCat(dir, "/", name);
}

absl::Status IoError(int err, absl::string_view what, absl::string_view path) {
  return Annotate(ErrnoError(err, absl::StrCat(what, " ", path)), "checkpoint");
}

std::string ShardWhat(absl::string_view name, int64_t shard) {
  return absl::StrCat("shard ", shard, " of \"", name, "\"");
}

// ---------------------------------------------------------------------------
// Files (io/file.h), with "checkpoint: " errors.

// A checkpoint file open for reading.
class File {
 public:
  static absl::StatusOr<File> Open(const std::string& path, int flags) {
    absl::StatusOr<UniqueFd> fd = OpenFile(path, flags);
    if (!fd.ok()) return Annotate(fd.status(), "checkpoint");
    return File(*std::move(fd), path);
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

// A checkpoint file written atomically (io/file.h's AtomicFile) under its
// name in the checkpoint directory.
class CheckpointFile {
 public:
  static absl::StatusOr<std::unique_ptr<CheckpointFile>> Create(
      const std::string& dir, const std::string& name) {
    absl::StatusOr<AtomicFile> file = AtomicFile::Create(JoinPath(dir, name));
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

// Whether `name` is a file a save of this format creates, so that files
// the current manifest no longer names can be removed.
bool IsCheckpointFile(absl::string_view name) {
  name = AtomicFileTarget(name);
  return name == kManifestName ||
         (absl::StartsWith(name, "rank") && absl::EndsWith(name, ".shards")) ||
         (absl::StartsWith(name, "dense.") && absl::EndsWith(name, ".bin"));
}

// A random id for this save's data files: files of the checkpoint being
// replaced are never overwritten.
std::string NewFileId() {
  std::random_device device;
  const uint64_t bits = (uint64_t{device()} << 32) ^ device() ^
                        static_cast<uint64_t>(absl::GetCurrentTimeNanos());
  return absl::StrFormat("%016x", bits);
}

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
    extent.add_block_xxh3(XXH3_64bits(
        data + at, static_cast<size_t>(std::min(block_bytes, length - at))));
  }
  RETURN_IF_ERROR(file.Append(data, static_cast<size_t>(length)));
  return extent;
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
v1::CheckpointManifest Skeleton(const StateDict& state_dict) {
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
  Saver(const StateDict& state_dict, const std::string& dir,
        std::shared_ptr<ProcessGroup> group, const SaveOptions& options)
      : state_dict_(state_dict),
        dir_(dir),
        group_(std::move(group)),
        block_bytes_(
            (std::max<int64_t>(options.block_bytes, 1) + kBlockAlignment - 1) /
            kBlockAlignment * kBlockAlignment) {}

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
    manifest_ = Skeleton(state_dict_);
    const std::string plan = manifest_.SerializeAsString();
    piece_.set_plan_digest(XXH3_64bits(plan.data(), plan.size()));
    std::error_code error;
    std::filesystem::create_directories(dir_, error);
    if (error && !std::filesystem::is_directory(dir_)) {
      return IoError(error.value(), "create directory", dir_);
    }
    RETURN_IF_ERROR(WriteShards());
    return writer() ? WriteDense() : absl::OkStatus();
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
        ASSIGN_OR_RETURN(file, CheckpointFile::Create(
                                   dir_, absl::StrCat("rank", group_rank(), ".",
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
                      dir_, absl::StrCat("dense.", NewFileId(), ".bin")));
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
    written_.push_back(JoinPath(dir_, file->name()));
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
    ASSIGN_OR_RETURN(auto file, CheckpointFile::Create(dir_, kManifestName));
    const std::string bytes = manifest_.SerializeAsString();
    RETURN_IF_ERROR(file->Append(bytes.data(), bytes.size()));
    RETURN_IF_ERROR(file->Commit());
    RemoveUnreferenced();
    return absl::OkStatus();
  }

  // Best effort: the checkpoint is committed whether or not this succeeds.
  void RemoveUnreferenced() {
    std::set<std::string> keep = {kManifestName};
    for (const v1::CheckpointEntry& entry : manifest_.entries()) {
      keep.insert(entry.dense().data().file());
      for (const v1::SavedShard& shard : entry.sharded().shards()) {
        keep.insert(shard.data().file());
      }
    }
    std::error_code error;
    for (const auto& item : std::filesystem::directory_iterator(dir_, error)) {
      const std::string name = item.path().filename().string();
      if (item.is_regular_file(error) && IsCheckpointFile(name) &&
          keep.count(name) == 0) {
        std::filesystem::remove(item.path(), error);
      }
    }
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
    for (const std::string& path : written_) unlink(path.c_str());
  }

  const StateDict& state_dict_;
  const std::string& dir_;
  std::shared_ptr<ProcessGroup> group_;
  const int64_t block_bytes_;
  v1::CheckpointManifest manifest_;
  v1::CheckpointSavePiece piece_;
  std::vector<std::string> written_;
};

// ---------------------------------------------------------------------------
// Loading.

// A manifest run checked against what it should hold, so that reads stay
// inside it and every block has its checksum.
absl::Status ValidateExtent(const v1::DataExtent& extent, int64_t length,
                            absl::string_view what) {
  const int64_t block = extent.block_bytes();
  const char* problem = nullptr;
  if (extent.file().empty() || absl::StrContains(extent.file(), '/') ||
      extent.file() == "..") {
    problem = "a bad file name";
  } else if (extent.offset() < 0 || extent.length() != length) {
    problem = "a bad offset or length";
  } else if (block <= 0 || block % kBlockAlignment != 0 ||
             extent.block_xxh3_size() != (length + block - 1) / block) {
    problem = "bad checksum blocks";
  }
  if (problem == nullptr) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat("checkpoint manifest: ", what,
                                          " has ", problem, " (file \"",
                                          extent.file(), "\")"));
}

// Reads verified element ranges of a checkpoint's data files, opening each
// file once.
class CheckpointReader {
 public:
  explicit CheckpointReader(std::string dir) : dir_(std::move(dir)) {}

  // Elements [first, first + count) of the run `extent` holds, as a 1-d CPU
  // tensor of `dtype`. Reads and verifies only the blocks that hold them.
  absl::StatusOr<Tensor> Read(const v1::DataExtent& extent, DType dtype,
                              int64_t first, int64_t count,
                              absl::string_view what) {
    const TensorOptions options = TensorOptions().WithDType(dtype);
    if (count == 0) return Tensor::Empty({0}, options);
    const int64_t element = static_cast<int64_t>(ElementSize(dtype));
    const int64_t block = extent.block_bytes();
    const int64_t first_block = first * element / block;
    const int64_t end_block = ((first + count) * element + block - 1) / block;
    const int64_t begin = first_block * block;
    const int64_t end = std::min(end_block * block, extent.length());
    ASSIGN_OR_RETURN(Tensor raw,
                     Tensor::Empty({(end - begin) / element}, options));
    ASSIGN_OR_RETURN(const File* file, Open(extent.file(), what));
    char* data = static_cast<char*>(raw.data_ptr());
    RETURN_IF_ERROR(file->ReadAt(extent.offset() + begin, data,
                                 static_cast<size_t>(end - begin), what));
    for (int64_t k = first_block; k < end_block; ++k) {
      const int64_t at = k * block;
      const int64_t n = std::min(block, extent.length() - at);
      if (XXH3_64bits(data + (at - begin), static_cast<size_t>(n)) !=
          extent.block_xxh3(static_cast<int>(k))) {
        return absl::DataLossError(absl::StrCat(
            "checkpoint file ", file->path(), " is corrupt: ", what,
            " fails the XXH3 checksum of its block ", k, " (file bytes [",
            extent.offset() + at, ", ", extent.offset() + at + n, "))"));
      }
    }
    return raw.Narrow(0, first - begin / element, count);
  }

 private:
  absl::StatusOr<const File*> Open(const std::string& name,
                                   absl::string_view what) {
    auto it = files_.find(name);
    if (it == files_.end()) {
      absl::StatusOr<File> file = File::Open(JoinPath(dir_, name), O_RDONLY);
      if (!file.ok()) {
        return Annotate(file.status(), absl::StrCat("reading ", what));
      }
      it = files_.emplace(name, std::move(*file)).first;
    }
    return &it->second;
  }

  std::string dir_;
  std::map<std::string, File> files_;
};

// A sharded entry of the manifest, converted and checked.
struct SavedTensor {
  std::string name;
  const v1::ShardedTensorEntry* entry;
  ShardedTensorMetadata metadata;
};

absl::StatusOr<SavedTensor> ParseSaved(const std::string& name,
                                       const v1::ShardedTensorEntry& entry) {
  absl::StatusOr<ShardedTensorMetadata> metadata = FromProto(entry.metadata());
  absl::Status status = metadata.status();
  if (status.ok()) {
    status = ValidateShardLayout(metadata->shards_metadata, metadata->size);
  }
  if (!status.ok()) {
    return absl::DataLossError(
        absl::StrCat("checkpoint manifest: \"", name,
                     "\" has bad metadata: ", status.message()));
  }
  const auto& shards = metadata->shards_metadata;
  if (static_cast<int>(shards.size()) != entry.shards_size()) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint manifest: \"", name, "\" lists ", entry.shards_size(),
        " saved shards for ", shards.size(), " shards"));
  }
  const int64_t element = ElementSize(metadata->tensor_properties.dtype);
  for (size_t i = 0; i < shards.size(); ++i) {
    RETURN_IF_ERROR(ValidateExtent(entry.shards(static_cast<int>(i)).data(),
                                   shards[i].numel() * element,
                                   ShardWhat(name, static_cast<int64_t>(i))));
  }
  return SavedTensor{name, &entry, *std::move(metadata)};
}

// Copies `box` (global coordinates) of saved shard `i` into `dst`, the
// tensor of the shard `target`. Reads the rows of the saved shard the box
// spans along dimension 0 (a contiguous run), rounded out to whole
// checksum blocks.
absl::Status CopySavedBox(CheckpointReader& reader, const SavedTensor& saved,
                          int i, const ShardMetadata& box,
                          const ShardMetadata& target, const Tensor& dst) {
  const ShardMetadata& shard = saved.metadata.shards_metadata[i];
  std::vector<int64_t> src_offsets =
      OffsetsWithin(box.shard_offsets(), shard.shard_offsets());
  std::vector<int64_t> slab = shard.shard_sizes();
  int64_t first = 0;
  int64_t count = 1;
  if (!slab.empty()) {
    const int64_t row = shard.numel() / slab[0];
    first = src_offsets[0] * row;
    count = box.shard_sizes()[0] * row;
    slab[0] = box.shard_sizes()[0];
    src_offsets[0] = 0;
  }
  ASSIGN_OR_RETURN(Tensor raw,
                   reader.Read(saved.entry->shards(i).data(),
                               saved.metadata.tensor_properties.dtype, first,
                               count, ShardWhat(saved.name, i)));
  ASSIGN_OR_RETURN(Tensor rows, raw.View(slab));
  return CopyBox(rows, src_offsets, dst,
                 OffsetsWithin(box.shard_offsets(), target.shard_offsets()),
                 box.shard_sizes());
}

// Fills `dst`, the tensor of shard `target`, from every saved shard it
// overlaps. The saved shards tile the tensor, so every element is written.
absl::Status FillShard(CheckpointReader& reader, const SavedTensor& saved,
                       const ShardMetadata& target, const Tensor& dst) {
  const auto& shards = saved.metadata.shards_metadata;
  for (size_t i = 0; i < shards.size(); ++i) {
    std::optional<ShardMetadata> box = Intersect(shards[i], target);
    if (!box.has_value()) continue;
    RETURN_IF_ERROR(
        CopySavedBox(reader, saved, static_cast<int>(i), *box, target, dst));
  }
  return absl::OkStatus();
}

// PyTorch's ShardedTensor.__setstate__ checks, for a load with the saved
// layout. A process is identified by its global rank: its rank in the
// saving group is its position among the group's global ranks.
absl::Status CheckSameGroup(const v1::ShardedTensorEntry& entry,
                            const Rank& rank, const ProcessGroup& group) {
  const auto& saved = entry.group_global_ranks();
  const auto it = std::find(saved.begin(), saved.end(), rank.rank());
  const int saved_rank =
      it == saved.end() ? -1 : static_cast<int>(it - saved.begin());
  if (saved_rank != group.rank()) {
    return absl::FailedPreconditionError(
        absl::StrCat("Local rank at save time was ", saved_rank,
                     ", but at load time was ", group.rank()));
  }
  if (saved.size() != group.size()) {
    return absl::FailedPreconditionError(
        absl::StrCat("Local world size at save time was ", saved.size(),
                     ", but at load time was ", group.size()));
  }
  if (entry.world_size() != rank.world_size()) {
    return absl::FailedPreconditionError(
        absl::StrCat("Global world size at save time was ", entry.world_size(),
                     ", but at load time was ", rank.world_size()));
  }
  return absl::OkStatus();
}

// Loads one checkpoint's entries, sharing open files between them.
class Loader {
 public:
  Loader(const std::string& dir, const LoadOptions& options)
      : reader_(dir), options_(options) {}

  absl::StatusOr<StateValue> Load(const v1::CheckpointEntry& entry) {
    if (entry.has_dense()) return LoadDense(entry.name(), entry.dense());
    if (!entry.has_sharded()) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint manifest: \"", entry.name(), "\" holds no tensor"));
    }
    ASSIGN_OR_RETURN(SavedTensor saved,
                     ParseSaved(entry.name(), entry.sharded()));
    auto target = options_.reshard.find(entry.name());
    if (target == options_.reshard.end()) return LoadSameLayout(saved);
    if (target->second.into.has_value()) {
      return FillInto(saved, *target->second.into);
    }
    return LoadResharded(saved, *target->second.spec,
                         target->second.process_group);
  }

 private:
  absl::StatusOr<Tensor> LoadDense(const std::string& name,
                                   const v1::DenseTensorEntry& dense) {
    absl::StatusOr<DType> dtype = FromProto(dense.dtype());
    std::vector<int64_t> sizes(dense.sizes().begin(), dense.sizes().end());
    std::optional<int64_t> numel;
    if (std::all_of(sizes.begin(), sizes.end(),
                    [](int64_t s) { return s >= 0; })) {
      numel = CheckedProduct(sizes);
    }
    if (!dtype.ok() || !numel.has_value()) {
      return absl::DataLossError(absl::StrCat("checkpoint manifest: \"", name,
                                              "\" has a bad dtype or sizes"));
    }
    const std::string what = absl::StrCat("\"", name, "\"");
    RETURN_IF_ERROR(ValidateExtent(
        dense.data(), *numel * static_cast<int64_t>(ElementSize(*dtype)),
        what));
    ASSIGN_OR_RETURN(Tensor raw,
                     reader_.Read(dense.data(), *dtype, 0, *numel, what));
    return raw.View(sizes);
  }

  // The rank and group of loaded tensors (load_with_process_group).
  absl::Status ResolveContext() {
    rank_ = options_.rank != nullptr ? options_.rank : DefaultRank();
    if (rank_ == nullptr)
      return absl::FailedPreconditionError(kNeedDefaultGroup);
    group_ = options_.process_group != nullptr ? options_.process_group
                                               : rank_->default_group();
    return absl::OkStatus();
  }

  ShardedTensorOptions TensorOptionsOn(std::shared_ptr<ProcessGroup> group) {
    ShardedTensorOptions options;
    options.rank = rank_;
    options.process_group = std::move(group);
    return options;
  }

  // Each rank reads its own shards, whole.
  absl::StatusOr<ShardedTensor> LoadSameLayout(const SavedTensor& saved) {
    RETURN_IF_ERROR(ResolveContext());
    RETURN_IF_ERROR(CheckSameGroup(*saved.entry, *rank_, *group_));
    ASSIGN_OR_RETURN(auto owners,
                     ResolveOwners(saved.metadata, *group_, *rank_));
    std::vector<Shard> local;
    for (size_t i = 0; i < owners.size(); ++i) {
      if (owners[i].first != rank_->rank()) continue;
      ASSIGN_OR_RETURN(Tensor tensor, ReadWholeShard(saved, static_cast<int>(i),
                                                     owners[i].second));
      local.push_back(
          Shard{std::move(tensor), saved.metadata.shards_metadata[i]});
    }
    ASSIGN_OR_RETURN(ShardingSpec spec,
                     FromProto(saved.entry->sharding_spec()));
    return ShardedTensor::InitFromLocalShardsWithSpec(
        std::move(local), saved.metadata, std::move(spec),
        TensorOptionsOn(group_));
  }

  absl::StatusOr<Tensor> ReadWholeShard(const SavedTensor& saved, int i,
                                        const Device& device) {
    const ShardMetadata& shard = saved.metadata.shards_metadata[i];
    const TensorProperties& properties = saved.metadata.tensor_properties;
    if (shard.numel() == 0) return AllocateShard(saved, shard, device);
    ASSIGN_OR_RETURN(
        Tensor raw,
        reader_.Read(saved.entry->shards(i).data(), properties.dtype, 0,
                     shard.numel(), ShardWhat(saved.name, i)));
    ASSIGN_OR_RETURN(Tensor tensor, raw.View(shard.shard_sizes()));
    if (!device.is_cpu() || properties.pin_memory) {
      ASSIGN_OR_RETURN(tensor, tensor.To(device, properties.pin_memory));
    }
    tensor.set_requires_grad(properties.requires_grad);
    return tensor;
  }

  static absl::StatusOr<Tensor> AllocateShard(const SavedTensor& saved,
                                              const ShardMetadata& shard,
                                              const Device& device) {
    const TensorProperties& properties = saved.metadata.tensor_properties;
    TensorOptions options;
    options.dtype = properties.dtype;
    options.device = device;
    options.pin_memory = properties.pin_memory && device.is_cpu();
    options.requires_grad = properties.requires_grad;
    return Tensor::Empty(shard.shard_sizes(), options);
  }

  // Each rank reads the boxes its new shards need.
  absl::StatusOr<ShardedTensor> LoadResharded(
      const SavedTensor& saved, const ShardingSpec& spec,
      std::shared_ptr<ProcessGroup> group) {
    RETURN_IF_ERROR(ResolveContext());
    if (group == nullptr) group = group_;
    ASSIGN_OR_RETURN(ShardedTensorMetadata metadata,
                     BuildMetadata(spec, saved.metadata.size,
                                   saved.metadata.tensor_properties));
    ASSIGN_OR_RETURN(auto owners, ResolveOwners(metadata, *group, *rank_));
    std::vector<Shard> local;
    for (size_t i = 0; i < owners.size(); ++i) {
      if (owners[i].first != rank_->rank()) continue;
      const ShardMetadata& shard = metadata.shards_metadata[i];
      ASSIGN_OR_RETURN(Tensor tensor,
                       AllocateShard(saved, shard, owners[i].second));
      RETURN_IF_ERROR(FillShard(reader_, saved, shard, tensor));
      local.push_back(Shard{std::move(tensor), shard});
    }
    return ShardedTensor::InitFromLocalShardsWithSpec(
        std::move(local), std::move(metadata), spec,
        TensorOptionsOn(std::move(group)));
  }

  absl::StatusOr<ShardedTensor> FillInto(const SavedTensor& saved,
                                         const ShardedTensor& target) {
    const TensorProperties& properties = saved.metadata.tensor_properties;
    if (target.size() != saved.metadata.size ||
        target.dtype() != properties.dtype) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot load \"", saved.name, "\" (", DTypeName(properties.dtype),
          " [", absl::StrJoin(saved.metadata.size, ", "),
          "]) into a sharded tensor of ", DTypeName(target.dtype()), " [",
          absl::StrJoin(target.size(), ", "), "]"));
    }
    for (const Shard& shard : target.local_shards()) {
      RETURN_IF_ERROR(FillShard(reader_, saved, shard.metadata, shard.tensor));
    }
    return target;
  }

  CheckpointReader reader_;
  const LoadOptions& options_;
  std::shared_ptr<Rank> rank_;
  std::shared_ptr<ProcessGroup> group_;
};

// Every resharding target names a sharded entry and says where it goes.
absl::Status CheckTargets(const v1::CheckpointManifest& manifest,
                          const LoadOptions& options, const std::string& dir) {
  for (const auto& [name, target] : options.reshard) {
    if (target.spec.has_value() == target.into.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the resharding target of \"", name,
                       "\" needs exactly one of a spec and a tensor to fill"));
    }
    const auto& entries = manifest.entries();
    auto it = std::find_if(
        entries.begin(), entries.end(),
        [&](const v1::CheckpointEntry& entry) { return entry.name() == name; });
    if (it == entries.end()) {
      return absl::NotFoundError(
          absl::StrCat("no entry named \"", name, "\" in checkpoint ", dir));
    }
    if (!it->has_sharded()) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", name,
                       "\" is a dense tensor; only sharded tensors can be "
                       "resharded"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SaveStateDict(const StateDict& state_dict, const std::string& dir,
                           const SaveOptions& options) {
  ASSIGN_OR_RETURN(std::shared_ptr<ProcessGroup> group,
                   ResolveSaveGroup(state_dict, options));
  if (group != nullptr && !group->is_member()) return absl::OkStatus();
  return Saver(state_dict, dir, std::move(group), options).Run();
}

absl::StatusOr<StateDict> LoadStateDict(const std::string& dir,
                                        const LoadOptions& options) {
  ASSIGN_OR_RETURN(v1::CheckpointManifest manifest,
                   ReadCheckpointManifest(dir));
  RETURN_IF_ERROR(CheckTargets(manifest, options, dir));
  Loader loader(dir, options);
  StateDict state_dict;
  for (const v1::CheckpointEntry& entry : manifest.entries()) {
    ASSIGN_OR_RETURN(StateValue value, loader.Load(entry));
    state_dict.emplace_back(entry.name(), std::move(value));
  }
  return state_dict;
}

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
