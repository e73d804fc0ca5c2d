#include "common/log_context.h"

#include <atomic>
#include <utility>

namespace tessera {
namespace {

thread_local LogContext current;
std::atomic<int> rank{-1};
std::atomic<int64_t> generation{0};

}  // namespace

const LogContext& CurrentLogContext() { return current; }

ScopedLogContext::ScopedLogContext(LogContext context)
    : previous_(std::exchange(current, std::move(context))) {}

ScopedLogContext::~ScopedLogContext() { current = std::move(previous_); }

void SetLogRank(int r) { rank.store(r, std::memory_order_relaxed); }
int LogRank() { return rank.load(std::memory_order_relaxed); }

void SetLogGeneration(int64_t g) {
  generation.store(g, std::memory_order_relaxed);
}
int64_t LogGeneration() { return generation.load(std::memory_order_relaxed); }

}  // namespace tessera
