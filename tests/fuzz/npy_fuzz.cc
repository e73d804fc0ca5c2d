// libFuzzer target: .npy files (client/npy.h), which `tessera write` and
// the client library read from users. A file that parses must encode back
// to one that parses to the same dtype and sizes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/string_view.h"
#include "client/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view contents(reinterpret_cast<const char*>(data), size);
  (void)tessera::ParseNpyHeader(contents);
  absl::StatusOr<tessera::Tensor> tensor = tessera::ParseNpy(contents);
  if (!tensor.ok()) return 0;
  absl::StatusOr<std::string> again = tessera::EncodeNpy(*tensor);
  if (!again.ok()) return 0;  // bfloat16 has no .npy type string.
  absl::StatusOr<tessera::Tensor> back = tessera::ParseNpy(*again);
  if (!back.ok() || back->sizes() != tensor->sizes() ||
      back->dtype() != tensor->dtype()) {
    std::abort();
  }
  return 0;
}
