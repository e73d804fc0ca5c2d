// Errors of system calls as absl::Status values, with one message shape:
// "<context>: <strerror(error)>".
//
// ErrnoError picks the code from the errno value (absl::ErrnoToStatus's
// table: ENOENT is NOT_FOUND, EACCES PERMISSION_DENIED, ENOSPC
// RESOURCE_EXHAUSTED, ECONNRESET UNAVAILABLE...). Sockets report every
// failure of the connection as UNAVAILABLE whatever errno says (the peer is
// gone or unreachable; the caller may retry elsewhere), which the overload
// with a code gives.
//
// Thread-safe (strerror is not called: absl's message uses the thread-safe
// strerror_r).
#ifndef TESSERA_IO_ERRNO_H_
#define TESSERA_IO_ERRNO_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tessera {

// "<context>: <description of error>", with the code for `error`.
absl::Status ErrnoError(int error, absl::string_view context);
// The same message with a fixed `code`.
absl::Status ErrnoError(int error, absl::string_view context,
                        absl::StatusCode code);

}  // namespace tessera

#endif  // TESSERA_IO_ERRNO_H_
