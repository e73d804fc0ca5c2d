#include "server/serve/connection_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "io/errno.h"

namespace tessera {

bool ConnectionServer::Connection::BeginRequest() {
  absl::MutexLock lock(&server_->mu_);
  if (server_->stopping_) return false;
  server_->busy_.insert(id_);
  return true;
}

bool ConnectionServer::Connection::EndRequest() {
  absl::MutexLock lock(&server_->mu_);
  server_->busy_.erase(id_);
  return !server_->stopping_;
}

bool ConnectionServer::Connection::ServeRequests(
    const std::function<absl::StatusOr<std::string>()>& next,
    const std::function<void()>& refuse,
    const std::function<bool(const std::string& request)>& answer) {
  while (true) {
    const absl::StatusOr<std::string> request = next();
    if (!request.ok()) return false;
    if (!BeginRequest()) {
      refuse();
      return true;
    }
    const bool open = answer(*request);
    if (!EndRequest()) return true;
    if (!open) return false;
  }
}

absl::StatusOr<std::unique_ptr<ConnectionServer>> ConnectionServer::Start(
    UniqueFd listener, int max_connections, Handler handler) {
  // Non-blocking, so that a client that gave up between poll and accept
  // cannot park the accept loop where Shutdown's wake-up does not reach.
  const int flags = fcntl(listener.get(), F_GETFL);
  if (flags < 0 || fcntl(listener.get(), F_SETFL, flags | O_NONBLOCK) != 0) {
    return ErrnoError(errno, "listener: fcntl", absl::StatusCode::kUnavailable);
  }
  UniqueFd wake(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid()) {
    return ErrnoError(errno, "eventfd", absl::StatusCode::kUnavailable);
  }
  std::unique_ptr<ConnectionServer> server(
      new ConnectionServer(std::move(listener), std::move(wake),
                           max_connections, std::move(handler)));
  server->acceptor_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

ConnectionServer::ConnectionServer(UniqueFd listener, UniqueFd wake,
                                   int max_connections, Handler handler)
    : listener_(std::move(listener)),
      wake_(std::move(wake)),
      max_connections_(max_connections),
      handler_(std::move(handler)) {}

ConnectionServer::~ConnectionServer() { Shutdown(); }

void ConnectionServer::AcceptLoop() {
  while (true) {
    pollfd fds[2] = {{listener_.get(), POLLIN, 0}, {wake_.get(), POLLIN, 0}};
    const int ready = poll(fds, 2, -1);
    const int poll_errno = errno;
    JoinFinished();
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
    }
    if (ready <= 0) {
      if (ready < 0 && poll_errno != EINTR) {
        absl::SleepFor(absl::Milliseconds(10));
      }
      continue;
    }
    const int fd = accept4(listener_.get(), nullptr, nullptr,
                           SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      // A peer that gave up before the accept is harmless; anything else
      // (EMFILE...) is retried after a pause rather than spun on.
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR &&
          errno != ECONNABORTED) {
        absl::SleepFor(absl::Milliseconds(10));
      }
      continue;
    }
    UniqueFd socket(fd);
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    if (static_cast<int>(connections_.size()) >= max_connections_) {
      continue;  // Refused: the socket closes here.
    }
    const uint64_t id = next_id_++;
    connections_.emplace(id, std::move(socket));
    threads_.emplace(id, std::thread([this, id, fd] { Serve(id, fd); }));
  }
}

void ConnectionServer::Serve(uint64_t id, int fd) {
  Connection connection(this, id, fd);
  handler_(connection);
  UniqueFd socket;
  {
    absl::MutexLock lock(&mu_);
    busy_.erase(id);  // A handler that returned mid-request is not busy.
    if (auto it = connections_.find(id); it != connections_.end()) {
      socket = std::move(it->second);
      connections_.erase(it);
    }
    finished_.push_back(id);
  }
  // Closed last, outside the lock: a peer that sees the close finds the
  // connection already put away (its bookkeeping freed).
  socket = UniqueFd();
}

void ConnectionServer::JoinFinished() {
  std::vector<std::thread> done;
  {
    absl::MutexLock lock(&mu_);
    for (uint64_t id : finished_) {
      auto it = threads_.find(id);
      if (it == threads_.end()) continue;
      done.push_back(std::move(it->second));
      threads_.erase(it);
    }
    finished_.clear();
  }
  for (std::thread& t : done) t.join();
}

void ConnectionServer::Shutdown(absl::Duration grace) {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    // Idle connections (between requests) are closed now; busy ones finish
    // their request first.
    for (const auto& [id, socket] : connections_) {
      if (busy_.count(id) == 0) InterruptSocket(socket.get());
    }
  }
  const uint64_t one = 1;
  while (write(wake_.get(), &one, sizeof(one)) < 0 && errno == EINTR) {
  }
  if (acceptor_.joinable()) acceptor_.join();
  // Closing the listener refuses new clients at once (and unbinds a Unix
  // socket's name).
  listener_ = UniqueFd();
  std::map<uint64_t, std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(this, &ConnectionServer::Drained),
                         grace);
    for (const auto& [id, socket] : connections_) InterruptSocket(socket.get());
    threads.swap(threads_);
    finished_.clear();
  }
  for (auto& [id, thread] : threads) thread.join();
}

}  // namespace tessera
