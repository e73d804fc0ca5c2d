# Sanitizers and fuzzing.
#
# TESSERA_SANITIZE: a comma list for -fsanitize= (e.g. "address,undefined"),
# applied to every target, with frame pointers kept and UBSan made fatal;
# deploy/test.sh --sanitize configures a separate build with it.
#
# TESSERA_FUZZ (AUTO|ON|OFF): the libFuzzer targets of tests/fuzz/. They
# need clang: AUTO builds them when the compiler is clang, ON requires it.
# With fuzzing on, every library is compiled with -fsanitize=fuzzer-no-link
# (coverage feedback for the fuzzers) and each target links -fsanitize=fuzzer.
set(TESSERA_SANITIZE "" CACHE STRING
    "Sanitizers for every target, as for -fsanitize= (e.g. address,undefined)")
set(TESSERA_FUZZ AUTO CACHE STRING
    "Build the libFuzzer targets: AUTO (with clang), ON (required) or OFF")
set_property(CACHE TESSERA_FUZZ PROPERTY STRINGS AUTO ON OFF)

if(TESSERA_SANITIZE)
  add_compile_options(-fsanitize=${TESSERA_SANITIZE} -fno-omit-frame-pointer
                      -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=${TESSERA_SANITIZE})
endif()

set(TESSERA_FUZZ_ENABLED OFF)
if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  if(TESSERA_FUZZ STREQUAL "AUTO" OR TESSERA_FUZZ STREQUAL "ON")
    set(TESSERA_FUZZ_ENABLED ON)
  endif()
elseif(TESSERA_FUZZ STREQUAL "ON")
  message(FATAL_ERROR "TESSERA_FUZZ=ON needs clang (libFuzzer); "
                      "configure with CXX=clang++-14")
endif()
if(TESSERA_FUZZ_ENABLED)
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()
