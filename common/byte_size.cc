#include "common/byte_size.h"

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace tessera {

absl::StatusOr<int64_t> ParseByteSize(absl::string_view flag,
                                      absl::string_view text) {
  struct Unit {
    absl::string_view suffix;
    double factor;
  };
  static constexpr Unit kUnits[] = {{"KiB", 1024.0},
                                    {"MiB", 1048576.0},
                                    {"GiB", 1073741824.0},
                                    {"TiB", 1099511627776.0},
                                    {"Ki", 1024.0},
                                    {"Mi", 1048576.0},
                                    {"Gi", 1073741824.0},
                                    {"Ti", 1099511627776.0},
                                    {"KB", 1e3},
                                    {"MB", 1e6},
                                    {"GB", 1e9},
                                    {"TB", 1e12},
                                    {"K", 1e3},
                                    {"M", 1e6},
                                    {"G", 1e9},
                                    {"T", 1e12},
                                    {"B", 1.0}};
  absl::string_view number = absl::StripAsciiWhitespace(text);
  double factor = 1;
  for (const Unit& unit : kUnits) {
    if (absl::ConsumeSuffix(&number, unit.suffix)) {
      factor = unit.factor;
      break;
    }
  }
  double value = 0;
  if (!absl::SimpleAtod(number, &value) || !(value >= 0) ||
      value * factor > 9.0e18) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, " must be a size such as 512MiB or 8GiB; got '", text, "'"));
  }
  return static_cast<int64_t>(value * factor);
}

}  // namespace tessera
