#include "server/sharded/sharded_tensor.h"

#include <functional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/proto_convert.h"
#include "common/shard_layout.h"
#include "common/status_macros.h"
#include "server/sharded/sharded_gather.h"
#include "tessera/v1/sharding.pb.h"

namespace tessera {

struct ShardedTensor::State {
  std::shared_ptr<Rank> rank;  // Null in no-process-group mode.
  std::shared_ptr<ProcessGroup> group;
  std::string tensor_id;
  // Shared with this rank's registry entry (one copy per rank); set when
  // the tensor is made, never changed after (Reshard swaps whole States).
  std::shared_ptr<const ShardedTensorMetadata> metadata;
  std::vector<Shard> local_shards;
  // Global rank owning each shard of metadata.shards_metadata (empty in
  // no-process-group mode). local_shards are this rank's, in this order.
  std::vector<int> owners;
  bool init_rrefs = false;
  RemoteShardMap remote_shards;
  bool registered = false;

  // A tensor of this layout.
  explicit State(ShardingSpec spec) : spec_(std::move(spec)) {}
  // A tensor made from its shards (init_from_local_shards): its layout is
  // the EnumerableShardingSpec of metadata.shards_metadata, which the
  // caller validated; it is built on first use (Spec()), since it would
  // copy every shard's metadata again and most tensors never ask for it.
  State() = default;

  const ShardingSpec& Spec() const {
    absl::MutexLock lock(&spec_mu_);
    if (!spec_.has_value()) {
      // Validated when the tensor was made: cannot fail.
      absl::StatusOr<EnumerableShardingSpec> tiling =
          EnumerableShardingSpec::CreateTiling(metadata->shards_metadata,
                                               metadata->size);
      spec_.emplace(*std::move(tiling));
    }
    return *spec_;
  }
  void SetSpec(ShardingSpec spec) {
    absl::MutexLock lock(&spec_mu_);
    spec_ = std::move(spec);
  }

  // Exchanges every member (keep the list complete): Reshard replaces a
  // tensor's contents under all of its handles.
  void Swap(State& other) {
    using std::swap;
    swap(rank, other.rank);
    swap(group, other.group);
    swap(tensor_id, other.tensor_id);
    {
      absl::MutexLock lock(&spec_mu_);
      absl::MutexLock other_lock(&other.spec_mu_);
      swap(spec_, other.spec_);
    }
    swap(metadata, other.metadata);
    swap(local_shards, other.local_shards);
    swap(owners, other.owners);
    swap(init_rrefs, other.init_rrefs);
    swap(remote_shards, other.remote_shards);
    swap(registered, other.registered);
  }
  ~State() {
    if (!registered) return;
    // Peers may hold remote shards of this tensor only with init_rrefs;
    // they may still be fetching, so those shards are retired until the
    // next Rank::Barrier rather than dropped.
    if (init_rrefs) {
      rank->registry().Retire(tensor_id);
    } else {
      rank->registry().Unregister(tensor_id);
    }
  }

 private:
  mutable absl::Mutex spec_mu_;
  // Unset only until Spec() builds a tensor's tiling.
  mutable std::optional<ShardingSpec> spec_ ABSL_GUARDED_BY(spec_mu_);
};

namespace {

// EnumerableShardingSpec::CreateTiling's checks without its copy of the
// shards: what a tensor made from its shards promises (State::Spec builds
// the spec from them later).
absl::Status ValidateTiling(const std::vector<ShardMetadata>& shards,
                            absl::Span<const int64_t> sizes) {
  if (shards.empty()) {
    return absl::InvalidArgumentError("Empty shard list provided: []");
  }
  return ValidateShardLayout(shards, sizes);
}

}  // namespace

absl::StatusOr<RankAndGroup> ResolveRankAndGroup(
    const ShardedTensorOptions& options) {
  RankAndGroup context{options.rank != nullptr ? options.rank : DefaultRank(),
                       options.process_group};
  if (context.rank == nullptr) {
    return absl::FailedPreconditionError(
        "Default process group has not been initialized, please make sure to "
        "call tessera::Rank::Init (and SetDefaultRank) or pass a rank");
  }
  if (context.group == nullptr) context.group = context.rank->default_group();
  return context;
}

namespace {

using ShardFactory = std::function<absl::StatusOr<Tensor>(
    absl::Span<const int64_t> sizes, const TensorOptions& options)>;

using Context = RankAndGroup;

absl::Status ValidateFormat(Layout layout, MemoryFormat memory_format) {
  if (layout != Layout::kStrided) {
    return absl::InvalidArgumentError(
        "Only torch.strided layout is currently supported");
  }
  if (memory_format != MemoryFormat::kContiguous) {
    return absl::InvalidArgumentError(
        "Only torch.contiguous_format memory_format is currently supported");
  }
  return absl::OkStatus();
}

// PyTorch's _init_rpc checks: remote shards need the RPC agent, and RPC
// ranks must be the process-group ranks they are looked up by.
absl::Status ValidateRpc(const Rank& rank) {
  if (!rank.rpc_initialized()) {
    return absl::FailedPreconditionError(
        "RPC Framework needs to be initialized using "
        "tessera::Rank::InitRpc");
  }
  if (rank.rpc_rank() != rank.rank()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Default ProcessGroup and RPC ranks must be the same for "
                     "ShardedTensor, found process group rank: ",
                     rank.rank(), " and RPC rank: ", rank.rpc_rank()));
  }
  return absl::OkStatus();
}

