// wire/data_connection.h over real loopback TCP with certificates made by
// the `openssl` command (tests/testing/test_pki.h): frames both ways in the
// clear and over mutual TLS, refusals (a client certificate of another CA,
// a server whose certificate does not name the host dialled, no client
// certificate), deadlines, and a context that reloads rotated files.
#include "wire/data_connection.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/ssl.h>

#include <algorithm>
#include <functional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/socket.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_pki.h"

namespace tessera {
namespace {

namespace tt = ::tessera::testing;
using ::testing::HasSubstr;

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

// ConnectTcp's sockets do not block; plain read/write loops want them to.
void Blocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK); }

class DataConnectionTest : public tt::PkiTest {
 protected:
  void SetUp() override {
    tt::PkiTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    ASSERT_TRUE(pki_->MakeCert("client", "ca"));
    ASSERT_OK_AND_ASSIGN(auto listening, ListenTcp("127.0.0.1"));
    listener_ = std::move(listening.first);
    address_ = absl::StrCat("127.0.0.1:", listening.second);
  }

  TlsConfig ServerConfig() const { return pki_->Server("ca", "daemon"); }

  // Accepts one connection and runs `serve` on it in a thread.
  std::thread Serve(std::function<void(int fd)> serve) {
    return std::thread([this, serve] {
      const int fd = accept(listener_.get(), nullptr, nullptr);
      if (fd < 0) return;
      serve(fd);
      close(fd);
    });
  }

  // The server's verdict on a TLS connection: echo one frame back.
  static std::function<void(int)> TlsEcho(std::shared_ptr<TlsContext> context,
                                          absl::Status* handshake) {
    return [context, handshake](int fd) {
      absl::StatusOr<DataConnection> accepted =
          DataConnection::Accept(fd, *context, Soon());
      *handshake = accepted.status();
      if (!accepted.ok()) return;
      absl::StatusOr<std::string> frame = accepted->ReadFrame(Soon());
      if (frame.ok()) accepted->WriteFrame(*frame, Soon()).IgnoreError();
    };
  }

  absl::StatusOr<std::string> ClientRoundTrip(const TlsConfig& config,
                                              const std::string& host,
                                              const std::string& payload) {
    ASSIGN_OR_RETURN(std::shared_ptr<TlsContext> context,
                     TlsContext::ForClient(config));
    ASSIGN_OR_RETURN(UniqueFd socket, ConnectTcp(address_, Soon()));
    ASSIGN_OR_RETURN(
        DataConnection connection,
        DataConnection::Connect(std::move(socket), host, *context, Soon()));
    RETURN_IF_ERROR(connection.WriteFrame(payload, Soon()));
    return connection.ReadFrame(Soon());
  }

  UniqueFd listener_;
  std::string address_;
};

TEST_F(DataConnectionTest, FramesInTheClearAndOverMutualTls) {
  // Plaintext.
  std::thread plain = Serve([](int fd) {
    DataConnection connection = DataConnection::PlainView(fd);
    absl::StatusOr<std::string> frame = connection.ReadFrame(Soon());
    if (frame.ok()) connection.WriteFrame(*frame + "!", Soon()).IgnoreError();
  });
  {
    ASSERT_OK_AND_ASSIGN(UniqueFd socket, ConnectTcp(address_, Soon()));
    DataConnection connection = DataConnection::Plain(std::move(socket));
    EXPECT_FALSE(connection.tls());
    ASSERT_OK(connection.WriteFrame("hello", Soon()));
    EXPECT_THAT(connection.ReadFrame(Soon()),
                tt::IsOkAndHolds(std::string("hello!")));
  }
  plain.join();

  // Mutual TLS, with a payload spanning many records.
  ASSERT_OK_AND_ASSIGN(auto server, TlsContext::ForServer(ServerConfig()));
  absl::Status handshake;
  std::thread tls = Serve(TlsEcho(server, &handshake));
  const std::string big(900 * 1024, 'x');
  EXPECT_THAT(ClientRoundTrip(pki_->Client("ca", "client"), "127.0.0.1", big),
              tt::IsOkAndHolds(big));
  tls.join();
  EXPECT_OK(handshake);
}

