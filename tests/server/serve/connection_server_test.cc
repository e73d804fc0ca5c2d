// ConnectionServer on a real TCP listener on 127.0.0.1, with real client
// sockets: a one-byte echo handler whose requests can be held open, to see
// the limit on connections and what Shutdown does to idle and busy ones.
#include "server/serve/connection_server.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "io/socket.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

constexpr absl::Duration kWait = absl::Seconds(10);

// A notification any number of threads may signal (absl::Notification
// aborts on a second Notify).
class FirstTime {
 public:
  void Notify() {
    if (!notified_.exchange(true)) notification_.Notify();
  }
  bool WaitForNotificationWithTimeout(absl::Duration timeout) {
    return notification_.WaitForNotificationWithTimeout(timeout);
  }

 private:
  std::atomic<bool> notified_{false};
  absl::Notification notification_;
};

// How an EchoServer's requests behave.
struct EchoOptions {
  int max_connections = 8;
  // A request waits for this before answering.
  absl::Notification* gate = nullptr;
  // A byte read waits for this before its request begins.
  absl::Notification* before_begin = nullptr;
  // A request reads a second byte (blocking in the socket) and answers
  // with that one.
  bool two_bytes = false;
};

EchoOptions Gated(absl::Notification* gate) {
  EchoOptions options;
  options.gate = gate;
  return options;
}

// Echoes each byte it reads, one request per byte (see EchoOptions).
class EchoServer {
 public:
  explicit EchoServer(EchoOptions options = {}) : options_(options) {
    absl::StatusOr<std::pair<UniqueFd, int>> listening = ListenTcp("127.0.0.1");
    EXPECT_OK(listening.status());
    port_ = listening->second;
    absl::StatusOr<std::unique_ptr<ConnectionServer>> server =
        ConnectionServer::Start(
            std::move(listening->first), options.max_connections,
            [this](ConnectionServer::Connection& c) { Serve(c); });
    EXPECT_OK(server.status());
    server_ = *std::move(server);
  }

  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  ConnectionServer& server() { return *server_; }
  // Requests answered (begun), and refused because Shutdown had begun;
  // connections whose requests Shutdown ended.
  int begun() const { return begun_.load(); }
  int refused() const { return refused_.load(); }
  int stopped() const { return stopped_.load(); }
  // Once the first request began, or was read.
  FirstTime& in_request() { return in_request_; }
  FirstTime& read_one() { return read_one_; }

 private:
  void Serve(ConnectionServer::Connection& connection) {
    const int fd = connection.fd();
    char byte = 0;
    const bool stopped = connection.ServeRequests(
        [&]() -> absl::StatusOr<std::string> {
          RETURN_IF_ERROR(ReadFull(fd, &byte, 1, absl::Now() + kWait));
          read_one_.Notify();
          if (options_.before_begin != nullptr) {
            options_.before_begin->WaitForNotificationWithTimeout(kWait);
          }
          return std::string(1, byte);
        },
        [&] {
          refused_.fetch_add(1);
          const char no = '!';
          WriteFull(fd, &no, 1, absl::Now() + kWait).IgnoreError();
        },
        [&](const std::string& request) {
          begun_.fetch_add(1);
          in_request_.Notify();
          if (options_.gate != nullptr) {
            options_.gate->WaitForNotificationWithTimeout(kWait);
          }
          char reply = request[0];
          if (options_.two_bytes &&
              !ReadFull(fd, &reply, 1, absl::Now() + kWait).ok()) {
            return false;
          }
          WriteFull(fd, &reply, 1, absl::Now() + kWait).IgnoreError();
          return true;
        });
    if (stopped) stopped_.fetch_add(1);
  }

  const EchoOptions options_;
  FirstTime in_request_;
  FirstTime read_one_;
  std::atomic<int> begun_{0};
  std::atomic<int> refused_{0};
  std::atomic<int> stopped_{0};
  int port_ = 0;
  std::unique_ptr<ConnectionServer> server_;
};

// One request: sends `byte`, returns what came back (or the error).
absl::StatusOr<char> Echo(const UniqueFd& socket, char byte) {
  absl::Status sent = WriteFull(socket.get(), &byte, 1, absl::Now() + kWait);
  if (!sent.ok()) return sent;
  char back = 0;
  absl::Status read = ReadFull(socket.get(), &back, 1, absl::Now() + kWait);
  if (!read.ok()) return read;
  return back;
}

UniqueFd Connect(const EchoServer& server) {
  absl::StatusOr<UniqueFd> socket =
      ConnectTcp(server.address(), absl::Now() + kWait);
  EXPECT_OK(socket.status());
  return socket.ok() ? *std::move(socket) : UniqueFd();
}

