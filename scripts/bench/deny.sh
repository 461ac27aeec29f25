#!/usr/bin/env bash
# What a connection refused by deny_clients costs, under a flood: fulcrum (one worker,
# CPU 1) listens on 0.0.0.0 with deny_clients = ["127.0.0.2"]; a flood of connections
# from 127.0.0.2 (a Python client on CPU 0 that connects and waits for the close) runs
# while an allowed client on 127.0.0.1 (h2load --h1, 5 connections, 500 requests/s, on
# CPU 0) measures its latency. Printed: fulcrum's CPU-µs per refused connection (its CPU
# time over the run, less what the allowed requests cost alone, over the refused count
# from fulcrum_clients_denied_total), and the allowed client's latency with and without
# the flood.
#
#   cargo build --release && scripts/bench/deny.sh
#
# Figures land in docs/performance.md, "Who may come in". Tools: Debian's nginx (the
# backend), nghttp2-client (h2load), python3.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${FULCRUM_BIN:-target/release/fulcrum}
seconds=10
work=$(mktemp -d)
mkdir -p "$work/tmp"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
source scripts/bench/lib.sh

backend=29601 port=29611 admin=29612
write_backend_conf "$work" "$backend"
taskset -c 0 nginx -c "$work/backend.conf" -p "$work" & pids+=($!)
printf 'deny_clients = ["127.0.0.2"]\naccess_log = "off"\n' >"$work/fulcrum.toml"
taskset -c 1 "$bin" serve --config "$work/fulcrum.toml" --listen "0.0.0.0:$port" \
  --admin "127.0.0.1:$admin" --workers 1 --backend "http://127.0.0.1:$backend" \
  --health-interval 60s 2>"$work/fulcrum.log" &
fulcrum_pid=$!; pids+=($!)
sleep 1

# allowed: the allowed client's run; prints its mean latency in ms.
allowed() {
  taskset -c 0 h2load --h1 -c 5 --rps 100 -D "$seconds" "http://127.0.0.1:$port/" \
    >"$work/h2load.out" 2>&1
  awk '/time for request:/ {print $6; exit}' "$work/h2load.out"
}
denied_count() {
  curl -s "http://127.0.0.1:$admin/metrics" |
    awk '/^fulcrum_clients_denied_total\{where="accept"\}/ {print $2}'
}

before=$(cpu "$fulcrum_pid")
quiet=$(allowed)
alone=$(( $(cpu "$fulcrum_pid") - before ))

cat >"$work/flood.py" <<'PY'
import socket, sys, threading, time
port, seconds = int(sys.argv[1]), float(sys.argv[2])
end = time.time() + seconds
def run():
    while time.time() < end:
        s = socket.socket()
        s.bind(("127.0.0.2", 0))
        try:
            s.connect(("127.0.0.2", port))
            s.recv(1)
        except OSError:
            pass
        s.close()
threads = [threading.Thread(target=run) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
PY
refused_before=$(denied_count)
before=$(cpu "$fulcrum_pid")
taskset -c 0 python3 "$work/flood.py" "$port" "$seconds" & flood=$!
loud=$(allowed)
wait "$flood"
during=$(( $(cpu "$fulcrum_pid") - before ))
refused=$(( $(denied_count) - refused_before ))
per=$(awk -v t="$during" -v a="$alone" -v hz="$hz" -v n="$refused" \
  'BEGIN { printf "%.1f", (t - a) / hz * 1e6 / n }')
echo "refused connections: $refused in ${seconds}s; fulcrum CPU per refused connection: $per µs"
echo "allowed client's mean latency: $quiet alone, $loud under the flood"
