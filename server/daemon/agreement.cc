#include "server/daemon/agreement.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace tessera::control_internal {

absl::Status Agree(ProcessGroup& group, const absl::Status& local,
                   bool* agreed) {
  absl::StatusOr<std::vector<absl::Status>> all =
      AllGatherStatuses(group, local);
  *agreed = all.ok();
  if (!all.ok()) return local.ok() ? all.status() : local;
  if (!local.ok()) return local;
  for (const absl::Status& status : *all) {
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

void ResyncTensorIds(Rank& rank, ProcessGroup& group) {
  // Taking an id is the only way to read the counter; one id is wasted.
  const std::string id = rank.NextTensorId(group);
  int64_t mine = 0;
  absl::SimpleAtoi(id.substr(id.rfind('/') + 1), &mine);
  absl::StatusOr<std::vector<std::string>> all =
      AllGatherBytes(group, absl::StrCat(mine));
  if (!all.ok()) {
    spdlog::error("control: re-aligning tensor ids: {}",
                  all.status().ToString());
    return;
  }
  int64_t top = mine;
  for (const std::string& theirs : *all) {
    int64_t value = 0;
    if (absl::SimpleAtoi(theirs, &value)) top = std::max(top, value);
  }
  for (int64_t i = mine; i < top; ++i) rank.NextTensorId(group);
}

}  // namespace tessera::control_internal
