// wire/record_sealer.h over real TLS sessions (OpenSSL, certificates made
// by the `openssl` command), handshaken in memory: records open at the
// other end, under every AEAD the data plane negotiates and under TLS 1.2
// and 1.3; a record changed, replayed, reordered, reflected back to its
// sender or cut short fails; both ends change keys at the same record.
#include "wire/record_sealer.h"

#include <openssl/bio.h>
#include <openssl/ssl.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_pki.h"
#include "wire/data_connection.h"

namespace tessera {
namespace {

namespace tt = ::tessera::testing;
using ::testing::HasSubstr;

// Two ends of one TLS session, handshaken through a memory BIO pair, and
// the sealer of each.
struct Session {
  ~Session() {
    client_sealer.reset();
    server_sealer.reset();
    SSL_free(client);
    SSL_free(server);
  }
  SSL* client = nullptr;
  SSL* server = nullptr;
  std::unique_ptr<RecordSealer> client_sealer;
  std::unique_ptr<RecordSealer> server_sealer;
};

class RecordSealerTest : public tt::PkiTest {
 protected:
  void SetUp() override {
    tt::PkiTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    ASSERT_TRUE(pki_->MakeCert("client", "ca"));
    ASSERT_OK_AND_ASSIGN(server_context_,
                         TlsContext::ForServer(pki_->Server("ca", "daemon")));
    ASSERT_OK_AND_ASSIGN(client_context_,
                         TlsContext::ForClient(pki_->Client("ca", "client")));
  }

  // A session whose client allows only `version` and `suite` (a TLS 1.3
  // suite name, or a TLS 1.2 cipher list).
  std::unique_ptr<Session> Handshake(
      int version = TLS1_3_VERSION, const std::string& suite = "",
      RecordSealer::Engine client_engine = RecordSealer::Engine::kFastest,
      RecordSealer::Engine server_engine = RecordSealer::Engine::kFastest) {
    auto session = std::make_unique<Session>();
    session->client = SSL_new(client_context_->Current().get());
    session->server = SSL_new(server_context_->Current().get());
    if (session->client == nullptr || session->server == nullptr) return {};
    SSL_set_max_proto_version(session->client, version);
    if (!suite.empty()) {
      if (version == TLS1_3_VERSION) {
        SSL_set_ciphersuites(session->client, suite.c_str());
      } else {
        SSL_set_cipher_list(session->client, suite.c_str());
      }
    }
    BIO* client_bio = nullptr;
    BIO* server_bio = nullptr;
    if (BIO_new_bio_pair(&client_bio, 0, &server_bio, 0) != 1) return {};
    SSL_set_bio(session->client, client_bio, client_bio);
    SSL_set_bio(session->server, server_bio, server_bio);
    SSL_set_connect_state(session->client);
    SSL_set_accept_state(session->server);
    for (int round = 0; round < 100; ++round) {
      const int c = SSL_do_handshake(session->client);
      const int s = SSL_do_handshake(session->server);
      if (c == 1 && s == 1) break;
    }
    if (!SSL_is_init_finished(session->client) ||
        !SSL_is_init_finished(session->server)) {
      return {};
    }
    absl::StatusOr<std::unique_ptr<RecordSealer>> c = RecordSealer::ForSession(
        session->client, /*server=*/false, client_engine);
    absl::StatusOr<std::unique_ptr<RecordSealer>> s = RecordSealer::ForSession(
        session->server, /*server=*/true, server_engine);
    if (!c.ok() || !s.ok()) {
      ADD_FAILURE() << c.status() << " " << s.status();
      return {};
    }
    session->client_sealer = *std::move(c);
    session->server_sealer = *std::move(s);
    return session;
  }

  static std::string Seal(RecordSealer& sealer, const std::string& plain) {
    std::string record(RecordSealer::RecordBytes(plain.size()), '\0');
    EXPECT_OK(sealer.Seal(plain.data(), plain.size(), record.data()));
    return record;
  }

  // Opens `record` into a separate buffer; its plaintext, or the error.
  static absl::StatusOr<std::string> Open(RecordSealer& sealer,
                                          std::string record) {
    if (record.size() < RecordSealer::kHeaderBytes + RecordSealer::kTagBytes) {
      return absl::InvalidArgumentError("short");
    }
    absl::StatusOr<size_t> n = RecordSealer::PlainBytes(record.data());
    if (!n.ok()) return n.status();
    if (RecordSealer::RecordBytes(*n) != record.size()) {
      return absl::DataLossError("the header and the record's size differ");
    }
    std::string plain(*n, '\0');
    absl::Status opened = sealer.Open(record.data(), *n, plain.data());
    if (!opened.ok()) return opened;
    return plain;
  }

