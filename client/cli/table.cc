#include "client/cli/table.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/tensor/tensor.h"

namespace tessera::cli {

std::string FormatColumns(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    if (widths.size() < row.size()) widths.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) {
      widths[i] = std::max(widths[i], row[i].size());
    }
  }
  std::string text;
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) {
      absl::StrAppend(&text, row[i]);
      if (i + 1 < row.size()) {
        text.append(widths[i] - row[i].size() + 2, ' ');
      }
    }
    text.push_back('\n');
  }
  return text;
}

std::string FormatDims(absl::Span<const int64_t> dims) {
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
}

std::string FormatBytes(int64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double value = static_cast<double>(bytes) / 1024;
  int unit = 0;
  while (value >= 1024 && unit + 1 < static_cast<int>(std::size(kUnits))) {
    value /= 1024;
    ++unit;
  }
  if (value < 10) return absl::StrFormat("%.2f %s", value, kUnits[unit]);
  return absl::StrFormat("%.1f %s", value, kUnits[unit]);
}

std::string DescribeArray(DType dtype, absl::Span<const int64_t> sizes) {
  const std::optional<int64_t> numel = CheckedProduct(sizes);
  const int64_t element_size = static_cast<int64_t>(ElementSize(dtype));
  std::string text =
      absl::StrCat(DTypeName(dtype), " ", FormatDims(sizes), ", ");
  if (numel.has_value() &&
      *numel <= std::numeric_limits<int64_t>::max() / element_size) {
    absl::StrAppend(&text, FormatBytes(*numel * element_size));
  } else {
    absl::StrAppend(&text, "too many bytes");
  }
  return text;
}

}  // namespace tessera::cli
