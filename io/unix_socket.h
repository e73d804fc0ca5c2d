// Unix-domain sockets for the local path (proto/tessera/v1/local.proto,
// docs/data_plane.md): abstract-namespace SOCK_SEQPACKET sockets carrying one
// message per packet, optionally with a file descriptor attached (SCM_RIGHTS),
// and the host id that tells whether two processes share a kernel.
//
// Every call is bounded by an absolute deadline: DEADLINE_EXCEEDED when it
// passes, UNAVAILABLE when the peer is gone or the socket fails. Sockets
// are non-blocking and close-on-exec, so are received descriptors; SIGPIPE
// is never raised. Nothing aborts on a peer's bad input.
//
// Thread-compatible: one thread per socket at a time.
#ifndef TESSERA_IO_UNIX_SOCKET_H_
#define TESSERA_IO_UNIX_SOCKET_H_

#include <sys/types.h>

#include <cstddef>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "io/unique_fd.h"

namespace tessera {

// Largest message either side sends or accepts.
inline constexpr size_t kMaxLocalMessageBytes = 64 << 10;

// The kernel's boot id (/proc/sys/kernel/random/boot_id): two processes see
// the same id exactly when they run on one kernel, that is one host (any
// containers on it included). Read once; "" when it cannot be read, which
// disables the local path.
const std::string& HostId();

// "<host id>/<socket name>", the local address a worker publishes.
std::string LocalAddress(absl::string_view host_id, absl::string_view name);
// Its two parts; INVALID_ARGUMENT for anything else (an empty part, a name
// too long for a socket address or holding a NUL).
absl::StatusOr<std::pair<std::string, std::string>> ParseLocalAddress(
    absl::string_view address);

// A new listening socket in the abstract namespace under a fresh name
// ("tessera-<pid>-<random>"): the socket and the name.
absl::StatusOr<std::pair<UniqueFd, std::string>> ListenLocal();
// Connects to the abstract socket `name`. UNAVAILABLE when nothing listens
// under that name in this network namespace, or its backlog is full.
absl::StatusOr<UniqueFd> ConnectLocal(absl::string_view name,
                                      absl::Time deadline);

// Sends one message (1 to kMaxLocalMessageBytes bytes), with `attach_fd`
// attached when it is >= 0 (the descriptor stays the caller's).
absl::Status SendLocalMessage(int fd, absl::string_view message,
                              absl::Time deadline, int attach_fd = -1);
// Receives one message. A descriptor attached to it is moved to *attached,
// or closed when `attached` is null. UNAVAILABLE when the peer has closed
// the connection; DATA_LOSS (and nothing kept) for a message longer than
// kMaxLocalMessageBytes or carrying more than one descriptor. The wait
// polls a moment before it blocks (io/read_spin.h) unless `poll` is
// false: for a message the peer sends after long work of its own (a
// lease's "done" after a large copy), whose wait says nothing of this
// host's wake-ups and is not counted.
absl::StatusOr<std::string> ReceiveLocalMessage(int fd, absl::Time deadline,
                                                UniqueFd* attached = nullptr,
                                                bool poll = true);

// The effective user id of the process at the other end (SO_PEERCRED, as
// it was when it connected).
absl::StatusOr<uid_t> PeerUid(int fd);

}  // namespace tessera

#endif  // TESSERA_IO_UNIX_SOCKET_H_
