#!/usr/bin/env bash
# The GPU machine's test run: builds Tessera with CUDA and NCCL, lists the
# visible GPUs, runs every ctest test (the "cuda" variants of the multi-rank
# suites run on one GPU, 4 ranks sharing it), runs the single-process CUDA
# tests under compute-sanitizer when it is installed, then the GPU and fetch
# benchmarks. Without a GPU it still runs: CUDA tests skip and gpu_bench
# prints its "skipped" line.
#
#   tests/gpu/run_gpu_tests.sh [RESULTS_DIR]      (default ./gpu-results)
#
# RESULTS_DIR receives configure.log, build.log, ctest.log, sanitizer-*.log, gpu_bench.jsonl,
# fetch_bench.jsonl and summary.txt. Environment: TESSERA_BUILD_DIR
# (default build-gpu), TESSERA_BUILD_TYPE (default Release), JOBS (default
# nproc), TESSERA_SKIP_BUILD=1 to reuse a built tree, CTEST_LIMIT (seconds
# for the whole ctest run, default 420), GPU_BENCH_ARGS and FETCH_BENCH_ARGS
# to replace the benchmarks' default arguments.
#
# A GPU machine without gRPC, Gloo and the rest: build here, then
# tests/gpu/pack_build.sh pack / run carries the built tree there.
#
# Every step is bounded by `timeout`, so the run ends well within 10
# minutes on 16 cores; a failing step is reported and the others still run.
# Exit status: 0 when every step passed, 1 otherwise (2 for a bad build).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2

results=${1:-./gpu-results}
build_dir=${TESSERA_BUILD_DIR:-build-gpu}
build_type=${TESSERA_BUILD_TYPE:-Release}
jobs=${JOBS:-$(nproc)}
mkdir -p "$results"
results=$(cd "$results" && pwd)
summary="$results/summary.txt"
: >"$summary"
failed=0

say() { echo "== $*" | tee -a "$summary"; }
# step NAME SECONDS OUT ERR COMMAND...: runs COMMAND under a time limit,
# its stdout to OUT and stderr to ERR (files; ERR "=" joins OUT), and
# records its outcome.
step() {
  local name=$1 limit=$2 out=$3 err=$4
  shift 4
  local start=$SECONDS
  if [[ $err == = ]]; then
    timeout --kill-after=10 "$limit" "$@" >"$out" 2>&1
  else
    timeout --kill-after=10 "$limit" "$@" >"$out" 2>"$err"
  fi
  local rc=$?
  if [[ $rc -eq 0 ]]; then
    say "PASS $name ($((SECONDS - start))s)"
  else
    [[ $rc -eq 124 || $rc -eq 137 ]] && name="$name (timed out after ${limit}s)"
    say "FAIL $name: exit $rc ($((SECONDS - start))s)"
    failed=1
  fi
  return $rc
}

# ---- Build.
if [[ ${TESSERA_SKIP_BUILD:-0} != 1 ]]; then
  generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  launcher=()
  command -v ccache >/dev/null &&
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  if ! step configure 300 "$results/configure.log" = \
    cmake -S . -B "$build_dir" "${generator[@]}" \
    -DCMAKE_BUILD_TYPE="$build_type" -DTESSERA_WITH_CUDA=ON "${launcher[@]}"; then
    tail -n 40 "$results/configure.log"
    exit 2
  fi
  if ! step build 480 "$results/build.log" = \
    cmake --build "$build_dir" -j "$jobs"; then
    grep -E -m 20 'error|Error' "$results/build.log"
    tail -n 40 "$results/build.log"
    exit 2
  fi
fi
bin() { echo "$build_dir/tests/$1"; }

# ---- The GPUs.
gpus=unknown
if command -v nvidia-smi >/dev/null; then
  if listing=$(nvidia-smi -L 2>&1); then
    echo "$listing" | tee -a "$summary"
    gpus=$(grep -c '^GPU ' <<<"$listing")
  else
    echo "$listing"
    gpus=0
  fi
else
  echo "nvidia-smi not found"
fi
say "visible GPUs: $gpus"

# ---- Every test. The CUDA variants are named .../cuda, *Cuda*, *Nccl*;
# without a GPU they skip with "needs a CUDA device".
# A machine the built tree was carried to (pack_build.sh) may lack the tools
# some tests run: those are left out and said so, not counted as failures.
excluded=()
if ! /usr/bin/python3 -c 'import numpy, pytest, torch' 2>/dev/null; then
  say "/usr/bin/python3 lacks numpy, pytest or torch: tests labelled python left out"
  excluded+=(python)
fi
if ! command -v clang-format >/dev/null; then
  say "clang-format not found: style tests left out"
  excluded+=(style)