TEST(ConnectionServerTest, ServesConnectionsConcurrently) {
  absl::Notification gate;
  EchoServer server(Gated(&gate));
  // Both requests begin while the gate holds them: each connection has its
  // own thread.
  UniqueFd sockets[2] = {Connect(server), Connect(server)};
  absl::StatusOr<char> back[2];
  std::vector<std::thread> clients;
  for (int i = 0; i < 2; ++i) {
    clients.emplace_back([&, i] { back[i] = Echo(sockets[i], 'a' + i); });
  }
  const absl::Time deadline = absl::Now() + kWait;
  while (server.begun() < 2 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(server.begun(), 2);
  gate.Notify();
  for (std::thread& client : clients) client.join();
  for (int i = 0; i < 2; ++i) {
    ASSERT_OK(back[i].status());
    EXPECT_EQ(*back[i], 'a' + i);
  }
  // A connection serves its requests one after another.
  for (char c : std::string("xyz")) {
    absl::StatusOr<char> again = Echo(sockets[0], c);
    ASSERT_OK(again.status());
    EXPECT_EQ(*again, c);
  }
}

TEST(ConnectionServerTest, ConnectionsBeyondTheLimitAreClosed) {
  EchoOptions options;
  options.max_connections = 1;
  EchoServer server(options);
  UniqueFd first = Connect(server);
  ASSERT_OK(Echo(first, 'a').status());  // Accepted and served.
  UniqueFd second = Connect(server);     // The backlog takes it...
  char byte = 0;
  // ...and the server closes it once accepted.
  EXPECT_FALSE(ReadFull(second.get(), &byte, 1, absl::Now() + kWait).ok());
  absl::StatusOr<char> still = Echo(first, 'b');
  ASSERT_OK(still.status());
  EXPECT_EQ(*still, 'b');
  // A closed connection frees its place.
  first = UniqueFd();
  const absl::Time deadline = absl::Now() + kWait;
  bool served = false;
  while (!served && absl::Now() < deadline) {
    UniqueFd next = Connect(server);
    served = Echo(next, 'c').ok();
    if (!served) absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_TRUE(served);
}

TEST(ConnectionServerTest, ShutdownClosesIdleConnectionsAtOnce) {
  EchoServer server;
  UniqueFd idle = Connect(server);
  ASSERT_OK(Echo(idle, 'a').status());
  const absl::Time start = absl::Now();
  server.server().Shutdown(absl::Seconds(30));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  char byte = 0;
  EXPECT_FALSE(ReadFull(idle.get(), &byte, 1, absl::Now() + kWait).ok());
  // The listener is closed: new clients are refused at once.
  EXPECT_FALSE(ConnectTcp(server.address(), absl::Now() + kWait).ok());
}

TEST(ConnectionServerTest, ShutdownLetsABusyRequestFinishWithinTheGrace) {
  absl::Notification gate;
  EchoServer server(Gated(&gate));
  UniqueFd busy = Connect(server);
  absl::StatusOr<char> back;
  std::thread client([&] { back = Echo(busy, 'q'); });
  ASSERT_TRUE(server.in_request().WaitForNotificationWithTimeout(kWait));
  std::thread stopper([&] { server.server().Shutdown(absl::Seconds(30)); });
  absl::SleepFor(absl::Milliseconds(100));
  gate.Notify();  // The request ends well within the grace.
  client.join();
  stopper.join();
  ASSERT_OK(back.status());
  EXPECT_EQ(*back, 'q');
  // The request ended the loop: the server was stopping.
  EXPECT_EQ(server.stopped(), 1);
  EXPECT_EQ(server.refused(), 0);
}

TEST(ConnectionServerTest, ShutdownCutsARequestPastTheGrace) {
  EchoOptions options;
  options.two_bytes = true;
  EchoServer server(options);
  UniqueFd busy = Connect(server);
  // Half a request: the handler waits inside it for the second byte.
  const char byte = 'q';
  ASSERT_OK(WriteFull(busy.get(), &byte, 1, absl::Now() + kWait));
  ASSERT_TRUE(server.in_request().WaitForNotificationWithTimeout(kWait));
  const absl::Time start = absl::Now();
  server.server().Shutdown(absl::Milliseconds(200));
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, absl::Milliseconds(200));
  EXPECT_LT(took, absl::Seconds(5));  // Not the handler's own 10 s wait.
  char back = 0;
  EXPECT_FALSE(ReadFull(busy.get(), &back, 1, absl::Now() + kWait).ok());
}

TEST(ConnectionServerTest, ARequestArrivingDuringShutdownIsRefused) {
  absl::Notification before_begin;
  EchoOptions options;
  options.before_begin = &before_begin;
  EchoServer server(options);
  UniqueFd socket = Connect(server);
  const char byte = 'q';
  ASSERT_OK(WriteFull(socket.get(), &byte, 1, absl::Now() + kWait));
  // The request was read but has not begun when Shutdown starts.
  ASSERT_TRUE(server.read_one().WaitForNotificationWithTimeout(kWait));
  std::thread stopper([&] { server.server().Shutdown(absl::Seconds(30)); });
  // Once new clients are refused, Shutdown is under way.
  const absl::Time deadline = absl::Now() + kWait;
  while (absl::Now() < deadline &&
         ConnectTcp(server.address(), absl::Now() + kWait).ok()) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  before_begin.Notify();
  stopper.join();
  EXPECT_EQ(server.refused(), 1);
  EXPECT_EQ(server.begun(), 0);
  EXPECT_EQ(server.stopped(), 1);
}

TEST(ConnectionServerTest, ShutdownIsIdempotentAndRunsInTheDestructor) {
  auto server = std::make_unique<EchoServer>();
  UniqueFd idle = Connect(*server);
  ASSERT_OK(Echo(idle, 'a').status());
  server->server().Shutdown();
  server->server().Shutdown(absl::Seconds(5));
  server.reset();
  char byte = 0;
  EXPECT_FALSE(ReadFull(idle.get(), &byte, 1, absl::Now() + kWait).ok());
}

}  // namespace
}  // namespace tessera