// Both ends of this version offer sealed records (wire/record_sealer.h):
// whatever the sizes of the reads and writes, the bytes arrive whole and
// in order, also when they are read straight into a destination.
TEST_F(DataConnectionTest, TlsConnectionsCarrySealedRecords) {
  ASSERT_OK_AND_ASSIGN(auto server, TlsContext::ForServer(ServerConfig()));
  std::string sent(3 * 1024 * 1024 + 12345, '\0');
  for (size_t i = 0; i < sent.size(); ++i) {
    sent[i] = static_cast<char>((i * 7919) >> 3);
  }
  bool server_sealed = false;
  absl::Status served;
  std::thread thread = Serve([&](int fd) {
    absl::StatusOr<DataConnection> accepted =
        DataConnection::Accept(fd, *server, Soon());
    served = accepted.status();
    if (!accepted.ok()) return;
    server_sealed = accepted->sealed();
    // Reads the client's bytes in pieces of odd sizes, then sends them back
    // in other odd pieces, the last one ending the message.
    std::string received(sent.size(), '\0');
    for (size_t at = 0, piece = 1; at < received.size();
         piece = piece * 3 + 1) {
      const size_t n = std::min(piece % 200000 + 1, received.size() - at);
      served = accepted->ReadFull(received.data() + at, n, Soon());
      if (!served.ok()) return;
      at += n;
    }
    for (size_t at = 0, piece = 5; at < received.size();
         piece = piece * 5 + 3) {
      const size_t n = std::min(piece % 300000 + 1, received.size() - at);
      served = accepted->WriteFull(received.data() + at, n, Soon(),
                                   /*more=*/at + n < received.size());
      if (!served.ok()) return;
      at += n;
    }
  });
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<TlsContext> context,
                       TlsContext::ForClient(pki_->Client("ca", "client")));
  ASSERT_OK_AND_ASSIGN(UniqueFd socket, ConnectTcp(address_, Soon()));
  ASSERT_OK_AND_ASSIGN(DataConnection connection,
                       DataConnection::Connect(std::move(socket), "127.0.0.1",
                                               *context, Soon()));
  EXPECT_TRUE(connection.sealed());
  ASSERT_OK(connection.WriteFull(sent.data(), sent.size(), Soon()));
  std::string echoed(sent.size(), '\0');
  // A short read first (it leaves part of a record), then into place.
  ASSERT_OK(connection.ReadFull(echoed.data(), 100, Soon()));
  ASSERT_OK(connection.ReadIntoDestination(echoed.data() + 100,
                                           echoed.size() - 100, Soon()));
  thread.join();
  EXPECT_OK(served);
  EXPECT_TRUE(server_sealed);
  EXPECT_TRUE(echoed == sent);
}

// A peer that does not offer sealed records (another TLS client, or an
// earlier version) gets OpenSSL's records, and both ends still agree.
TEST_F(DataConnectionTest, APeerWithoutSealedRecordsGetsTlsRecords) {
  ASSERT_OK_AND_ASSIGN(auto server, TlsContext::ForServer(ServerConfig()));
  absl::Status handshake;
  bool server_sealed = true;
  std::thread thread = Serve([&](int fd) {
    absl::StatusOr<DataConnection> accepted =
        DataConnection::Accept(fd, *server, Soon());
    handshake = accepted.status();
    if (!accepted.ok()) return;
    server_sealed = accepted->sealed();
    absl::StatusOr<std::string> frame = accepted->ReadFrame(Soon());
    if (frame.ok()) accepted->WriteFrame(*frame + "!", Soon()).IgnoreError();
  });
  // A plain OpenSSL client with the cluster's certificates and no ALPN.
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<TlsContext> context,
                       TlsContext::ForClient(pki_->Client("ca", "client")));
  ASSERT_OK_AND_ASSIGN(UniqueFd socket, ConnectTcp(address_, Soon()));
  SSL* ssl = SSL_new(context->Current().get());
  ASSERT_NE(ssl, nullptr);
  Blocking(socket.get());
  SSL_set_fd(ssl, socket.get());
  ASSERT_EQ(SSL_connect(ssl), 1);
  const std::string payload(200 * 1024, 'p');
  std::string frame(4, '\0');
  for (int i = 0; i < 4; ++i) {
    frame[i] = static_cast<char>(payload.size() >> (8 * i));
  }
  frame += payload;
  for (size_t at = 0; at < frame.size();) {
    const int n =
        SSL_write(ssl, frame.data() + at, static_cast<int>(frame.size() - at));
    ASSERT_GT(n, 0);
    at += static_cast<size_t>(n);
  }
  std::string reply(frame.size() + 1, '\0');
  for (size_t at = 0; at < reply.size();) {
    const int n =
        SSL_read(ssl, reply.data() + at, static_cast<int>(reply.size() - at));
    ASSERT_GT(n, 0);
    at += static_cast<size_t>(n);
  }
  SSL_free(ssl);
  thread.join();
  EXPECT_OK(handshake);
  EXPECT_FALSE(server_sealed);
  EXPECT_EQ(reply.substr(4), payload + "!");
}

