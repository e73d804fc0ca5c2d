#include "wire/record_sealer.h"

#include <endian.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/objects.h>
#include <openssl/ssl.h>

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

#if TESSERA_WITH_IPSEC_MB
#include <intel-ipsec-mb.h>
#endif

namespace tessera {
namespace {

constexpr size_t kIvBytes = 12;
constexpr char kExporterLabel[] = "EXPORTER-tessera-sealed-records";

#if TESSERA_WITH_IPSEC_MB
// ipsec-mb's functions for this CPU (its AES-GCM with VAES and AVX-512
// runs 2.5 times OpenSSL 3.0's here), or null where the CPU has no AES-NI.
// Made once; its GCM functions keep no state of their own, so every
// thread may call them at once.
IMB_MGR* IpsecMb() {
  static IMB_MGR* const manager = [] {
    IMB_MGR* made = alloc_mb_mgr(0);
    if (made == nullptr) return made;
    IMB_ARCH arch = IMB_ARCH_NONE;
    init_mb_mgr_auto(made, &arch);
    if (imb_get_errno(made) != 0 || arch == IMB_ARCH_NONE ||
        arch == IMB_ARCH_NOAESNI) {
      free_mb_mgr(made);
      return static_cast<IMB_MGR*>(nullptr);
    }
    return made;
  }();
  return manager;
}

// The library wants its expanded keys on 64 bytes.
struct alignas(64) IpsecKey {
  gcm_key_data data;
};

// One record's AES-GCM (a 16- or 32-byte key), either way; the tag it
// computes goes to `tag`.
void IpsecGcm(bool encrypt, int key_bytes, const IpsecKey& key,
              unsigned char* out, const unsigned char* in, size_t n,
              const unsigned char* nonce, const unsigned char* header,
              unsigned char* tag) {
  IMB_MGR* const mb = IpsecMb();
  gcm_context_data context;
  const auto run = key_bytes == 16
                       ? (encrypt ? mb->gcm128_enc : mb->gcm128_dec)
                       : (encrypt ? mb->gcm256_enc : mb->gcm256_dec);
  run(&key.data, &context, out, in, n, nonce, header,
      RecordSealer::kHeaderBytes, tag, RecordSealer::kTagBytes);
}
#endif

absl::StatusOr<const EVP_CIPHER*> SessionAead(SSL* ssl) {
  const SSL_CIPHER* negotiated = SSL_get_current_cipher(ssl);
  const int nid =
      negotiated != nullptr ? SSL_CIPHER_get_cipher_nid(negotiated) : NID_undef;
  switch (nid) {
    case NID_aes_128_gcm:
      return EVP_aes_128_gcm();
    case NID_aes_256_gcm:
      return EVP_aes_256_gcm();
    case NID_chacha20_poly1305:
      return EVP_chacha20_poly1305();
    default:
      return absl::FailedPreconditionError(absl::StrCat(
          "sealed records need an AEAD cipher; the TLS session uses ",
          negotiated != nullptr ? SSL_CIPHER_get_name(negotiated) : "none"));
  }
}

void PutU32(uint32_t value, char* out) {
  const uint32_t little = htole32(value);
  std::memcpy(out, &little, sizeof(little));
}

uint32_t GetU32(const char* in) {
  uint32_t little;
  std::memcpy(&little, in, sizeof(little));
  return le32toh(little);
}

}  // namespace

struct RecordSealer::Direction {
  ~Direction() {
    EVP_CIPHER_CTX_free(ctx);
#if TESSERA_WITH_IPSEC_MB
    if (ipsec_key != nullptr)
      OPENSSL_cleanse(ipsec_key.get(), sizeof(IpsecKey));
#endif
  }
  EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
#if TESSERA_WITH_IPSEC_MB
  // Set when ipsec-mb seals this direction's AES-GCM (ctx is then unused).
  std::unique_ptr<IpsecKey> ipsec_key;
#endif
  unsigned char iv[kIvBytes] = {};
  uint64_t key_number = 0;
  uint64_t sequence = 0;  // of the next record under this key
  // The nonce of the next record: the IV XOR its sequence number
  // (big-endian, in the last 8 bytes).
  void Nonce(unsigned char* nonce) const {
    std::memcpy(nonce, iv, kIvBytes);
    for (int i = 0; i < 8; ++i) {
      nonce[kIvBytes - 1 - i] ^=
          static_cast<unsigned char>(sequence >> (8 * i));
    }
  }
};

RecordSealer::RecordSealer(SSL* ssl, bool server, const EVP_CIPHER* cipher,
                           bool ipsec_mb)
    : ssl_(ssl),
      server_(server),
      cipher_(cipher),
      ipsec_mb_(ipsec_mb),
      out_(std::make_unique<Direction>()),
      in_(std::make_unique<Direction>()) {}

RecordSealer::~RecordSealer() = default;

absl::StatusOr<std::unique_ptr<RecordSealer>> RecordSealer::ForSession(
    SSL* ssl, bool server, Engine engine) {
  ASSIGN_OR_RETURN(const EVP_CIPHER* cipher, SessionAead(ssl));
  bool ipsec_mb = false;
  static_cast<void>(engine);
#if TESSERA_WITH_IPSEC_MB
  ipsec_mb = engine == Engine::kFastest && IpsecMb() != nullptr &&
             (cipher == EVP_aes_128_gcm() || cipher == EVP_aes_256_gcm());
#endif
  std::unique_ptr<RecordSealer> sealer(
      new RecordSealer(ssl, server, cipher, ipsec_mb));
  if (sealer->out_->ctx == nullptr || sealer->in_->ctx == nullptr) {
    return absl::InternalError("sealed records: cannot make cipher contexts");
  }
  RETURN_IF_ERROR(sealer->Rekey(*sealer->out_, /*encrypt=*/true));
  RETURN_IF_ERROR(sealer->Rekey(*sealer->in_, /*encrypt=*/false));
  return sealer;
}

std::string RecordSealer::Describe() const {
  return absl::StrCat(EVP_CIPHER_get0_name(cipher_), " (",
                      ipsec_mb_ ? "ipsec-mb" : "OpenSSL", ")");
}

absl::Status RecordSealer::Rekey(Direction& direction, bool encrypt) {
  // The exporter's context names the direction (client to server, or
  // server to client) and the key's number, so that no two keys repeat.
  unsigned char context[9];
  context[0] = (encrypt == server_) ? 's' : 'c';
  for (int i = 0; i < 8; ++i) {
    context[8 - i] =
        static_cast<unsigned char>(direction.key_number >> (8 * i));
  }
  const int key_bytes = EVP_CIPHER_get_key_length(cipher_);
  unsigned char material[64 + kIvBytes];
  if (key_bytes <= 0 || key_bytes > 64 ||
      SSL_export_keying_material(
          ssl_, material, static_cast<size_t>(key_bytes) + kIvBytes,
          kExporterLabel, sizeof(kExporterLabel) - 1, context, sizeof(context),
          /*use_context=*/1) != 1) {
    return absl::InternalError(
        "sealed records: the TLS session cannot export keys");
  }
  std::memcpy(direction.iv, material + key_bytes, kIvBytes);
  bool keyed = false;
#if TESSERA_WITH_IPSEC_MB
  if (ipsec_mb_) {
    if (direction.ipsec_key == nullptr) {
      direction.ipsec_key = std::make_unique<IpsecKey>();
    }
    if (key_bytes == 16) {
      IMB_AES128_GCM_PRE(IpsecMb(), material, &direction.ipsec_key->data);
    } else {
      IMB_AES256_GCM_PRE(IpsecMb(), material, &direction.ipsec_key->data);
    }
    keyed = true;
  }
#endif
  if (!ipsec_mb_) {
    const int enc = encrypt ? 1 : 0;
    keyed = EVP_CipherInit_ex(direction.ctx, cipher_, nullptr, nullptr, nullptr,
                              enc) == 1 &&
            EVP_CIPHER_CTX_ctrl(direction.ctx, EVP_CTRL_AEAD_SET_IVLEN,
                                kIvBytes, nullptr) == 1 &&
            EVP_CipherInit_ex(direction.ctx, nullptr, nullptr, material,
                              nullptr, enc) == 1;
  }
  OPENSSL_cleanse(material, sizeof(material));
  if (!keyed) return absl::InternalError("sealed records: cannot set a key");
  direction.sequence = 0;
  return absl::OkStatus();
}

absl::Status RecordSealer::NextNonce(Direction& direction, bool encrypt,
                                     unsigned char* nonce) {
  if (direction.sequence == kRecordsPerKey) {
    ++direction.key_number;
    RETURN_IF_ERROR(Rekey(direction, encrypt));
  }
  direction.Nonce(nonce);
  return absl::OkStatus();
}

absl::Status RecordSealer::Seal(const char* plain, size_t n, char* out) {
  if (n == 0 || n > kMaxRecordBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("sealed records: a record of ", n, " bytes"));
  }
  Direction& d = *out_;
  unsigned char nonce[kIvBytes];
  RETURN_IF_ERROR(NextNonce(d, /*encrypt=*/true, nonce));
  PutU32(static_cast<uint32_t>(n), out);
  auto* header = reinterpret_cast<unsigned char*>(out);
  auto* body = header + kHeaderBytes;
  const auto* in = reinterpret_cast<const unsigned char*>(plain);
#if TESSERA_WITH_IPSEC_MB
  if (ipsec_mb_) {
    IpsecGcm(/*encrypt=*/true, EVP_CIPHER_get_key_length(cipher_), *d.ipsec_key,
             body, in, n, nonce, header, body + n);
    ++d.sequence;
    return absl::OkStatus();
  }
#endif
  int length = 0;
  int final_length = 0;
  if (EVP_EncryptInit_ex(d.ctx, nullptr, nullptr, nullptr, nonce) != 1 ||
      EVP_EncryptUpdate(d.ctx, nullptr, &length, header, kHeaderBytes) != 1 ||
      EVP_EncryptUpdate(d.ctx, body, &length, in, static_cast<int>(n)) != 1 ||
      EVP_EncryptFinal_ex(d.ctx, body + length, &final_length) != 1 ||
      EVP_CIPHER_CTX_ctrl(d.ctx, EVP_CTRL_AEAD_GET_TAG, kTagBytes, body + n) !=
          1) {
    return absl::InternalError("sealed records: encryption failed");
  }
  ++d.sequence;
  return absl::OkStatus();
}

