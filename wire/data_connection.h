// A data-plane connection (docs/data_plane.md): a TCP socket carrying
// frames and chunk bytes, in the clear or over TLS (OpenSSL, TLS 1.2 or
// 1.3) with the same certificates as gRPC (wire/credentials.h).
//
//   server  TlsContext::ForServer(config): the daemon's certificate; with a
//           CA, a client certificate it signed is required (mutual TLS).
//   client  TlsContext::ForClient(config): verifies the server's
//           certificate against the CA and its subjectAltName against the
//           host dialled (an IP address or a DNS name); presents the
//           client certificate when the configuration has one.
//
// Contexts re-read their files when they change (checked at most every
// config.refresh_seconds), as gRPC's certificate provider does; a rotation
// that fails to load keeps the previous context (and logs why).
//
// When both ends offer it (ALPN RecordSealer::kAlpn), a TLS connection
// carries its bytes after the handshake as sealed records
// (wire/record_sealer.h) instead of OpenSSL's: the AEAD the session
// agreed, under keys it exports, encrypted straight from the caller's
// bytes (two copies fewer when sending) and, into a read's destination,
// opened in place (one fewer when receiving). A peer that does not offer
// it gets plain TLS records, as before.
//
// Every read, write and handshake is bounded by an absolute deadline:
// DEADLINE_EXCEEDED when it passes, UNAVAILABLE when the peer goes away or
// the TLS layer fails (the message carries OpenSSL's reason). A peer that
// closed the connection never raises SIGPIPE, in the clear or over TLS: a
// client process need not ignore it. A TLS connection's socket is made
// non-blocking; InterruptSocket(fd()) still interrupts a thread blocked in
// it.
//
// Thread-safety: a TlsContext may be used from any thread; a
// DataConnection by one thread at a time.
#ifndef TESSERA_WIRE_DATA_CONNECTION_H_
#define TESSERA_WIRE_DATA_CONNECTION_H_

#include <sys/uio.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "io/unique_fd.h"
#include "wire/credentials.h"

typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_st SSL;
typedef struct bio_st BIO;

namespace tessera {

class TlsContext {
 public:
  // INVALID_ARGUMENT naming the file when a certificate, key or CA cannot
  // be loaded (or the key does not match the certificate).
  static absl::StatusOr<std::shared_ptr<TlsContext>> ForServer(
      const TlsConfig& config);
  static absl::StatusOr<std::shared_ptr<TlsContext>> ForClient(
      const TlsConfig& config);
  ~TlsContext();

  // The current SSL_CTX (reloaded first when the files changed).
  std::shared_ptr<SSL_CTX> Current();

 private:
  TlsContext(TlsConfig config, bool server)
      : config_(config), server_(server) {}
  static absl::StatusOr<std::shared_ptr<TlsContext>> Make(
      const TlsConfig& config, bool server);
  absl::StatusOr<std::shared_ptr<SSL_CTX>> Build() const;
  // mtime and size of the configuration's files, for change detection.
  std::string Fingerprint() const;

  const TlsConfig config_;
  const bool server_;
  absl::Mutex mu_;
  std::shared_ptr<SSL_CTX> ctx_ ABSL_GUARDED_BY(mu_);
  std::string fingerprint_ ABSL_GUARDED_BY(mu_);
  absl::Time checked_ ABSL_GUARDED_BY(mu_);
};

// The contexts of this process's data plane, made from ProcessTls() on
// first use and again when it changes; null when TLS is off. Errors (files
// unreadable) come back on every call.
absl::StatusOr<std::shared_ptr<TlsContext>> ProcessServerTlsContext();
absl::StatusOr<std::shared_ptr<TlsContext>> ProcessClientTlsContext();

class DataConnection {
 public:
  // A plaintext connection over `fd`, owned or not.
  static DataConnection Plain(UniqueFd fd);
  static DataConnection PlainView(int fd);
  // The server's side of a TLS connection over `fd` (not owned: the
  // connection server closes it), handshaken by `deadline`.
  static absl::StatusOr<DataConnection> Accept(int fd, TlsContext& context,
                                               absl::Time deadline);
  // The client's side over `fd` (owned), checking that the server's
  // certificate names `host`.
  static absl::StatusOr<DataConnection> Connect(UniqueFd fd,
                                                const std::string& host,
                                                TlsContext& context,
                                                absl::Time deadline);

  DataConnection(DataConnection&&) noexcept;
  DataConnection& operator=(DataConnection&&) noexcept;
  ~DataConnection();

  int fd() const { return fd_; }
  bool tls() const { return ssl_ != nullptr; }
  // Whether the TLS session's bytes travel as sealed records.
  bool sealed() const { return sealed_ != nullptr; }
  // Whether the channel itself authenticates every byte (TLS: each record's
  // AES-GCM or ChaCha20-Poly1305 tag), so that the data plane's per-chunk
  // XXH3 would only repeat the check: both ends then skip it and send
  // kUncheckedChunk (wire/chunk_codec.h) in its place.
  bool authenticated() const { return tls(); }

  absl::Status ReadFull(void* data, size_t size, absl::Time deadline);
  // ReadFull into a read's destination, which a failed read leaves
  // unspecified: sealed records are opened straight into `data` (a copy
  // less), so after a failure it may hold bytes nobody sent. Never into a
  // shard or anything else that outlives a failed transfer.
  absl::Status ReadIntoDestination(void* data, size_t size,
                                   absl::Time deadline);
  // `more`: more bytes follow at once (MSG_MORE in the clear).
  absl::Status WriteFull(const void* data, size_t size, absl::Time deadline,
                         bool more = false);
  // WriteFull of the pieces `pieces` points at, joined, gathered by the
  // kernel (io/socket.h WriteVFull); `pieces` is consumed. In the clear
  // only: FAILED_PRECONDITION, with nothing sent, on a TLS connection.
  absl::Status WriteVFull(std::vector<struct iovec>& pieces,
                          absl::Time deadline, bool more = false);
  // A length-prefixed frame (chunk_codec.h's format).
  absl::Status WriteFrame(absl::string_view payload, absl::Time deadline,
                          bool more = false);
  absl::StatusOr<std::string> ReadFrame(absl::Time deadline);

 private:
  DataConnection(UniqueFd owned, int fd, SSL* ssl);
  // Runs an SSL call until it completes, waiting for the socket as it asks.
  template <typename Call>
  absl::StatusOr<int> Drive(Call call, absl::Time deadline,
                            absl::string_view what);
  // Makes `ssl_` write through a buffer (records leave in large writes).
  absl::Status AttachBuffer();
  // After the handshake: sealed records when ALPN chose them, else plain
  // TLS records read ahead.
  absl::Status StartRecords(bool server);
  // Sends what the write buffer (or the sealed records') holds.
  absl::Status Flush(absl::Time deadline);
  // `direct`: whole records may be opened straight into `out`.
  absl::Status ReadSealed(char* out, size_t size, absl::Time deadline,
                          bool direct);
  absl::Status WriteSealed(const char* in, size_t size, absl::Time deadline,
                           bool more);

  UniqueFd owned_;
  int fd_ = -1;
  SSL* ssl_ = nullptr;     // owned
  BIO* buffer_ = nullptr;  // owned by ssl_: records on their way out
  struct Sealed;
  std::unique_ptr<Sealed> sealed_;  // null: plaintext or OpenSSL's records
};

}  // namespace tessera

#endif  // TESSERA_WIRE_DATA_CONNECTION_H_