// Each shard's (global rank, device), validated against the group.
absl::StatusOr<std::vector<std::pair<int, Device>>> ResolvePlacements(
    const Context& context, const ShardedTensorMetadata& metadata) {
  const WorkerResolver* resolver =
      context.rank->rpc_initialized() ? context.rank.get() : nullptr;
  std::vector<std::pair<int, Device>> placements;
  placements.reserve(metadata.shards_metadata.size());
  for (const ShardMetadata& shard : metadata.shards_metadata) {
    ASSIGN_OR_RETURN(auto placement,
                     ParseAndValidateRemoteDevice(context.group->global_ranks(),
                                                  shard.placement(), resolver,
                                                  context.group->is_member()));
    placements.push_back(std::move(placement));
  }
  return placements;
}

absl::StatusOr<RemoteShardMap> BuildRemoteShards(
    const Rank& rank, const std::string& tensor_id,
    const ShardedTensorMetadata& metadata,
    const std::vector<std::pair<int, Device>>& placements) {
  RemoteShardMap remote;
  for (size_t i = 0; i < placements.size(); ++i) {
    int owner = placements[i].first;
    if (owner == rank.rank()) continue;
    ASSIGN_OR_RETURN(WorkerInfo worker, rank.Worker(owner));
    ASSIGN_OR_RETURN(std::shared_ptr<ShardClient> client,
                     rank.ClientFor(owner));
    remote[owner].emplace_back(std::move(worker), tensor_id,
                               static_cast<int64_t>(i),
                               metadata.shards_metadata[i], std::move(client));
  }
  return remote;
}

// The properties of one rank's local shards, which must agree.
absl::StatusOr<TensorProperties> LocalProperties(
    const std::vector<Shard>& shards, int rank) {
  TensorProperties properties;
  for (size_t i = 0; i < shards.size(); ++i) {
    const Tensor& tensor = shards[i].tensor;
    TensorProperties p;
    p.dtype = tensor.dtype();
    p.requires_grad = tensor.requires_grad();
    p.pin_memory = tensor.is_pinned();
    if (i == 0) {
      properties = p;
      continue;
    }
    auto mismatch = [&](absl::string_view name, const std::string& a,
                        const std::string& b) {
      return absl::InvalidArgumentError(
          absl::StrCat("Local shards' tensor ", name,
                       " property need to be the same on "
                       "rank:",
                       rank, "! Found one local shard tensor ", name, "=", a,
                       ", the other local shard tensor ", name, "=", b));
    };
    if (p.dtype != properties.dtype) {
      return mismatch("dtype", std::string(DTypeName(properties.dtype)),
                      std::string(DTypeName(p.dtype)));
    }
    if (p.requires_grad != properties.requires_grad) {
      return mismatch("requires_grad",
                      properties.requires_grad ? "True" : "False",
                      p.requires_grad ? "True" : "False");
    }
    if (p.pin_memory != properties.pin_memory) {
      return mismatch("pin_memory", properties.pin_memory ? "True" : "False",
                      p.pin_memory ? "True" : "False");
    }
  }
  return properties;
}

