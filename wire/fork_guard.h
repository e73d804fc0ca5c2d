// gRPC and fork(): a process forked from one that already used gRPC (a
// client or a daemon) must not use it, and now says so instead of hanging.
//
// Why: gRPC's threads (its pollers and timers) do not survive fork(), and
// the child inherits its parent's epoll set. A child's call then waited
// forever, past its deadline (no timer thread fires it), and its sockets'
// events could wake the parent's pollers, which would take them for their
// own. gRPC's own fork support (GRPC_ENABLE_FORK_SUPPORT) does not make a
// child's calls work in the gRPC this project builds with (1.51: they end
// DEADLINE_EXCEEDED). Typical ways in: multiprocessing's default "fork"
// start method, torch DataLoader workers, os.fork() after connecting.
//
// NoteGrpcInUse() is called by CreateTesseraChannel (every channel the
// client library and the daemons make) before gRPC starts. From then on, in
// a child forked from this process (or from a child of it):
//   - every call on a channel that carries ForkGuardInterceptorFactory ends
//     at once with FAILED_PRECONDITION (ForkedAfterGrpcError), without
//     touching gRPC's transport, whether the channel was made before the
//     fork or after;
//   - CheckNotForkedAfterGrpc returns that status, for code that would use
//     a connection inherited from the parent (a data-plane or local-path
//     socket: writing to one would mix the child's bytes into the parent's
//     stream).
// The parent is unaffected. A process started by exec (multiprocessing's
// "spawn" or "forkserver", subprocess) starts clean.
//
// Thread-safety: all functions may be called from any thread.
#ifndef TESSERA_WIRE_FORK_GUARD_H_
#define TESSERA_WIRE_FORK_GUARD_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/channel.h"
#include "grpcpp/support/client_interceptor.h"

namespace tessera {

// Marks this process as a user of gRPC (idempotent; cheap after the first
// call): children forked from now on are refused.
void NoteGrpcInUse();

// True in a process forked (at any depth) after a process called
// NoteGrpcInUse, and before any exec.
bool ForkedAfterGrpc();

// FAILED_PRECONDITION: "<what>: this process was forked from one that had
// already used gRPC ..." with the ways out.
absl::Status ForkedAfterGrpcError(absl::string_view what);

// OK, or ForkedAfterGrpcError(what) when ForkedAfterGrpc().
absl::Status CheckNotForkedAfterGrpc(absl::string_view what);

// `channel` as a pointer whose last owner, in a process ForkedAfterGrpc(),
// leaves the channel to the process's end instead of destroying it (tearing
// down a channel inherited from the parent aborts inside gRPC: its threads
// are not there); elsewhere the channel goes as usual.
std::shared_ptr<grpc::Channel> KeptInForkedChildren(
    std::shared_ptr<grpc::Channel> channel);

// A client interceptor factory that, in a process ForkedAfterGrpc(), makes
// every call fail as above before it reaches the transport (a hijacking
// interceptor); it adds nothing to calls elsewhere.
std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>
ForkGuardInterceptorFactory();

}  // namespace tessera

#endif  // TESSERA_WIRE_FORK_GUARD_H_
