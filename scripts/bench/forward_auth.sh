#!/usr/bin/env bash
# What forward auth costs when on: fulcrum (one worker, CPU 1) in front of an nginx backend
# (CPU 0) that also answers the auth subrequest (200 for /check), on a route with
# forward_auth and on one without; nginx (one worker, CPU 1) the same with auth_request.
# h2load --h1 (10 connections, CPU 0) sends the same number of requests to each; printed:
# requests/s, mean latency and the proxy's CPU-µs per request.
#
#   cargo build --release && scripts/bench/forward_auth.sh
#
# Figures land in docs/performance.md, "Who may come in". Tools: Debian's nginx,
# nghttp2-client (h2load).
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${FULCRUM_BIN:-target/release/fulcrum}
n=${REQUESTS:-50000}
work=$(mktemp -d)
mkdir -p "$work/tmp"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
source scripts/bench/lib.sh

backend=29701 port=29711 admin=29712 nginx=29721
write_backend_conf "$work" "$backend"
taskset -c 0 nginx -c "$work/backend.conf" -p "$work" & pids+=($!)
cat >"$work/fulcrum.toml" <<TOML
access_log = "off"
[[routes]]
pool = "default"
path_prefix = "/fa"
forward_auth = { url = "http://127.0.0.1:$backend/check" }
[[routes]]
pool = "default"
TOML
start_fulcrum_config "$bin" "$work" "$port" "$admin" "$backend"
{ nginx_proxy_open "$work" "$backend" "$nginx"
  echo '    location = /check { internal; proxy_pass http://b; proxy_http_version 1.1;'
  echo '      proxy_set_header Connection ""; proxy_pass_request_body off; proxy_set_header Content-Length ""; }'
  echo '    location /fa { auth_request /check; proxy_pass http://b; proxy_http_version 1.1; proxy_set_header Connection ""; }'
  echo '    location / { proxy_pass http://b; proxy_http_version 1.1; proxy_set_header Connection ""; } } }'
} >"$work/nginx.conf"
taskset -c 1 nginx -c "$work/nginx.conf" -p "$work" & nginx_pid=$!; pids+=($!)
sleep 1

# run NAME PID URL: one h2load run; prints a table row.
run() {
  local before after
  before=$(cpu "$2")
  taskset -c 0 h2load --h1 -c 10 -n "$n" "$3" >"$work/h2load.out" 2>&1
  after=$(cpu "$2")
  local rps mean
  rps=$(awk '/^finished in/ {print $4; exit}' "$work/h2load.out")
  mean=$(awk '/time for request:/ {print $6; exit}' "$work/h2load.out")
  grep -q " $n succeeded" "$work/h2load.out" || { cat "$work/h2load.out" >&2; exit 1; }
  printf '| %s | %s | %s | %.1f |\n' "$1" "$rps" "$mean" \
    "$(echo "($after - $before) * 1000000 / $hz / $n" | bc -l)"
}

echo "| | requests/s | mean latency | proxy CPU-µs per request |"
echo "|---|---|---|---|"
run "fulcrum, plain route" "$fulcrum_pid" "http://127.0.0.1:$port/plain"
run "fulcrum, forward_auth" "$fulcrum_pid" "http://127.0.0.1:$port/fa/x"
run "nginx, plain location" "$nginx_pid" "http://127.0.0.1:$nginx/plain"
run "nginx, auth_request" "$nginx_pid" "http://127.0.0.1:$nginx/fa/x"