// A byte changed on its way (here by a relay in the middle, after the
// handshake) fails the read with DATA_LOSS: neither the connection nor the
// reader takes it for data.
TEST_F(DataConnectionTest, AByteChangedOnItsWayFailsTheRead) {
  ASSERT_OK_AND_ASSIGN(auto server, TlsContext::ForServer(ServerConfig()));
  const std::string big(2 * 1024 * 1024, 'w');
  for (const bool into_destination : {false, true}) {
    SCOPED_TRACE(into_destination ? "into a destination" : "ReadFull");
    std::thread thread = Serve([&](int fd) {
      absl::StatusOr<DataConnection> accepted =
          DataConnection::Accept(fd, *server, Soon());
      if (!accepted.ok()) return;
      accepted->WriteFull(big.data(), big.size(), Soon()).IgnoreError();
      // Holds the connection open until the client is done.
      char byte;
      accepted->ReadFull(&byte, 1, Soon()).IgnoreError();
    });
    // The relay: client <-> relay <-> server; the server's byte number
    // 1 MiB + 7 (well past the handshake) reaches the client flipped.
    ASSERT_OK_AND_ASSIGN(auto relay_listening, ListenTcp("127.0.0.1"));
    std::thread relay([&] {
      UniqueFd from_client(
          accept(relay_listening.first.get(), nullptr, nullptr));
      absl::StatusOr<UniqueFd> to_server = ConnectTcp(address_, Soon());
      if (!from_client.valid() || !to_server.ok()) return;
      Blocking(from_client.get());
      Blocking(to_server->get());
      std::thread up([&] {
        char buffer[65536];
        ssize_t n;
        while ((n = read(from_client.get(), buffer, sizeof(buffer))) > 0) {
          if (send(to_server->get(), buffer, n, MSG_NOSIGNAL) != n) break;
        }
        shutdown(to_server->get(), SHUT_WR);
      });
      char buffer[65536];
      size_t total = 0;
      ssize_t n;
      const size_t flip = (size_t{1} << 20) + 7;
      while ((n = read(to_server->get(), buffer, sizeof(buffer))) > 0) {
        if (total <= flip && flip < total + n) buffer[flip - total] ^= 0x10;
        total += n;
        if (send(from_client.get(), buffer, n, MSG_NOSIGNAL) != n) break;
      }
      shutdown(from_client.get(), SHUT_WR);
      up.join();
    });
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<TlsContext> context,
                         TlsContext::ForClient(pki_->Client("ca", "client")));
    ASSERT_OK_AND_ASSIGN(
        UniqueFd socket,
        ConnectTcp(absl::StrCat("127.0.0.1:", relay_listening.second), Soon()));
    ASSERT_OK_AND_ASSIGN(DataConnection connection,
                         DataConnection::Connect(std::move(socket), "127.0.0.1",
                                                 *context, Soon()));
    ASSERT_TRUE(connection.sealed());
    std::string received(big.size(), '\0');
    const absl::Status read =
        into_destination
            ? connection.ReadIntoDestination(received.data(), received.size(),
                                             Soon())
            : connection.ReadFull(received.data(), received.size(), Soon());
    EXPECT_THAT(read, tt::StatusIs(absl::StatusCode::kDataLoss,
                                   HasSubstr("authentication check")));
    if (!into_destination) {
      // Nothing of the changed record reached the reader.
      EXPECT_EQ(received.find('w' ^ 0x10), std::string::npos);
    }
    InterruptSocket(connection.fd());
    thread.join();
    relay.join();
  }
}

