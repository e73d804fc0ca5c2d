#include "server/daemon/replication.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/region_transfer.h"
#include "client/shard_client.h"
#include "client/stall_watchdog.h"
#include "common/log_context.h"
#include "common/proto_convert.h"
#include "common/status_macros.h"
#include "server/daemon/agreement.h"
#include "spdlog/spdlog.h"
#include "wire/replicas.h"
#include "wire/version_id.h"

namespace tessera::control_internal {
namespace {

// A rebuilt tensor's ShardedTensor, with `shards` (this daemon's, possibly
// none) under the cluster's tensor id.
absl::StatusOr<ShardedTensor> RebuiltTensor(const std::shared_ptr<Rank>& rank,
                                            const v1::TensorInfo& info,
                                            ShardedTensorMetadata metadata,
                                            const v1::ShardingSpec& spec_proto,
                                            std::vector<Shard> shards) {
  const ShardedTensorOptions options =
      ShardedTensorOptions()
          .WithDType(metadata.tensor_properties.dtype)
          .WithRank(rank)
          .WithTensorId(info.tensor_id());
  if (spec_proto.spec_case() == v1::ShardingSpec::SPEC_NOT_SET) {
    return ShardedTensor::InitFromLocalShardsAndGlobalMetadata(
        std::move(shards), std::move(metadata), options);
  }
  ASSIGN_OR_RETURN(ShardingSpec spec, FromProto(spec_proto));
  return ShardedTensor::InitFromLocalShardsWithSpec(
      std::move(shards), std::move(metadata), std::move(spec), options);
}

}  // namespace

Replication::Replication(std::shared_ptr<Rank> rank,
                         std::shared_ptr<ProcessGroup> group,
                         std::shared_ptr<MemoryBudget> budget,
                         absl::Duration op_timeout, TensorTable* table)
    : rank_(std::move(rank)),
      group_(std::move(group)),
      budget_(std::move(budget)),
      op_timeout_(op_timeout),
      table_(table) {}

Replication::~Replication() { Shutdown(); }

void Replication::Shutdown() {
  std::vector<Running> refills;
  {
    absl::MutexLock lock(&mu_);
    refills.swap(refills_);
  }
  for (Running& refill : refills) refill.thread.join();
}

void Replication::StartRefillLocked(std::function<void()> body) {
  for (auto it = refills_.begin(); it != refills_.end();) {
    if (!it->finished->load()) {
      ++it;
      continue;
    }
    it->thread.join();  // Finished: returns at once.
    it = refills_.erase(it);
  }
  auto finished = std::make_shared<std::atomic<bool>>(false);
  std::thread thread([body = std::move(body), finished] {
    body();
    finished->store(true);
  });
  refills_.push_back(Running{std::move(thread), std::move(finished)});
}

std::shared_ptr<Refill> Replication::Refilling(
    const std::string& tensor_id) const {
  absl::MutexLock lock(&mu_);
  auto it = refilling_.find(tensor_id);
  return it == refilling_.end() ? nullptr : it->second;
}

std::vector<std::string> Replication::WorkerHosts() const {
  // The host part of each daemon's advertised address: what operators call
  // a host (a node's address). The local path's host id would not do: it
  // names the kernel, which network namespaces and containers on one
  // machine share although their addresses differ.
  std::vector<std::string> hosts;
  for (int r = 0; r < rank_->world_size(); ++r) {
    absl::StatusOr<WorkerInfo> worker = rank_->Worker(r);
    hosts.push_back(worker.ok()
                        ? worker->address.substr(0, worker->address.rfind(':'))
                        : absl::StrCat("rank ", r));  // unknown: a host alone
  }
  return hosts;
}

absl::StatusOr<std::shared_ptr<RegisteredTensor>> Replication::AllocateCopies(
    const v1::TensorInfo& info, const ShardedTensorMetadata& metadata,
    int64_t* host_bytes) const {
  auto copies = std::make_shared<RegisteredTensor>();
  copies->metadata = std::make_shared<const ShardedTensorMetadata>(metadata);
  *host_bytes = 0;
  const DType dtype = metadata.tensor_properties.dtype;
  for (int shard = 0; shard < info.replicas_size(); ++shard) {
    const auto& ranks = info.replicas(shard).ranks();
    if (std::find(ranks.begin(), ranks.end(), rank()) == ranks.end()) continue;
    const ShardMetadata& where = metadata.shards_metadata[shard];
    // Zeros, never older bytes of this daemon's memory, for copies that are
    // not filled from their owners (an empty tensor or version).
    ASSIGN_OR_RETURN(
        Tensor copy,
        Tensor::Zeros(where.shard_sizes(), TensorOptions().WithDType(dtype)));
    *host_bytes += static_cast<int64_t>(copy.nbytes());
    copies->local_shards.push_back(LocalShard{shard, std::move(copy)});
  }
  return copies;
}

absl::Status Replication::FetchFromHolders(
    const v1::TensorInfo& info, const std::vector<LocalShard>& shards,
    const std::set<int>& gone, absl::Time deadline) const {
  // The op's log context, for the lines the fetching threads log.
  const LogContext op = CurrentLogContext();
  return RunInParallel(shards.size(), 16, [&](size_t k) -> absl::Status {
    const LocalShard& local = shards[k];
    const int shard = static_cast<int>(local.index);
    std::vector<int> candidates;
    for (const int holder : HoldersOf(info, shard)) {
      if (holder != rank() && gone.count(holder) == 0) {
        candidates.push_back(holder);
      }
    }
    std::vector<std::string> tried;
    for (size_t c = 0; c < candidates.size(); ++c) {
      const int holder = candidates[c];
      const bool owner = holder == info.shard_ranks(shard);
      const std::string id =
          owner ? info.tensor_id() : ReplicaTensorId(info.tensor_id());
      FetchOptions options;
      options.timeout = std::max(deadline - absl::Now(), absl::ZeroDuration());
      absl::StatusOr<std::shared_ptr<ShardClient>> client =
          rank_->ClientFor(holder);
      const auto fetch = [&](const FetchOptions& watched) {
        return (*client)->FetchShardInto(id, shard, local.tensor, watched);
      };
      // A holder that moves nothing for the patience (stalled) is given up
      // for the next; the last one keeps the time left.
      absl::Status fetched =
          client.ok()
              ? FetchWatched(options,
                             c + 1 < candidates.size() ? kDefaultHolderPatience
                                                       : absl::ZeroDuration(),
                             fetch)
              : client.status();
      if (fetched.ok()) return absl::OkStatus();
      {
        LogContext about = op;
        about.tensor = info.name();
        about.peer = holder;
        const ScopedLogContext context(std::move(about));
        spdlog::warn("shard {} of tensor '{}' from rank {} ({}): {}", shard,
                     absl::CEscape(info.name()), holder,
                     owner ? "its owner" : "a replica", fetched.ToString());
      }
      tried.push_back(absl::StrCat(owner ? "owner" : "replica", " rank ",
                                   holder, ": ", fetched.ToString()));
    }
    return absl::UnavailableError(absl::StrCat(
        "no holder of shard ", shard, " of tensor ", info.name(),
        " could give it (",
        tried.empty() ? "none is left" : absl::StrJoin(tried, "; "), ")"));
  });
}

absl::StatusOr<Replication::PlacedCopies> Replication::PlaceCopies(
    v1::TensorInfo* info, const ShardedTensorMetadata& metadata,
    int copies) const {
  const std::vector<int> owners(info->shard_ranks().begin(),
                                info->shard_ranks().end());
  ASSIGN_OR_RETURN(std::vector<std::vector<int>> placed,
                   PlaceReplicas(owners, copies, WorkerHosts()));
  info->clear_replicas();
  for (const std::vector<int>& ranks : placed) {
    info->add_replicas()->mutable_ranks()->Add(ranks.begin(), ranks.end());
  }
  return CopiesFor(
      *info, metadata,
      absl::StrCat("replicas of \"", info->name(), "\" on rank ", rank()));
}

absl::StatusOr<Replication::PlacedCopies> Replication::CopiesFor(
    const v1::TensorInfo& info, const ShardedTensorMetadata& metadata,
    const std::string& what) const {
  // Reserved before anything is allocated.
  int64_t host_bytes = 0;
  for (int shard = 0; shard < info.replicas_size(); ++shard) {
    const auto& ranks = info.replicas(shard).ranks();
    if (std::find(ranks.begin(), ranks.end(), rank()) == ranks.end()) continue;
    const int64_t numel =
        CheckedProduct(metadata.shards_metadata[shard].shard_sizes())
            .value_or(std::numeric_limits<int64_t>::max());
    const int64_t element =
        static_cast<int64_t>(ElementSize(metadata.tensor_properties.dtype));
    host_bytes =
        numel > (std::numeric_limits<int64_t>::max() - host_bytes) / element
            ? std::numeric_limits<int64_t>::max()
            : host_bytes + numel * element;
  }
  PlacedCopies result;
  ASSIGN_OR_RETURN(result.held, budget_->Reserve(host_bytes, what));
  int64_t allocated = 0;
  ASSIGN_OR_RETURN(result.mine, AllocateCopies(info, metadata, &allocated));
  return result;
}

absl::Status Replication::Replicate(const std::string& name, int copies,
                                    const v1::CreateTensorRequest* init,
                                    bool* agreed) {
  absl::StatusOr<v1::TensorInfo> held_info = table_->Info(name);
  if (!held_info.ok()) return held_info.status();
  v1::TensorInfo info = *std::move(held_info);
  std::shared_ptr<ReplicaCopies> registered;
  absl::Status local = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(ShardedTensorMetadata metadata,
                     FromProto(info.metadata()));
    ASSIGN_OR_RETURN(PlacedCopies placed, PlaceCopies(&info, metadata, copies));
    std::shared_ptr<RegisteredTensor>& mine = placed.mine;
    MemoryBudget::Reservation& held = placed.held;
    const v1::InitKind kind =
        init != nullptr ? init->init() : v1::INIT_KIND_UNSPECIFIED;
    if (kind == v1::INIT_KIND_ZEROS || kind == v1::INIT_KIND_ONES ||
        kind == v1::INIT_KIND_FULL) {
      const double value = kind == v1::INIT_KIND_ZEROS  ? 0.0
                           : kind == v1::INIT_KIND_ONES ? 1.0
                                                        : init->fill_value();
      for (LocalShard& copy : mine->local_shards) {
        ASSIGN_OR_RETURN(
            Tensor filled,
            Tensor::Full(copy.tensor.sizes(), value,
                         TensorOptions().WithDType(copy.tensor.dtype())));
        copy.tensor = std::move(filled);
      }
    } else if (init == nullptr || kind == v1::INIT_KIND_RAND ||
               kind == v1::INIT_KIND_RANDN) {
      // From the owners, registered by now on every daemon (the op agreed
      // on the tensor before).
      RETURN_IF_ERROR(FetchFromHolders(info, mine->local_shards, {},
                                       absl::Now() + op_timeout_));
    }
    ASSIGN_OR_RETURN(registered,
                     ReplicaCopies::Register(rank_, info.tensor_id(),
                                             std::move(mine), std::move(held)));
    return absl::OkStatus();
  }();
  const absl::Status status = Agree(*group_, local, agreed);
  if (status.ok()) {
    table_
        ->Update(name,
                 [&](TableEntry& entry) {
                   entry.info = std::move(info);
                   // A versioned tensor's copies are version 1's: freed
                   // with it (version_set.h).
                   if (entry.versions != nullptr) {
                     entry.versions->SetCopies(1, std::move(registered));
                   } else {
                     entry.replicas = std::move(registered);
                   }
                 })
        .IgnoreError();  // Only the executor removes entries.
  }
  return status;
}

