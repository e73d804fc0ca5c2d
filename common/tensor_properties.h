// TensorProperties: what every shard of a sharded tensor shares (dtype,
// layout, requires_grad, memory format, pinning), as PyTorch's
// torch.distributed._shard TensorProperties. A plain value type.
#ifndef TESSERA_COMMON_TENSOR_PROPERTIES_H_
#define TESSERA_COMMON_TENSOR_PROPERTIES_H_

#include <cstdint>
#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/dtype.h"

namespace tessera {

enum class Layout : uint8_t { kStrided, kSparseCoo };
enum class MemoryFormat : uint8_t { kContiguous, kChannelsLast, kPreserve };

// "torch.strided", "torch.sparse_coo".
absl::string_view LayoutName(Layout layout);
// "torch.contiguous_format", "torch.channels_last", "torch.preserve_format".
absl::string_view MemoryFormatName(MemoryFormat format);

struct TensorProperties {
  DType dtype = DType::kFloat32;
  Layout layout = Layout::kStrided;
  bool requires_grad = false;
  MemoryFormat memory_format = MemoryFormat::kContiguous;
  bool pin_memory = false;

  std::string ToString() const;

  friend bool operator==(const TensorProperties& a, const TensorProperties& b) {
    return a.dtype == b.dtype && a.layout == b.layout &&
           a.requires_grad == b.requires_grad &&
           a.memory_format == b.memory_format && a.pin_memory == b.pin_memory;
  }
  friend bool operator!=(const TensorProperties& a, const TensorProperties& b) {
    return !(a == b);
  }
};

std::ostream& operator<<(std::ostream& os, const TensorProperties& p);

}  // namespace tessera

#endif  // TESSERA_COMMON_TENSOR_PROPERTIES_H_
