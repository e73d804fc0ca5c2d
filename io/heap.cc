#include "io/heap.h"

#include <malloc.h>

#include <cstdlib>
#include <cstring>

namespace tessera {

bool KeepFreedHeapForReuse() {
  if (const char* tunables = std::getenv("GLIBC_TUNABLES");
      tunables != nullptr &&
      std::strstr(tunables, "glibc.malloc.trim_threshold") != nullptr) {
    return false;
  }
  // mallopt returns 1 on success (0 from an allocator that ignores it).
  return mallopt(M_TRIM_THRESHOLD, static_cast<int>(kKeptFreeHeapBytes)) == 1;
}

}  // namespace tessera
