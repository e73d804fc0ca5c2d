#include "wire/checksum_ahead.h"

#include <algorithm>

#include "common/checksum.h"
#include "common/int_math.h"

namespace tessera {

ChecksumAhead::ChecksumAhead(const char* data, int64_t total_bytes,
                             int64_t chunk_bytes, int lead)
    : data_(data),
      total_bytes_(std::max<int64_t>(total_bytes, 0)),
      chunk_bytes_(std::max<int64_t>(chunk_bytes, 1)),
      num_chunks_(CeilDiv(total_bytes_, chunk_bytes_)),
      lead_(std::clamp(lead, 1, kMaxLead)) {
  {
    absl::MutexLock lock(&mu_);
    sums_.resize(static_cast<size_t>(lead_ + 1));
  }
  helper_ = StartThread([this] { Run(); });
}

ChecksumAhead::~ChecksumAhead() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  helper_->Wait();
}

void ChecksumAhead::Run() {
  for (int64_t k = 0; k < num_chunks_; ++k) {
    {
      absl::MutexLock lock(&mu_);
      const auto may_hash = [this, k]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || k < taken_ + lead_;
      };
      mu_.Await(absl::Condition(&may_hash));
      if (stop_) return;
    }
    const int64_t begin = k * chunk_bytes_;
    const int64_t size = std::min(chunk_bytes_, total_bytes_ - begin);
    const uint64_t sum = Checksum64(data_ + begin, static_cast<size_t>(size));
    absl::MutexLock lock(&mu_);
    sums_[static_cast<size_t>(k % (lead_ + 1))] = sum;
    hashed_ = k + 1;
  }
}

uint64_t ChecksumAhead::Take(int64_t k) {
  absl::MutexLock lock(&mu_);
  taken_ = std::max(taken_, k);
  const auto ready = [this, k]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return hashed_ > k;
  };
  mu_.Await(absl::Condition(&ready));
  return sums_[static_cast<size_t>(k % (lead_ + 1))];
}

}  // namespace tessera
