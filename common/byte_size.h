// Byte sizes as people write them on command lines ("512MiB", "8GiB"),
// shared by the daemon's flags (--memory-limit) and the tessera tool's
// (tessera bench --sizes).
//
// Thread-safety: pure functions.
#ifndef TESSERA_COMMON_BYTE_SIZE_H_
#define TESSERA_COMMON_BYTE_SIZE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tessera {

// "512MiB", "8GiB", "1.5G", "1000000": bytes. Ki/Mi/Gi/Ti (with or
// without a trailing B) are powers of 1024, K/M/G/T and KB/MB/GB/TB powers
// of 1000 (as Kubernetes quantities). INVALID_ARGUMENT naming `flag`.
absl::StatusOr<int64_t> ParseByteSize(absl::string_view flag,
                                      absl::string_view text);

}  // namespace tessera

#endif  // TESSERA_COMMON_BYTE_SIZE_H_
