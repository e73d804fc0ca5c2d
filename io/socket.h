// Blocking TCP I/O with deadlines, for the raw data plane
// (server/serve/data_plane_server.h, ShardClient). Every call is bounded by an
// absolute deadline and returns DEADLINE_EXCEEDED when it passes, UNAVAILABLE
// when the peer is gone or the connection fails; nothing blocks forever and
// SIGPIPE is never raised (MSG_NOSIGNAL).
//
// Thread-compatible: one thread per file descriptor at a time.
#ifndef TESSERA_IO_SOCKET_H_
#define TESSERA_IO_SOCKET_H_

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "io/unique_fd.h"

namespace tessera {

// "localhost", 127.0.0.0/8 or ::1 (bracketed or not); purely textual.
bool IsLoopbackHost(absl::string_view host);
// An IPv4 or IPv6 address (not a name); purely textual.
bool IsIpAddress(absl::string_view host);

// Interrupts any thread blocked on the socket `fd` (shutdown(2) both
// ways); does not close it.
void InterruptSocket(int fd);

// Whether the peer of the connected socket `fd` has shut down its sending
// side or the connection failed (poll(2) POLLRDHUP, POLLHUP or POLLERR, not
// waiting): a client that gave up on its request (cancelled, or past its
// deadline) has closed or shut down its socket. Bytes it sent before
// remain readable either way.
bool PeerHungUp(int fd);

// Waits until `fd` is ready for `events` (poll(2) flags; an error or hang-up
// counts as ready) or `deadline` passes: DEADLINE_EXCEEDED "<what>:
// deadline exceeded", or UNAVAILABLE when poll fails.
absl::Status AwaitReady(int fd, short events, absl::Time deadline,
                        absl::string_view what);

// "host:port", bracketing a bare IPv6 host ("[::1]:80").
std::string JoinHostPort(absl::string_view host, int port);

// Connects to "host:port" (IPv4 or a resolvable name).
absl::StatusOr<UniqueFd> ConnectTcp(const std::string& address,
                                    absl::Time deadline);
// Listens on `host`:`port` (0: an ephemeral port); returns the socket and
// the port. A port in use is UNAVAILABLE naming host:port and "port in use".
absl::StatusOr<std::pair<UniqueFd, int>> ListenTcp(const std::string& host,
                                                   int port = 0);

// DEADLINE_EXCEEDED "<what>: deadline exceeded" once `deadline` has passed,
// else OK. Transfers call it before each system call, not only before they
// wait: a peer fast enough never to make them wait must not outlast it.
absl::Status CheckDeadline(absl::Time deadline, absl::string_view what);

// Reads or writes all `size` bytes, or fails: DEADLINE_EXCEEDED when
// `deadline` passes first (also while bytes keep arriving), UNAVAILABLE when
// the peer closes or the socket fails. A failed call may have moved part.
absl::Status ReadFull(int fd, void* data, size_t size, absl::Time deadline);
// Reads at least `at_least` and at most `at_most` bytes into `data` (what
// has arrived, once `at_least` is in): the number read, or ReadFull's errors.
absl::StatusOr<size_t> ReadAtLeast(int fd, void* data, size_t at_least,
                                   size_t at_most, absl::Time deadline);
// `more` says more data follows at once (MSG_MORE), so small pieces of one
// reply leave in one segment despite TCP_NODELAY.
absl::Status WriteFull(int fd, const void* data, size_t size,
                       absl::Time deadline, bool more = false);
// WriteFull of the pieces `pieces` points at, in order, gathered by the
// kernel (sendmsg with up to IOV_MAX pieces a call) instead of first
// copied into one buffer. `pieces` is consumed (advanced past what was
// sent); empty pieces are allowed.
absl::Status WriteVFull(int fd, std::vector<struct iovec>& pieces,
                        absl::Time deadline, bool more = false);
}  // namespace tessera

#endif  // TESSERA_IO_SOCKET_H_
