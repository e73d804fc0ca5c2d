// Sockets with deadlines (io/socket.h) and Unix sockets (io/unix_socket.h),
// on real loopback and socketpair descriptors.
#include "io/socket.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/unix_socket.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

constexpr absl::Duration kWait = absl::Seconds(5);

std::pair<UniqueFd, UniqueFd> StreamPair() {
  int fds[2] = {-1, -1};
  socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds);
  return {UniqueFd(fds[0]), UniqueFd(fds[1])};
}

TEST(AwaitReadyTest, TimesOutThenSeesData) {
  auto [a, b] = StreamPair();
  const absl::Time start = absl::Now();
  EXPECT_THAT(AwaitReady(a.get(), POLLIN, start + absl::Milliseconds(50),
                         "waiting for b"),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       "waiting for b: deadline exceeded"));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(45));
  ASSERT_EQ(write(b.get(), "x", 1), 1);
  EXPECT_OK(AwaitReady(a.get(), POLLIN, absl::Now() + kWait, "waiting"));
}

TEST(AwaitReadyTest, PastDeadlineFailsAtOnce) {
  auto [a, b] = StreamPair();
  ASSERT_EQ(write(b.get(), "x", 1), 1);
  EXPECT_THAT(AwaitReady(a.get(), POLLIN, absl::Now() - absl::Seconds(1), "w"),
              StatusIs(absl::StatusCode::kDeadlineExceeded, ::testing::_));
}

// CPU time of the calling thread.
absl::Duration ThreadCpuTime() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return absl::DurationFromTimespec(now);
}

// Regression: AwaitReady computed the poll timeout as
// ToInt64Milliseconds(left) + 1, which overflowed for an infinite `left`
// and left poll(2) a timeout of 0: the wait spun (300 ms of CPU here).
TEST(AwaitReadyTest, NoDeadlineBlocksWithoutSpinning) {
  // absl::InfiniteFuture() is a deadline like any other: the wait sleeps in
  // poll(2) until the peer writes, it does not burn a core meanwhile.
  auto [a, b] = StreamPair();
  std::thread writer([fd = b.get()] {
    absl::SleepFor(absl::Milliseconds(300));
    ASSERT_EQ(write(fd, "x", 1), 1);
  });
  const absl::Time start = absl::Now();
  const absl::Duration cpu_before = ThreadCpuTime();
  EXPECT_OK(AwaitReady(a.get(), POLLIN, absl::InfiniteFuture(), "waiting"));
  const absl::Duration cpu = ThreadCpuTime() - cpu_before;
  writer.join();
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(250));
  EXPECT_LT(cpu, absl::Milliseconds(100)) << "AwaitReady spun on the CPU";
}

