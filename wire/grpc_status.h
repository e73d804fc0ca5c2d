// Conversion between absl::Status (used everywhere inside Tessera) and
// grpc::Status (used only at the RPC edge). The canonical codes are
// numerically identical in both libraries, so the code and the message
// cross unchanged in both directions (a message longer than
// kMaxGrpcMessageBytes is cut in its middle); payloads are not carried.
//
// Lives in wire/ because both the client library and the server need it.
// Pure functions; thread-safe.
#ifndef TESSERA_WIRE_GRPC_STATUS_H_
#define TESSERA_WIRE_GRPC_STATUS_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/status.h"

namespace tessera {

// The longest message a grpc::Status carries. gRPC sends it in a trailer
// (grpc-message, percent-encoded: up to 3 bytes a byte), and a peer refuses
// metadata beyond 8 KiB by replacing the whole status with
// RESOURCE_EXHAUSTED, so an error quoting a hostile 100,000-character name
// would reach its caller as "metadata size exceeds limit", its code lost.
inline constexpr size_t kMaxGrpcMessageBytes = 2048;

// `message`, or its head and tail with what was cut said between them
// when it is longer than kMaxGrpcMessageBytes (at most that long).
inline std::string CapGrpcMessage(absl::string_view message) {
  if (message.size() <= kMaxGrpcMessageBytes) return std::string(message);
  constexpr size_t kHead = 1280;
  constexpr size_t kTail = 640;
  return absl::StrCat(message.substr(0, kHead), " [... ",
                      message.size() - kHead - kTail, " bytes cut ...] ",
                      message.substr(message.size() - kTail));
}

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      CapGrpcMessage(status.message()));
}

inline absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

}  // namespace tessera

#endif  // TESSERA_WIRE_GRPC_STATUS_H_
