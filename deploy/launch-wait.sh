# Sourced by deploy/demo.sh and examples/weight_sync/run.sh: the wait for
# `tessera launch` started in the background.
#
#   launch_wait NAME LAUNCHER_PID LOG
#
# Waits (up to 60 s) for the launcher's "ready" line in LOG; on a launcher
# that exits or a timeout, prints LOG and "NAME: ..." to stderr and exits
# 1. Then evaluates the ready line's exports (TESSERA_ADDRESS and, for a
# secure launch, the client's certificate and token).
launch_wait() {
  local name=$1 pid=$2 log=$3
  for _ in $(seq 1 600); do
    grep -q '^ready' "$log" && break
    if ! kill -0 "$pid" 2>/dev/null; then
      cat "$log" >&2
      echo "$name: the daemons did not start (see above)" >&2
      exit 1
    fi
    sleep 0.1
  done
  grep -q '^ready' "$log" || {
    cat "$log" >&2
    echo "$name: timeout" >&2
    exit 1
  }
  eval "$(sed -n 's/^ready: //p' "$log")"
}
