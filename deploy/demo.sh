#!/usr/bin/env bash
# The main job, for now: builds the `tessera` tool and shows the shard plan
# of a 10x20 tensor chunked over 4 CPU ranks, as a table and as JSON, and
# of a 2x2 grid. Installs missing Debian packages first.
set -euo pipefail
cd "$(dirname "$0")/.."

deploy/install-deps.sh
build_dir=${TESSERA_BUILD_DIR:-build}
cmake -S . -B "$build_dir" -G Ninja \
  -DTESSERA_WITH_CUDA="${TESSERA_WITH_CUDA:-AUTO}" >/dev/null
cmake --build "$build_dir" -j "$(nproc)" --target tessera
tessera="$build_dir/client/cli/tessera"

run() {
  echo
  echo "\$ tessera $*"
  "$tessera" "$@"
}
run plan --size 10,20 \
  --spec 'chunk:dim=0:rank:0/cpu,rank:1/cpu,rank:2/cpu,rank:3/cpu'
run plan --size 10,20 --json \
  --spec 'chunk:dim=0:rank:0/cpu,rank:1/cpu,rank:2/cpu,rank:3/cpu'
run plan --size 10,10 \
  --spec 'enum:0,0:5,5@rank:0/cpu;0,5:5,5@rank:1/cpu;5,0:5,5@rank:2/cpu;5,5:5,5@rank:3/cpu'
