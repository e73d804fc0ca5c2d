// Integer arithmetic on sizes a client, a peer or a file may have chosen:
// written so that no intermediate value overflows int64, whatever the
// inputs in the stated ranges. Pure functions; thread-safe.
#ifndef TESSERA_COMMON_INT_MATH_H_
#define TESSERA_COMMON_INT_MATH_H_

#include <cstdint>

namespace tessera {

// ceil(a / b) for a >= 0 and b > 0, without computing a + b - 1.
constexpr int64_t CeilDiv(int64_t a, int64_t b) {
  return a / b + (a % b != 0 ? 1 : 0);
}

}  // namespace tessera

#endif  // TESSERA_COMMON_INT_MATH_H_
