#include "server/daemon/refill.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tessera {

Refill::Refill(std::vector<LocalShard> own,
               std::shared_ptr<RegisteredTensor> copies)
    : own_(std::move(own)), copies_(std::move(copies)) {}

const Tensor* Refill::Buffer(bool replica, int64_t shard) const {
  if (replica) {
    if (copies_ == nullptr) return nullptr;
    const LocalShard* copy = copies_->FindShard(shard);
    return copy == nullptr ? nullptr : &copy->tensor;
  }
  for (const LocalShard& local : own_) {
    if (local.index == shard) return &local.tensor;
  }
  return nullptr;
}

absl::StatusOr<bool> Refill::Write(bool replica, const RegionPiece& piece) {
  const int64_t shard = static_cast<int64_t>(piece.shard);
  absl::MutexLock lock(&mu_);
  if (complete_) return false;
  const Tensor* buffer = Buffer(replica, shard);
  if (buffer == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "this daemon refills no ", replica ? "replica" : "shard", " ", shard));
  }
  const std::vector<int64_t> origin(piece.view.dim(), 0);
  RETURN_IF_ERROR(CopyBox(piece.view, origin, *buffer, piece.offsets_in_shard,
                          piece.box->shard_sizes()));
  ASSIGN_OR_RETURN(Tensor data, piece.view.Clone());
  log_.push_back(
      Logged{replica, shard, piece.offsets_in_shard, std::move(data)});
  return true;
}

absl::Status Refill::Complete(const std::function<absl::Status()>& finish) {
  absl::MutexLock lock(&mu_);
  absl::Status replayed;
  for (const Logged& logged : log_) {
    const Tensor* buffer = Buffer(logged.replica, logged.shard);
    if (buffer == nullptr) continue;
    const std::vector<int64_t> origin(logged.data.dim(), 0);
    absl::Status copied = CopyBox(logged.data, origin, *buffer,
                                  logged.offsets_in_shard, logged.data.sizes());
    if (replayed.ok()) replayed = copied;
  }
  log_.clear();
  complete_ = true;
  absl::Status finished = finish();
  complete_flag_ = true;
  return replayed.ok() ? finished : replayed;
}

}  // namespace tessera