absl::StatusOr<std::shared_ptr<Refill>> Replication::RefillBuffers(
    const v1::TensorInfo& info, const ShardedTensorMetadata& metadata,
    int64_t* host_bytes) const {
  // The shards it owns (they survive on replicas: else they would be lost)
  // and its replicas of others', to refill.
  std::vector<LocalShard> own;
  for (int shard = 0; shard < info.shard_ranks_size(); ++shard) {
    if (info.shard_ranks(shard) != rank_->rank()) continue;
    const ShardMetadata& where = metadata.shards_metadata[shard];
    TensorOptions tensor_options =
        TensorOptions().WithDType(metadata.tensor_properties.dtype);
    if (where.placement().has_value()) {
      tensor_options = tensor_options.WithDevice(where.placement()->device());
    }
    ASSIGN_OR_RETURN(Tensor tensor,
                     Tensor::Empty(where.shard_sizes(), tensor_options));
    if (tensor.device().is_cpu()) {
      *host_bytes += static_cast<int64_t>(tensor.nbytes());
    }
    own.push_back(LocalShard{shard, std::move(tensor)});
  }
  std::shared_ptr<RegisteredTensor> copies;
  if (info.replicas_size() > 0) {
    int64_t copy_bytes = 0;
    ASSIGN_OR_RETURN(copies, AllocateCopies(info, metadata, &copy_bytes));
    *host_bytes += copy_bytes;
    if (copies->local_shards.empty()) copies.reset();
  }
  if (own.empty() && copies == nullptr) return nullptr;
  return std::make_shared<Refill>(std::move(own), std::move(copies));
}

