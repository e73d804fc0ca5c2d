// The data plane's own record protection after a TLS handshake
// (docs/data_plane.md, "Sealed records"; docs/security.md): the bulk bytes
// of a TLS data-plane connection are sealed with the AEAD its TLS session
// negotiated (AES-128-GCM, AES-256-GCM or ChaCha20-Poly1305), under keys
// the session exports (RFC 8446 section 7.5, RFC 5705), instead of going
// through OpenSSL's record layer. The same pattern as DTLS-SRTP (RFC 5764):
// TLS authenticates the peers and agrees the keys; the records are the
// application's. What it saves is copies: OpenSSL copies every byte it
// sends into its write buffer before encrypting it there, while Seal
// encrypts straight from the caller's memory into the bytes that go to
// the socket.
//
// A record on the wire:
//
//   u32le n | ciphertext (n bytes) | tag (16 bytes)      1 <= n <=
//   kMaxRecordBytes
//
// The header is the AEAD's additional data; the nonce is the direction's IV
// XOR the record's sequence number (as in TLS 1.3), so records cannot be
// dropped, repeated, reordered or moved to the other direction without
// Open failing. Each direction has its own key; both ends move to a fresh
// key (exported with the key's number as context) every kRecordsPerKey
// records, far inside AES-GCM's per-key limits. Open checks the tag as it
// decrypts: bytes of a record that failed must not be used
// (DataConnection opens records in a buffer of its own, except into a
// read's destination that a failed read leaves unspecified anyway).
//
// Thread-safety: none; one connection's reader and writer at a time (each
// direction has its own state, so one thread may Seal while another
// Opens). The SSL session must outlive the sealer.
#ifndef TESSERA_WIRE_RECORD_SEALER_H_
#define TESSERA_WIRE_RECORD_SEALER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

typedef struct ssl_st SSL;
typedef struct evp_cipher_ctx_st EVP_CIPHER_CTX;
typedef struct evp_cipher_st EVP_CIPHER;

namespace tessera {

class RecordSealer {
 public:
  static constexpr size_t kHeaderBytes = 4;
  static constexpr size_t kTagBytes = 16;
  // A record's plaintext at most: large enough that the per-record cost
  // (a nonce, a tag) is small, small enough to stay in a core's cache
  // between its arrival and its decryption.
  static constexpr size_t kMaxRecordBytes = size_t{64} << 10;
  // Records sealed under one key (per direction): 2^20 records of 64 KiB
  // are 2^32 AES blocks, a hundredth of TLS 1.3's limit for AES-GCM.
  static constexpr uint64_t kRecordsPerKey = uint64_t{1} << 20;

  // The ALPN name both ends offer and accept for sealed records.
  static constexpr char kAlpn[] = "tessera-sealed-records/1";

  // What computes the AEAD. kFastest: Intel's ipsec-mb for AES-GCM where
  // the build found it (libipsec-mb, x86-64) and the CPU has AES-NI (with
  // VAES and AVX-512 it runs 2.5 times OpenSSL 3.0's AES-GCM), else
  // OpenSSL. Both compute the same records; tests seal with one and open
  // with the other.
  enum class Engine { kFastest, kOpenssl };

  // The sealer of one end of `ssl`, whose handshake has completed;
  // FAILED_PRECONDITION when its cipher is not one of the three AEADs,
  // INTERNAL when OpenSSL cannot export keys.
  static absl::StatusOr<std::unique_ptr<RecordSealer>> ForSession(
      SSL* ssl, bool server, Engine engine = Engine::kFastest);
  ~RecordSealer();
  // The AEAD and the engine, e.g. "AES-128-GCM (ipsec-mb)".
  std::string Describe() const;
  RecordSealer(const RecordSealer&) = delete;
  RecordSealer& operator=(const RecordSealer&) = delete;

  // The wire size of a record of `n` plaintext bytes.
  static constexpr size_t RecordBytes(size_t n) {
    return kHeaderBytes + n + kTagBytes;
  }

  // Seals the next outgoing record: `n` bytes (1 to kMaxRecordBytes) of
  // `plain` into `out`, which has RecordBytes(n) bytes (and may not
  // overlap `plain`).
  absl::Status Seal(const char* plain, size_t n, char* out);

  // The plaintext length a record header announces: DATA_LOSS when it is
  // out of range (with what the bytes look like when they are a TLS alert,
  // the peer's refusal of the handshake).
  static absl::StatusOr<size_t> PlainBytes(const char* header);

  // Opens the next incoming record, RecordBytes(n) bytes at `record` with
  // n = PlainBytes(record), decrypting its n bytes into `plain`: in place
  // (record + kHeaderBytes) or into memory that does not overlap the
  // record. DATA_LOSS when the tag does not match (the bytes were changed,
  // or are not the next record): `plain` then holds bytes nobody sent, the
  // connection is useless, and every later Open fails too.
  absl::Status Open(const char* record, size_t n, char* plain);

 private:
  struct Direction;
  RecordSealer(SSL* ssl, bool server, const EVP_CIPHER* cipher, bool ipsec_mb);
  // Keys `direction` for its current key number.
  absl::Status Rekey(Direction& direction, bool encrypt);
  // The nonce of `direction`'s next record, after moving to the next key
  // when this one has sealed (or opened) kRecordsPerKey records.
  absl::Status NextNonce(Direction& direction, bool encrypt,
                         unsigned char* nonce);

  SSL* const ssl_;
  const bool server_;
  const EVP_CIPHER* const cipher_;
  const bool ipsec_mb_;  // ipsec-mb computes the AEAD, else OpenSSL
  std::unique_ptr<Direction> out_;
  std::unique_ptr<Direction> in_;
  bool broken_ = false;  // an Open failed
};

}  // namespace tessera

#endif  // TESSERA_WIRE_RECORD_SEALER_H_
