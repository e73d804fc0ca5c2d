#include "wire/data_connection.h"

#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "io/file.h"
#include "io/socket.h"
#include "wire/chunk_codec.h"
#include "wire/openssl_init.h"
#include "wire/record_sealer.h"

namespace tessera {
namespace {

// OpenSSL's queued errors as one line (and the queue emptied).
std::string OpensslErrors() {
  std::string text;
  while (const unsigned long code = ERR_get_error()) {
    char buffer[256];
    ERR_error_string_n(code, buffer, sizeof(buffer));
    absl::StrAppend(&text, text.empty() ? "" : "; ", buffer);
  }
  return text.empty() ? "no detail" : text;
}

absl::Status Invalid(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(what, ": ", OpensslErrors()));
}

void FreeContext(SSL_CTX* ctx) { SSL_CTX_free(ctx); }

// OpenSSL's socket BIO writes with write(2), so a peer that closed the
// connection raised SIGPIPE, which kills a client process that does not
// ignore it (the daemons do; a C++ or Python program need not). This
// method is that BIO with its write made by send(2) with MSG_NOSIGNAL:
// the peer's close is EPIPE, an error like any other. Everything else
// (reads, the descriptor's controls) is OpenSSL's socket BIO's own.
int SendWithoutSigpipe(BIO* bio, const char* data, int size) {
  int fd = -1;
  BIO_get_fd(bio, &fd);
  errno = 0;
  const ssize_t n = ::send(fd, data, static_cast<size_t>(size), MSG_NOSIGNAL);
  BIO_clear_retry_flags(bio);
  if (n <= 0 && BIO_sock_should_retry(static_cast<int>(n))) {
    BIO_set_retry_write(bio);
  }
  return static_cast<int>(n);
}

const BIO_METHOD* SocketWithoutSigpipe() {
  static const BIO_METHOD* const method = [] {
    const BIO_METHOD* socket = BIO_s_socket();
    BIO_METHOD* made = BIO_meth_new(
        BIO_get_new_index() | BIO_TYPE_SOURCE_SINK | BIO_TYPE_DESCRIPTOR,
        "socket without SIGPIPE");
    if (made == nullptr || BIO_meth_set_write(made, SendWithoutSigpipe) != 1 ||
        BIO_meth_set_read(made, BIO_meth_get_read(socket)) != 1 ||
        BIO_meth_set_puts(made, BIO_meth_get_puts(socket)) != 1 ||
        BIO_meth_set_ctrl(made, BIO_meth_get_ctrl(socket)) != 1 ||
        BIO_meth_set_create(made, BIO_meth_get_create(socket)) != 1 ||
        BIO_meth_set_destroy(made, BIO_meth_get_destroy(socket)) != 1) {
      return static_cast<const BIO_METHOD*>(nullptr);
    }
    return static_cast<const BIO_METHOD*>(made);
  }();
  return method;
}

absl::Status SetNonBlocking(int fd) {
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    return absl::UnavailableError("cannot make the socket non-blocking");
  }
  return absl::OkStatus();
}

// The context made from ProcessTls() by `make`, made again when the
// process's configuration changes (SetProcessTls).
template <typename Make>
absl::StatusOr<std::shared_ptr<TlsContext>> ProcessContext(Make make) {
  struct Made {
    TlsConfig config;
    absl::StatusOr<std::shared_ptr<TlsContext>> context;
  };
  static absl::Mutex mu(absl::kConstInit);
  static auto* made = new std::optional<Made>();
  const TlsConfig config = ProcessTls();
  absl::MutexLock lock(&mu);
  if (!made->has_value() || (*made)->config.cert_file != config.cert_file ||
      (*made)->config.key_file != config.key_file ||
      (*made)->config.ca_file != config.ca_file) {
    *made = Made{config, config.enabled()
                             ? make(config)
                             : absl::StatusOr<std::shared_ptr<TlsContext>>(
                                   std::shared_ptr<TlsContext>())};
  }
  return (*made)->context;
}

}  // namespace

// ---- TlsContext
// ---------------------------------------------------------------

