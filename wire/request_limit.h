// The largest request a Tessera daemon takes, and the client's check of a
// request against it before sending.
//
// A daemon's gRPC server receives messages of up to kMaxRequestBytes
// (server/serve/shard_service.h: ConfigureShardServer; gRPC's default,
// 4 MiB, refused a version group of more than about 60,000 names). A
// larger request would cross the wire only to be refused with
// RESOURCE_EXHAUSTED, and one beyond 2 GiB cannot even be serialized:
// gRPC's synchronous stub then aborts the calling process (a delete of
// 3,000 names of 1 MiB each did). CheckRequestSize refuses both before any
// byte is sent.
//
// Pure functions; thread-safe.
#ifndef TESSERA_WIRE_REQUEST_LIMIT_H_
#define TESSERA_WIRE_REQUEST_LIMIT_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/message_lite.h"

namespace tessera {

inline constexpr int kMaxRequestBytes = 64 << 20;

// OK when `request` fits what a daemon takes; RESOURCE_EXHAUSTED "the
// request is N bytes, more than the 67108864 a daemon takes ..." otherwise
// (the code a daemon's gRPC server answers an oversized message with).
inline absl::Status CheckRequestSize(
    const google::protobuf::MessageLite& request) {
  const size_t bytes = request.ByteSizeLong();
  if (bytes <= static_cast<size_t>(kMaxRequestBytes)) {
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "the request is ", bytes, " bytes, more than the ", kMaxRequestBytes,
      " a daemon takes: name fewer tensors (or shorter names) in one call"));
}

}  // namespace tessera

#endif  // TESSERA_WIRE_REQUEST_LIMIT_H_
