// Error-propagation macros for absl::Status / absl::StatusOr.
//
// Abseil 20220623 (the Debian bookworm LTS) ships no status macros, so
// Tessera carries its own, modelled on tensorstore's.
//
//   RETURN_IF_ERROR(expr);            // returns expr's Status if not ok.
//   ASSIGN_OR_RETURN(auto x, expr);   // x = *expr, or returns its Status.
#ifndef TESSERA_COMMON_STATUS_MACROS_H_
#define TESSERA_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace tessera::internal_status {
inline const absl::Status& GetStatus(const absl::Status& status) {
  return status;
}
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}
}  // namespace tessera::internal_status

#define TESSERA_STATUS_CONCAT_INNER_(a, b) a##b
#define TESSERA_STATUS_CONCAT_(a, b) TESSERA_STATUS_CONCAT_INNER_(a, b)

#define RETURN_IF_ERROR(expr)                           \
  for (absl::Status tessera_status_ =                   \
           ::tessera::internal_status::GetStatus(expr); \
       !tessera_status_.ok();)                          \
  return tessera_status_

#define TESSERA_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                   \
  if (!tmp.ok()) return std::move(tmp).status();       \
  lhs = std::move(tmp).value()

#define ASSIGN_OR_RETURN(lhs, expr) \
  TESSERA_ASSIGN_OR_RETURN_IMPL_(   \
      TESSERA_STATUS_CONCAT_(tessera_statusor_, __LINE__), lhs, expr)

namespace tessera {

// `status` with "<context>: " put before its message, same code: what a
// layer was doing when a call below it failed. OK stays OK.
inline absl::Status Annotate(const absl::Status& status,
                             absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrCat(context, ": ", status.message()));
}

}  // namespace tessera

#endif  // TESSERA_COMMON_STATUS_MACROS_H_
