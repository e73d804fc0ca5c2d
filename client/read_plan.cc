#include "client/read_plan.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "client/cluster.h"
#include "client/region_transfer.h"
#include "common/region.h"
#include "common/status_macros.h"
#include "wire/replicas.h"
#include "wire/version_id.h"

namespace tessera {
namespace {

// Boxes of up to this many dimensions are cut without allocating.
constexpr size_t kMaxPlanRank = 8;
// Runs of a plan that planned again before giving up.
constexpr int kRunAttempts = 3;

bool Floating(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat64 ||
         dtype == DType::kFloat16 || dtype == DType::kBFloat16;
}

std::string Dims(absl::Span<const int64_t> dims) {
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
}

// Whether boxes a and b (offsets, sizes) share an element.
bool BoxesOverlap(absl::Span<const int64_t> a_offsets,
                  absl::Span<const int64_t> a_sizes,
                  absl::Span<const int64_t> b_offsets,
                  absl::Span<const int64_t> b_sizes) {
  for (size_t d = 0; d < a_sizes.size(); ++d) {
    if (a_sizes[d] == 0 || b_sizes[d] == 0) return false;
    if (a_offsets[d] + a_sizes[d] <= b_offsets[d] ||
        b_offsets[d] + b_sizes[d] <= a_offsets[d]) {
      return false;
    }
  }
  return true;
}

bool Retryable(const absl::Status& status) {
  return absl::IsNotFound(status) || absl::IsFailedPrecondition(status) ||
         absl::IsUnavailable(status);
}

}  // namespace

bool PlanCastAllowed(DType from, DType to) {
  return from == to || (Floating(from) && Floating(to));
}

ReadItem ReadItem::Box(std::string name, std::vector<int64_t> offsets,
                       Tensor out) {
  ReadItem item;
  ReadSource source;
  source.name = std::move(name);
  source.sizes = out.sizes();
  source.offsets = std::move(offsets);
  item.sources.push_back(std::move(source));
  item.out = std::move(out);
  return item;
}

absl::StatusOr<std::vector<PlanPiece>> PlanPieces(
    absl::Span<const PlannedTensor> tensors,
    absl::Span<const PlanTarget> targets) {
  std::vector<PlanPiece> pieces;
  for (size_t t = 0; t < targets.size(); ++t) {
    const PlanTarget& target = targets[t];
    const size_t rank = target.out_sizes.size();
    for (size_t s = 0; s < target.sources.size(); ++s) {
      const PlanSource& source = target.sources[s];
      if (source.tensor >= tensors.size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "item ", t, " source ", s, ": no tensor ", source.tensor));
      }
      const PlannedTensor& tensor = tensors[source.tensor];
      const std::string what =
          absl::StrCat("item ", t, ": box ", Dims(source.offsets), " + ",
                       Dims(source.sizes), " of tensor ", tensor.name);
      RETURN_IF_ERROR(ValidateRegion(source.offsets, source.sizes, tensor.sizes,
                                     absl::StrCat("tensor ", tensor.name),
                                     "tensor"));
      const std::vector<int64_t> out_offsets =
          source.out_offsets.empty() ? std::vector<int64_t>(rank, 0)
                                     : source.out_offsets;
      if (source.sizes.size() != rank || out_offsets.size() != rank) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": ", source.sizes.size(), " dims and ", out_offsets.size(),
            " out offsets for an out of ", rank, " dims"));
      }
      RETURN_IF_ERROR(ValidateRegion(out_offsets, source.sizes,
                                     target.out_sizes,
                                     absl::StrCat("out of item ", t), "out"));
      if (!PlanCastAllowed(tensor.dtype, target.out_dtype)) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": tensor of ", DTypeName(tensor.dtype),
                         " into an out of ", DTypeName(target.out_dtype),
                         " (only floating types convert to one another)"));
      }
      for (size_t o = 0; o < s; ++o) {
        const PlanSource& other = target.sources[o];
        const std::vector<int64_t> other_offsets =
            other.out_offsets.empty() ? std::vector<int64_t>(rank, 0)
                                      : other.out_offsets;
        if (BoxesOverlap(out_offsets, source.sizes, other_offsets,
                         other.sizes)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "item ", t, ": sources ", o, " and ", s, " overlap in out (at ",
              Dims(other_offsets), " and ", Dims(out_offsets), ")"));
        }
      }
      const int64_t element = static_cast<int64_t>(ElementSize(tensor.dtype));
      for (size_t k = 0; k < tensor.shards.size(); ++k) {
        const ShardMetadata& shard = tensor.shards[k];
        const absl::Span<const int64_t> shard_offsets = shard.shard_offsets();
        const absl::Span<const int64_t> shard_sizes = shard.shard_sizes();
        if (shard_sizes.size() != rank) continue;
        int64_t lo[kMaxPlanRank];
        int64_t hi[kMaxPlanRank];
        bool empty = rank > kMaxPlanRank;
        for (size_t d = 0; d < rank && !empty; ++d) {
          lo[d] = std::max(shard_offsets[d], source.offsets[d]);
          hi[d] = std::min(shard_offsets[d] + shard_sizes[d],
                           source.offsets[d] + source.sizes[d]);
          empty = hi[d] <= lo[d];
        }
        if (empty && rank <= kMaxPlanRank) continue;
        PlanPiece& piece = pieces.emplace_back();
        piece.target = static_cast<uint32_t>(t);
        piece.tensor = source.tensor;
        piece.shard = static_cast<uint32_t>(k);
        piece.bytes = element;
        if (rank > kMaxPlanRank) {
          // Rare: more dimensions than the fast path holds.
          for (size_t d = 0; d < rank; ++d) {
            const int64_t l = std::max(shard_offsets[d], source.offsets[d]);
            const int64_t h = std::min(shard_offsets[d] + shard_sizes[d],
                                       source.offsets[d] + source.sizes[d]);
            if (h <= l) {
              pieces.pop_back();
              break;
            }
            piece.offsets_in_shard.push_back(l - shard_offsets[d]);
            piece.out_offsets.push_back(out_offsets[d] + l - source.offsets[d]);
            piece.sizes.push_back(h - l);
            piece.bytes *= h - l;
          }
          continue;
        }
        piece.offsets_in_shard.resize(rank);
        piece.out_offsets.resize(rank);
        piece.sizes.resize(rank);
        for (size_t d = 0; d < rank; ++d) {
          piece.offsets_in_shard[d] = lo[d] - shard_offsets[d];
          piece.out_offsets[d] = out_offsets[d] + lo[d] - source.offsets[d];
          piece.sizes[d] = hi[d] - lo[d];
          piece.bytes *= hi[d] - lo[d];
        }
      }
    }
  }
  return pieces;
}

