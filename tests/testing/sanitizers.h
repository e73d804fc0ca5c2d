// Which sanitizer a test binary was built with, for tests whose subject
// the sanitizer replaces (its allocator, say): TESSERA_TEST_UNDER_ASAN is
// defined to 1 under AddressSanitizer (GCC's and Clang's spellings).
#ifndef TESSERA_TESTS_TESTING_SANITIZERS_H_
#define TESSERA_TESTS_TESTING_SANITIZERS_H_

#if defined(__SANITIZE_ADDRESS__)
#define TESSERA_TEST_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TESSERA_TEST_UNDER_ASAN 1
#endif
#endif

#endif  // TESSERA_TESTS_TESTING_SANITIZERS_H_
