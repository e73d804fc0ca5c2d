#include "common/tensor_name.h"

#include <cctype>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace tessera {
namespace {

// What ShownName keeps of a name too long to be one.
constexpr size_t kShownPrefix = 64;

}  // namespace

absl::Status ValidateTensorName(absl::string_view name) {
  bool ok = !name.empty() && name.size() <= kMaxTensorNameLength;
  for (char c : name) {
    ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_' ||
                c == '.' || c == '-');
  }
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("invalid tensor name \"", absl::CHexEscape(ShownName(name)),
                   "\": a name is 1 to ", kMaxTensorNameLength,
                   " characters of [A-Za-z0-9_.-]"));
}

std::string ShownText(absl::string_view text, size_t longest, size_t shown) {
  if (text.size() <= longest) return std::string(text);
  return absl::StrCat(text.substr(0, shown), "...(", text.size(), " bytes)");
}

std::string ShownName(absl::string_view name) {
  return ShownText(name, kMaxTensorNameLength, kShownPrefix);
}

}  // namespace tessera