namespace {

// INVALID_ARGUMENT when the outs of two items overlap in part, so that
// what a run leaves there would depend on which piece lands last. Checked
// for dense outs; strided ones (which may interleave, as the even and odd
// columns of one buffer) are the caller's to keep apart. Outs that are the
// same memory exactly are allowed: tied parameters (a language model's
// embedding and output weights) read from tensors that hold the same
// values.
absl::Status CheckOutsApart(const std::vector<ReadItem>& items) {
  struct Span {
    std::string device;
    uintptr_t lo = 0;
    uintptr_t hi = 0;
    size_t item = 0;
  };
  std::vector<Span> spans;
  for (size_t i = 0; i < items.size(); ++i) {
    const Tensor& out = items[i].out;
    if (out.numel() == 0 || !out.is_contiguous()) continue;
    const uintptr_t lo = reinterpret_cast<uintptr_t>(out.data_ptr());
    spans.push_back(Span{out.device().ToString(), lo, lo + out.nbytes(), i});
  }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return std::tie(a.device, a.lo) < std::tie(b.device, b.lo);
  });
  // Each span against the earlier one of its device that reaches furthest.
  for (size_t k = 1, far = 0; k < spans.size(); ++k) {
    const Span& a = spans[far];
    const Span& b = spans[k];
    const bool same = b.lo == a.lo && b.hi == a.hi;
    if (b.device == a.device && b.lo < a.hi && !same) {
      return absl::InvalidArgumentError(absl::StrCat(
          "planning reads: items ", std::min(a.item, b.item), " and ",
          std::max(a.item, b.item),
          " write the same memory (their outs overlap), so what it held "
          "after a run would depend on which piece landed last"));
    }
    if (b.device != a.device || b.hi > a.hi) far = k;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<ReadPlan>> ReadPlan::Make(
    std::shared_ptr<internal_client::Cluster> cluster, Control control,
    std::vector<ReadItem> items) {
  if (items.empty()) {
    return absl::InvalidArgumentError("planning reads: no items");
  }
  std::shared_ptr<ReadPlan> plan(new ReadPlan());
  plan->cluster_ = std::move(cluster);
  plan->control_ = std::move(control);
  // Each name once, in the order first seen (a state dict's plan has tens
  // of thousands).
  absl::flat_hash_set<absl::string_view> seen;
  for (size_t i = 0; i < items.size(); ++i) {
    const ReadItem& item = items[i];
    if (!item.out.defined() ||
        !(item.out.device().is_cpu() || item.out.device().is_cuda())) {
      return absl::InvalidArgumentError(
          absl::StrCat("planning reads: item ", i, ": out ",
                       item.out.DebugString(), " is not a CPU or CUDA tensor"));
    }
    if (item.sources.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("planning reads: item ", i, " has no source"));
    }
    for (const ReadSource& source : item.sources) {
      if (seen.insert(source.name).second) plan->names_.push_back(source.name);
    }
  }
  RETURN_IF_ERROR(CheckOutsApart(items));
  plan->items_ = std::move(items);
  absl::MutexLock lock(&plan->mu_);
  RETURN_IF_ERROR(plan->Plan());
  return plan;
}

