#include "common/checksum.h"

#ifdef TESSERA_XXH3_DISPATCH
// Declared by the library's xxh_x86dispatch.h, whose macros would also
// rename the portable functions used below; declared here instead.
extern "C" {
XXH64_hash_t XXH3_64bits_dispatch(const void* input, size_t len);
XXH_errorcode XXH3_64bits_update_dispatch(XXH3_state_t* state,
                                          const void* input, size_t len);
}
#endif

namespace tessera {

uint64_t Checksum64(const void* data, size_t size) {
#ifdef TESSERA_XXH3_DISPATCH
  return XXH3_64bits_dispatch(data, size);
#else
  return XXH3_64bits(data, size);
#endif
}

Checksum64Stream::Checksum64Stream() { XXH3_64bits_reset(&state_); }

void Checksum64Stream::Update(const void* data, size_t size) {
#ifdef TESSERA_XXH3_DISPATCH
  XXH3_64bits_update_dispatch(&state_, data, size);
#else
  XXH3_64bits_update(&state_, data, size);
#endif
}

uint64_t Checksum64Stream::Digest() const {
  return XXH3_64bits_digest(&state_);
}

}  // namespace tessera
