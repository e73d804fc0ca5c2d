#include "io/unix_socket.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "io/errno.h"
#include "io/read_spin.h"
#include "io/socket.h"

namespace tessera {
namespace {

absl::Status Errno(absl::string_view what, int error) {
  return ErrnoError(error, what, absl::StatusCode::kUnavailable);
}

// The longest name an abstract socket address holds (sun_path less the
// leading NUL).
constexpr size_t kMaxNameBytes = sizeof(sockaddr_un::sun_path) - 1;

socklen_t AbstractAddress(absl::string_view name, sockaddr_un* addr) {
  *addr = sockaddr_un{};
  addr->sun_family = AF_UNIX;
  addr->sun_path[0] = '\0';
  std::memcpy(addr->sun_path + 1, name.data(), name.size());
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 +
                                name.size());
}

std::string FreshName() {
  static std::mt19937_64 engine = [] {
    std::random_device device;
    return std::mt19937_64((static_cast<uint64_t>(device()) << 32) ^ device() ^
                           static_cast<uint64_t>(getpid()));
  }();
  static absl::Mutex mu(absl::kConstInit);
  absl::MutexLock lock(&mu);
  return absl::StrFormat("tessera-%d-%016x", getpid(), engine());
}

}  // namespace

const std::string& HostId() {
  static const std::string* const id = [] {
    std::ifstream file("/proc/sys/kernel/random/boot_id");
    std::string line;
    if (!file || !std::getline(file, line)) return new std::string();
    absl::StripAsciiWhitespace(&line);
    for (char c : line) {
      if (!absl::ascii_isxdigit(c) && c != '-') return new std::string();
    }
    return new std::string(line);
  }();
  return *id;
}

std::string LocalAddress(absl::string_view host_id, absl::string_view name) {
  return absl::StrCat(host_id, "/", name);
}

absl::StatusOr<std::pair<std::string, std::string>> ParseLocalAddress(
    absl::string_view address) {
  const size_t slash = address.find('/');
  if (slash == absl::string_view::npos || slash == 0 ||
      slash + 1 == address.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed local address \"", address,
                     "\" (expected <host id>/<socket name>)"));
  }
  const absl::string_view name = address.substr(slash + 1);
  if (name.size() > kMaxNameBytes ||
      name.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "malformed local address \"", address, "\": not a socket name"));
  }
  return std::make_pair(std::string(address.substr(0, slash)),
                        std::string(name));
}

absl::StatusOr<std::pair<UniqueFd, std::string>> ListenLocal() {
  // A name collision (another process drew the same random name) is
  // retried with a new one.
  for (int attempt = 0;; ++attempt) {
    UniqueFd socket(
        ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!socket.valid()) return Errno("socket", errno);
    std::string name = FreshName();
    sockaddr_un addr;
    const socklen_t len = AbstractAddress(name, &addr);
    if (bind(socket.get(), reinterpret_cast<const sockaddr*>(&addr), len) !=
        0) {
      if (errno == EADDRINUSE && attempt < 3) continue;
      return Errno(absl::StrCat("binding local socket ", name), errno);
    }
    if (listen(socket.get(), 128) != 0) {
      return Errno(absl::StrCat("listening on local socket ", name), errno);
    }
    return std::make_pair(std::move(socket), std::move(name));
  }
}

absl::StatusOr<UniqueFd> ConnectLocal(absl::string_view name,
                                      absl::Time deadline) {
  if (name.empty() || name.size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a local socket name: \"", name, "\""));
  }
  if (absl::Now() >= deadline) {
    return absl::DeadlineExceededError(absl::StrCat(
        "connecting to local socket ", name, ": deadline exceeded"));
  }
  UniqueFd socket(
      ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!socket.valid()) return Errno("socket", errno);
  sockaddr_un addr;
  const socklen_t len = AbstractAddress(name, &addr);
  // A Unix connect completes or fails at once; EAGAIN is a full backlog.
  if (connect(socket.get(), reinterpret_cast<const sockaddr*>(&addr), len) !=
      0) {
    return Errno(absl::StrCat("connecting to local socket ", name), errno);
  }
  return socket;
}