// One rank's shards as metadata, after PyTorch's local checks.
absl::StatusOr<ShardedTensorMetadata> LocalMetadata(
    const std::vector<Shard>& local_shards,
    absl::Span<const int64_t> global_sizes, const ProcessGroup& group,
    int rank) {
  for (const Shard& shard : local_shards) {
    RETURN_IF_ERROR(shard.Validate());
    if (!shard.tensor.is_contiguous()) {
      return ValidateFormat(Layout::kStrided, MemoryFormat::kChannelsLast);
    }
    ASSIGN_OR_RETURN(auto placement,
                     ParseAndValidateRemoteDevice(group.global_ranks(),
                                                  shard.metadata.placement()));
    if (placement.first != rank) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Local shard metadata's rank does not match with the rank in its "
          "process group! Found current rank in the process group: ",
          rank, ", local ShardMetadata placement's rank: ", placement.first));
    }
  }
  ShardedTensorMetadata mine;
  ASSIGN_OR_RETURN(mine.tensor_properties, LocalProperties(local_shards, rank));
  mine.size.assign(global_sizes.begin(), global_sizes.end());
  for (const Shard& shard : local_shards) {
    mine.shards_metadata.push_back(shard.metadata);
  }
  return mine;
}

// One rank's contribution to init_from_local_shards, as gathered.
struct RankShards {
  int rank = 0;
  PackedMetadata metadata;  // header().size: that rank's global_sizes.
};

// The first mismatch of a property between two ranks, in PyTorch's words.
absl::Status CompareRanks(const RankShards& a, const RankShards& b) {
  auto mismatch = [&](absl::string_view name, const std::string& x,
                      const std::string& y) {
    return absl::InvalidArgumentError(
        absl::StrCat("ShardedTensor ", name,
                     " property does not match from different "
                     "ranks! Found ",
                     name, "=", x, " on rank:", a.rank, ", and ", name, "=", y,
                     " on rank:", b.rank));
  };
  const TensorProperties& p = a.metadata.header().tensor_properties;
  const TensorProperties& q = b.metadata.header().tensor_properties;
  const std::vector<int64_t>& a_size = a.metadata.header().size;
  const std::vector<int64_t>& b_size = b.metadata.header().size;
  if (a_size != b_size) {
    return mismatch("global_size",
                    absl::StrCat("[", absl::StrJoin(a_size, ", "), "]"),
                    absl::StrCat("[", absl::StrJoin(b_size, ", "), "]"));
  }
  if (p.dtype != q.dtype) {
    return mismatch("dtype", std::string(DTypeName(p.dtype)),
                    std::string(DTypeName(q.dtype)));
  }
  if (p.requires_grad != q.requires_grad) {
    return mismatch("requires_grad", p.requires_grad ? "True" : "False",
                    q.requires_grad ? "True" : "False");
  }
  if (p.pin_memory != q.pin_memory) {
    return mismatch("pin_memory", p.pin_memory ? "True" : "False",
                    q.pin_memory ? "True" : "False");
  }
  return absl::OkStatus();
}

}  // namespace

// Factories share one path; only the way a local shard is filled differs.
class ShardedTensorBuilder {
 public:
  static absl::StatusOr<ShardedTensor> Create(
      const ShardingSpec& spec, absl::Span<const int64_t> sizes,
      const ShardedTensorOptions& options, const ShardFactory& make) {
    ASSIGN_OR_RETURN(Context context, ResolveRankAndGroup(options));
    RETURN_IF_ERROR(ValidateFormat(options.layout, options.memory_format));
    TensorProperties properties;
    properties.dtype = options.dtype;
    properties.layout = options.layout;
    properties.requires_grad = options.requires_grad;
    properties.memory_format = options.memory_format;
    properties.pin_memory = options.pin_memory;
    ASSIGN_OR_RETURN(ShardedTensorMetadata metadata,
                     BuildMetadata(spec, sizes, properties));
    ASSIGN_OR_RETURN(auto placements, ResolvePlacements(context, metadata));
    if (options.init_rrefs) RETURN_IF_ERROR(ValidateRpc(*context.rank));

    auto state = std::make_shared<ShardedTensor::State>(spec);
    state->rank = context.rank;
    state->group = context.group;
    state->init_rrefs = options.init_rrefs;
    state->tensor_id = options.tensor_id;
    for (size_t i = 0; i < placements.size(); ++i) {
      if (placements[i].first != context.rank->rank()) continue;
      TensorOptions tensor_options;
      tensor_options.dtype = options.dtype;
      tensor_options.device = placements[i].second;
      tensor_options.pin_memory = options.pin_memory;
      tensor_options.requires_grad = options.requires_grad;
      ASSIGN_OR_RETURN(
          Tensor tensor,
          make(metadata.shards_metadata[i].shard_sizes(), tensor_options));
      state->local_shards.push_back(
          Shard{std::move(tensor), metadata.shards_metadata[i]});
    }
    state->metadata =
        std::make_shared<const ShardedTensorMetadata>(std::move(metadata));
    return Finish(std::move(state), placements);
  }

