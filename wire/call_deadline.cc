#include "wire/call_deadline.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace tessera {

void SetCallDeadline(grpc::ClientContext& context, absl::Time deadline) {
  context.set_deadline(absl::ToChronoTime(deadline));
  if (deadline == absl::InfiniteFuture()) return;
  const int64_t left =
      std::max<int64_t>(0, absl::ToInt64Microseconds(deadline - absl::Now()));
  context.AddMetadata(kTimeoutKey, absl::StrCat(left));
}

absl::Time CallDeadlineOf(const grpc::ServerContextBase& context,
                          absl::Time received) {
  const absl::Time deadline = absl::FromChrono(context.deadline());
  const auto& metadata = context.client_metadata();
  const auto found = metadata.find(kTimeoutKey);
  if (found == metadata.end()) return deadline;
  const absl::string_view text(found->second.data(), found->second.size());
  // SimpleAtoi refuses a value beyond int64 too.
  int64_t left = 0;
  if (!absl::SimpleAtoi(text, &left) || left < 0) return deadline;
  return std::min(deadline, received + absl::Microseconds(left));
}

}  // namespace tessera
