#!/usr/bin/env bash
# The main job: starts 4 CPU daemons on this machine (`tessera launch`),
# runs the demo client against them (create a 10x20 tensor, print its shard
# table, fetch a remote shard, read a region spanning three shards, gather,
# save and load), shows a few CLI commands (`tessera top` among them), and
# stops the daemons.
# Installs missing Debian packages and builds first.
#
# Ports: the store on TESSERA_MASTER_PORT (29500), daemons on
# TESSERA_BASE_PORT + rank (29600..29603).
#
# --secure (or TESSERA_SECURE=1): the same with mutual TLS and tokens
# (`tessera launch --secure`); the demo and the CLI use the client
# credentials the launcher's ready line exports.
set -euo pipefail
cd "$(dirname "$0")/.."

secure=${TESSERA_SECURE:-0}
for arg in "$@"; do
  case "$arg" in
    --secure) secure=1 ;;
    *) echo "usage: $0 [--secure]" >&2; exit 2 ;;
  esac
done
secure_flag=()
[[ "$secure" == 1 ]] && secure_flag=(--secure)

deploy/install-deps.sh
build_dir=${TESSERA_BUILD_DIR:-build}
cmake -S . -B "$build_dir" -G Ninja \
  -DTESSERA_WITH_CUDA="${TESSERA_WITH_CUDA:-AUTO}" >/dev/null
cmake --build "$build_dir" -j "$(nproc)" \
  --target tessera tessera-server tessera-demo
bin="$build_dir/bin"
master_port=${TESSERA_MASTER_PORT:-29500}
base_port=${TESSERA_BASE_PORT:-29600}
export TESSERA_ADDRESS="127.0.0.1:$base_port"

log=$(mktemp -t tessera-launch.XXXXXX)
checkpoint=$(mktemp -d -t tessera-demo-checkpoint.XXXXXX)
launcher=""
stop() {
  if [[ -n "$launcher" ]] && kill -0 "$launcher" 2>/dev/null; then
    kill -INT "$launcher" 2>/dev/null || true
    wait "$launcher" 2>/dev/null || true
    echo "daemons stopped"
  fi
  rm -rf "$checkpoint"
}
trap stop EXIT

echo "\$ tessera launch --nproc 4 --cpu ${secure_flag[*]}"
"$bin/tessera" launch --nproc 4 --cpu "${secure_flag[@]}" --host 127.0.0.1 \
  --master-port "$master_port" --base-port "$base_port" \
  --checkpoint-root "$checkpoint" >"$log" 2>&1 &
launcher=$!
# TESSERA_ADDRESS, and with --secure the client's certificate and token.
source deploy/launch-wait.sh
launch_wait demo "$launcher" "$log"
grep -v '^\[' "$log"

run() {
  echo
  echo "\$ tessera $*"
  "$bin/tessera" "$@"
}
echo
echo "\$ tessera-demo --checkpoint demo"
"$bin/tessera-demo" --checkpoint demo

run health
run ls
run describe demo
run read demo --offsets 8,0 --sizes 2,6
# What every daemon served and holds (docs/metrics.md): from their metrics.
run top --once --interval 1
run rm demo
