// wire/data_connection.h over real loopback TCP with certificates made by
// the `openssl` command (tests/testing/test_pki.h): frames both ways in the
// clear and over mutual TLS, refusals (a client certificate of another CA,
// a server whose certificate does not name the host dialled, no client
// certificate), deadlines, and a context that reloads rotated files.
#include "wire/data_connection.h"

#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

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

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

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

  TlsConfig ServerConfig() const {
    TlsConfig config;
    config.cert_file = pki_->Path("daemon", "pem");
    config.key_file = pki_->Path("daemon", "key");
    config.ca_file = pki_->Path("ca", "pem");
    return config;
  }

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
