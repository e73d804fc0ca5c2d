#include "io/read_spin.h"

#include <algorithm>
#include <atomic>

namespace tessera {
namespace {

constexpr int kSpinScoreMax = 8;
constexpr int kSpinAbove = 4;
std::atomic<int> g_spin_score{kSpinScoreMax};

bool SpinWorthIt() {
  return g_spin_score.load(std::memory_order_relaxed) >= kSpinAbove;
}

void RecordWait(std::chrono::steady_clock::duration waited) {
  int score = g_spin_score.load(std::memory_order_relaxed);
  const int next = waited <= ReadSpin::kReadSpin
                       ? std::min(score + 1, kSpinScoreMax)
                       : std::max(score - 2, 0);
  if (next != score) {
    // A lost race only drops one sample.
    g_spin_score.compare_exchange_weak(score, next, std::memory_order_relaxed);
  }
}

}  // namespace

bool ReadSpin::Poll(bool small) {
  const Clock::time_point now = Clock::now();
  if (waiting_since_ == Clock::time_point{}) {
    waiting_since_ = now;
    spin_ = small && SpinWorthIt();
  }
  return spin_ && now - waiting_since_ < kReadSpin;
}

void ReadSpin::Got() {
  if (waiting_since_ == Clock::time_point{}) return;
  RecordWait(Clock::now() - waiting_since_);
  waiting_since_ = {};
}

}  // namespace tessera