fi
exclude=()
if ((${#excluded[@]})); then
  exclude=(-LE "$(
    IFS='|'
    echo "${excluded[*]}"
  )")
fi
step ctest "${CTEST_LIMIT:-420}" "$results/ctest.log" = \
  ctest --test-dir "$build_dir" -j "$jobs" --timeout 300 --output-on-failure \
  "${exclude[@]}"
grep -E '^[0-9]+% tests passed|^Total Test time' "$results/ctest.log" |
  tee -a "$summary"
sed -n '/The following tests FAILED:/,$p' "$results/ctest.log" |
  tee -a "$summary"
cuda_re='/cuda|Cuda|CUDA|Nccl|NCCL|nccl|gpu'
for outcome in Passed Skipped; do
  count=$(grep -E 'Test +#' "$results/ctest.log" | grep -E "$cuda_re" |
    grep -c "$outcome")
  say "CUDA/NCCL tests $outcome: $count"
done

# ---- compute-sanitizer on the single-process CUDA tests (a multi-process
# test's ranks would escape it).
sanitizer=$(command -v compute-sanitizer ||
  ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
if [[ -z $sanitizer ]]; then
  say "compute-sanitizer not found (PATH, /usr/local/cuda/bin): skipped"
elif [[ $gpus == 0 ]]; then
  say "no GPU visible: compute-sanitizer runs skipped"
else
  say "compute-sanitizer: $sanitizer"
  # binary|gtest filter; optional binaries (the chunk staging and same-host
  # tests) are run when they were built.
  targets=(
    "common/tessera_common_test|*Cuda*:*Storage*"
    "server/collective/tessera_process_group_test|Nccl*"
    "integration/tessera_nccl_single_gpu_test|*"
  )
  for optional in "$build_dir"/tests/*/*/tessera_*chunk*_test \
    "$build_dir"/tests/*/*/tessera_*local*_test \
    "$build_dir"/tests/*/*/tessera_cuda*_test; do
    [[ -x $optional ]] && targets+=("${optional#"$build_dir/tests/"}|*")
  done
  for target in "${targets[@]}"; do
    binary=$(bin "${target%%|*}")
    filter=${target#*|}
    name=$(basename "$binary")
    if [[ ! -x $binary ]]; then
      say "FAIL memcheck $name: not built"
      failed=1
      continue
    fi
    # API errors are not counted: the tests provoke some on purpose (bad
    # device indices, IPC probes) and check that they become statuses.
    # A binary the glob matched that never calls CUDA (the local etcd
    # test) has nothing to check: the sanitizer exits 255 saying so, which
    # is reported as such when the tests themselves passed.
    log="$results/sanitizer-memcheck-$name.log"
    timeout --kill-after=10 300 "$sanitizer" --tool memcheck \
      --error-exitcode 99 --report-api-errors no \
      --leak-check "${SANITIZER_LEAK_CHECK:-no}" --log-file "$log" \
      "$binary" --gtest_filter="$filter" >"$results/memcheck-$name.out" 2>&1
    rc=$?
    if [[ $rc -eq 0 ]]; then
      say "PASS memcheck $name"
    elif grep -q 'terminated before first instrumented API call' "$log" &&
      grep -q '^\[  PASSED  \]' "$results/memcheck-$name.out"; then
      say "N/A memcheck $name: its tests passed and call no CUDA"
    else
      say "FAIL memcheck $name: exit $rc"
      failed=1
    fi
  done
  for tool in racecheck synccheck; do
    step "$tool tessera_common_test" 300 \
      "$results/$tool-tessera_common_test.out" = \
      "$sanitizer" --tool "$tool" --error-exitcode 99 \
      --log-file "$results/sanitizer-$tool-tessera_common_test.log" \
      "$(bin common/tessera_common_test)" --gtest_filter='*Cuda*'
  done
fi

# ---- Benchmarks (JSON lines).
read -r -a gpu_args <<<"${GPU_BENCH_ARGS:-}"
step gpu_bench 300 "$results/gpu_bench.jsonl" "$results/gpu_bench.err" \
  "$(bin bench/gpu_bench)" "${gpu_args[@]}"
cat "$results/gpu_bench.jsonl"
read -r -a fetch_args <<<"${FETCH_BENCH_ARGS:---shard-mib 1 64 --scale-shards 10000 100000}"
step fetch_bench 300 "$results/fetch_bench.jsonl" \
  "$results/fetch_bench.err" "$(bin bench/fetch_bench)" "${fetch_args[@]}"
cat "$results/fetch_bench.jsonl"

say "results in $results"
if [[ $failed -ne 0 ]]; then
  say "SOME STEPS FAILED"
  exit 1
fi
say "ALL STEPS PASSED"
