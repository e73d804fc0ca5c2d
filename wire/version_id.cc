#include "wire/version_id.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tessera {

std::string VersionId(absl::string_view tensor_id, int64_t number) {
  return absl::StrCat(tensor_id, "@", number);
}

bool IsVersionOf(absl::string_view id, absl::string_view tensor_id) {
  return VersionNumber(id) >= 1 && VersionBase(id) == tensor_id;
}

int64_t VersionNumber(absl::string_view id) {
  const size_t at = id.rfind('@');
  int64_t number = 0;
  if (at == absl::string_view::npos ||
      !absl::SimpleAtoi(id.substr(at + 1), &number) || number < 1) {
    return 0;
  }
  return number;
}

std::string RegistrationId(absl::string_view tensor_id, int64_t number) {
  return number <= 1 ? std::string(tensor_id) : VersionId(tensor_id, number);
}

namespace {
constexpr absl::string_view kAtLeast = "@>=";
}  // namespace

std::string AtLeastId(absl::string_view tensor_id, int64_t number) {
  return absl::StrCat(tensor_id, kAtLeast, number);
}

std::optional<AtLeast> ParseAtLeast(absl::string_view id) {
  const size_t at = id.rfind(kAtLeast);
  if (at == absl::string_view::npos) return std::nullopt;
  const absl::string_view base = id.substr(0, at);
  const absl::string_view digits = id.substr(at + kAtLeast.size());
  AtLeast parsed;
  if (digits.empty() || digits.size() > 18 ||
      !std::all_of(digits.begin(), digits.end(),
                   [](char c) { return c >= '0' && c <= '9'; }) ||
      !absl::SimpleAtoi(digits, &parsed.number) || parsed.number < 1) {
    return std::nullopt;
  }
  parsed.latest_id = std::string(base);
  return parsed;
}

bool Versioned(const v1::TensorInfo& info) { return info.versions_kept() >= 2; }

absl::string_view VersionBase(absl::string_view id) {
  const size_t at = id.rfind('@');
  return at == absl::string_view::npos ? id : id.substr(0, at);
}

}  // namespace tessera