absl::Status ReadPlan::Plan() {
  ASSIGN_OR_RETURN(views_, control_.open(names_));
  absl::flat_hash_map<std::string, uint32_t> index;
  std::vector<PlannedTensor> tensors(views_.size());
  for (size_t t = 0; t < views_.size(); ++t) {
    index[views_[t].name()] = static_cast<uint32_t>(t);
    tensors[t].name = views_[t].name();
    tensors[t].dtype = views_[t].dtype();
    tensors[t].sizes = views_[t].sizes();
    tensors[t].shards = views_[t].metadata().shards_metadata;
  }
  std::vector<PlanTarget> targets(items_.size());
  for (size_t i = 0; i < items_.size(); ++i) {
    targets[i].out_sizes = items_[i].out.sizes();
    targets[i].out_dtype = items_[i].out.dtype();
    for (const ReadSource& source : items_[i].sources) {
      targets[i].sources.push_back({index.at(source.name), source.offsets,
                                    source.sizes, source.out_offsets});
    }
  }
  absl::StatusOr<std::vector<PlanPiece>> planned = PlanPieces(tensors, targets);
  RETURN_IF_ERROR(Annotate(planned.status(), "planning reads"));
  std::vector<PlanPiece> pieces = *std::move(planned);
  // Lost shards (their owner restarted, no replica) cannot be read.
  for (const PlanPiece& piece : pieces) {
    const ShardedTensorView& view = views_[piece.tensor];
    if (!view.degraded()) continue;
    const auto& lost = view.info().lost_shards();
    if (std::find(lost.begin(), lost.end(), static_cast<int>(piece.shard)) !=
        lost.end()) {
      return absl::UnavailableError(absl::StrCat(
          "planning reads: tensor ", view.name(), " is degraded: shard ",
          piece.shard, " of rank ", view.owner_rank(piece.shard),
          " was lost when its owner restarted; load it from a checkpoint (with "
          "replace) or delete it"));
    }
  }
  std::vector<Tensor> out_views;
  out_views.reserve(pieces.size());
  for (const PlanPiece& piece : pieces) {
    ASSIGN_OR_RETURN(Tensor view, RegionView(items_[piece.target].out,
                                             piece.out_offsets, piece.sizes));
    out_views.push_back(std::move(view));
  }
  // Fetch order: the owners' pieces interleaved, so that the first ones
  // started reach every daemon.
  std::map<int, std::vector<size_t>> by_owner;
  for (size_t p = 0; p < pieces.size(); ++p) {
    by_owner[views_[pieces[p].tensor].owner_rank(pieces[p].shard)].push_back(p);
  }
  std::vector<size_t> order;
  order.reserve(pieces.size());
  for (size_t k = 0; order.size() < pieces.size(); ++k) {
    for (const auto& [rank, list] : by_owner) {
      if (k < list.size()) order.push_back(list[k]);
    }
  }
  // Pieces of small host shards (owners lend none over the local path:
  // each would be a data-plane round trip): Fetch asks their owner for
  // them in pipelined batches.
  std::vector<bool> pipelined(pieces.size());
  for (size_t p = 0; p < pieces.size(); ++p) {
    const ShardedTensorView& view = views_[pieces[p].tensor];
    const int64_t shard_bytes =
        HostShardBytes(view.info().metadata(), pieces[p].shard);
    pipelined[p] =
        shard_bytes >= 0 && shard_bytes < cluster_->options().local_min_bytes;
  }
  // Pieces of a CUDA shard whose owner runs on this host, bound for a
  // dense run of a CUDA out of the tensor's dtype: the local path copies
  // them into it from the owner's memory (CUDA IPC), device to device.
  // Through host staging instead, 128 tensors of 2048 x 1024 float32 over
  // 4 daemons read (half of each) at 1.8-2.0 GB/s on an H200, in place
  // at 4.7 GB/s (tests/bench/gpu_bench.cc, plan_run). Pieces that come
  // over a stream keep the staging: their in-place landing (pinned slots,
  // a CUDA stream per piece) was not measured to be faster.
  std::vector<bool> in_place(pieces.size());
  const bool local = cluster_->options().use_local_path;
  for (size_t p = 0; p < pieces.size() && local; ++p) {
    const ShardedTensorView& view = views_[pieces[p].tensor];
    const Tensor& out = out_views[p];
    if (!out.device().is_cuda() || !out.is_contiguous() ||
        out.dtype() != view.dtype() || pipelined[p]) {
      continue;
    }
    const v1::ShardedTensorMetadata& metadata = view.info().metadata();
    if (pieces[p].shard >=
            static_cast<size_t>(metadata.shards_metadata_size()) ||
        metadata.shards_metadata(static_cast<int>(pieces[p].shard))
                .placement()
                .device()
                .type() != v1::DEVICE_TYPE_CUDA) {
      continue;
    }
    absl::StatusOr<std::shared_ptr<const internal_client::Worker>> owner =
        cluster_->worker(view.owner_rank(pieces[p].shard));
    in_place[p] = owner.ok() && (*owner)->shards->same_host();
  }
  // Versioned tensors numbered alike: a group begun and published
  // together.
  bool aligned = true;
  const ShardedTensorView* first = nullptr;
  for (const ShardedTensorView& view : views_) {
    if (!view.versioned()) continue;
    if (first == nullptr) {
      first = &view;
    } else if (view.version() != first->version() ||
               view.info().next_version() != first->info().next_version()) {
      aligned = false;
    }
  }
  pieces_ = std::move(pieces);
  out_views_ = std::move(out_views);
  pipelined_ = std::move(pipelined);
  in_place_ = std::move(in_place);
  order_ = std::move(order);
  aligned_ = aligned;
  stale_ = false;
  ++plans_;
  return absl::OkStatus();
}

