#include "io/errno.h"

#include <string>

namespace tessera {

absl::Status ErrnoError(int error, absl::string_view context) {
  return absl::ErrnoToStatus(error, context);
}

absl::Status ErrnoError(int error, absl::string_view context,
                        absl::StatusCode code) {
  return absl::Status(code, absl::ErrnoToStatus(error, context).message());
}

}  // namespace tessera
