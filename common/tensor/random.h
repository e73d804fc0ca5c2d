// Generator: the seeded pseudo-random numbers behind Rand and Randn.
#ifndef TESSERA_COMMON_TENSOR_RANDOM_H_
#define TESSERA_COMMON_TENSOR_RANDOM_H_

#include <cstdint>
#include <memory>

namespace tessera {

// Pseudo-random numbers for Rand/Randn: a 64-bit Mersenne Twister
// (std::mt19937_64). The same seed gives the same numbers on every run and
// machine. Thread-safe; copies of a Generator share one state.
class Generator {
 public:
  explicit Generator(uint64_t seed = kDefaultSeed);
  void ManualSeed(uint64_t seed);
  uint64_t NextU64();
  // Uniform in [0, 1) with `bits` random mantissa bits (<= 53), so the
  // result is exact in the target type and never rounds up to 1: the top
  // `bits` bits of NextU64() times 2^-bits. `bits` is clamped to [1, 53].
  double NextUniform(int bits = 53);
  // Standard normal (Box-Muller), full double precision. Each Box-Muller
  // draw makes two values; the second is returned by the next call (and
  // dropped by ManualSeed), so sequences depend only on the seed.
  double NextNormal();

  static constexpr uint64_t kDefaultSeed = 67280421310721ull;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

// The process-wide generator used when none is passed; thread-safe.
Generator& DefaultGenerator();
// Re-seeds the default generator (torch.manual_seed).
void ManualSeed(uint64_t seed);

}  // namespace tessera

#endif  // TESSERA_COMMON_TENSOR_RANDOM_H_