  // Registers the local shards and builds the remote ones: the last step of
  // every collective constructor.
  static absl::StatusOr<ShardedTensor> Finish(
      std::shared_ptr<ShardedTensor::State> state,
      const std::vector<std::pair<int, Device>>& placements) {
    Rank& rank = *state->rank;
    if (state->tensor_id.empty()) {
      state->tensor_id = rank.NextTensorId(*state->group);
    }
    for (const auto& placement : placements) {
      state->owners.push_back(placement.first);
    }
    if (state->init_rrefs) {
      ASSIGN_OR_RETURN(state->remote_shards,
                       BuildRemoteShards(rank, state->tensor_id,
                                         *state->metadata, placements));
    }
    auto registered = std::make_shared<RegisteredTensor>();
    registered->metadata = state->metadata;
    registered->local_shards.reserve(state->local_shards.size());
    size_t next_local = 0;
    for (size_t i = 0; i < placements.size(); ++i) {
      if (placements[i].first != rank.rank()) continue;
      registered->local_shards.push_back(LocalShard{
          static_cast<int64_t>(i), state->local_shards[next_local++].tensor});
    }
    RETURN_IF_ERROR(rank.registry().Register(state->tensor_id, registered));
    state->registered = true;
    // PyTorch's _init_rpc ends with a world-wide sync, so no rank fetches a
    // shard its owner has not registered yet. One barrier: O(W) messages.
    if (state->init_rrefs) RETURN_IF_ERROR(rank.Barrier());
    return ShardedTensor(std::move(state));
  }

  static absl::StatusOr<ShardedTensor> FromLocalShards(
      std::vector<Shard> local_shards, absl::Span<const int64_t> global_sizes,
      const ShardedTensorOptions& options) {
    ASSIGN_OR_RETURN(Context context, ResolveRankAndGroup(options));
    ProcessGroup& group = *context.group;
    if (!group.is_member()) {
      return absl::FailedPreconditionError(
          absl::StrCat("init_from_local_shards: rank ", context.rank->rank(),
                       " is not a member of process group ", group.name()));
    }
    // Local mistakes travel through the same all-gather as the metadata,
    // so every member fails together instead of waiting for the others.
    absl::StatusOr<ShardedTensorMetadata> mine =
        LocalMetadata(local_shards, global_sizes, group, context.rank->rank());
    ASSIGN_OR_RETURN(
        std::vector<std::string> gathered,
        AllGatherOutcomes(group, mine.ok() ? absl::StatusOr<std::string>(
                                                 SerializeMetadata(*mine))
                                           : mine.status()));
    // Each rank's shards are decoded straight into the global list, in
    // rank order (a million shards are never held twice).
    std::vector<RankShards> ranks;
    size_t total = 0;
    for (size_t r = 0; r < gathered.size(); ++r) {
      ASSIGN_OR_RETURN(PackedMetadata theirs,
                       PackedMetadata::Parse(gathered[r]));
      if (theirs.shard_count() == 0) continue;
      total += theirs.shard_count();
      ranks.push_back(RankShards{group.global_ranks()[r], std::move(theirs)});
    }
    if (ranks.empty()) {
      return absl::InvalidArgumentError(
          "ShardedTensor have no local shards on all ranks!");
    }
    ShardedTensorMetadata global = ranks.front().metadata.header();
    for (const RankShards& r : ranks) {
      RETURN_IF_ERROR(CompareRanks(ranks.front(), r));
    }
    global.shards_metadata.reserve(total);
    for (const RankShards& r : ranks) {
      RETURN_IF_ERROR(r.metadata.AppendShardsTo(&global.shards_metadata));
    }
    RETURN_IF_ERROR(ValidateTiling(global.shards_metadata, global.size));
    // Its spec is built from the metadata when first asked for.
    auto state = std::make_shared<ShardedTensor::State>();
    state->rank = context.rank;
    state->group = context.group;
    state->init_rrefs = options.init_rrefs;
    state->tensor_id = options.tensor_id;
    if (options.init_rrefs) RETURN_IF_ERROR(ValidateRpc(*context.rank));
    state->local_shards = std::move(local_shards);
    state->metadata =
        std::make_shared<const ShardedTensorMetadata>(std::move(global));
    std::vector<std::pair<int, Device>> placements;
    ASSIGN_OR_RETURN(placements, ResolvePlacements(context, *state->metadata));
    return Finish(std::move(state), placements);
  }

