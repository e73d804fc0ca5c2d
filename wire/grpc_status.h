// Conversion between absl::Status (used everywhere inside Tessera) and
// grpc::Status (used only at the RPC edge). The canonical codes are
// numerically identical in both libraries, so the code and the message
// cross unchanged in both directions; payloads are not carried.
//
// Lives in wire/ because both the client library and the server need it.
// Pure functions; thread-safe.
#ifndef TESSERA_WIRE_GRPC_STATUS_H_
#define TESSERA_WIRE_GRPC_STATUS_H_

#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace tessera {

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

inline absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

}  // namespace tessera

#endif  // TESSERA_WIRE_GRPC_STATUS_H_
