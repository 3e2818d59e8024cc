#!/usr/bin/env bash
# viewtape vs nginx nchan, same workloads, one session. Loopback only; every
# run is bounded (count and time) by viewtape-bench; every server is stopped on exit.
#
#   bench/peers/side_by_side.sh [OUT_DIR]      (default /tmp/viewtape-side-by-side)
#
# Needs release builds: cargo build --release -p viewtape-server -p viewtape-bench
# Env: BENCH (viewtape-bench binary), VIEWTAPE_BIN (viewtape binary), REPEATS (default 3),
#      ONLY (space-separated subset of: fanout100 fanout1000 maxrate replay idle).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-/tmp/viewtape-side-by-side}
mkdir -p "$out"
BENCH=${BENCH:-$root/target/release/viewtape-bench}
export VIEWTAPE_BIN=${VIEWTAPE_BIN:-$root/target/release/viewtape}
export VIEWTAPE_NO_BUILD=1 RUST_LOG=${RUST_LOG:-warn}
REPEATS=${REPEATS:-3}
ONLY=${ONLY:-fanout100 fanout1000 maxrate replay idle}
NCHAN="$here/nchan.sh --max-seconds 900 --"
want() { [[ " $ONLY " == *" $1 "* ]]; }

# viewtape may hold 20,000 SSE connections (the fd limit here); the default is 10,000.
config="$out/viewtape-bench.toml"
printf '[server]\nmax_connections = 20000\n' > "$config"

log() { echo "[$(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)] $*" | tee -a "$out/runs.log"; }
vt() { # viewtape-bench against a freshly spawned viewtape
  log "viewtape: viewtape-bench $*"
  timeout 900 "$BENCH" "$@" --server-arg=--config --server-arg="$config" 2>>"$out/stderr.log" | tee -a "$out/runs.log" \
    || log "FAILED (see $out/stderr.log)"
}
nc() { # viewtape-bench against a fresh nginx+nchan (1 worker)
  log "nchan: viewtape-bench $* --peer nchan --peer-url \$NCHAN_URL --pid \$NCHAN_WORKER_PID"
  # shellcheck disable=SC2016
  $NCHAN sh -c '"$0" "$@" --peer nchan --peer-url "$NCHAN_URL" --pid "$NCHAN_WORKER_PID"' \
    "$BENCH" "$@" 2>>"$out/stderr.log" | tee -a "$out/runs.log" \
    || log "FAILED (see $out/stderr.log)"
}

{ echo "nproc=$(nproc)"; grep -m1 'model name' /proc/cpuinfo; uname -r; nginx -v 2>&1;
  dpkg-query -W libnginx-mod-nchan; git -C "$root" rev-parse --short HEAD; } | tee -a "$out/runs.log"

for i in $(seq 1 "$REPEATS"); do
  if want fanout100; then
    vt fanout --subscribers 100 --rate 50 --seconds 15
    nc fanout --subscribers 100 --rate 50 --seconds 15
  fi
  if want fanout1000; then
    vt fanout --subscribers 1000 --rate 50 --seconds 15
    nc fanout --subscribers 1000 --rate 50 --seconds 15
  fi
  if want idle; then
    vt idle --connections 10000 --hold-seconds 3
    nc idle --connections 10000 --hold-seconds 3
  fi
done
if want replay; then
  vt replay --events 10000 --runs 7
  nc replay --events 10000 --runs 7
  vt replay --events 100000 --runs 7
fi
if want maxrate; then
  for rate in ${VT_RATES:-500 1000 2000}; do
    vt fanout --subscribers 1000 --rate "$rate" --seconds 10 --drain-seconds 20
  done
  for rate in ${NC_RATES:-25 50 100}; do
    nc fanout --subscribers 1000 --rate "$rate" --seconds 10 --drain-seconds 20
  done
fi
log "done; output in $out"