absl::StatusOr<size_t> RecordSealer::PlainBytes(const char* header) {
  const uint32_t n = GetU32(header);
  if (n >= 1 && n <= kMaxRecordBytes) return n;
  // 0x15 (alert) or 0x17 (application data; TLS 1.3 encrypts its alerts),
  // then the version's major byte 3.
  const unsigned char type = static_cast<unsigned char>(header[0]);
  if ((type == 0x15 || type == 0x17) && header[1] == 0x03) {
    return absl::UnavailableError(
        "the peer answered with a TLS record, not a sealed one: it refused "
        "this connection's TLS session (its certificate?) and closed it");
  }
  return absl::DataLossError(absl::StrCat("sealed records: a record announces ",
                                          n, " bytes (1 to ", kMaxRecordBytes,
                                          " are allowed)"));
}

absl::Status RecordSealer::Open(const char* record, size_t n, char* plain) {
  if (broken_) {
    return absl::DataLossError(
        "sealed records: an earlier record failed its check");
  }
  if (n == 0 || n > kMaxRecordBytes || GetU32(record) != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("sealed records: opening a record of ", n, " bytes"));
  }
  Direction& d = *in_;
  unsigned char nonce[kIvBytes];
  RETURN_IF_ERROR(NextNonce(d, /*encrypt=*/false, nonce));
  const auto* header = reinterpret_cast<const unsigned char*>(record);
  const unsigned char* body = header + kHeaderBytes;
  // The tag the record carries (OpenSSL's API takes it non-const; an
  // in-place open overwrites only the body before it).
  unsigned char tag[kTagBytes];
  std::memcpy(tag, body + n, kTagBytes);
  auto* out = reinterpret_cast<unsigned char*>(plain);
  bool opened = false;