TEST(TcpTest, ListenConnectAndMoveBytes) {
  ASSERT_OK_AND_ASSIGN(auto listening, ListenTcp("127.0.0.1"));
  auto& [listener, port] = listening;
  ASSERT_GT(port, 0);
  ASSERT_OK_AND_ASSIGN(
      UniqueFd client,
      ConnectTcp("127.0.0.1:" + std::to_string(port), absl::Now() + kWait));
  UniqueFd server(accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
  ASSERT_TRUE(server.valid());
  std::string big(3 << 20, 'q');  // More than a socket buffer holds.
  std::thread writer([&] {
    EXPECT_OK(
        WriteFull(client.get(), big.data(), big.size(), absl::Now() + kWait));
  });
  std::string got(big.size(), '\0');
  EXPECT_OK(
      ReadFull(server.get(), got.data(), got.size(), absl::Now() + kWait));
  writer.join();
  EXPECT_EQ(got, big);
}

TEST(TcpTest, ConnectsToAResolvableName) {
  ASSERT_OK_AND_ASSIGN(auto listening, ListenTcp("127.0.0.1"));
  auto& [listener, port] = listening;
  ASSERT_OK_AND_ASSIGN(
      UniqueFd client,
      ConnectTcp("localhost:" + std::to_string(port), absl::Now() + kWait));
  UniqueFd server(accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
  ASSERT_TRUE(server.valid());
  ASSERT_OK(WriteFull(server.get(), "pong", 4, absl::Now() + kWait));
  std::string got(4, '\0');
  ASSERT_OK(ReadFull(client.get(), got.data(), 4, absl::Now() + kWait));
  EXPECT_EQ(got, "pong");
}

TEST(TcpTest, ListenNeedsAnIpv4Address) {
  EXPECT_THAT(
      ListenTcp("not-an-address"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("IPv4 address")));
}

TEST(TcpTest, NothingListeningIsUnavailable) {
  int port = 0;
  {
    ASSERT_OK_AND_ASSIGN(auto listening, ListenTcp("127.0.0.1"));
    port = listening.second;
  }  // Closed: nothing listens there now.
  EXPECT_THAT(
      ConnectTcp("127.0.0.1:" + std::to_string(port), absl::Now() + kWait),
      StatusIs(absl::StatusCode::kUnavailable, HasSubstr("connecting to")));
  EXPECT_THAT(ConnectTcp("127.0.0.1", absl::Now() + kWait),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("without a port")));
}

// WriteVFull: pieces (empty ones among them; more than one sendmsg takes;
// more bytes than a socket buffer holds, so calls send part of a piece)
// arrive joined, in order; a peer that stops reading ends it at the
// deadline.
TEST(TcpTest, WriteVFullSendsPiecesJoined) {
  auto [a, b] = StreamPair();
  std::string source(4 << 20, '\0');
  for (size_t i = 0; i < source.size(); ++i) {
    source[i] = static_cast<char>((i * 131) >> 3);
  }
  std::vector<struct iovec> pieces;
  std::string expected;
  for (size_t at = 0, n = 0; at < source.size(); at += n + 17) {
    n = std::min<size_t>((at % 5) * 700, source.size() - at);
    pieces.push_back(iovec{source.data() + at, n});
    expected.append(source, at, n);
  }
  ASSERT_GT(pieces.size(), 2000u);
  const int sender = a.get();
  std::thread writer(
      [&] { EXPECT_OK(WriteVFull(sender, pieces, absl::Now() + kWait)); });
  std::string got(expected.size(), '\0');
  EXPECT_OK(ReadFull(b.get(), got.data(), got.size(), absl::Now() + kWait));
  writer.join();
  EXPECT_TRUE(got == expected);
  EXPECT_TRUE(pieces.empty());

  std::vector<struct iovec> stuck = {iovec{source.data(), source.size()}};
  EXPECT_THAT(WriteVFull(a.get(), stuck, absl::Now() + absl::Milliseconds(100)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("send")));
}

TEST(TcpTest, ReadAfterThePeerClosedIsUnavailable) {
  auto [a, b] = StreamPair();
  b.reset();
  char byte;
  EXPECT_THAT(
      ReadFull(a.get(), &byte, 1, absl::Now() + kWait),
      StatusIs(absl::StatusCode::kUnavailable, HasSubstr("closed by peer")));
}

TEST(TcpTest, ReadOfASilentPeerEndsAtTheDeadline) {
  auto [a, b] = StreamPair();
  char byte;
  EXPECT_THAT(ReadFull(a.get(), &byte, 1, absl::Now() + absl::Milliseconds(50)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, ::testing::_));
}

// A deadline bounds the transfer, not only its waits: bytes that are all
// there already, or a peer that keeps up, do not carry a call past it.
TEST(TcpTest, PastDeadlineFailsEvenWhenEveryByteIsThere) {
  auto [a, b] = StreamPair();
  const std::string bytes(1000, 'q');
  ASSERT_OK(
      WriteFull(b.get(), bytes.data(), bytes.size(), absl::Now() + kWait));
  std::string got(bytes.size(), '\0');
  const absl::Time past = absl::Now() - absl::Milliseconds(1);
  EXPECT_THAT(ReadFull(a.get(), got.data(), got.size(), past),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("recv")));
  EXPECT_THAT(WriteFull(a.get(), bytes.data(), bytes.size(), past),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("send")));
  // Nothing was consumed: the bytes are still there for a call in time.
  EXPECT_OK(ReadFull(a.get(), got.data(), got.size(), absl::Now() + kWait));
  EXPECT_EQ(got, bytes);
}