  static absl::StatusOr<ShardedTensor> FromLocalShardsAndGlobalMetadata(
      std::vector<Shard> local_shards, ShardedTensorMetadata metadata,
      const ShardedTensorOptions& options) {
    RETURN_IF_ERROR(ValidateFormat(metadata.tensor_properties.layout,
                                   metadata.tensor_properties.memory_format));
    RETURN_IF_ERROR(ValidateTiling(metadata.shards_metadata, metadata.size));
    for (const Shard& shard : local_shards) RETURN_IF_ERROR(shard.Validate());
    auto state = std::make_shared<ShardedTensor::State>();
    state->init_rrefs = options.init_rrefs;
    state->tensor_id = options.tensor_id;
    std::shared_ptr<Rank> rank =
        options.rank != nullptr ? options.rank : DefaultRank();
    if (rank == nullptr) {
      // No process group: every shard of the metadata is local (PyTorch's
      // no-process-group mode), and nothing is served.
      RETURN_IF_ERROR(MatchLocalShards(local_shards, metadata, [](size_t) {
                        return true;
                      }).status());
      state->local_shards = std::move(local_shards);
      state->metadata =
          std::make_shared<const ShardedTensorMetadata>(std::move(metadata));
      return ShardedTensor(std::move(state));
    }
    ASSIGN_OR_RETURN(Context context, ResolveRankAndGroup(options));
    if (options.init_rrefs) RETURN_IF_ERROR(ValidateRpc(*rank));
    ASSIGN_OR_RETURN(auto placements, ResolvePlacements(context, metadata));
    ASSIGN_OR_RETURN(std::vector<Shard> ordered,
                     MatchLocalShards(local_shards, metadata, [&](size_t i) {
                       return placements[i].first == rank->rank();
                     }));
    state->rank = context.rank;
    state->group = context.group;
    state->local_shards = std::move(ordered);
    state->metadata =
        std::make_shared<const ShardedTensorMetadata>(std::move(metadata));
    return Finish(std::move(state), placements);
  }

  static absl::StatusOr<ShardedTensor> FromLocalTensor(
      Tensor local_tensor, const ShardingSpec& spec,
      absl::Span<const int64_t> global_sizes,
      const ShardedTensorOptions& options) {
    if (!local_tensor.is_contiguous()) {
      return absl::InvalidArgumentError(
          "local_tensor is not a contiguous Tensor.");
    }
    TensorProperties properties;
    properties.dtype = local_tensor.dtype();
    properties.requires_grad = local_tensor.requires_grad();
    properties.pin_memory = local_tensor.is_pinned();
    ASSIGN_OR_RETURN(ShardedTensorMetadata metadata,
                     BuildMetadata(spec, global_sizes, properties));
    ASSIGN_OR_RETURN(Context context, ResolveRankAndGroup(options));
    ASSIGN_OR_RETURN(auto placements, ResolvePlacements(context, metadata));
    std::vector<Shard> local_shards;
    for (size_t i = 0; i < placements.size(); ++i) {
      if (placements[i].first != context.rank->rank()) continue;
      ASSIGN_OR_RETURN(Shard shard, Shard::Create(local_tensor,
                                                  metadata.shards_metadata[i]));
      local_shards.push_back(std::move(shard));
    }
    return WithSpec(std::move(local_shards), std::move(metadata), spec,
                    options);
  }

  static absl::StatusOr<ShardedTensor> WithSpec(
      std::vector<Shard> local_shards, ShardedTensorMetadata metadata,
      ShardingSpec spec, const ShardedTensorOptions& options) {
    ASSIGN_OR_RETURN(ShardedTensor st, FromLocalShardsAndGlobalMetadata(
                                           std::move(local_shards),
                                           std::move(metadata), options));
    st.state_->SetSpec(std::move(spec));
    return st;
  }