absl::Status Replication::Rebuild(v1::TensorInfo info,
                                  const v1::ShardingSpec& spec_proto,
                                  const std::set<int>& starting,
                                  std::vector<v1::VersionPin> pins) {
  TableEntry entry;
  const bool mine_lost = std::any_of(
      info.lost_shards().begin(), info.lost_shards().end(), [&](int shard) {
        return shard < info.shard_ranks_size() &&
               info.shard_ranks(shard) == rank_->rank();
      });
  // What to refill: the tensor, or each kept version of a versioned one
  // (docs/versions.md; open versions are not: their publish fails).
  std::vector<RefillPart> parts;
  if (!mine_lost) {
    ASSIGN_OR_RETURN(ShardedTensorMetadata metadata,
                     FromProto(info.metadata()));
    std::vector<int64_t> numbers = {0};
    if (Versioned(info)) {
      numbers.assign(info.kept_versions().begin(), info.kept_versions().end());
    }
    for (const int64_t number : numbers) {
      RefillPart part;
      part.number = number;
      int64_t host_bytes = 0;
      ASSIGN_OR_RETURN(part.refill, RefillBuffers(info, metadata, &host_bytes));
      if (part.refill != nullptr) {
        // Each version also holds its own copy of the metadata.
        if (number != 0) {
          host_bytes += VersionMetadataBytes(metadata.shards_metadata.size());
        }
        ASSIGN_OR_RETURN(
            part.held,
            budget_->Reserve(
                host_bytes,
                number == 0
                    ? absl::StrCat("refilling \"", info.name(), "\" on rank ",
                                   rank())
                    : absl::StrCat("refilling version ", number, " of \"",
                                   info.name(), "\" on rank ", rank())));
      }
      parts.push_back(std::move(part));
    }
    const bool nothing_here = std::all_of(
        parts.begin(), parts.end(),
        [](const RefillPart& part) { return part.refill == nullptr; });
    if (nothing_here) {
      // Nothing of it here: it takes part in the tensor's collectives (and
      // version ops) with nothing of its own.
      ASSIGN_OR_RETURN(std::shared_ptr<VersionSet> versions,
                       CompleteParts(info, spec_proto, pins, &parts));
      if (versions != nullptr) {
        entry.tensor = versions->Latest();
        entry.versions = std::move(versions);
      } else {
        entry.tensor = *std::move(parts[0].tensor);
      }
      parts.clear();
    } else {
      // The latest version's refill marks the entry as refilling (ops on it
      // are UNAVAILABLE, reads skip this daemon's shards) until every part
      // completes.
      // (Every version has the same shards here.)
      entry.refill = parts.back().refill;
      if (!Versioned(info)) entry.held = std::move(parts[0].held);
    }
  }
  const std::shared_ptr<Refill> refill = entry.refill;
  // The cluster admitted its metadata on every daemon: held here too,
  // whatever is left.
  entry.metadata = budget_->Charge(
      EntryMetadataBytes(info.metadata().shards_metadata_size()));
  entry.info = info;
  // In the table before the refill starts, so that its completion finds
  // the entry.
  table_->Put(info.name(), std::move(entry));
  if (refill != nullptr) {
    absl::MutexLock lock(&mu_);
    if (!Versioned(info)) refilling_[info.tensor_id()] = refill;
    StartRefillLocked(
        [this, info, spec_proto, starting, refill,
         parts = std::make_shared<std::vector<RefillPart>>(std::move(parts)),
         pins = std::move(pins)]() mutable {
          RunRefill(info, spec_proto, starting, refill, std::move(*parts),
                    std::move(pins));
        });
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<VersionSet>> Replication::CompleteParts(
    const v1::TensorInfo& info, const v1::ShardingSpec& spec,
    const std::vector<v1::VersionPin>& pins,
    std::vector<RefillPart>* parts) const {
  const bool versioned = Versioned(info);
  std::shared_ptr<VersionSet> versions;
  if (versioned) {
    versions = std::make_shared<VersionSet>(
        rank_, info.name(), info.tensor_id(), info.versions_kept());
  }
  // The newest first: the registry maps the tensor's id to the highest
  // version published, so from the first AddPublished on, reads of the
  // latest find the latest (oldest first, they found each older version
  // in turn while the others were being added).
  for (auto it = parts->rbegin(); it != parts->rend(); ++it) {
    RefillPart& part = *it;
    // Each version under its own id (version_set.h).
    v1::TensorInfo of = info;
    of.set_tensor_id(RegistrationId(info.tensor_id(), part.number));
    ASSIGN_OR_RETURN(ShardedTensorMetadata metadata, FromProto(of.metadata()));
    std::vector<Shard> shards;
    std::shared_ptr<ReplicaCopies> copies;
    if (part.refill != nullptr) {
      for (const LocalShard& local : part.refill->own()) {
        shards.push_back(
            Shard{local.tensor, metadata.shards_metadata[local.index]});
      }
      if (part.refill->copies() != nullptr) {
        ASSIGN_OR_RETURN(copies,
                         ReplicaCopies::Register(rank_, of.tensor_id(),
                                                 part.refill->copies(),
                                                 MemoryBudget::Reservation()));
      }
    }
    ASSIGN_OR_RETURN(
        ShardedTensor tensor,
        RebuiltTensor(rank_, of, std::move(metadata), spec, std::move(shards)));
    if (versioned) {
      versions->AddPublished(part.number, std::move(tensor), std::move(copies),
                             std::move(part.held), info.next_version());
    } else {
      part.tensor = std::move(tensor);
      part.copies = std::move(copies);
    }
  }
  if (versions != nullptr) {
    const absl::Time now = absl::Now();
    for (const v1::VersionPin& pin : pins) {
      versions->Pin(pin.id(), pin.number(),
                    now + absl::Milliseconds(pin.lease_left_ms()),
                    absl::Milliseconds(pin.renewal_ms()));
    }
  }
  return versions;
}

void Replication::RunRefill(v1::TensorInfo info, v1::ShardingSpec spec,
                            std::set<int> starting,
                            std::shared_ptr<Refill> refill,
                            std::vector<RefillPart> parts,
                            std::vector<v1::VersionPin> pins) {
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + op_timeout_;
  const bool versioned = Versioned(info);
  absl::Status status;
  int64_t shards = 0;
  int64_t copies = 0;
  for (auto it = parts.begin(); it != parts.end() && status.ok();) {
    const RefillPart& part = *it;
    if (part.refill == nullptr) {
      ++it;
      continue;
    }
    // A version's shards and copies are fetched by its id.
    v1::TensorInfo of = info;
    if (versioned) of.set_tensor_id(VersionId(info.tensor_id(), part.number));
    absl::Status fetched =
        FetchFromHolders(of, part.refill->own(), starting, deadline);
    if (fetched.ok() && part.refill->copies() != nullptr) {
      fetched = FetchFromHolders(of, part.refill->copies()->local_shards,
                                 starting, deadline);
    }
    if (!fetched.ok() && versioned && std::next(it) != parts.end()) {
      // An older version the others may have freed meanwhile (its pin
      // ended): this daemon goes on without it, its readers read it from
      // the other holders while it is kept.
      spdlog::warn("control: version {} of tensor {} is not refilled: {}",
                   part.number, info.name(), fetched.ToString());
      it = parts.erase(it);
      continue;
    }
    status = fetched;
    shards += static_cast<int64_t>(part.refill->own().size());
    if (part.refill->copies() != nullptr) {
      copies +=
          static_cast<int64_t>(part.refill->copies()->local_shards.size());
    }
    ++it;
  }
  if (status.ok()) {
    // Writes (of an unversioned tensor: a published version takes none)
    // that arrived meanwhile are replayed before the buffers are
    // registered.
    status = refill->Complete([&]() -> absl::Status {
      for (RefillPart& part : parts) {
        if (part.refill != nullptr && part.refill != refill) {
          RETURN_IF_ERROR(
              part.refill->Complete([] { return absl::OkStatus(); }));
        }
      }
      ASSIGN_OR_RETURN(std::shared_ptr<VersionSet> versions,
                       CompleteParts(info, spec, pins, &parts));
      if (versions != nullptr) {
        ShardedTensor latest = versions->Latest();
        table_->CompleteRefill(info.name(), refill, std::move(latest), nullptr,
                               std::move(versions));
      } else {
        table_->CompleteRefill(info.name(), refill, *std::move(parts[0].tensor),
                               std::move(parts[0].copies), nullptr);
      }
      return absl::OkStatus();
    });
  }
  {
    // Done either way: later writes find the registered shards, or (after
    // a failure) are refused as for a shard this daemon does not hold.
    absl::MutexLock lock(&mu_);
    auto it = refilling_.find(info.tensor_id());
    if (it != refilling_.end() && it->second == refill) refilling_.erase(it);
  }
  if (status.ok()) {
    spdlog::info(
        "control: refilled tensor {} ({} versions, {} shards, {} "
        "replicas) in {}",
        info.name(), versioned ? parts.size() : 0, shards, copies,
        absl::FormatDuration(absl::Now() - start));
    return;
  }
  spdlog::error("control: refilling tensor {} failed: {}", info.name(),
                status.ToString());
  table_->FailRefill(info.name(), refill, status.ToString());
}

void Replication::RefillStale(const std::string& tensor_id,
                              std::function<void(bool refilled)> done) {
  const std::optional<std::string> name = table_->NameOf(tensor_id);
  absl::StatusOr<v1::TensorInfo> info =
      name.has_value() ? table_->Info(*name)
                       : absl::NotFoundError("no such tensor id");
  if (!info.ok() || Versioned(*info) || info->replicas_size() == 0) {
    done(true);  // Gone, or nothing a writer marks: nothing to refill.
    return;
  }
  if (Refilling(tensor_id) != nullptr) {
    done(false);  // A restart's refill is running: after it.
    return;
  }
  absl::StatusOr<ShardedTensorMetadata> metadata = FromProto(info->metadata());
  int64_t host_bytes = 0;
  absl::StatusOr<std::shared_ptr<Refill>> refill =
      metadata.ok()
          ? RefillBuffers(*info, *metadata, &host_bytes)
          : absl::StatusOr<std::shared_ptr<Refill>>(metadata.status());
  absl::StatusOr<MemoryBudget::Reservation> held =
      refill.ok()
          ? budget_->Reserve(host_bytes,
                             absl::StrCat("refilling the stale copy of \"",
                                          info->name(), "\" on rank ", rank()))
          : absl::StatusOr<MemoryBudget::Reservation>(refill.status());
  if (!held.ok()) {
    spdlog::error("control: cannot refill the stale copy of tensor {}: {}",
                  info->name(), held.status().ToString());
    done(false);
    return;
  }
  if (*refill == nullptr) {
    done(true);
    return;
  }
  absl::MutexLock lock(&mu_);
  refilling_[tensor_id] = *refill;
  StartRefillLocked([this, info = *std::move(info), refill = *refill,
                     held = std::make_shared<MemoryBudget::Reservation>(
                         *std::move(held)),
                     done = std::move(done)]() mutable {
    const absl::Time start = absl::Now();
    const absl::Time deadline = start + op_timeout_;
    absl::Status status = FetchFromHolders(info, refill->own(), {}, deadline);
    if (status.ok() && refill->copies() != nullptr) {
      status =
          FetchFromHolders(info, refill->copies()->local_shards, {}, deadline);
    }
    if (status.ok()) {
      // Over the registered bytes, the writes meanwhile replayed first.
      status = refill->Complete([&]() -> absl::Status {
        const auto copy_over = [&](const std::string& id,
                                   const std::vector<LocalShard>& fresh) {
          const std::shared_ptr<const RegisteredTensor> registered =
              rank_->registry().Find(id);
          for (const LocalShard& local : fresh) {
            const LocalShard* mine = registered != nullptr
                                         ? registered->FindShard(local.index)
                                         : nullptr;
            if (mine == nullptr) {
              return absl::NotFoundError(absl::StrCat(
                  "shard ", local.index, " of ", id, " is not registered"));
            }
            const std::vector<int64_t> origin(local.tensor.dim(), 0);
            RETURN_IF_ERROR(CopyBox(local.tensor, origin, mine->tensor, origin,
                                    local.tensor.sizes()));
          }
          return absl::OkStatus();
        };
        RETURN_IF_ERROR(copy_over(info.tensor_id(), refill->own()));
        if (refill->copies() != nullptr) {
          RETURN_IF_ERROR(copy_over(ReplicaTensorId(info.tensor_id()),
                                    refill->copies()->local_shards));
        }
        return absl::OkStatus();
      });
    }
    {
      absl::MutexLock lock(&mu_);
      auto it = refilling_.find(info.tensor_id());
      if (it != refilling_.end() && it->second == refill) refilling_.erase(it);
    }
    if (status.ok()) {
      spdlog::info("control: refilled the stale copy of tensor {} in {}",
                   info.name(), absl::FormatDuration(absl::Now() - start));
    } else {
      spdlog::error("control: refilling the stale copy of tensor {} failed: {}",
                    info.name(), status.ToString());
    }
    done(status.ok());
  });
}

}  // namespace tessera::control_internal
