// Plain-text tables and shapes for the subcommands' output.
//
// Pure functions; thread-safe.
#ifndef TESSERA_CLIENT_CLI_TABLE_H_
#define TESSERA_CLIENT_CLI_TABLE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "common/dtype.h"

namespace tessera::cli {

// Rows of cells, left-aligned in columns two spaces apart; each row ends
// in '\n' and carries no trailing spaces.
std::string FormatColumns(const std::vector<std::vector<std::string>>& rows);

// "[10, 20]".
std::string FormatDims(absl::Span<const int64_t> dims);

// "512 B", "1.50 KiB", "37.1 MiB", "1.25 GiB".
std::string FormatBytes(int64_t bytes);

// "float32 [10, 20], 800 B": an array's dtype, shape and size.
std::string DescribeArray(DType dtype, absl::Span<const int64_t> sizes);

}  // namespace tessera::cli

#endif  // TESSERA_CLIENT_CLI_TABLE_H_