  // A record changed, replayed, reordered, reflected or cut fails, with
  // both ends on `engine`.
  void ExpectChangedRecordsFail(RecordSealer::Engine engine);

  std::shared_ptr<TlsContext> server_context_;
  std::shared_ptr<TlsContext> client_context_;
};

TEST_F(RecordSealerTest, RecordsOpenAtTheOtherEndUnderEveryAead) {
  const struct {
    const char* what;
    int version;
    std::string suite;
  } cases[] = {
      {"TLS 1.3, AES-128-GCM", TLS1_3_VERSION, "TLS_AES_128_GCM_SHA256"},
      {"TLS 1.3, AES-256-GCM", TLS1_3_VERSION, "TLS_AES_256_GCM_SHA384"},
      {"TLS 1.3, ChaCha20-Poly1305", TLS1_3_VERSION,
       "TLS_CHACHA20_POLY1305_SHA256"},
      {"TLS 1.2, AES-128-GCM", TLS1_2_VERSION, "ECDHE-ECDSA-AES128-GCM-SHA256"},
      {"TLS 1.2, ChaCha20-Poly1305", TLS1_2_VERSION,
       "ECDHE-ECDSA-CHACHA20-POLY1305"},
  };
  using Engine = RecordSealer::Engine;
  // The fastest engine (ipsec-mb for AES-GCM, where built) against itself
  // and against OpenSSL's, both ways: the same records.
  const std::pair<Engine, Engine> engines[] = {
      {Engine::kFastest, Engine::kFastest},
      {Engine::kOpenssl, Engine::kFastest},
      {Engine::kFastest, Engine::kOpenssl}};
  for (const auto& c : cases) {
    for (const auto& [client_engine, server_engine] : engines) {
      std::unique_ptr<Session> session =
          Handshake(c.version, c.suite, client_engine, server_engine);
      ASSERT_NE(session, nullptr);
      SCOPED_TRACE(absl::StrCat(c.what, ": client ",
                                session->client_sealer->Describe(), ", server ",
                                session->server_sealer->Describe()));
      const std::string big(RecordSealer::kMaxRecordBytes, 'b');
      for (const std::string& plain :
           {std::string("x"), std::string("hello"), big}) {
        const std::string record = Seal(*session->client_sealer, plain);
        // The bytes on the wire are not the plaintext.
        if (plain.size() >= 5) {
          EXPECT_EQ(record.find(plain), std::string::npos);
        }
        EXPECT_THAT(Open(*session->server_sealer, record),
                    tt::IsOkAndHolds(plain));
        EXPECT_THAT(
            Open(*session->client_sealer, Seal(*session->server_sealer, plain)),
            tt::IsOkAndHolds(plain));
      }
      // In place, as a connection opens its own buffer.
      std::string record = Seal(*session->client_sealer, "in place");
      ASSERT_OK(session->server_sealer->Open(
          record.data(), 8, record.data() + RecordSealer::kHeaderBytes));
      EXPECT_EQ(record.substr(RecordSealer::kHeaderBytes, 8), "in place");
    }
  }
}

TEST_F(RecordSealerTest, SizesOutsideTheLimitsAreRefused) {
  std::unique_ptr<Session> session = Handshake();
  ASSERT_NE(session, nullptr);
  char out[16];
  EXPECT_THAT(session->client_sealer->Seal("", 0, out),
              tt::StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  const std::string too_big(RecordSealer::kMaxRecordBytes + 1, 'x');
  std::string record(RecordSealer::RecordBytes(too_big.size()), '\0');
  EXPECT_THAT(session->client_sealer->Seal(too_big.data(), too_big.size(),
                                           record.data()),
              tt::StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  // Headers announcing 0 or more than the limit.
  const char zero[4] = {0, 0, 0, 0};
  EXPECT_THAT(RecordSealer::PlainBytes(zero),
              tt::StatusIs(absl::StatusCode::kDataLoss, HasSubstr("0 bytes")));
  const char huge[4] = {0, 0, 0, 0x40};
  EXPECT_THAT(RecordSealer::PlainBytes(huge),
              tt::StatusIs(absl::StatusCode::kDataLoss, ::testing::_));
  // A TLS alert where a sealed record should be: the peer refused us.
  const char alert[4] = {0x15, 0x03, 0x03, 0x00};
  EXPECT_THAT(RecordSealer::PlainBytes(alert),
              tt::StatusIs(absl::StatusCode::kUnavailable,
                           HasSubstr("refused this connection's TLS session")));
}

TEST_F(RecordSealerTest, ChangedReplayedReorderedReflectedOrCutRecordsFail) {
  for (const RecordSealer::Engine engine :
       {RecordSealer::Engine::kFastest, RecordSealer::Engine::kOpenssl}) {
    SCOPED_TRACE(engine == RecordSealer::Engine::kFastest ? "fastest"
                                                          : "OpenSSL");
    ExpectChangedRecordsFail(engine);
  }
}

void RecordSealerTest::ExpectChangedRecordsFail(RecordSealer::Engine engine) {
  const auto Handshake = [this, engine] {
    return this->Handshake(TLS1_3_VERSION, "", engine, engine);
  };
  const std::string plain = "the weights of step 7";
  const auto expect_refused = [](const absl::StatusOr<std::string>& opened) {
    EXPECT_FALSE(opened.ok());
    if (!opened.ok()) {
      EXPECT_EQ(opened.status().code(), absl::StatusCode::kDataLoss)
          << opened.status();
    }
  };
  {
    SCOPED_TRACE("a ciphertext byte changed");
    std::unique_ptr<Session> session = Handshake();
    ASSERT_NE(session, nullptr);
    std::string record = Seal(*session->client_sealer, plain);
    record[RecordSealer::kHeaderBytes + 3] ^= 0x01;
    expect_refused(Open(*session->server_sealer, record));
    // The connection is done: the next, intact record fails too.
    expect_refused(
        Open(*session->server_sealer, Seal(*session->client_sealer, plain)));
  }
  {
    SCOPED_TRACE("a tag byte changed");
    std::unique_ptr<Session> session = Handshake();
    ASSERT_NE(session, nullptr);
    std::string record = Seal(*session->client_sealer, plain);
    record.back() ^= 0x80;
    expect_refused(Open(*session->server_sealer, record));
  }
  {
    SCOPED_TRACE("cut short, its header changed to match");
    std::unique_ptr<Session> session = Handshake();
    ASSERT_NE(session, nullptr);
    std::string record = Seal(*session->client_sealer, plain);
    std::string cut = record.substr(0, record.size() - 1);
    cut[0] = static_cast<char>(plain.size() - 1);
    expect_refused(Open(*session->server_sealer, cut));
  }
  {
    SCOPED_TRACE("replayed");
    std::unique_ptr<Session> session = Handshake();
    ASSERT_NE(session, nullptr);
    const std::string record = Seal(*session->client_sealer, plain);
    ASSERT_THAT(Open(*session->server_sealer, record), tt::IsOkAndHolds(plain));
    expect_refused(Open(*session->server_sealer, record));
  }
  {
    SCOPED_TRACE("reordered (or one dropped)");
    std::unique_ptr<Session> session = Handshake();
    ASSERT_NE(session, nullptr);
    const std::string first = Seal(*session->client_sealer, plain);
    const std::string second = Seal(*session->client_sealer, plain);
    expect_refused(Open(*session->server_sealer, second));
  }
  {
    SCOPED_TRACE("reflected back to its sender");
    std::unique_ptr<Session> session = Handshake();
    ASSERT_NE(session, nullptr);
    expect_refused(
        Open(*session->client_sealer, Seal(*session->client_sealer, plain)));
  }
  {
    SCOPED_TRACE("from another session");
    std::unique_ptr<Session> one = Handshake();
    std::unique_ptr<Session> other = Handshake();
    ASSERT_NE(one, nullptr);
    ASSERT_NE(other, nullptr);
    expect_refused(
        Open(*other->server_sealer, Seal(*one->client_sealer, plain)));
  }
}

TEST_F(RecordSealerTest, BothEndsChangeKeysAtTheSameRecord) {
  std::unique_ptr<Session> session = Handshake();
  ASSERT_NE(session, nullptr);
  // Records of one byte up to, across and past the first change of key.
  char record[RecordSealer::RecordBytes(1)];
  char plain = 0;
  for (uint64_t i = 0; i < RecordSealer::kRecordsPerKey + 3; ++i) {
    const char byte = static_cast<char>(i);
    ASSERT_OK(session->server_sealer->Seal(&byte, 1, record)) << i;
    ASSERT_OK(session->client_sealer->Open(record, 1, &plain)) << i;
    ASSERT_EQ(plain, byte) << i;
  }
}

}  // namespace
}  // namespace tessera
