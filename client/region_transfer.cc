#include "client/region_transfer.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/checksum.h"
#include "common/proto_convert.h"
#include "common/region.h"
#include "common/status_macros.h"
#include "grpcpp/client_context.h"
#include "io/thread_cache.h"
#include "wire/call_deadline.h"
#include "wire/grpc_status.h"

namespace tessera {

absl::Status RunInParallel(size_t n, int parallelism,
                           const std::function<absl::Status(size_t)>& body) {
  if (n == 0) return absl::OkStatus();
  if (n == 1) return body(0);
  std::vector<absl::Status> results(n);
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  const auto work = [&] {
    for (size_t i = next++; i < n && !failed.load(); i = next++) {
      results[i] = body(i);
      if (!results[i].ok()) failed.store(true);
    }
  };
  const size_t threads =
      std::min(n, static_cast<size_t>(std::max(parallelism, 1)));
  std::vector<std::shared_ptr<ThreadJob>> workers;
  workers.reserve(threads - 1);
  for (size_t t = 1; t < threads; ++t) workers.push_back(StartThread(work));
  work();  // this thread is one of the workers
  for (const std::shared_ptr<ThreadJob>& worker : workers) worker->Wait();
  for (const absl::Status& result : results) {
    RETURN_IF_ERROR(result);
  }
  return absl::OkStatus();
}

absl::Status ForEachRegionPiece(
    absl::Span<const ShardMetadata> shards,
    absl::Span<const int64_t> region_offsets, const Tensor& data,
    int parallelism,
    const std::function<absl::Status(const RegionPiece&)>& body) {
  ASSIGN_OR_RETURN(const ShardMetadata region,
                   ShardMetadata::Create(region_offsets, data.sizes()));
  const std::vector<RegionOverlap> overlaps = Overlaps(shards, region);
  return RunInParallel(
      overlaps.size(), parallelism, [&](size_t k) -> absl::Status {
        const RegionOverlap& overlap = overlaps[k];
        RegionPiece piece;
        piece.shard = overlap.shard;
        piece.box = &overlap.box;
        piece.offsets_in_shard = OffsetsWithin(
            overlap.box.shard_offsets(), shards[overlap.shard].shard_offsets());
        ASSIGN_OR_RETURN(piece.view,
                         RegionView(data,
                                    OffsetsWithin(overlap.box.shard_offsets(),
                                                  region_offsets),
                                    overlap.box.shard_sizes()));
        return body(piece);
      });
}

namespace {

// What one piece of a region write did.
struct PieceOutcome {
  size_t shard = 0;
  std::string box;    // "[4:6, 0:4]"
  std::string owner;  // "rank 2 (10.0.0.3:29600)"
  absl::Status status;
};

// WriteEveryRegionPiece's outcome; `outcomes` in any order.
absl::Status PartialWriteError(absl::string_view what,
                               std::vector<PieceOutcome> outcomes) {
  std::sort(outcomes.begin(), outcomes.end(),
            [](const PieceOutcome& a, const PieceOutcome& b) {
              return a.shard < b.shard;
            });
  std::vector<std::string> written;
  std::vector<std::string> failed;
  absl::StatusCode code = absl::StatusCode::kOk;
  for (const PieceOutcome& outcome : outcomes) {
    if (outcome.status.ok()) {
      written.push_back(absl::StrCat(outcome.box, " on ", outcome.owner));
      continue;
    }
    if (code == absl::StatusCode::kOk) code = outcome.status.code();
    failed.push_back(absl::StrCat(outcome.box, " on ", outcome.owner, ": ",
                                  outcome.status.ToString()));
  }
  if (failed.empty()) return absl::OkStatus();
  return absl::Status(
      code, absl::StrCat(
                what, ": ", written.size(), " of ", outcomes.size(),
                " boxes written; not written: ", absl::StrJoin(failed, "; "),
                written.empty() ? std::string()
                                : absl::StrCat("; written: ",
                                               absl::StrJoin(written, ", "))));
}

}  // namespace

absl::Status WriteToHolders(
    size_t holders, const HolderWriteOptions& options,
    const std::function<
        absl::Status(size_t k, const std::shared_ptr<Cancellation>& cancel,
                     std::string* name)>& write,
    std::string* names) {
  if (holders == 1) {  // One copy: nothing to wait for but itself.
    return write(0, options.cancel, names);
  }
  std::vector<std::string> named(holders);
  std::vector<absl::Status> results(holders);
  std::vector<std::shared_ptr<Cancellation>> cancels;
  std::vector<Cancellation::Registration> chained;
  for (size_t k = 0; k < holders; ++k) {
    cancels.push_back(std::make_shared<Cancellation>());
    if (options.cancel != nullptr) {
      chained.push_back(
          options.cancel->OnCancel([c = cancels.back()] { c->Cancel(); }));
    }
  }
  // Every holder is tried, each on its own thread; this one watches for
  // the first that took the piece, then gives the rest their patience.
  absl::Mutex mu;
  size_t finished = 0;
  std::vector<bool> done(holders, false);
  absl::Time first_ok = absl::InfiniteFuture();
  const absl::Time start = absl::Now();
  std::vector<std::shared_ptr<ThreadJob>> threads;
  for (size_t k = 0; k < holders; ++k) {
    threads.push_back(StartThread([&, k] {
      absl::Status result = write(k, cancels[k], &named[k]);
      absl::MutexLock lock(&mu);
      results[k] = std::move(result);
      done[k] = true;
      ++finished;
      if (results[k].ok()) first_ok = std::min(first_ok, absl::Now());
    }));
  }
  std::vector<bool> given_up(holders, false);
  {
    absl::MutexLock lock(&mu);
    const auto all_done = [&] { return finished == holders; };
    if (!options.mark_stale) {
      mu.Await(absl::Condition(&all_done));
    } else {
      const auto settled = [&] {
        return finished == holders || first_ok != absl::InfiniteFuture();
      };
      mu.Await(absl::Condition(&settled));
      if (finished < holders) {
        const absl::Time give_up =
            first_ok + std::max(options.patience, first_ok - start);
        mu.AwaitWithDeadline(absl::Condition(&all_done), give_up);
        for (size_t k = 0; k < holders; ++k) {
          if (done[k]) continue;
          given_up[k] = true;
          cancels[k]->Cancel();
        }
        mu.Await(absl::Condition(&all_done));
      }
    }
  }
  for (const std::shared_ptr<ThreadJob>& thread : threads) thread->Wait();
  // A holder that takes no writes now (ABORTED: a reshard fences its
  // layout) fails the piece, whatever the others took: passing it over or
  // marking it stale would let the reshard copy its bytes without this
  // write. The caller writes the piece again once the fence ends.
  for (size_t k = 0; k < holders; ++k) {
    if (absl::IsAborted(results[k])) {
      *names = named[k];
      return results[k];
    }
  }
  std::vector<std::string> written;
  std::vector<std::string> skipped;
  std::vector<std::string> failed;
  std::vector<size_t> missed;
  absl::Status first;
  // A write the caller cancelled ends CANCELLED, whatever some holders
  // took (a cancelled write may have been applied in part).
  const bool mark = options.mark_stale &&
                    !(options.cancel != nullptr && options.cancel->cancelled());
  for (size_t k = 0; k < holders; ++k) {
    if (results[k].ok()) {
      written.push_back(named[k]);
      continue;
    }
    const bool not_live = !given_up[k] && (absl::IsUnavailable(results[k]) ||
                                           absl::IsNotFound(results[k]));
    const std::string why =
        given_up[k] ? absl::StrCat(named[k], ": no answer within ",
                                   absl::FormatDuration(absl::Now() - start))
                    : absl::StrCat(named[k], ": ", results[k].ToString());
    if (not_live) {
      skipped.push_back(why);
    } else if (mark) {
      missed.push_back(k);
      skipped.push_back(absl::StrCat(why, "; marked stale"));
    } else {
      failed.push_back(why);
      if (first.ok()) first = results[k];
    }
  }
  if (written.empty()) {
    // No holder has it: the owner's error is the piece's.
    *names = absl::StrJoin(named, " and ");
    for (const absl::Status& result : results) {
      if (!result.ok()) return result;
    }
  }
  if (!missed.empty()) {
    if (absl::Status marked = options.mark_stale(missed); !marked.ok()) {
      std::vector<std::string> unmarked;
      for (const size_t k : missed) {
        unmarked.push_back(absl::StrCat(named[k], ": ", results[k].ToString()));
      }
      return absl::Status(
          marked.code(),
          absl::StrCat("not written to ", absl::StrJoin(unmarked, "; "),
                       ", and they could not be marked stale (so the write "
                       "fails: they may serve the old bytes): ",
                       marked.message()));
    }
  }
  *names = absl::StrJoin(written, " and ");
  if (!skipped.empty()) {
    absl::StrAppend(names, " (not written to ", absl::StrJoin(skipped, "; "),
                    ")");
  }
  if (first.ok()) return absl::OkStatus();
  return absl::Status(first.code(), absl::StrCat("not written to ",
                                                 absl::StrJoin(failed, "; ")));
}

absl::Status WriteEveryRegionPiece(
    absl::Span<const ShardMetadata> shards,
    absl::Span<const int64_t> region_offsets, const Tensor& data,
    int parallelism, absl::string_view what,
    const std::function<absl::Status(const RegionPiece&, std::string* owner)>&
        write) {
  absl::Mutex mu;
  std::vector<PieceOutcome> outcomes;
  RETURN_IF_ERROR(
      ForEachRegionPiece(shards, region_offsets, data, parallelism,
                         [&](const RegionPiece& piece) -> absl::Status {
                           PieceOutcome outcome;
                           outcome.shard = piece.shard;
                           outcome.box = BoxString(*piece.box);
                           outcome.status = write(piece, &outcome.owner);
                           absl::MutexLock lock(&mu);
                           outcomes.push_back(std::move(outcome));
                           // Always OK, so that every piece is tried.
                           return absl::OkStatus();
                         }));
  return PartialWriteError(what, std::move(outcomes));
}

std::string BoxString(const ShardMetadata& box) {
  std::vector<std::string> dims;
  for (size_t d = 0; d < box.shard_offsets().size(); ++d) {
    dims.push_back(absl::StrCat(box.shard_offsets()[d], ":",
                                box.shard_offsets()[d] + box.shard_sizes()[d]));
  }
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
}

ProgressCounter::ProgressCounter(
    int64_t total, std::function<void(int64_t done, int64_t total)> progress)
    : total_(total), progress_(std::move(progress)) {}

void ProgressCounter::SetTotal(int64_t total) {
  absl::MutexLock lock(&mu_);
  total_ = total;
}

void ProgressCounter::Add(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  done_ += bytes;
  if (total_ > 0) done_ = std::min(done_, total_);  // Pieces moved again.
  reported_done_ = done_ == total_;
  if (progress_) progress_(done_, total_);
}

void ProgressCounter::Finish() {
  absl::MutexLock lock(&mu_);
  if (reported_done_) return;
  done_ = total_;
  reported_done_ = true;
  if (progress_) progress_(done_, total_);
}

int64_t WriteChunkBytesFor(int64_t requested) {
  if (requested <= 0) return kDefaultWriteChunkBytes;
  return std::clamp(requested, kMinWriteChunkBytes, kMaxWriteChunkBytes);
}

absl::StatusOr<int64_t> WriteRegion(v1::ControlService::StubInterface& stub,
                                    const std::string& name,
                                    const std::string& tensor_id,
                                    absl::Span<const int64_t> offsets,
                                    const Tensor& data,
                                    const RegionWriteOptions& options) {
  if (!data.defined()) {
    return absl::InvalidArgumentError("WriteRegion: undefined data");
  }
  // The bytes to send, row-major in host memory.
  ASSIGN_OR_RETURN(const Tensor bytes, data.device().is_cpu()
                                           ? data.Contiguous()
                                           : data.To(Device::Cpu()));
  const int64_t total = static_cast<int64_t>(bytes.nbytes());
  const int64_t chunk_bytes = WriteChunkBytesFor(options.chunk_bytes);
  const char* base = static_cast<const char*>(bytes.data_ptr());

  grpc::ClientContext context;
  SetCallDeadline(context, options.deadline);
  // Cancelling the call ends a write blocked on a stalled daemon, from the
  // start of the call (which waits for the connection) to its Finish.
  const Cancellation::Registration interrupt =
      OnCancel(options.cancel, [&context] { context.TryCancel(); });
  v1::WriteRegionResponse response;
  std::unique_ptr<grpc::ClientWriterInterface<v1::WriteRegionChunk>> writer =
      stub.WriteRegion(&context, &response);
  v1::WriteRegionChunk chunk;
  v1::WriteRegionHeader* header = chunk.mutable_header();
  header->set_name(name);
  header->set_tensor_id(tensor_id);
  header->mutable_offsets()->Add(offsets.begin(), offsets.end());
  header->mutable_sizes()->Add(data.sizes().begin(), data.sizes().end());
  header->set_dtype(ToProto(data.dtype()));
  header->set_total_bytes(total);
  header->set_replica(options.replica);
  int64_t offset = 0;
  // One message even for an empty box: it carries the header.
  do {
    if (Cancelled(options.cancel)) break;
    const int64_t size = std::min(chunk_bytes, total - offset);
    chunk.set_offset(offset);
    chunk.set_data(size > 0 ? base + offset : "", static_cast<size_t>(size));
    chunk.set_checksum(Checksum64(chunk.data().data(), chunk.data().size()));
    // A failed write means the stream is over (the daemon refused it or
    // the connection broke): Finish says why.
    if (!writer->Write(chunk)) break;
    if (options.on_chunk && size > 0) options.on_chunk(size);
    chunk.clear_header();
    offset += size;
  } while (offset < total);
  writer->WritesDone();
  const absl::Status finished = FromGrpcStatus(writer->Finish());
  if (Cancelled(options.cancel)) {
    // An incomplete stream is never applied; a complete one whose answer
    // was not awaited may have been.
    return absl::CancelledError(absl::StrCat(
        "WriteRegion of tensor ", name, ": cancelled by the caller after ",
        offset, " of ", total, " bytes",
        offset < total ? " (nothing of it applied)"
                       : " had been sent (the daemon may have applied them)"));
  }
  RETURN_IF_ERROR(finished);
  if (offset != total) {
    // The daemon closed the stream early yet reported success.
    return absl::DataLossError(absl::StrCat("WriteRegion of tensor ", name,
                                            ": the daemon accepted ", offset,
                                            " of ", total, " bytes"));
  }
  return response.bytes_written();
}

}  // namespace tessera