absl::Status SendLocalMessage(int fd, absl::string_view message,
                              absl::Time deadline, int attach_fd) {
  if (message.empty() || message.size() > kMaxLocalMessageBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("local message of ", message.size(), " bytes (1 to ",
                     kMaxLocalMessageBytes, " allowed)"));
  }
  iovec iov{const_cast<char*>(message.data()), message.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  if (attach_fd >= 0) {
    std::memset(control, 0, sizeof(control));
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* header = CMSG_FIRSTHDR(&msg);
    header->cmsg_level = SOL_SOCKET;
    header->cmsg_type = SCM_RIGHTS;
    header->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(header), &attach_fd, sizeof(int));
  }
  while (true) {
    const ssize_t n = sendmsg(fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n >= 0) {
      // A packet leaves whole or not at all.
      if (static_cast<size_t>(n) == message.size()) return absl::OkStatus();
      return absl::UnavailableError("sendmsg: short write on a local socket");
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return Errno("sendmsg", errno);
    const absl::Status ready = AwaitReady(fd, POLLOUT, deadline, "sendmsg");
    if (!ready.ok()) return ready;
  }
}

absl::StatusOr<std::string> ReceiveLocalMessage(int fd, absl::Time deadline,
                                                UniqueFd* attached, bool poll) {
  // Not zeroed: only the bytes received are kept.
  std::unique_ptr<char[]> buffer(new char[kMaxLocalMessageBytes]);
  // Room for a few descriptors, so that a peer attaching too many is seen
  // (and every one of them closed) rather than silently truncated.
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
  // Polls a moment before blocking, while waits are short
  // (io/read_spin.h): local messages are requests and their replies.
  ReadSpin wait;
  while (true) {
    iovec iov{buffer.get(), kMaxLocalMessageBytes};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t n = recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        return Errno("recvmsg", errno);
      }
      // At most ReadSpin::kReadSpin past the deadline: AwaitReady sees it.
      if (poll && wait.Poll(/*small=*/true)) continue;
      const absl::Status ready = AwaitReady(fd, POLLIN, deadline, "recvmsg");
      if (!ready.ok()) return ready;
      continue;
    }
    if (poll) wait.Got();
    // Owned at once, so that every return below closes what it drops.
    std::vector<UniqueFd> received;
    for (cmsghdr* header = CMSG_FIRSTHDR(&msg); header != nullptr;
         header = CMSG_NXTHDR(&msg, header)) {
      if (header->cmsg_level != SOL_SOCKET || header->cmsg_type != SCM_RIGHTS) {
        continue;
      }
      const size_t count = (header->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int received_fd;
        std::memcpy(&received_fd, CMSG_DATA(header) + i * sizeof(int),
                    sizeof(int));
        received.emplace_back(received_fd);
      }
    }
    // Zero-length messages are never sent: 0 is the peer's close.
    if (n == 0) return absl::UnavailableError("connection closed by peer");
    if ((msg.msg_flags & MSG_TRUNC) != 0) {
      return absl::DataLossError(absl::StrCat("local message longer than ",
                                              kMaxLocalMessageBytes, " bytes"));
    }
    if ((msg.msg_flags & MSG_CTRUNC) != 0 || received.size() > 1) {
      return absl::DataLossError(
          "local message carries more than one descriptor");
    }
    if (attached != nullptr && !received.empty()) {
      *attached = std::move(received.front());
    }
    return std::string(buffer.get(), static_cast<size_t>(n));
  }
}

absl::StatusOr<uid_t> PeerUid(int fd) {
  ucred credentials{};
  socklen_t len = sizeof(credentials);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &credentials, &len) != 0) {
    return Errno("SO_PEERCRED", errno);
  }
  return credentials.uid;
}

}  // namespace tessera