// A peer that closed a TLS connection is an error for the writer, not
// SIGPIPE (whose default action would end this test's process).
TEST_F(DataConnectionTest, WritingToAClosedTlsPeerIsAnErrorNotSigpipe) {
  signal(SIGPIPE, SIG_DFL);
  ASSERT_OK_AND_ASSIGN(auto server, TlsContext::ForServer(ServerConfig()));
  absl::Status handshake;
  std::thread closing = Serve([&](int fd) {
    absl::StatusOr<DataConnection> accepted =
        DataConnection::Accept(fd, *server, Soon());
    handshake = accepted.status();
    // Returns at once: Serve closes the socket.
  });
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<TlsContext> context,
                       TlsContext::ForClient(pki_->Client("ca", "client")));
  ASSERT_OK_AND_ASSIGN(UniqueFd socket, ConnectTcp(address_, Soon()));
  ASSERT_OK_AND_ASSIGN(DataConnection connection,
                       DataConnection::Connect(std::move(socket), "127.0.0.1",
                                               *context, Soon()));
  closing.join();
  ASSERT_OK(handshake);
  const std::string frame(64 * 1024, 'x');
  absl::Status written;
  for (int i = 0; i < 100 && written.ok(); ++i) {
    written = connection.WriteFrame(frame, Soon());
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_THAT(written, tt::StatusIs(absl::StatusCode::kUnavailable,
                                    ::testing::HasSubstr("send")));
}

TEST_F(DataConnectionTest, StrangersAndWrongNamesAreRefused) {
  ASSERT_OK_AND_ASSIGN(auto server, TlsContext::ForServer(ServerConfig()));
  ASSERT_TRUE(pki_->MakeCa("other_ca"));
  ASSERT_TRUE(pki_->MakeCert("stranger", "other_ca"));
  ASSERT_TRUE(pki_->MakeCert("expired", "ca", /*days=*/-1));
  const struct {
    const char* what;
    TlsConfig client;
    std::string host;
  } cases[] = {
      {"a certificate of another CA", pki_->Client("ca", "stranger"),
       "127.0.0.1"},
      {"no client certificate", pki_->Client("ca", ""), "127.0.0.1"},
      {"an expired client certificate", pki_->Client("ca", "expired"),
       "127.0.0.1"},
      {"a server not named so", pki_->Client("ca", "client"), "10.1.2.3"},
      {"trusting another CA", pki_->Client("other_ca", "stranger"),
       "127.0.0.1"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    absl::Status handshake;
    std::thread thread = Serve(TlsEcho(server, &handshake));
    const absl::StatusOr<std::string> echoed =
        ClientRoundTrip(c.client, c.host, "secret");
    thread.join();
    EXPECT_FALSE(echoed.ok());
    EXPECT_FALSE(handshake.ok() && echoed.ok());
  }
}

TEST_F(DataConnectionTest, DeadlinesBoundTheHandshakeAndReads) {
  ASSERT_OK_AND_ASSIGN(auto server, TlsContext::ForServer(ServerConfig()));
  // A client that connects and says nothing: the handshake gives up.
  ASSERT_OK_AND_ASSIGN(UniqueFd silent, ConnectTcp(address_, Soon()));
  const int fd = accept(listener_.get(), nullptr, nullptr);
  ASSERT_GE(fd, 0);
  const absl::Time start = absl::Now();
  EXPECT_THAT(
      DataConnection::Accept(fd, *server, absl::Now() + absl::Milliseconds(300))
          .status(),
      tt::StatusIs(absl::StatusCode::kDeadlineExceeded, ::testing::_));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  close(fd);
}

TEST_F(DataConnectionTest, ContextsReloadRotatedFiles) {
  TlsConfig config = pki_->Client("ca", "client");
  config.refresh_seconds = 1;
  ASSERT_OK_AND_ASSIGN(auto client, TlsContext::ForClient(config));
  const std::shared_ptr<SSL_CTX> before = client->Current();
  ASSERT_TRUE(pki_->MakeCert("client", "ca"));  // new key and certificate
  absl::SleepFor(absl::Milliseconds(1100));
  EXPECT_NE(client->Current(), before);
  // A broken rotation keeps the last good context.
  const std::shared_ptr<SSL_CTX> good = client->Current();
  ASSERT_TRUE(
      tt::Shell(absl::StrCat("echo broken > ", pki_->Path("client", "pem"))));
  absl::SleepFor(absl::Milliseconds(1100));
  EXPECT_EQ(client->Current(), good);
  EXPECT_THAT(TlsContext::ForClient(config).status(),
              tt::StatusIs(absl::StatusCode::kInvalidArgument,
                           ::testing::HasSubstr("client.pem")));
}

}  // namespace
}  // namespace tessera
