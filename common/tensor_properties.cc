#include "common/tensor_properties.h"

#include "absl/strings/str_cat.h"

namespace tessera {

absl::string_view LayoutName(Layout layout) {
  return layout == Layout::kStrided ? "torch.strided" : "torch.sparse_coo";
}

absl::string_view MemoryFormatName(MemoryFormat format) {
  switch (format) {
    case MemoryFormat::kContiguous:
      return "torch.contiguous_format";
    case MemoryFormat::kChannelsLast:
      return "torch.channels_last";
    case MemoryFormat::kPreserve:
      break;
  }
  return "torch.preserve_format";
}

std::string TensorProperties::ToString() const {
  return absl::StrCat("TensorProperties(dtype=torch.", DTypeName(dtype),
                      ", layout=", LayoutName(layout),
                      ", requires_grad=", requires_grad ? "True" : "False",
                      ", memory_format=", MemoryFormatName(memory_format),
                      ", pin_memory=", pin_memory ? "True" : "False", ")");
}

std::ostream& operator<<(std::ostream& os, const TensorProperties& p) {
  return os << p.ToString();
}

}  // namespace tessera
