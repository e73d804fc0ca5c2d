// Request ids: a client names each control call it makes with an id in
// the call's gRPC metadata (x-tessera-request-id), and the daemons log it
// with the operation the call started, on every daemon, so that one grep
// of the logs follows a client's call across the cluster
// (docs/metrics.md, "Logs"). For logged calls the id is also the
// operation's idempotency key (docs/control_log.md, "Retries and request
// ids").
//
// Thread-safety: free functions, safe from any thread.
#ifndef TESSERA_WIRE_REQUEST_ID_H_
#define TESSERA_WIRE_REQUEST_ID_H_

#include <string>

#include "absl/strings/string_view.h"
#include "grpcpp/client_context.h"
#include "grpcpp/server_context.h"

namespace tessera {

// The metadata key (gRPC keys are lower case).
inline constexpr char kRequestIdKey[] = "x-tessera-request-id";
// Ids longer than this, or with characters outside [A-Za-z0-9._:-], are
// ignored by daemons: an id ends up in every daemon's log. (Clients take
// ids of up to 64 bytes from users and add ".N" to number later calls,
// client/client.h.)
inline constexpr size_t kMaxRequestIdBytes = 80;

// Whether daemons accept `id` (see kMaxRequestIdBytes).
bool IsValidRequestId(absl::string_view id);

// `id` as an error message quotes it: escaped, in single quotes, and cut
// after kMaxRequestIdBytes ("..." and its size), so that a huge or
// binary id a caller sent is not echoed whole.
std::string QuotedRequestId(absl::string_view id);

// A new random id ("r-" and 16 hex digits).
std::string NewRequestId();

// Adds `id` to the call's metadata.
void SetRequestId(grpc::ClientContext& context, const std::string& id);

// The id the client sent, or "" when it sent none or one that is not
// acceptable (see kMaxRequestIdBytes).
std::string RequestIdOf(const grpc::ServerContextBase& context);

}  // namespace tessera

#endif  // TESSERA_WIRE_REQUEST_ID_H_