  // Pairs each local shard with the shard of `metadata` it claims to be,
  // among those `is_local` selects, and returns the local shards in
  // metadata order (as Finish expects). Every selected shard must be given
  // once, with the metadata's dtype. One hash lookup per shard, so large
  // layouts stay linear.
  static absl::StatusOr<std::vector<Shard>> MatchLocalShards(
      const std::vector<Shard>& local_shards,
      const ShardedTensorMetadata& metadata,
      const std::function<bool(size_t)>& is_local) {
    const auto& shards = metadata.shards_metadata;
    // ToString is the whole identity (offsets, sizes, placement).
    absl::flat_hash_map<std::string, std::vector<size_t>> unclaimed;
    size_t expected = 0;
    for (size_t i = 0; i < shards.size(); ++i) {
      if (!is_local(i)) continue;
      unclaimed[shards[i].ToString()].push_back(i);
      ++expected;
    }
    if (local_shards.size() != expected) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Number of local shards (", local_shards.size(),
          ") does not match the number of shards placed on this rank in "
          "global metadata (",
          expected, ")"));
    }
    std::vector<const Shard*> by_index(shards.size(), nullptr);
    for (const Shard& shard : local_shards) {
      auto it = unclaimed.find(shard.metadata.ToString());
      if (it == unclaimed.end() || it->second.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("Local shard ", shard.metadata.ToString(),
                         " is not in the global metadata (among the shards "
                         "placed on this rank)"));
      }
      if (shard.tensor.dtype() != metadata.tensor_properties.dtype) {
        return absl::InvalidArgumentError(absl::StrCat(
            "Local shard tensor dtype ", DTypeName(shard.tensor.dtype()),
            " does not match the global metadata's dtype ",
            DTypeName(metadata.tensor_properties.dtype)));
      }
      by_index[it->second.back()] = &shard;
      it->second.pop_back();
    }
    std::vector<Shard> ordered;
    ordered.reserve(expected);
    for (const Shard* shard : by_index) {
      if (shard != nullptr) ordered.push_back(*shard);
    }
    return ordered;
  }

  static ShardedTensorOptions OptionsOf(const ShardedTensor& other,
                                        std::optional<DType> dtype) {
    const TensorProperties& p = other.metadata().tensor_properties;
    ShardedTensorOptions options;
    options.dtype = dtype.value_or(p.dtype);
    options.layout = p.layout;
    options.requires_grad = p.requires_grad;
    options.pin_memory = p.pin_memory;
    options.memory_format = p.memory_format;
    options.process_group = other.process_group();
    options.rank = other.rank();
    options.init_rrefs = other.state_->init_rrefs;
    return options;
  }
};

absl::StatusOr<ShardedTensor> ShardedTensor::InitFromLocalShards(
    std::vector<Shard> local_shards, absl::Span<const int64_t> global_sizes,
    const ShardedTensorOptions& options) {
  return ShardedTensorBuilder::FromLocalShards(std::move(local_shards),
                                               global_sizes, options);
}

absl::StatusOr<ShardedTensor> ShardedTensor::InitFromLocalTensor(
    Tensor local_tensor, const ShardingSpec& spec,
    absl::Span<const int64_t> global_sizes,
    const ShardedTensorOptions& options) {
  return ShardedTensorBuilder::FromLocalTensor(std::move(local_tensor), spec,
                                               global_sizes, options);
}

absl::StatusOr<ShardedTensor>
ShardedTensor::InitFromLocalShardsAndGlobalMetadata(
    std::vector<Shard> local_shards, ShardedTensorMetadata metadata,
    const ShardedTensorOptions& options) {
  return ShardedTensorBuilder::FromLocalShardsAndGlobalMetadata(
      std::move(local_shards), std::move(metadata), options);
}

absl::StatusOr<ShardedTensor> ShardedTensor::InitFromLocalShardsWithSpec(
    std::vector<Shard> local_shards, ShardedTensorMetadata metadata,
    ShardingSpec spec, const ShardedTensorOptions& options) {
  return ShardedTensorBuilder::WithSpec(
      std::move(local_shards), std::move(metadata), std::move(spec), options);
}

absl::Status ShardedTensor::ReplaceShards(std::vector<Shard> local_shards,
                                          ShardedTensorMetadata metadata,
                                          ShardingSpec spec) {
  ASSIGN_OR_RETURN(
      ShardedTensor replacement,
      ShardedTensorBuilder::WithSpec(
          std::move(local_shards), std::move(metadata), std::move(spec),
          ShardedTensorBuilder::OptionsOf(*this, std::nullopt)));
  state_->Swap(*replacement.state_);
  return absl::OkStatus();
}

