#include "common/tensor/random.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/tensor/tensor.h"

namespace tessera {

namespace {

constexpr double kPi = 3.14159265358979323846;

}  // namespace

// ---- Generator
// -----------------------------------------------------------------

struct Generator::State {
  explicit State(uint64_t seed) : engine(seed) {}

  double UniformLocked(int bits) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    bits = std::clamp(bits, 1, 53);
    return static_cast<double>(engine() >> (64 - bits)) *
           std::ldexp(1.0, -bits);
  }

  absl::Mutex mu;
  std::mt19937_64 engine ABSL_GUARDED_BY(mu);
  // Box-Muller makes two normals per draw; the second one is kept here.
  bool has_cached_normal ABSL_GUARDED_BY(mu) = false;
  double cached_normal ABSL_GUARDED_BY(mu) = 0;
};

Generator::Generator(uint64_t seed) : state_(std::make_shared<State>(seed)) {}

void Generator::ManualSeed(uint64_t seed) {
  absl::MutexLock lock(&state_->mu);
  state_->engine.seed(seed);
  state_->has_cached_normal = false;
}

uint64_t Generator::NextU64() {
  absl::MutexLock lock(&state_->mu);
  return state_->engine();
}

double Generator::NextUniform(int bits) {
  absl::MutexLock lock(&state_->mu);
  return state_->UniformLocked(bits);
}

double Generator::NextNormal() {
  absl::MutexLock lock(&state_->mu);
  if (state_->has_cached_normal) {
    state_->has_cached_normal = false;
    return state_->cached_normal;
  }
  // u1 in (0, 1] keeps the logarithm finite.
  const double u1 = 1.0 - state_->UniformLocked(53);
  const double u2 = state_->UniformLocked(53);
  const double radius = std::sqrt(-2.0 * std::log(u1));
  const double theta = 2.0 * kPi * u2;
  state_->cached_normal = radius * std::sin(theta);
  state_->has_cached_normal = true;
  return radius * std::cos(theta);
}

Generator& DefaultGenerator() {
  static Generator* const generator = new Generator();
  return *generator;
}

void ManualSeed(uint64_t seed) { DefaultGenerator().ManualSeed(seed); }

}  // namespace tessera
