#!/usr/bin/env bash
# Runs one libFuzzer target for a bounded time over a copy of its seed
# corpus (so the checked-in corpus never changes):
#   run_fuzzer.sh BINARY SEED_DIR WORK_DIR SECONDS
# The fuzzer's output goes to WORK_DIR/log; its final stats (executions,
# corpus) are printed, and on a failure the end of the log. Crashes, leaks,
# out-of-memory inputs and timeouts are written to WORK_DIR/ (crash-*,
# leak-*, oom-*, timeout-*) and fail the run.
#
# The mutations follow a fixed seed (TESSERA_LIBFUZZER_SEED, default 1), so that
# a run explores the same inputs in the same order on every machine: a test
# run that passed keeps passing, and a slower machine explores a prefix of
# what a faster one did. TESSERA_LIBFUZZER_SEED=0 lets libFuzzer pick a seed per
# run, for exploring (README.md: "Sanitizers and fuzzing").
set -uo pipefail
binary=$1 seeds=$2 work=$3 seconds=$4
rm -rf "$work"
mkdir -p "$work/corpus"
cp "$seeds"/* "$work/corpus/"
"$binary" -seed="${TESSERA_LIBFUZZER_SEED:-1}" -max_total_time="$seconds" -rss_limit_mb=2048 -malloc_limit_mb=1024 \
  -timeout=10 -print_final_stats=1 -artifact_prefix="$work/" \
  "$work/corpus" >"$work/log" 2>&1
status=$?
grep -a -E '^stat::(number_of_executed_units|average_exec_per_sec|new_units_added|peak_rss_mb)' "$work/log"
echo "corpus: $(find "$work/corpus" -type f | wc -l) inputs, $(du -sb "$work/corpus" | cut -f1) bytes"
if ((status != 0)); then
  tail -n 60 "$work/log"
  echo "run_fuzzer: $(basename "$binary") failed (exit $status); inputs in $work/" >&2
fi
exit "$status"