absl::StatusOr<std::shared_ptr<TlsContext>> TlsContext::Make(
    const TlsConfig& config, bool server) {
  std::shared_ptr<TlsContext> context(new TlsContext(config, server));
  absl::StatusOr<std::shared_ptr<SSL_CTX>> built = context->Build();
  if (!built.ok()) return built.status();
  absl::MutexLock lock(&context->mu_);
  context->ctx_ = *std::move(built);
  context->fingerprint_ = context->Fingerprint();
  context->checked_ = absl::Now();
  return context;
}

absl::StatusOr<std::shared_ptr<TlsContext>> TlsContext::ForServer(
    const TlsConfig& config) {
  return Make(config, /*server=*/true);
}

absl::StatusOr<std::shared_ptr<TlsContext>> TlsContext::ForClient(
    const TlsConfig& config) {
  return Make(config, /*server=*/false);
}

TlsContext::~TlsContext() = default;

namespace {

// RecordSealer::kAlpn in ALPN's wire format: a length byte, then the name.
const std::string& SealedRecordsProtocols() {
  static const std::string* const protocols = [] {
    const std::string name = RecordSealer::kAlpn;
    return new std::string(std::string(1, static_cast<char>(name.size())) +
                           name);
  }();
  return *protocols;
}

// The server's ALPN choice: sealed records when the client offers them;
// otherwise no protocol (OpenSSL's records).
int SelectSealedRecords(SSL*, const unsigned char** out,
                        unsigned char* out_length, const unsigned char* in,
                        unsigned int in_length, void*) {
  const std::string& protocols = SealedRecordsProtocols();
  unsigned char* chosen = nullptr;
  if (SSL_select_next_proto(
          &chosen, out_length,
          reinterpret_cast<const unsigned char*>(protocols.data()),
          static_cast<unsigned int>(protocols.size()), in,
          in_length) != OPENSSL_NPN_NEGOTIATED) {
    return SSL_TLSEXT_ERR_NOACK;
  }
  *out = chosen;
  return SSL_TLSEXT_ERR_OK;
}

}  // namespace

std::string TlsContext::Fingerprint() const {
  return absl::StrCat(FileVersion(config_.cert_file), "|",
                      FileVersion(config_.key_file), "|",
                      FileVersion(config_.ca_file));
}