#if TESSERA_WITH_IPSEC_MB
  if (ipsec_mb_) {
    unsigned char computed[kTagBytes];
    IpsecGcm(/*encrypt=*/false, EVP_CIPHER_get_key_length(cipher_),
             *d.ipsec_key, out, body, n, nonce, header, computed);
    opened = CRYPTO_memcmp(computed, tag, kTagBytes) == 0;
  }
#endif
  if (!ipsec_mb_) {
    int length = 0;
    int final_length = 0;
    opened =
        EVP_DecryptInit_ex(d.ctx, nullptr, nullptr, nullptr, nonce) == 1 &&
        EVP_DecryptUpdate(d.ctx, nullptr, &length, header, kHeaderBytes) == 1 &&
        EVP_CIPHER_CTX_ctrl(d.ctx, EVP_CTRL_AEAD_SET_TAG, kTagBytes, tag) ==
            1 &&
        EVP_DecryptUpdate(d.ctx, out, &length, body, static_cast<int>(n)) ==
            1 &&
        EVP_DecryptFinal_ex(d.ctx, out + length, &final_length) == 1;
  }
  if (!opened) {
    broken_ = true;
    return absl::DataLossError(absl::StrCat(
        "sealed records: record ", d.sequence, " under key ", d.key_number,
        " failed its authentication check (changed on the way, or out of "
        "order)"));
  }
  ++d.sequence;
  return absl::OkStatus();
}

}  // namespace tessera