TEST(TcpTest, ReadFromAPeerThatKeepsSendingEndsAtTheDeadline) {
  auto [a, b] = StreamPair();
  std::atomic<bool> stop{false};
  std::thread writer([&, fd = b.get()] {
    const std::string piece(4096, 'w');
    while (
        !stop.load() &&
        WriteFull(fd, piece.data(), piece.size(), absl::Now() + kWait).ok()) {
    }
  });
  // More than 4 KiB sends deliver in time; pages are touched only as bytes
  // arrive.
  constexpr size_t kSink = size_t{1} << 30;
  std::unique_ptr<char[]> sink(new char[kSink]);
  const absl::Time start = absl::Now();
  EXPECT_THAT(
      ReadFull(a.get(), sink.get(), kSink, start + absl::Milliseconds(100)),
      StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("recv")));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  stop = true;
  a.reset();  // the writer's next send fails
  writer.join();
}

TEST(TcpTest, WriteAfterThePeerClosedIsUnavailableWithoutSigpipe) {
  auto [a, b] = StreamPair();
  b.reset();
  const std::string bytes(1 << 20, 'z');
  EXPECT_THAT(
      WriteFull(a.get(), bytes.data(), bytes.size(), absl::Now() + kWait),
      StatusIs(absl::StatusCode::kUnavailable, HasSubstr("send")));
}

TEST(TcpTest, InterruptWakesABlockedRead) {
  auto [a, b] = StreamPair();
  absl::Status read;
  std::thread reader([&, fd = a.get()] {
    char byte;
    read = ReadFull(fd, &byte, 1, absl::Now() + kWait);
  });
  absl::SleepFor(absl::Milliseconds(50));
  const absl::Time interrupted = absl::Now();
  InterruptSocket(a.get());
  reader.join();
  EXPECT_LT(absl::Now() - interrupted, absl::Seconds(2));
  EXPECT_THAT(read, StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
}

TEST(UnixSocketTest, MessagesAndAttachedDescriptors) {
  ASSERT_OK_AND_ASSIGN(auto listening, ListenLocal());
  auto& [listener, name] = listening;
  ASSERT_OK_AND_ASSIGN(UniqueFd client,
                       ConnectLocal(name, absl::Now() + kWait));
  UniqueFd server(accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
  ASSERT_TRUE(server.valid());
  auto [to_lend, other_end] = StreamPair();
  ASSERT_OK(SendLocalMessage(client.get(), "hello", absl::Now() + kWait,
                             to_lend.get()));
  UniqueFd received;
  ASSERT_OK_AND_ASSIGN(
      std::string message,
      ReceiveLocalMessage(server.get(), absl::Now() + kWait, &received));
  EXPECT_EQ(message, "hello");
  ASSERT_TRUE(received.valid());
  ASSERT_EQ(write(received.get(), "y", 1), 1);  // The same socket, lent.
  char byte = 0;
  ASSERT_EQ(read(other_end.get(), &byte, 1), 1);
  EXPECT_EQ(byte, 'y');
  ASSERT_OK_AND_ASSIGN(uid_t uid, PeerUid(server.get()));
  EXPECT_EQ(uid, geteuid());
}

TEST(UnixSocketTest, AddressesNameThisHost) {
  ASSERT_FALSE(HostId().empty());
  const std::string address = LocalAddress(HostId(), "tessera-1");
  ASSERT_OK_AND_ASSIGN(auto parts, ParseLocalAddress(address));
  EXPECT_EQ(parts.first, HostId());
  EXPECT_EQ(parts.second, "tessera-1");
  EXPECT_THAT(ParseLocalAddress("no-slash"),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  EXPECT_THAT(ConnectLocal("tessera-nobody-listens", absl::Now() + kWait),
              StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
}

}  // namespace
}  // namespace tessera