absl::StatusOr<std::shared_ptr<SSL_CTX>> TlsContext::Build() const {
  InitOpenssl();
  ERR_clear_error();
  std::shared_ptr<SSL_CTX> ctx(
      SSL_CTX_new(server_ ? TLS_server_method() : TLS_client_method()),
      FreeContext);
  if (ctx == nullptr) return Invalid("cannot make a TLS context");
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  // Bulk data: AES-128-GCM first (AES-NI makes it the cheapest AEAD here,
  // ~15% faster than AES-256), ChaCha20 for hosts without AES-NI.
  SSL_CTX_set_ciphersuites(ctx.get(),
                           "TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_"
                           "SHA256:TLS_AES_256_GCM_SHA384");
  SSL_CTX_set_cipher_list(ctx.get(),
                          "ECDHE+AESGCM:ECDHE+CHACHA20:!aNULL:!eNULL:!SHA1:"
                          "!kRSA");
  // OpenSSL's records (a peer without sealed records) read whole socket
  // buffers at once rather than a record header, then its body: half the
  // system calls per 16 KiB record. 64 KiB (four records) stays in a
  // core's cache while it is decrypted and copied out; 256 KiB read
  // 256 MiB over 16 connections 10-13% slower here, 1 MiB 35% slower
  // (client_bench --secure --mib 256, interleaved runs). Read-ahead starts
  // after the handshake (StartRecords): during it, OpenSSL must not take
  // the first sealed record's bytes from the socket.
  SSL_CTX_set_default_read_buffer_len(ctx.get(), 64 << 10);
  // Nothing may follow the handshake in OpenSSL's records when the bytes
  // after it are sealed: no session tickets (nobody resumes data-plane
  // sessions) and no renegotiation.
  SSL_CTX_set_options(ctx.get(), SSL_OP_NO_RENEGOTIATION);
  if (server_) {
    SSL_CTX_set_num_tickets(ctx.get(), 0);
    SSL_CTX_set_alpn_select_cb(ctx.get(), SelectSealedRecords, nullptr);
  }
  // Writes may resume from another buffer position (SSL_write retries).
  SSL_CTX_set_mode(ctx.get(), SSL_MODE_ENABLE_PARTIAL_WRITE |
                                  SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  if (!config_.cert_file.empty()) {
    if (SSL_CTX_use_certificate_chain_file(ctx.get(),
                                           config_.cert_file.c_str()) != 1) {
      return Invalid(config_.cert_file);
    }
    if (SSL_CTX_use_PrivateKey_file(ctx.get(), config_.key_file.c_str(),
                                    SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(ctx.get()) != 1) {
      return Invalid(config_.key_file);
    }
  }
  if (!config_.ca_file.empty()) {
    if (SSL_CTX_load_verify_locations(ctx.get(), config_.ca_file.c_str(),
                                      nullptr) != 1) {
      return Invalid(config_.ca_file);
    }
    SSL_CTX_set_verify(ctx.get(),
                       server_
                           ? SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT
                           : SSL_VERIFY_PEER,
                       nullptr);
  } else if (!server_) {
    return absl::InvalidArgumentError(
        "a TLS client needs a CA to verify the server with");
  }
  return ctx;
}

std::shared_ptr<SSL_CTX> TlsContext::Current() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  if (now - checked_ >= absl::Seconds(config_.refresh_seconds)) {
    checked_ = now;
    const std::string fingerprint = Fingerprint();
    if (fingerprint != fingerprint_) {
      absl::StatusOr<std::shared_ptr<SSL_CTX>> rebuilt = Build();
      if (rebuilt.ok()) {
        ctx_ = *std::move(rebuilt);
        fingerprint_ = fingerprint;
      } else {
        // A half-written rotation: keep serving with what worked, and try
        // again at the next check.
        spdlog::error("data plane TLS: keeping the previous certificates: {}",
                      std::string(rebuilt.status().message()));
      }
    }
  }
  return ctx_;
}

absl::StatusOr<std::shared_ptr<TlsContext>> ProcessServerTlsContext() {
  return ProcessContext(
      [](const TlsConfig& config) { return TlsContext::ForServer(config); });
}

absl::StatusOr<std::shared_ptr<TlsContext>> ProcessClientTlsContext() {
  return ProcessContext(
      [](const TlsConfig& config) { return TlsContext::ForClient(config); });
}

// ---- DataConnection
// -----------------------------------------------------------

DataConnection DataConnection::Plain(UniqueFd fd) {
  const int raw = fd.get();
  return DataConnection(std::move(fd), raw, nullptr);
}

DataConnection DataConnection::PlainView(int fd) {
  return DataConnection(UniqueFd(), fd, nullptr);
}

// A sealed connection's records on their way out and in.
struct DataConnection::Sealed {
  // Sealed records leave in sends of about this many bytes.
  static constexpr size_t kSendBytes = size_t{256} << 10;
  // Received bytes not yet opened; room for several whole records.
  static constexpr size_t kReceiveBytes = size_t{256} << 10;

  std::unique_ptr<RecordSealer> sealer;
  std::unique_ptr<char[]> out = std::make_unique<char[]>(
      kSendBytes + RecordSealer::RecordBytes(RecordSealer::kMaxRecordBytes));
  size_t out_size = 0;
  std::unique_ptr<char[]> in = std::make_unique<char[]>(kReceiveBytes);
  size_t in_begin = 0;  // [in_begin, in_end): received, not yet opened
  size_t in_end = 0;
  const char* plain = nullptr;  // an opened record's bytes not yet read
  size_t plain_size = 0;
};

DataConnection::DataConnection(UniqueFd owned, int fd, SSL* ssl)
    : owned_(std::move(owned)), fd_(fd), ssl_(ssl) {}

DataConnection::DataConnection(DataConnection&& other) noexcept
    : owned_(std::move(other.owned_)),
      fd_(std::exchange(other.fd_, -1)),
      ssl_(std::exchange(other.ssl_, nullptr)),
      buffer_(std::exchange(other.buffer_, nullptr)),
      sealed_(std::move(other.sealed_)) {}

DataConnection& DataConnection::operator=(DataConnection&& other) noexcept {
  if (this != &other) {
    sealed_.reset();  // before the session its sealer reads keys from
    if (ssl_ != nullptr) SSL_free(ssl_);
    owned_ = std::move(other.owned_);
    fd_ = std::exchange(other.fd_, -1);
    ssl_ = std::exchange(other.ssl_, nullptr);
    buffer_ = std::exchange(other.buffer_, nullptr);
    sealed_ = std::move(other.sealed_);
  }
  return *this;
}

DataConnection::~DataConnection() {
  sealed_.reset();
  if (ssl_ != nullptr) SSL_free(ssl_);
}

template <typename Call>
absl::StatusOr<int> DataConnection::Drive(Call call, absl::Time deadline,
                                          absl::string_view what) {
  while (true) {
    RETURN_IF_ERROR(CheckDeadline(deadline, what));
    ERR_clear_error();
    const int n = call();
    if (n > 0) return n;
    switch (SSL_get_error(ssl_, n)) {
      case SSL_ERROR_WANT_READ:
        RETURN_IF_ERROR(AwaitReady(fd_, POLLIN, deadline, what));
        break;
      case SSL_ERROR_WANT_WRITE:
        RETURN_IF_ERROR(AwaitReady(fd_, POLLOUT, deadline, what));
        break;
      case SSL_ERROR_ZERO_RETURN:
        return absl::UnavailableError(
            absl::StrCat(what, ": the peer closed the connection"));
      case SSL_ERROR_SYSCALL:
        if (ERR_peek_error() == 0) {
          const int error = errno;
          return absl::UnavailableError(
              absl::StrCat(what, ": ",
                           error != 0 ? std::strerror(error)
                                      : "the peer closed the connection",
                           " (a peer that refused the TLS session closes it)"));
        }
        [[fallthrough]];
      default:
        return absl::UnavailableError(
            absl::StrCat(what, ": TLS: ", OpensslErrors()));
    }
  }
}

absl::Status DataConnection::AttachBuffer() {
  // Reads straight from the socket; writes through a buffer in front of
  // it, flushed when a write ends a message (WriteFull without `more`):
  // a 512 KiB chunk leaves in a few large sends instead of 32 records'
  // worth of small ones.
  const BIO_METHOD* method = SocketWithoutSigpipe();
  BIO* socket = method != nullptr ? BIO_new(method) : nullptr;
  BIO* buffered = socket != nullptr ? BIO_new(BIO_f_buffer()) : nullptr;
  if (buffered == nullptr) {
    BIO_free(socket);
    return Invalid("cannot make the data connection's TLS buffers");
  }
  BIO_set_fd(socket, fd_, BIO_NOCLOSE);
  BIO_set_write_buffer_size(buffered, 1 << 20);
  BIO_push(buffered, socket);
  BIO_up_ref(socket);
  SSL_set_bio(ssl_, socket, buffered);
  buffer_ = buffered;
  return absl::OkStatus();
}

absl::Status DataConnection::StartRecords(bool server) {
  const unsigned char* protocol = nullptr;
  unsigned int length = 0;
  SSL_get0_alpn_selected(ssl_, &protocol, &length);
  if (absl::string_view(reinterpret_cast<const char*>(protocol), length) !=
      RecordSealer::kAlpn) {
    SSL_set_read_ahead(ssl_, 1);
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(std::unique_ptr<RecordSealer> sealer,
                   RecordSealer::ForSession(ssl_, server));
  sealed_ = std::make_unique<Sealed>();
  sealed_->sealer = std::move(sealer);
  return absl::OkStatus();
}

absl::Status DataConnection::Flush(absl::Time deadline) {
  if (sealed_ != nullptr) {
    const size_t size = std::exchange(sealed_->out_size, 0);
    return tessera::WriteFull(fd_, sealed_->out.get(), size, deadline);
  }
  if (buffer_ == nullptr) return absl::OkStatus();
  while (BIO_wpending(buffer_) > 0) {
    ERR_clear_error();
    if (BIO_flush(buffer_) > 0) break;
    if (!BIO_should_retry(buffer_)) {
      const int error = errno;
      return absl::UnavailableError(absl::StrCat(
          "send: ", error != 0 ? std::strerror(error) : OpensslErrors()));
    }
    RETURN_IF_ERROR(AwaitReady(fd_, POLLOUT, deadline, "send"));
  }
  return absl::OkStatus();
}

absl::StatusOr<DataConnection> DataConnection::Accept(int fd,
                                                      TlsContext& context,
                                                      absl::Time deadline) {
  RETURN_IF_ERROR(SetNonBlocking(fd));
  SSL* ssl = SSL_new(context.Current().get());
  if (ssl == nullptr) return Invalid("cannot make a TLS session");
  DataConnection connection(UniqueFd(), fd, ssl);
  RETURN_IF_ERROR(connection.AttachBuffer());
  RETURN_IF_ERROR(connection
                      .Drive([ssl] { return SSL_accept(ssl); }, deadline,
                             "data plane TLS handshake")
                      .status());
  RETURN_IF_ERROR(connection.Flush(deadline));
  RETURN_IF_ERROR(connection.StartRecords(/*server=*/true));
  return connection;
}

absl::StatusOr<DataConnection> DataConnection::Connect(UniqueFd fd,
                                                       const std::string& host,
                                                       TlsContext& context,
                                                       absl::Time deadline) {
  RETURN_IF_ERROR(SetNonBlocking(fd.get()));
  SSL* ssl = SSL_new(context.Current().get());
  if (ssl == nullptr) return Invalid("cannot make a TLS session");
  const int raw = fd.get();
  DataConnection connection(std::move(fd), raw, ssl);
  RETURN_IF_ERROR(connection.AttachBuffer());
  const bool ip = IsIpAddress(host);
  X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
  if (ip ? X509_VERIFY_PARAM_set1_ip_asc(param, host.c_str()) != 1
         : (SSL_set1_host(ssl, host.c_str()) != 1 ||
            SSL_set_tlsext_host_name(ssl, host.c_str()) != 1)) {
    return Invalid(absl::StrCat("cannot check the name ", host));
  }
  const std::string& protocols = SealedRecordsProtocols();
  if (SSL_set_alpn_protos(
          ssl, reinterpret_cast<const unsigned char*>(protocols.data()),
          static_cast<unsigned int>(protocols.size())) != 0) {
    return Invalid("cannot offer sealed records");
  }
  RETURN_IF_ERROR(
      connection
          .Drive([ssl] { return SSL_connect(ssl); }, deadline,
                 absl::StrCat("data plane TLS handshake with ", host))
          .status());
  RETURN_IF_ERROR(connection.Flush(deadline));
  RETURN_IF_ERROR(connection.StartRecords(/*server=*/false));
  return connection;
}

absl::Status DataConnection::ReadFull(void* data, size_t size,
                                      absl::Time deadline) {
  if (ssl_ == nullptr) return tessera::ReadFull(fd_, data, size, deadline);
  RETURN_IF_ERROR(Flush(deadline));  // what we said, before the answer
  if (sealed_ != nullptr) {
    return ReadSealed(static_cast<char*>(data), size, deadline,
                      /*direct=*/false);
  }
  char* out = static_cast<char*>(data);
  while (size > 0) {
    const int want = static_cast<int>(std::min<size_t>(size, 1 << 30));
    ASSIGN_OR_RETURN(
        const int n,
        Drive([&] { return SSL_read(ssl_, out, want); }, deadline, "recv"));
    out += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status DataConnection::WriteFull(const void* data, size_t size,
                                       absl::Time deadline, bool more) {
  if (ssl_ == nullptr) {
    return tessera::WriteFull(fd_, data, size, deadline, more);
  }
  if (sealed_ != nullptr) {
    return WriteSealed(static_cast<const char*>(data), size, deadline, more);
  }
  const char* in = static_cast<const char*>(data);
  while (size > 0) {
    const int want = static_cast<int>(std::min<size_t>(size, 1 << 30));
    ASSIGN_OR_RETURN(
        const int n,
        Drive([&] { return SSL_write(ssl_, in, want); }, deadline, "send"));
    in += n;
    size -= static_cast<size_t>(n);
  }
  return more ? absl::OkStatus() : Flush(deadline);
}

absl::Status DataConnection::WriteVFull(std::vector<struct iovec>& pieces,
                                        absl::Time deadline, bool more) {
  if (ssl_ != nullptr) {
    return absl::FailedPreconditionError(
        "a gathered write is for connections in the clear; TLS records are "
        "written from one buffer (WriteFull)");
  }
  return tessera::WriteVFull(fd_, pieces, deadline, more);
}

absl::Status DataConnection::ReadIntoDestination(void* data, size_t size,
                                                 absl::Time deadline) {
  if (sealed_ == nullptr) return ReadFull(data, size, deadline);
  RETURN_IF_ERROR(Flush(deadline));
  return ReadSealed(static_cast<char*>(data), size, deadline, /*direct=*/true);
}

absl::Status DataConnection::ReadSealed(char* out, size_t size,
                                        absl::Time deadline, bool direct) {
  Sealed& s = *sealed_;
  // Has [in_begin, in_begin + need) received, reading what else has
  // arrived into the room after it.
  const auto fill = [&](size_t need) -> absl::Status {
    const size_t have = s.in_end - s.in_begin;
    if (have >= need) return absl::OkStatus();
    if (have == 0) {
      s.in_begin = s.in_end = 0;
    } else if (Sealed::kReceiveBytes - s.in_begin < need) {
      // The record does not fit in the room left: its start moves to the
      // front (what is before it has been opened and read).
      std::memmove(s.in.get(), s.in.get() + s.in_begin, have);
      s.in_begin = 0;
      s.in_end = have;
    }
    ASSIGN_OR_RETURN(const size_t n,
                     ReadAtLeast(fd_, s.in.get() + s.in_end, need - have,
                                 Sealed::kReceiveBytes - s.in_end, deadline));
    s.in_end += n;
    return absl::OkStatus();
  };
  while (size > 0) {
    if (s.plain_size > 0) {
      const size_t n = std::min(size, s.plain_size);
      std::memcpy(out, s.plain, n);
      s.plain += n;
      s.plain_size -= n;
      out += n;
      size -= n;
      continue;
    }
    RETURN_IF_ERROR(fill(RecordSealer::kHeaderBytes));
    char* record = s.in.get() + s.in_begin;
    ASSIGN_OR_RETURN(const size_t n, RecordSealer::PlainBytes(record));
    RETURN_IF_ERROR(fill(RecordSealer::RecordBytes(n)));
    record = s.in.get() + s.in_begin;
    s.in_begin += RecordSealer::RecordBytes(n);
    if (direct && n <= size) {
      RETURN_IF_ERROR(s.sealer->Open(record, n, out));
      out += n;
      size -= n;
      continue;
    }
    char* plain = record + RecordSealer::kHeaderBytes;
    RETURN_IF_ERROR(s.sealer->Open(record, n, plain));
    s.plain = plain;
    s.plain_size = n;
  }
  return absl::OkStatus();
}

absl::Status DataConnection::WriteSealed(const char* in, size_t size,
                                         absl::Time deadline, bool more) {
  Sealed& s = *sealed_;
  while (size > 0) {
    const size_t n = std::min(size, RecordSealer::kMaxRecordBytes);
    if (s.out_size >= Sealed::kSendBytes) {
      const size_t ready = std::exchange(s.out_size, 0);
      RETURN_IF_ERROR(tessera::WriteFull(fd_, s.out.get(), ready, deadline,
                                         /*more=*/true));
    }
    RETURN_IF_ERROR(s.sealer->Seal(in, n, s.out.get() + s.out_size));
    s.out_size += RecordSealer::RecordBytes(n);
    in += n;
    size -= n;
  }
  return more ? absl::OkStatus() : Flush(deadline);
}

absl::Status DataConnection::WriteFrame(absl::string_view payload,
                                        absl::Time deadline, bool more) {
  if (payload.size() > kMaxDataPlaneFrameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("frame of ", payload.size(), " bytes is too large"));
  }
  // One write: the length and the payload leave together.
  std::string frame(4 + payload.size(), '\0');
  const uint32_t n = static_cast<uint32_t>(payload.size());
  for (int i = 0; i < 4; ++i) frame[i] = static_cast<char>(n >> (8 * i));
  frame.replace(4, payload.size(), payload.data(), payload.size());
  return WriteFull(frame.data(), frame.size(), deadline, more);
}

absl::StatusOr<std::string> DataConnection::ReadFrame(absl::Time deadline) {
  unsigned char length[4];
  RETURN_IF_ERROR(ReadFull(length, sizeof(length), deadline));
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i) n |= static_cast<uint32_t>(length[i]) << (8 * i);
  if (n > kMaxDataPlaneFrameBytes) {
    return absl::DataLossError(absl::StrCat("frame of ", n,
                                            " bytes exceeds the limit of ",
                                            kMaxDataPlaneFrameBytes));
  }
  std::string payload(n, '\0');
  RETURN_IF_ERROR(ReadFull(payload.data(), n, deadline));
  return payload;
}

}  // namespace tessera