absl::StatusOr<ShardedTensor> ShardedTensor::Empty(
    const ShardingSpec& spec, absl::Span<const int64_t> sizes,
    const ShardedTensorOptions& options) {
  return ShardedTensorBuilder::Create(spec, sizes, options, Tensor::Empty);
}

absl::StatusOr<ShardedTensor> ShardedTensor::Zeros(
    const ShardingSpec& spec, absl::Span<const int64_t> sizes,
    const ShardedTensorOptions& options) {
  return ShardedTensorBuilder::Create(spec, sizes, options, Tensor::Zeros);
}

absl::StatusOr<ShardedTensor> ShardedTensor::Ones(
    const ShardingSpec& spec, absl::Span<const int64_t> sizes,
    const ShardedTensorOptions& options) {
  return ShardedTensorBuilder::Create(spec, sizes, options, Tensor::Ones);
}

absl::StatusOr<ShardedTensor> ShardedTensor::Full(
    const ShardingSpec& spec, absl::Span<const int64_t> sizes,
    double fill_value, const ShardedTensorOptions& options) {
  return ShardedTensorBuilder::Create(
      spec, sizes, options,
      [fill_value](absl::Span<const int64_t> s, const TensorOptions& o) {
        return Tensor::Full(s, fill_value, o);
      });
}

absl::StatusOr<ShardedTensor> ShardedTensor::Rand(
    const ShardingSpec& spec, absl::Span<const int64_t> sizes,
    const ShardedTensorOptions& options, Generator* generator) {
  return ShardedTensorBuilder::Create(
      spec, sizes, options,
      [generator](absl::Span<const int64_t> s, const TensorOptions& o) {
        return Tensor::Rand(s, o, generator);
      });
}

absl::StatusOr<ShardedTensor> ShardedTensor::Randn(
    const ShardingSpec& spec, absl::Span<const int64_t> sizes,
    const ShardedTensorOptions& options, Generator* generator) {
  return ShardedTensorBuilder::Create(
      spec, sizes, options,
      [generator](absl::Span<const int64_t> s, const TensorOptions& o) {
        return Tensor::Randn(s, o, generator);
      });
}

absl::StatusOr<ShardedTensor> ShardedTensor::EmptyLike(
    const ShardedTensor& other, std::optional<DType> dtype) {
  return Empty(other.sharding_spec(), other.size(),
               ShardedTensorBuilder::OptionsOf(other, dtype));
}

absl::StatusOr<ShardedTensor> ShardedTensor::ZerosLike(
    const ShardedTensor& other, std::optional<DType> dtype) {
  return Zeros(other.sharding_spec(), other.size(),
               ShardedTensorBuilder::OptionsOf(other, dtype));
}

absl::StatusOr<ShardedTensor> ShardedTensor::OnesLike(
    const ShardedTensor& other, std::optional<DType> dtype) {
  return Ones(other.sharding_spec(), other.size(),
              ShardedTensorBuilder::OptionsOf(other, dtype));
}

absl::StatusOr<ShardedTensor> ShardedTensor::FullLike(
    const ShardedTensor& other, double fill_value, std::optional<DType> dtype) {
  return Full(other.sharding_spec(), other.size(), fill_value,
              ShardedTensorBuilder::OptionsOf(other, dtype));
}

absl::StatusOr<ShardedTensor> ShardedTensor::RandLike(
    const ShardedTensor& other, std::optional<DType> dtype,
    Generator* generator) {
  return Rand(other.sharding_spec(), other.size(),
              ShardedTensorBuilder::OptionsOf(other, dtype), generator);
}

absl::StatusOr<ShardedTensor> ShardedTensor::RandnLike(
    const ShardedTensor& other, std::optional<DType> dtype,
    Generator* generator) {
  return Randn(other.sharding_spec(), other.size(),
               ShardedTensorBuilder::OptionsOf(other, dtype), generator);
}

const std::vector<int64_t>& ShardedTensor::size() const {
  return state_->metadata->size;
}

absl::StatusOr<int64_t> ShardedTensor::size(int64_t d) const {
  ASSIGN_OR_RETURN(const int64_t wrapped,
                   WrapDim(d, dim(), /*wrap_scalar=*/false));
  return size()[wrapped];
}

