// RandomNonce: 64 bits that differ between processes and between calls,
// for ids that must not repeat across restarts: a process's incarnation, a
// save's data file names. Mixes the system's random device with the clock.
// Not for secrets.
//
// Thread-safe.
#ifndef TESSERA_COMMON_NONCE_H_
#define TESSERA_COMMON_NONCE_H_

#include <cstdint>
#include <random>

#include "absl/time/clock.h"

namespace tessera {

inline uint64_t RandomNonce() {
  // One per thread: making one costs CPUID (trapped by hypervisors: 7% of
  // a client beginning 8,000 versions); it keeps no state that a fork
  // could copy (RDRAND, or reads of the system's device).
  thread_local std::random_device device;
  return (uint64_t{device()} << 32) ^ device() ^
         static_cast<uint64_t>(absl::GetCurrentTimeNanos());
}

}  // namespace tessera

#endif  // TESSERA_COMMON_NONCE_H_