absl::Status ReadPlan::Fetch(const std::vector<size_t>& which,
                             const std::vector<std::string>& ids,
                             const TransferOptions& options,
                             absl::Time deadline,
                             std::vector<int64_t>* versions,
                             int64_t* bytes) const {
  std::atomic<int64_t> moved{0};
  ProgressCounter progress(0, options.progress);
  int64_t total = 0;
  for (size_t p : which) total += pieces_[p].bytes;
  progress.SetTotal(total);
  // Holders this run gave up on: its later pieces ask the others.
  internal_client::PassedOver passed_over;
  // Where piece p lands: straight in `out` when it is host memory of the
  // tensor's dtype, or a CUDA out that the local path fills device to
  // device (in_place_); else in host staging, converted and copied into
  // it by `settle` after the fetch (to the device for a CUDA out).
  const auto landing_of = [&](size_t p) -> absl::StatusOr<Tensor> {
    const Tensor& out = out_views_[p];
    const DType dtype = views_[pieces_[p].tensor].dtype();
    if (out.dtype() == dtype && (out.device().is_cpu() || in_place_[p])) {
      return out;
    }
    return Tensor::Empty(out.sizes(),
                         TensorOptions().WithDType(dtype).Private());
  };
  const auto settle = [&](size_t p, const Tensor& landing) -> absl::Status {
    const Tensor& out = out_views_[p];
    moved += pieces_[p].bytes;
    if (landing.storage() == out.storage()) return absl::OkStatus();
    Tensor converted = landing;
    if (out.dtype() != landing.dtype()) {
      ASSIGN_OR_RETURN(converted, landing.ToDType(out.dtype()));
    }
    const std::vector<int64_t> origin(out.dim(), 0);
    return Annotate(
        CopyBox(converted, origin, out, origin, out.sizes()),
        absl::StrCat("reading tensor ", views_[pieces_[p].tensor].name(),
                     " into item ", pieces_[p].target));
  };
  // One piece, from the first of its shard's holders that serves it.
  const auto fetch_one = [&](size_t p) -> absl::Status {
    const PlanPiece& piece = pieces_[p];
    const ShardedTensorView& view = views_[piece.tensor];
    ASSIGN_OR_RETURN(const Tensor landing, landing_of(p));
    FetchOptions fetch;
    fetch.chunk_bytes = options.chunk_bytes;
    fetch.cancel = options.cancel;
    fetch.on_chunk = [&progress](int64_t n) { progress.Add(n); };
    fetch.served_version = &(*versions)[p];
    RETURN_IF_ERROR(internal_client::FetchFromHolders(
        *cluster_, view.info(), ids[piece.tensor], piece.shard,
        piece.offsets_in_shard, landing, std::move(fetch), deadline,
        absl::StrCat("reading tensor ", view.name(), " box ",
                     Dims(piece.out_offsets), " of item ", piece.target),
        &passed_over));
    return settle(p, landing);
  };
  // Pieces planned to be pipelined (pipelined_) are asked of their owner
  // in batches (ShardClient::FetchRegionsPipelined): one round trip per
  // batch. A piece a batch does not bring is fetched on its own, which
  // tells a refused piece from a stalled or restarted owner. A batch with
  // pieces of replicated shards waits for its owner no longer than a
  // holder's patience (its pieces are small: a live owner answers them
  // well within it), and an owner that did not answer (stalled, gone) is
  // passed over for the rest of the run (PassedOver): every piece a batch
  // did not bring, and every later one of that owner, is asked of the
  // replicas. A stalled owner costs one patience per run. The batches
  // go first (one round trip each), then the pieces on their own, in the
  // plan's order (the owners' pieces interleaved).
  struct Task {
    std::vector<size_t> pieces;
    // The owner and its rank, for a batch.
    std::shared_ptr<const internal_client::Worker> owner;
    int rank = -1;
    // For a batch, the most holders of a shard of its pieces.
    size_t holders = 1;
  };
  std::vector<Task> tasks;
  std::vector<size_t> alone;
  std::map<int, std::vector<size_t>> by_owner;
  for (size_t p : which) {
    if (pipelined_[p]) {
      by_owner[views_[pieces_[p].tensor].owner_rank(pieces_[p].shard)]
          .push_back(p);
    } else {
      alone.push_back(p);
    }
  }
  for (auto& [rank, list] : by_owner) {
    absl::StatusOr<std::shared_ptr<const internal_client::Worker>> owner =
        cluster_->worker(rank);
    if (list.size() < 2 || !owner.ok() || !(*owner)->shards->has_data_plane()) {
      alone.insert(alone.end(), list.begin(), list.end());
      continue;
    }
    for (size_t first = 0; first < list.size();
         first += ShardClient::kMaxPipelinedFetches) {
      const size_t end =
          std::min(list.size(), first + ShardClient::kMaxPipelinedFetches);
      Task& batch = tasks.emplace_back();
      batch.pieces.assign(list.begin() + first, list.begin() + end);
      batch.owner = *owner;
      batch.rank = rank;
      for (size_t p : batch.pieces) {
        batch.holders = std::max(batch.holders,
                                 HoldersOf(views_[pieces_[p].tensor].info(),
                                           static_cast<int>(pieces_[p].shard))
                                     .size());
      }
    }
  }
  for (size_t p : alone) tasks.push_back({{p}, nullptr, -1, 1});
  const auto fetch_batch = [&](const Task& batch) -> absl::Status {
    // An owner this run gave up on already: its replicated pieces go to
    // the replicas at once.
    if (batch.holders > 1 && passed_over.Contains(batch.rank)) {
      for (size_t p : batch.pieces) RETURN_IF_ERROR(fetch_one(p));
      return absl::OkStatus();
    }
    std::vector<ShardClient::RegionFetch> boxes;
    boxes.reserve(batch.pieces.size());
    for (size_t p : batch.pieces) {
      const PlanPiece& piece = pieces_[p];
      ShardClient::RegionFetch& box = boxes.emplace_back();
      box.tensor_id = ids[piece.tensor];
      box.shard_index = static_cast<int64_t>(piece.shard);
      box.region_offsets.assign(piece.offsets_in_shard.begin(),
                                piece.offsets_in_shard.end());
      ASSIGN_OR_RETURN(box.destination, landing_of(p));
      box.served_version = &(*versions)[p];
    }
    FetchOptions fetch;
    fetch.chunk_bytes = options.chunk_bytes;
    fetch.cancel = options.cancel;
    fetch.timeout = std::max(deadline - absl::Now(), absl::ZeroDuration());
    if (batch.holders > 1) {
      // As FetchFromHolders gives a try that is not the last.
      const absl::Duration patience = cluster_->options().holder_patience;
      fetch.timeout = patience > absl::ZeroDuration()
                          ? std::min(fetch.timeout, patience)
                          : fetch.timeout / static_cast<int64_t>(batch.holders);
    }
    const std::vector<absl::Status> fetched =
        batch.owner->shards->FetchRegionsPipelined(boxes, fetch);
    for (size_t k = 0; k < batch.pieces.size(); ++k) {
      const size_t p = batch.pieces[k];
      if (fetched[k].ok()) {
        progress.Add(pieces_[p].bytes);
        RETURN_IF_ERROR(settle(p, boxes[k].destination));
        continue;
      }
      // A stalled or gone owner: the replicas are asked for the rest.
      if (absl::IsUnavailable(fetched[k]) ||
          absl::IsDeadlineExceeded(fetched[k])) {
        passed_over.Add(batch.rank);
      }
      RETURN_IF_ERROR(fetch_one(p));
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(RunInParallel(
      tasks.size(), options.parallelism, [&](size_t t) -> absl::Status {
        const Task& task = tasks[t];
        return task.owner == nullptr ? fetch_one(task.pieces[0])
                                     : fetch_batch(task);
      }));
  *bytes += moved.load();
  progress.Finish();
  return absl::OkStatus();
}

absl::StatusOr<ReadPlanRun> ReadPlan::RunOnce(const TransferOptions& options,
                                              int64_t version,
                                              absl::Time deadline,
                                              bool* final) {
  ReadPlanRun run;
  const size_t tensors = views_.size();
  // The latest of a versioned tensor is asked for as at least the newest
  // this client saw (wire/version_id.h: a reader woken by a publish gets
  // that version from the daemons still applying it, not the one before);
  // of tensors numbered alike (one group), the newest seen of any.
  std::vector<int64_t> seen(tensors, 0);
  int64_t seen_of_any = 0;
  for (size_t t = 0; t < tensors; ++t) {
    if (!views_[t].versioned()) continue;
    seen[t] = cluster_->SeenVersion(views_[t].tensor_id());
    if (aligned_) seen_of_any = std::max(seen_of_any, seen[t]);
  }
  std::vector<std::string> ids(tensors);
  bool hinted = false;
  for (size_t t = 0; t < tensors; ++t) {
    const ShardedTensorView& view = views_[t];
    const int64_t at_least = std::max(seen_of_any, seen[t]);
    if (!view.versioned()) {
      ids[t] = view.tensor_id();
    } else if (version > 0) {
      ids[t] = VersionId(view.tensor_id(), version);
    } else if (at_least >= 2) {
      ids[t] = AtLeastId(view.tensor_id(), at_least);
      hinted = true;
    } else {
      ids[t] = view.tensor_id();
    }
  }
  std::vector<int64_t> versions(pieces_.size(), 0);
  absl::Status first =
      Fetch(order_, ids, options, deadline, &versions, &run.bytes);
  if (absl::IsNotFound(first) && hinted) {
    // A daemon without that version (restarted since, or older than the
    // form): the latest as it is.
    for (size_t t = 0; t < tensors; ++t) ids[t] = views_[t].tensor_id();
    std::fill(versions.begin(), versions.end(), int64_t{0});
    first = Fetch(order_, ids, options, deadline, &versions, &run.bytes);
  }
  RETURN_IF_ERROR(first);
  std::vector<int64_t> read(tensors, 0);
  const auto finish = [&]() -> absl::StatusOr<ReadPlanRun> {
    for (size_t t = 0; t < tensors; ++t) {
      if (!views_[t].versioned()) continue;
      cluster_->SawVersion(views_[t].tensor_id(), read[t]);
      run.version = std::max(run.version, read[t]);
    }
    for (size_t t = 0; t < tensors; ++t) {
      run.versions.emplace_back(views_[t].name(), read[t]);
    }
    return run;
  };
  // The pieces of versioned tensors not read at want[their tensor].
  const auto behind = [&](const std::vector<int64_t>& want) {
    std::vector<size_t> which;
    for (size_t p = 0; p < pieces_.size(); ++p) {
      const uint32_t t = pieces_[p].tensor;
      if (views_[t].versioned() && versions[p] != want[t]) which.push_back(p);
    }
    return which;
  };
  if (version > 0) {
    // Published versions only: a holder serves a version by its id while
    // it is open there (its writers' bytes) or while its publish is still
    // being applied there; the latter passes in moments.
    const std::vector<int64_t> asked(tensors, version);
    const auto unpublished = [&]() { return behind(asked); };
    std::vector<size_t> which = unpublished();
    absl::Status fetched;
    const absl::Status published = AwaitPublished(
        deadline,
        absl::StrCat(
            "running a read plan: tensor ",
            which.empty() ? "" : views_[pieces_[which[0]].tensor].name()),
        version, [&] { return !(which = unpublished()).empty(); },
        [&] {
          fetched = Fetch(which, ids, options, deadline, &versions, &run.bytes);
          return fetched;
        });
    // Refused as unpublished (not a fetch's error): no new plan helps.
    if (!published.ok() && fetched.ok()) *final = true;
    RETURN_IF_ERROR(published);
    for (size_t t = 0; t < tensors; ++t) {
      if (views_[t].versioned()) read[t] = version;
    }
    return finish();
  }
  // The newest version any piece (or an earlier read) came from.
  int64_t newest = 0;
  bool any = false;
  for (size_t t = 0; t < tensors; ++t) {
    if (!views_[t].versioned()) continue;
    any = true;
    newest = std::max(newest, cluster_->SeenVersion(views_[t].tensor_id()));
  }
  if (!any) return finish();
  for (size_t p = 0; p < pieces_.size(); ++p) {
    if (views_[pieces_[p].tensor].versioned()) {
      newest = std::max(newest, versions[p]);
    }
  }
  std::vector<int64_t> want(tensors, newest);
  if (aligned_) {
    std::vector<size_t> which = behind(want);
    if (which.empty()) {
      read = want;
      return finish();
    }
    // A publish was being applied (or another came meanwhile): the pieces
    // of older versions again, as at least the newest, which each holder
    // serves once it has published it too. Only published versions: a
    // tensor numbered alike by chance may hold that number open.
    std::vector<std::string> at(tensors);
    for (size_t t = 0; t < tensors; ++t) {
      at[t] = AtLeastId(views_[t].tensor_id(), newest);
    }
    const absl::Status again =
        Fetch(which, at, options, deadline, &versions, &run.bytes);
    if (!again.ok() && !absl::IsNotFound(again)) return again;
    if (again.ok() && behind(want).empty()) {
      read = want;
      return finish();
    }
    // Not every tensor reached that version (numbered apart), or a newer
    // one was published meanwhile: one point of the log instead.
  }
  // One point of the log: pin the latest of each, read again what is not
  // of the pinned versions, unpin.
  std::vector<std::string> versioned;
  for (const ShardedTensorView& view : views_) {
    if (view.versioned()) versioned.push_back(view.name());
  }
  ASSIGN_OR_RETURN(const v1::VersionGroup group, control_.pin(versioned));
  run.pinned = true;
  absl::flat_hash_map<std::string, int64_t> pinned;
  for (const v1::VersionHandle& handle : group.versions()) {
    pinned[handle.name()] = handle.number();
  }
  std::vector<std::string> at(tensors);
  bool alike = true;
  int64_t common = 0;
  for (size_t t = 0; t < tensors; ++t) {
    if (!views_[t].versioned()) continue;
    auto it = pinned.find(views_[t].name());
    want[t] = it == pinned.end() ? 0 : it->second;
    if (common == 0) common = want[t];
    alike = alike && want[t] == common;
    at[t] = VersionId(views_[t].tensor_id(), want[t]);
  }
  const absl::Status again =
      Fetch(behind(want), at, options, deadline, &versions, &run.bytes);
  const absl::Status released = control_.unpin(group);
  RETURN_IF_ERROR(again);
  (void)released;  // The pin's lease ends it anyway.
  aligned_ = alike;
  read = want;
  return finish();
}

absl::StatusOr<ReadPlanRun> ReadPlan::Run(const TransferOptions& options,
                                          int64_t version) {
  if (version < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("running a read plan: negative version ", version));
  }
  absl::MutexLock lock(&mu_);
  if (version > 0) {
    for (const ShardedTensorView& view : views_) {
      if (!view.versioned()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "running a read plan at version ", version, ": tensor ",
            view.name(),
            " has no versions (it was created without versions >= 2)"));
      }
    }
  }
  // One deadline for the run, its attempts and re-plans included.
  const absl::Time deadline = absl::Now() + options.timeout;
  bool replanned = false;
  absl::Status status;
  for (int attempt = 0; attempt < kRunAttempts; ++attempt) {
    if (attempt > 0 && absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "running a read plan: the deadline passed while planning again "
          "after: ",
          status.message()));
    }
    if (stale_) {
      RETURN_IF_ERROR(Plan());
      replanned = attempt > 0 || plans_ > 1;
    }
    bool final = false;
    absl::StatusOr<ReadPlanRun> run =
        RunOnce(options, version, deadline, &final);
    if (run.ok()) {
      run->replanned = replanned;
      return run;
    }
    status = run.status();
    if (final || !Retryable(status) ||
        (options.cancel != nullptr && options.cancel->cancelled())) {
      return status;
    }
    // A tensor resharded, deleted or re-created, or a daemon restarted:
    // plan again from fresh metadata.
    stale_ = true;
  }
  if (absl::IsNotFound(status) && version > 0) {
    return absl::NotFoundError(absl::StrCat(
        "running a read plan at version ", version,
        ": it is not kept by every tensor (freed, or never published; "
        "`tessera versions NAME` lists the kept ones): ",
        status.message()));
  }
  return status;
}

