#!/usr/bin/env bash
# What a mirror costs in CPU: fulcrum (one worker, CPU 1) in front of an nginx backend
# (CPU 0), on a route that mirrors every request to a pool of the same backend and on
# one that does not; nginx (one worker, CPU 1) the same with its `mirror` directive.
# h2load --h1 (10 connections, CPU 0) sends the same number of requests to each, the
# routes taking turns for ROUNDS rounds; printed: requests/s, mean latency and the
# proxy's CPU-µs per request, and each proxy's mirrored/plain CPU ratio per round.
#
#   cargo build --release && scripts/bench/mirror.sh
#
# Figures land in docs/performance.md, "Shift and shadow traffic". Tools: Debian's
# nginx, nghttp2-client (h2load).
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${FULCRUM_BIN:-target/release/fulcrum}
n=${REQUESTS:-50000}
rounds=${ROUNDS:-3}
work=$(mktemp -d)
mkdir -p "$work/tmp"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
source scripts/bench/lib.sh

backend=29801 port=29811 admin=29812 nginx=29821
write_backend_conf "$work" "$backend"
taskset -c 0 nginx -c "$work/backend.conf" -p "$work" & pids+=($!)
cat >"$work/fulcrum.toml" <<TOML
access_log = "off"
[[pools]]
name = "p"
[[pools]]
name = "m"
backends = [{ url = "http://127.0.0.1:$backend" }]
[[routes]]
pool = "p"
path_prefix = "/m"
mirror = { pool = "m" }
[[routes]]
pool = "p"
TOML
start_fulcrum_config "$bin" "$work" "$port" "$admin" "$backend"
{ nginx_proxy_open "$work" "$backend" "$nginx"
  echo '    location = /copy { internal; proxy_pass http://b$request_uri; proxy_http_version 1.1;'
  echo '      proxy_set_header Connection ""; }'
  echo '    location /m { mirror /copy; proxy_pass http://b; proxy_http_version 1.1; proxy_set_header Connection ""; }'
  echo '    location / { proxy_pass http://b; proxy_http_version 1.1; proxy_set_header Connection ""; } } }'
} >"$work/nginx.conf"
taskset -c 1 nginx -c "$work/nginx.conf" -p "$work" & nginx_pid=$!; pids+=($!)
sleep 1

# run NAME PID URL: one h2load run; prints a table row and leaves the CPU-µs in $us.
run() {
  local before after rps mean
  before=$(cpu "$2")
  taskset -c 0 h2load --h1 -c 10 -n "$n" "$3" >"$work/h2load.out" 2>&1
  after=$(cpu "$2")
  rps=$(awk '/^finished in/ {print $4; exit}' "$work/h2load.out")
  mean=$(awk '/time for request:/ {print $6; exit}' "$work/h2load.out")
  grep -q " $n succeeded" "$work/h2load.out" || { cat "$work/h2load.out" >&2; exit 1; }
  us=$(echo "($after - $before) * 1000000 / $hz / $n" | bc -l)
  printf '| %s | %s | %s | %.1f |\n' "$1" "$rps" "$mean" "$us"
}

for p in "$port" "$nginx"; do # warm up
  taskset -c 0 h2load --h1 -c 10 -n 5000 "http://127.0.0.1:$p/m/x" >/dev/null 2>&1
done
echo "| | requests/s | mean latency | proxy CPU-µs per request |"
echo "|---|---|---|---|"
ratios=()
for r in $(seq "$rounds"); do
  run "fulcrum, plain route" "$fulcrum_pid" "http://127.0.0.1:$port/plain"; plain=$us
  run "fulcrum, mirrored" "$fulcrum_pid" "http://127.0.0.1:$port/m/x"; mirrored=$us
  ratios+=("round $r: fulcrum $(echo "$mirrored / $plain" | bc -l | cut -c1-4)")
  run "nginx, plain location" "$nginx_pid" "http://127.0.0.1:$nginx/plain"; plain=$us
  run "nginx, mirror" "$nginx_pid" "http://127.0.0.1:$nginx/m/x"; mirrored=$us
  ratios+=("nginx $(echo "$mirrored / $plain" | bc -l | cut -c1-4)")
done
echo "mirrored / plain CPU per request: ${ratios[*]}"
