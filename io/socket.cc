#include "io/socket.h"

#include "absl/strings/match.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "io/errno.h"
#include "io/read_spin.h"

namespace tessera {

std::string JoinHostPort(absl::string_view host, int port) {
  if (absl::StrContains(host, ':') && !absl::StartsWith(host, "[")) {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}
namespace {

absl::Status Errno(absl::string_view what) {
  return ErrnoError(errno, what, absl::StatusCode::kUnavailable);
}

// A read still missing at least this many bytes blocks at once: the wait
// is for the next segment of a transfer already streaming (io/read_spin.h).
constexpr size_t kBulkReadBytes = size_t{64} << 10;

void TuneSocket(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

}  // namespace

bool IsLoopbackHost(absl::string_view host) {
  host = absl::StripPrefix(absl::StripSuffix(host, "]"), "[");
  if (host == "localhost" || host == "::1") return true;
  in_addr addr{};
  const std::string text(host);
  return inet_pton(AF_INET, text.c_str(), &addr) == 1 &&
         (ntohl(addr.s_addr) >> 24) == 127;
}

bool IsIpAddress(absl::string_view host) {
  const std::string text(host);
  in_addr v4{};
  in6_addr v6{};
  return inet_pton(AF_INET, text.c_str(), &v4) == 1 ||
         inet_pton(AF_INET6, text.c_str(), &v6) == 1;
}

void InterruptSocket(int fd) {
  if (fd >= 0) shutdown(fd, SHUT_RDWR);
}

bool PeerHungUp(int fd) {
  pollfd entry{fd, POLLRDHUP, 0};
  int ready;
  do {
    ready = poll(&entry, 1, 0);
  } while (ready < 0 && errno == EINTR);
  return ready > 0 && (entry.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

absl::Status CheckDeadline(absl::Time deadline, absl::string_view what) {
  if (absl::Now() < deadline) return absl::OkStatus();
  return absl::DeadlineExceededError(absl::StrCat(what, ": deadline exceeded"));
}

absl::Status AwaitReady(int fd, short events, absl::Time deadline,
                        absl::string_view what) {
  while (true) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return CheckDeadline(deadline, what);
    pollfd p{fd, events, 0};
    // Capped before the +1: an infinite deadline is INT64_MAX milliseconds,
    // which would wrap to a zero timeout and spin.
    constexpr int64_t kMaxWaitMs = int64_t{1} << 30;
    const int timeout_ms = static_cast<int>(
        std::min(absl::ToInt64Milliseconds(left), kMaxWaitMs - 1) + 1);
    const int ready = poll(&p, 1, timeout_ms);
    if (ready > 0) return absl::OkStatus();
    if (ready < 0 && errno != EINTR) return Errno(what);
  }
}

absl::StatusOr<UniqueFd> ConnectTcp(const std::string& address,
                                    absl::Time deadline) {
  size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("address without a port: ", address));
  }
  std::string host = address.substr(0, colon);
  std::string port = address.substr(colon + 1);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found);
      rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("resolving ", address, ": ", gai_strerror(rc)));
  }
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> owner(found, freeaddrinfo);
  UniqueFd socket(
      ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!socket.valid()) return Errno("socket");
  const std::string what = absl::StrCat("connecting to ", address);
  if (connect(socket.get(), found->ai_addr, found->ai_addrlen) != 0) {
    if (errno != EINPROGRESS) return Errno(what);
    absl::Status ready = AwaitReady(socket.get(), POLLOUT, deadline, what);
    if (!ready.ok()) return ready;
    int error = 0;
    socklen_t len = sizeof(error);
    getsockopt(socket.get(), SOL_SOCKET, SO_ERROR, &error, &len);
    if (error != 0) {
      errno = error;
      return Errno(what);
    }
  }
  TuneSocket(socket.get());
  return socket;
}

