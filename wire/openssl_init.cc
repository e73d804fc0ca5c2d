#include "wire/openssl_init.h"

#include <openssl/crypto.h>
#include <openssl/ssl.h>

namespace tessera {

void InitOpenssl() {
  static const bool initialised = [] {
    return OPENSSL_init_ssl(OPENSSL_INIT_NO_ATEXIT |
                                OPENSSL_INIT_LOAD_SSL_STRINGS |
                                OPENSSL_INIT_LOAD_CRYPTO_STRINGS,
                            nullptr) == 1;
  }();
  (void)initialised;
}

}  // namespace tessera
