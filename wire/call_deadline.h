// Call deadlines as the client meant them. gRPC sends a call's deadline as
// a relative timeout whose encoding "may round up arbitrarily": with
// gRPC 1.51 a timeout of 30 s arrives as up to a few hundred milliseconds
// more, and a retry that reuses the header a first attempt compressed
// arrives with the first attempt's timeout. A daemon that answers a
// logged call just before its deadline (server/daemon/op_log.h,
// kAnswerMargin) then answers after the client gave up, and the client is
// left unsure whether its operation ran. So a Tessera client also sends
// the time it has left, unrounded, in microseconds
// (x-tessera-timeout-us), and a daemon takes the sooner of the two.
//
// Thread-safety: free functions, safe from any thread.
// Failure modes: a missing, malformed or negative header is ignored
// (gRPC's deadline stands); a header can only make a deadline sooner.
#ifndef TESSERA_WIRE_CALL_DEADLINE_H_
#define TESSERA_WIRE_CALL_DEADLINE_H_

#include "absl/time/time.h"
#include "grpcpp/client_context.h"
#include "grpcpp/server_context.h"

namespace tessera {

// The metadata key (gRPC keys are lower case).
inline constexpr char kTimeoutKey[] = "x-tessera-timeout-us";

// Sets the call's gRPC deadline to `deadline` and, unless it is infinite,
// adds the time left until it (from now, in microseconds, rounded down) to
// its metadata. Call right before the call starts, once per context.
void SetCallDeadline(grpc::ClientContext& context, absl::Time deadline);

// The call's deadline: gRPC's, or `received` plus the time the client said
// it had left when that is sooner. `received`: when the call arrived
// (absl::Now() when the handler starts).
absl::Time CallDeadlineOf(const grpc::ServerContextBase& context,
                          absl::Time received = absl::Now());

}  // namespace tessera

#endif  // TESSERA_WIRE_CALL_DEADLINE_H_