absl::StatusOr<std::pair<UniqueFd, int>> ListenTcp(const std::string& host,
                                                   int port) {
  UniqueFd socket(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!socket.valid()) return Errno("socket");
  int one = 1;
  setsockopt(socket.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data plane needs an IPv4 address to listen on, got ", host));
  }
  socklen_t len = sizeof(addr);
  if (bind(socket.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    const int error = errno;
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", JoinHostPort(host, port), ": ",
        std::strerror(error), error == EADDRINUSE ? " (port in use)" : ""));
  }
  if (listen(socket.get(), 128) != 0 ||
      getsockname(socket.get(), reinterpret_cast<sockaddr*>(&addr), &len) !=
          0) {
    return Errno(absl::StrCat("listening on ", host));
  }
  return std::make_pair(std::move(socket),
                        static_cast<int>(ntohs(addr.sin_port)));
}

absl::StatusOr<size_t> ReadAtLeast(int fd, void* data, size_t at_least,
                                   size_t at_most, absl::Time deadline) {
  char* const start = static_cast<char*>(data);
  char* out = start;
  size_t room = at_most;
  // Each wait first polls the socket in a loop for a moment, while waits
  // are short (io/read_spin.h).
  ReadSpin wait;
  while (static_cast<size_t>(out - start) < at_least) {
    absl::Status in_time = CheckDeadline(deadline, "recv");
    if (!in_time.ok()) return in_time;
    ssize_t n = recv(fd, out, room, MSG_DONTWAIT);
    if (n > 0) {
      out += n;
      room -= static_cast<size_t>(n);
      wait.Got();
      continue;
    }
    if (n == 0) return absl::UnavailableError("connection closed by peer");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return Errno("recv");
    if (wait.Poll(at_least - static_cast<size_t>(out - start) <
                  kBulkReadBytes)) {
      continue;
    }
    absl::Status ready = AwaitReady(fd, POLLIN, deadline, "recv");
    if (!ready.ok()) return ready;
  }
  return static_cast<size_t>(out - start);
}

absl::Status ReadFull(int fd, void* data, size_t size, absl::Time deadline) {
  return ReadAtLeast(fd, data, size, size, deadline).status();
}

absl::Status WriteFull(int fd, const void* data, size_t size,
                       absl::Time deadline, bool more) {
  const int flags = MSG_DONTWAIT | MSG_NOSIGNAL | (more ? MSG_MORE : 0);
  const char* in = static_cast<const char*>(data);
  while (size > 0) {
    absl::Status in_time = CheckDeadline(deadline, "send");
    if (!in_time.ok()) return in_time;
    ssize_t n = send(fd, in, size, flags);
    if (n > 0) {
      in += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return Errno("send");
    absl::Status ready = AwaitReady(fd, POLLOUT, deadline, "send");
    if (!ready.ok()) return ready;
  }
  return absl::OkStatus();
}

absl::Status WriteVFull(int fd, std::vector<struct iovec>& pieces,
                        absl::Time deadline, bool more) {
  const int flags = MSG_DONTWAIT | MSG_NOSIGNAL | (more ? MSG_MORE : 0);
  size_t first = 0;  // The first piece not yet sent whole.
  while (true) {
    while (first < pieces.size() && pieces[first].iov_len == 0) ++first;
    if (first == pieces.size()) break;
    absl::Status in_time = CheckDeadline(deadline, "send");
    if (!in_time.ok()) return in_time;
    msghdr message{};
    message.msg_iov = pieces.data() + first;
    message.msg_iovlen = std::min<size_t>(pieces.size() - first, IOV_MAX);
    // Pieces beyond this call: MSG_MORE so the segments stay full.
    const bool rest = first + message.msg_iovlen < pieces.size();
    ssize_t n = sendmsg(fd, &message, flags | (rest ? MSG_MORE : 0));
    if (n > 0) {
      size_t sent = static_cast<size_t>(n);
      while (first < pieces.size() && sent >= pieces[first].iov_len) {
        sent -= pieces[first].iov_len;
        ++first;
      }
      if (sent > 0) {
        pieces[first].iov_base =
            static_cast<char*>(pieces[first].iov_base) + sent;
        pieces[first].iov_len -= sent;
      }
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return Errno("send");
    absl::Status ready = AwaitReady(fd, POLLOUT, deadline, "send");
    if (!ready.ok()) return ready;
  }
  pieces.clear();
  return absl::OkStatus();
}

}  // namespace tessera
