// wire/openssl_init.h: OpenSSL still works for threads that use it after
// exit() has begun (gRPC's and the data plane's threads do, while a
// daemon or client exits). With OpenSSL's default exit-time cleanup such a
// thread crashed (use after free) or leaked its thread-local state.
#include "wire/openssl_init.h"

#include <openssl/rand.h>

#include <cstdlib>
#include <thread>

#include "gtest/gtest.h"

namespace tessera {
namespace {

// Runs in a child process: an exit handler registered before OpenSSL is
// initialised runs after any handler OpenSSL registers, and uses it from
// a new thread, as a gRPC thread still finishing a handshake would.
void UseOpensslWhileExiting() {
  std::atexit([] {
    int made = 0;
    std::thread([&made] {
      unsigned char bytes[16];
      made = RAND_bytes(bytes, sizeof(bytes));
    }).join();
    if (made != 1) std::_Exit(7);
  });
  InitOpenssl();
  unsigned char bytes[16];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) std::_Exit(8);
  std::exit(0);
}

TEST(OpensslInitTest, ThreadsMayUseOpensslAfterExitBegins) {
  // A fresh process (the test binary run again), so that this is its
  // first initialisation of OpenSSL.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(UseOpensslWhileExiting(), ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace tessera
