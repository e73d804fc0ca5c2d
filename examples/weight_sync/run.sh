#!/usr/bin/env bash
# Weight sync on one host (docs/weight_sync.md): starts 4 CPU daemons
# (`tessera launch --nproc 4 --cpu`), runs 4 trainer processes that change
# a GPT-2-small-shaped model every step and publish it, and 2 reader
# processes (a TP=2 inference engine, qkv fused) that pull their slices
# with a read plan and check every parameter against the trainers'
# checksums; stops the daemons. Exits 0 when every reader verified every
# version it read.
#
#   examples/weight_sync/run.sh [--steps N] [--tiny]
#
# Builds what it needs first (TESSERA_BUILD_DIR, default build). Ports: the
# store on TESSERA_MASTER_PORT (29500), daemons on TESSERA_BASE_PORT + rank
# (29600..29603).
set -euo pipefail
cd "$(dirname "$0")/../.."

build_dir=${TESSERA_BUILD_DIR:-build}
if [[ ! -f "$build_dir/build.ninja" && ! -f "$build_dir/Makefile" ]]; then
  cmake -S . -B "$build_dir" -G Ninja \
    -DTESSERA_WITH_CUDA="${TESSERA_WITH_CUDA:-AUTO}" >/dev/null
fi
cmake --build "$build_dir" -j "$(nproc)" --target tessera tessera-server \
  _tessera >/dev/null
bin="$build_dir/bin"
master_port=${TESSERA_MASTER_PORT:-29500}
base_port=${TESSERA_BASE_PORT:-29600}
export TESSERA_ADDRESS="127.0.0.1:$base_port"
export PYTHONPATH="$PWD/$build_dir/python${PYTHONPATH:+:$PYTHONPATH}"

log=$(mktemp -t tessera-weight-sync.XXXXXX)
launcher=""
stop() {
  if [[ -n "$launcher" ]] && kill -0 "$launcher" 2>/dev/null; then
    kill -INT "$launcher" 2>/dev/null || true
    wait "$launcher" 2>/dev/null || true
  fi
  rm -f "$log"
}
trap stop EXIT

echo "\$ tessera launch --nproc 4 --cpu"
"$bin/tessera" launch --nproc 4 --cpu --host 127.0.0.1 \
  --master-port "$master_port" --base-port "$base_port" >"$log" 2>&1 &
launcher=$!
source deploy/launch-wait.sh
launch_wait "weight sync" "$launcher" "$log"

echo "\$ examples/weight_sync/weight_sync.py all $*"
/usr/bin/python3 examples/weight_sync/weight_sync.py all "$@"