int64_t ReadPlan::bytes() const {
  absl::MutexLock lock(&mu_);
  int64_t total = 0;
  for (const PlanPiece& piece : pieces_) total += piece.bytes;
  return total;
}

size_t ReadPlan::pieces() const {
  absl::MutexLock lock(&mu_);
  return pieces_.size();
}

std::vector<std::string> ReadPlan::names() const { return names_; }

std::vector<std::vector<int64_t>> ReadPlan::shapes() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::vector<int64_t>> shapes;
  shapes.reserve(views_.size());
  for (const ShardedTensorView& view : views_) shapes.push_back(view.sizes());
  return shapes;
}

std::vector<std::tuple<int, size_t, int64_t>> ReadPlan::sources() const {
  absl::MutexLock lock(&mu_);
  std::map<int, std::pair<size_t, int64_t>> by_rank;
  for (const PlanPiece& piece : pieces_) {
    auto& [count, bytes] =
        by_rank[views_[piece.tensor].owner_rank(piece.shard)];
    ++count;
    bytes += piece.bytes;
  }
  std::vector<std::tuple<int, size_t, int64_t>> sources;
  for (const auto& [rank, entry] : by_rank) {
    sources.emplace_back(rank, entry.first, entry.second);
  }
  return sources;
}

int ReadPlan::plans() const {
  absl::MutexLock lock(&mu_);
  return plans_;
}

}  // namespace tessera