DType ShardedTensor::dtype() const {
  return state_->metadata->tensor_properties.dtype;
}
Layout ShardedTensor::layout() const {
  return state_->metadata->tensor_properties.layout;
}
bool ShardedTensor::requires_grad() const {
  return state_->metadata->tensor_properties.requires_grad;
}
bool ShardedTensor::is_pinned() const {
  return state_->metadata->tensor_properties.pin_memory;
}

Device ShardedTensor::device() const {
  if (state_->local_shards.empty()) return Device::Cpu();
  return state_->local_shards.front().tensor.device();
}

const ShardedTensorMetadata& ShardedTensor::metadata() const {
  return *state_->metadata;
}
const ShardingSpec& ShardedTensor::sharding_spec() const {
  return state_->Spec();
}
const std::vector<Shard>& ShardedTensor::local_shards() const {
  return state_->local_shards;
}

absl::StatusOr<Tensor> ShardedTensor::local_tensor() const {
  if (state_->local_shards.size() != 1) {
    return absl::UnimplementedError("Only single local shard is supported.");
  }
  return state_->local_shards.front().tensor;
}

absl::StatusOr<RemoteShardMap> ShardedTensor::remote_shards() const {
  if (!state_->init_rrefs) {
    return absl::FailedPreconditionError(
        "ShardedTensor created with init_rrefs=False, no RRefs to remote "
        "shards available");
  }
  return state_->remote_shards;
}

absl::Status ShardedTensor::Gather(int dst, const Tensor& out) const {
  const int my_rank = state_->rank != nullptr ? state_->rank->rank() : -1;
  RETURN_IF_ERROR(ValidateGatherOutput(my_rank, dst, size(), dtype(), out));
  ShardedGather gather(GatherSource{
      state_->rank, state_->group, state_->tensor_id, state_->metadata,
      state_->local_shards, state_->owners, state_->registered});
  RETURN_IF_ERROR(gather.Prepare());
  std::optional<int> root = state_->group->GroupRank(dst);
  if (!root.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gather: dst rank ", dst, " is not in the process group ([",
        absl::StrJoin(state_->group->global_ranks(), ", "), "])"));
  }
  if (gather.Pulls(*root)) {
    // Every member registered its shards before calling (they are
    // registered when the tensor is made); the barrier says so. The others
    // then hold their shards until the root's outcome, which all return.
    RETURN_IF_ERROR(state_->group->Barrier());
    return AllGatherStatus(
        *state_->group, my_rank == dst ? gather.Pull(out) : absl::OkStatus());
  }
  ASSIGN_OR_RETURN(Tensor send, gather.PackLocal());
  // Every member sizes its buffers from the tensor's metadata, agreed
  // when the tensor was made: no plans to exchange first.
  if (my_rank != dst) return state_->group->GatherAgreed(send, {}, *root);
  ASSIGN_OR_RETURN(std::vector<Tensor> buffers, gather.Buffers(out));
  RETURN_IF_ERROR(state_->group->GatherAgreed(send, buffers, *root));
  return gather.Unpack(buffers, out);
}

absl::StatusOr<Tensor> ShardedTensor::GatherAll() const {
  ShardedGather gather(GatherSource{
      state_->rank, state_->group, state_->tensor_id, state_->metadata,
      state_->local_shards, state_->owners, state_->registered});
  RETURN_IF_ERROR(gather.Prepare());
  ASSIGN_OR_RETURN(Tensor send, gather.PackLocal());
  ASSIGN_OR_RETURN(
      Tensor out,
      Tensor::Empty(size(), TensorOptions().WithDType(dtype()).Private()));
  ASSIGN_OR_RETURN(std::vector<Tensor> buffers, gather.Buffers(out));
  RETURN_IF_ERROR(state_->group->AllGatherAgreed(send, buffers));
  RETURN_IF_ERROR(gather.Unpack(buffers, out));
  return out;
}

const std::string& ShardedTensor::tensor_id() const {
  return state_->tensor_id;
}
const std::shared_ptr<ProcessGroup>& ShardedTensor::process_group() const {
  return state_->group;
}
const std::shared_ptr<Rank>& ShardedTensor::rank() const {
  return state_->rank;
}
ShardedTensorOptions ShardedTensor::options() const {
  return ShardedTensorBuilder::OptionsOf(*this, std::nullopt);
}

}  // namespace tessera
