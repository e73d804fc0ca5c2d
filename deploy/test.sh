#!/usr/bin/env bash
# The README's test command (and CI's, .ci/run): builds Tessera and runs
# every test (unit, CLI, benchmark smoke runs and the formatting check)
# through ctest, then a second build with clang under AddressSanitizer and
# UndefinedBehaviorSanitizer that runs the suite again (without the
# benchmark, style and GPU tiers) and the libFuzzer targets of tests/fuzz/
# for TESSERA_FUZZ_SECONDS each (default 6). Both always run, in CI or
# not. Installs missing Debian packages first.
#
#   deploy/test.sh                    # the suite, then sanitized + fuzzers
#   deploy/test.sh --sanitize address # other sanitizers for the second run
#   deploy/test.sh --sanitize-only    # only the sanitized run
#   deploy/test.sh --no-sanitize      # only the suite (a quicker local loop;
#                                     # not what CI runs)
#
# The test builds keep line tables, not full debug info (-g1, and -O1
# -gline-tables-only under the sanitizers, as they recommend): backtraces
# and sanitizer reports name files and lines, and the two builds fit CI's
# time. The tests' own sources (not the code they test, not the
# benchmarks) compile at -O0 (TESSERA_TEST_OPTIMIZE): most of their
# compile time was the optimizer on gtest and gRPC templates (-O0 took a
# third less than -O1), and they spend their run time in the code they
# test. In the first build they have no debug info either (-g0, a tenth
# less; a failed expectation names its file and line without it, and the
# code under test keeps its line tables). The test binaries reuse one
# precompiled header of the headers they share (TESSERA_TEST_PCH,
# tests/CMakeLists.txt). The libraries are unity builds (8 sources a
# compile, CMAKE_UNITY_BUILD; the generated protobuf code is not), which
# parses their shared headers once a batch: so file-local names in one
# library's .cc files must differ. A test binary of several sources is
# one compile (most of a test source's compile is instantiating gtest's
# and the headers' templates, once a compile), so the same holds for its
# sources. Build Tessera yourself
# (cmake, README) for full debug info.
#
# Each unit and process test binary runs whole, as one ctest test
# (TESSERA_WHOLE_BINARY_LABELS; gtest still reports each test), the
# cluster tests one process per test. The sanitized run's request fuzz sends 400
# requests per method (TESSERA_FUZZ_REQUESTS; the first run 1000).
#
# Environment: TESSERA_BUILD_DIR (default build), TESSERA_SANITIZE_BUILD_DIR
# (default build-san), TESSERA_WITH_CUDA (AUTO|ON|OFF, default AUTO),
# TESSERA_SANITIZE (sanitizers; default address,undefined).
set -euo pipefail
cd "$(dirname "$0")/.."

sanitize=${TESSERA_SANITIZE:-address,undefined}
normal=1
while (($#)); do
  case "$1" in
    --sanitize) sanitize=${2:?--sanitize needs a list, e.g. address,undefined}; shift ;;
    --sanitize=*) sanitize=${1#--sanitize=} ;;
    --sanitize-only) normal=0 ;;
    --no-sanitize) sanitize= ;;
    *) echo "test.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
  shift
done

deploy/install-deps.sh
jobs=$(nproc)

if ((normal)); then
  build_dir=${TESSERA_BUILD_DIR:-build}
  cmake -S . -B "$build_dir" -G Ninja \
    -DTESSERA_WITH_CUDA="${TESSERA_WITH_CUDA:-AUTO}" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" \
    -DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=8 \
    "-DTESSERA_TEST_OPTIMIZE=-O0;-g0" "-DTESSERA_WHOLE_BINARY_LABELS=unit;process"
  cmake --build "$build_dir" -j "$jobs"
  # One test more than cores: at -j "$jobs" the CPUs were busy 58% of the
  # run (tests wait on leases, deadlines and other processes), at one more
  # 71%, and the run took 0.7 of the time. The sanitized run below, busier
  # per test, keeps one per core.
  ctest --test-dir "$build_dir" --output-on-failure -j "$((jobs + 1))" \
    --timeout 300
fi

if [[ -n "$sanitize" ]]; then
  san_dir=${TESSERA_SANITIZE_BUILD_DIR:-build-san}
  echo "test.sh: sanitized run ($sanitize, fuzzing) in $san_dir"
  # CUDA code is built and tested by the normal run; clang compiles the rest.
  CC=clang-14 CXX=clang++-14 cmake -S . -B "$san_dir" -G Ninja \
    -DTESSERA_WITH_CUDA=OFF -DTESSERA_BUILD_BENCH=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only -DNDEBUG" \
    -DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=8 \
    -DTESSERA_TEST_OPTIMIZE=-O0 "-DTESSERA_WHOLE_BINARY_LABELS=unit;process" \
    -DTESSERA_SANITIZE="$sanitize" -DTESSERA_FUZZ=ON \
    -DTESSERA_FUZZ_SECONDS="${TESSERA_FUZZ_SECONDS:-6}"
  cmake --build "$san_dir" -j "$jobs"
  # allocator_may_return_null: an impossible allocation is an error the
  # code reports (Storage::Allocate), not an abort; the fuzzers still flag
  # inputs that make them allocate over 1 GiB (run_fuzzer.sh).
  ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:allocator_may_return_null=1:strict_string_checks=1} \
  LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/tests/sanitizers/lsan.supp:print_suppressions=0} \
  UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
  TESSERA_FUZZ_REQUESTS=${TESSERA_FUZZ_REQUESTS:-400} \
    ctest --test-dir "$san_dir" --output-on-failure -j "$jobs" --timeout 600 \
      -LE 'bench|style|gpu'
fi
