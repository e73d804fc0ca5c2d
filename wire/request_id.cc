#include "wire/request_id.h"

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/nonce.h"

namespace tessera {

std::string NewRequestId() { return absl::StrFormat("r-%016x", RandomNonce()); }

void SetRequestId(grpc::ClientContext& context, const std::string& id) {
  context.AddMetadata(kRequestIdKey, id);
}

std::string QuotedRequestId(absl::string_view id) {
  if (id.size() <= kMaxRequestIdBytes) {
    return absl::StrCat("'", absl::CEscape(id), "'");
  }
  return absl::StrCat("'", absl::CEscape(id.substr(0, kMaxRequestIdBytes)),
                      "...' (", id.size(), " bytes)");
}

bool IsValidRequestId(absl::string_view id) {
  if (id.empty() || id.size() > kMaxRequestIdBytes) return false;
  for (const char c : id) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' &&
        c != '_' && c != ':' && c != '-') {
      return false;
    }
  }
  return true;
}

std::string RequestIdOf(const grpc::ServerContextBase& context) {
  const auto& metadata = context.client_metadata();
  const auto found = metadata.find(kRequestIdKey);
  if (found == metadata.end()) return "";
  const absl::string_view value(found->second.data(), found->second.size());
  return IsValidRequestId(value) ? std::string(value) : "";
}

}  // namespace tessera
