#!/usr/bin/env bash
# nginx + nchan on loopback, as the SSE pub/sub peer for viewtape-bench.
#
#   bench/peers/nchan.sh [--port PORT] [--max-seconds S] [-- COMMAND ARGS...]
#
# Installs Debian `nginx` + `libnginx-mod-nchan` if missing, writes an nginx.conf into a temp
# dir (1 worker, 127.0.0.1:PORT, no access log) with one channel `prices`:
#   POST /pub/prices   publisher (body = the message; nchan assigns ids "<time>:<tag>")
#   GET  /sub/prices   eventsource subscriber; resumes after `Last-Event-ID`; new
#                      subscribers without one start at the newest message
# and a buffer equivalent to viewtape's tape: nchan_message_buffer_length 100000,
# nchan_message_timeout 1h. Prints the address and the master/worker PIDs, then either runs
# COMMAND (with NCHAN_URL, NCHAN_PORT, NCHAN_MASTER_PID, NCHAN_WORKER_PID in its environment) or
# waits for a signal, at most --max-seconds (default 3600). nginx is stopped and the temp dir
# removed on exit, whatever the reason.
#
# Example (the load tool against this peer):
#   bench/peers/nchan.sh -- sh -c 'target/release/viewtape-bench fanout --peer nchan \
#       --peer-url "$NCHAN_URL" --pid "$NCHAN_WORKER_PID" --subscribers 1000 --rate 50 --seconds 15'
set -euo pipefail

port=""
max_seconds=3600
while [ $# -gt 0 ]; do
  case "$1" in
    --port) port="$2"; shift 2 ;;
    --max-seconds) max_seconds="$2"; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "nchan.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

module=/usr/lib/nginx/modules/ngx_nchan_module.so
if ! command -v nginx >/dev/null 2>&1 || [ ! -f "$module" ]; then
  echo "nchan.sh: installing nginx + libnginx-mod-nchan" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y nginx libnginx-mod-nchan >&2 \
    || { apt-get update >&2 && apt-get install -y nginx libnginx-mod-nchan >&2; }
fi

# Free = no socket at all on it (listening or not: thousands of client sockets from a previous
# run may still hold ephemeral ports). Candidates lie below the ephemeral range.
port_free() { ! ss -Htan "( sport = :$1 or dport = :$1 )" 2>/dev/null | grep -q .; }
low_ephemeral=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
if [ -z "$port" ]; then
  for _ in $(seq 1 50); do
    candidate=$(( 10000 + RANDOM % (low_ephemeral - 10000) ))
    if port_free "$candidate"; then port=$candidate; break; fi
  done
  [ -n "$port" ] || { echo "nchan.sh: no free port found" >&2; exit 1; }
fi

dir=$(mktemp -d /tmp/nchan-peer.XXXXXX)
master=""
teardown() {
  if [ -n "$master" ] && kill -0 "$master" 2>/dev/null; then
    kill -TERM "$master" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$master" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$master" 2>/dev/null || true
    wait "$master" 2>/dev/null || true
  fi
  rm -rf "$dir"
}
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

mkdir -p "$dir/tmp"
cat > "$dir/nginx.conf" <<CONF
load_module $module;
daemon off;
master_process on;
user root;
worker_processes 1;
worker_rlimit_nofile 20000;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
events {
    worker_connections 19000;
    multi_accept on;
}
http {
    access_log off;
    client_body_temp_path $dir/tmp/body;
    proxy_temp_path $dir/tmp/proxy;
    fastcgi_temp_path $dir/tmp/fastcgi;
    uwsgi_temp_path $dir/tmp/uwsgi;
    scgi_temp_path $dir/tmp/scgi;
    keepalive_requests 1000000;
    keepalive_timeout 300s;
    nchan_shared_memory_size 512m;
    server {
        listen 127.0.0.1:$port backlog=4096;
        # The same buffer for both ends of the channel (viewtape keeps a tape of the view).
        nchan_message_buffer_length 100000;
        nchan_message_timeout 1h;
        location = /pub/prices {
            nchan_publisher;
            nchan_channel_id prices;
        }
        location = /sub/prices {
            nchan_subscriber eventsource;
            nchan_channel_id prices;
            nchan_subscriber_first_message newest;
        }
    }
}
CONF

nginx -t -q -c "$dir/nginx.conf" -p "$dir" >&2
nginx -c "$dir/nginx.conf" -p "$dir" &
master=$!

url="http://127.0.0.1:$port"
worker=""
for _ in $(seq 1 100); do
  if ss -Hltn "sport = :$port" 2>/dev/null | grep -q . ; then
    worker=$(pgrep -P "$master" | head -n1 || true)
    [ -n "$worker" ] && break
  fi
  kill -0 "$master" 2>/dev/null || { cat "$dir/error.log" >&2; echo "nchan.sh: nginx exited" >&2; exit 1; }
  sleep 0.1
done
[ -n "$worker" ] || { cat "$dir/error.log" >&2; echo "nchan.sh: nginx did not start" >&2; exit 1; }

echo "nchan listening on $url/ (publish: POST $url/pub/prices, subscribe: GET $url/sub/prices)"
echo "nchan master_pid=$master worker_pid=$worker conf=$dir/nginx.conf"

export NCHAN_URL="$url" NCHAN_PORT="$port" NCHAN_MASTER_PID="$master" NCHAN_WORKER_PID="$worker"
if [ $# -gt 0 ]; then
  status=0
  timeout "$max_seconds" "$@" || status=$?
  exit "$status"
fi
# No command: keep nginx up until a signal (or the time bound).
sleep "$max_seconds" &
wait $! || true
