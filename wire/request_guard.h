// What every Tessera gRPC server installs so that a request it cannot use
// gets a status that says why, naming the method.
//
// gRPC's callback API answers a request whose bytes do not parse as the
// method's message with UNIMPLEMENTED and an empty message (and so it does
// when a handler throws while creating its reactor). The guard, a server
// interceptor, rewrites those answers of methods the server does
// implement:
//  - when no request message was parsed (gRPC hands the interceptor none):
//    INVALID_ARGUMENT "<Service>/<Method>: malformed request: not a valid
//    <request type>";
//  - when one was (a handler that then failed unexpectedly): INTERNAL
//    "<Service>/<Method>: the request failed unexpectedly on this server
//    (see its log)".
// Unknown methods keep UNIMPLEMENTED. It costs one flag per call.
//
// It also reports every call that ends (its method, final code and time)
// to the process's RequestObserver, if one is set: the daemon counts them
// in its metrics (tessera_rpcs_total).
//
// Thread-safety: the factory is stateless; interceptors belong to one call.
#ifndef TESSERA_WIRE_REQUEST_GUARD_H_
#define TESSERA_WIRE_REQUEST_GUARD_H_

#include <grpcpp/server_builder.h>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace tessera {

// Called on gRPC's thread as each call of a guarded server sends its
// status: `method` is "tessera.v1.ControlService/GetCluster" for a method
// Tessera defines and "other" for any other name (health, reflection, or a
// name a client made up: a client cannot grow the set), `code` the status
// sent, `took` the time since the call arrived (a stream's whole life).
// Process-wide; null (the default) calls nothing. Set it before serving.
using RequestObserver = void (*)(absl::string_view method,
                                 grpc::StatusCode code, absl::Duration took);
void SetRequestObserver(RequestObserver observer);

// Adds the guard to `builder`'s interceptors (call before BuildAndStart),
// and removes gRPC's server reflection when SetServerReflection(false)
// was called.
void AddRequestGuard(grpc::ServerBuilder& builder);

// Whether every Tessera gRPC server this process builds from now on
// serves reflection (the default: linking gRPC's reflection library adds
// it to every server). A daemon's --reflection=false.
void SetServerReflection(bool enabled);

}  // namespace tessera

#endif  // TESSERA_WIRE_REQUEST_GUARD_H_
