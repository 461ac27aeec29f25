#!/usr/bin/env bash
# How fulcrum's cost grows with the pool and with client connections, at a fixed offered
# load: CPU-µs per request of the whole `fulcrum serve` process and its peak RSS.
#
#   cargo build --release && scripts/bench/scale.sh
#
# One nginx (from Debian, `apt-get install nginx h2load`) answers on port 29201 of every
# 127.0.x.y address, so a pool of N backends is N distinct URLs on one server. fulcrum
# runs with one worker pinned to CPU 1, h2load (HTTP/1.1, 10k req/s in total) and nginx
# on CPU 0; health checks every 60 s, access log on. Figures land in docs/performance.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${FULCRUM_BIN:-target/release/fulcrum}
work=$(mktemp -d)
mkdir -p "$work/tmp"
cat >"$work/nginx.conf" <<CONF
daemon off;
worker_processes 1;
pid $work/nginx.pid;
error_log $work/error.log;
worker_rlimit_nofile 65536;
events { worker_connections 32768; }
http {
  access_log off;
  client_body_temp_path $work/tmp; proxy_temp_path $work/tmp;
  fastcgi_temp_path $work/tmp; uwsgi_temp_path $work/tmp; scgi_temp_path $work/tmp;
  keepalive_requests 10000000;
  keepalive_timeout 75s;
  server { listen 29201 backlog=4096; location / { return 200 "backend .....................................................................................\n"; } }
}
CONF
taskset -c 0 nginx -c "$work/nginx.conf" -p "$work" &
ngx=$!
trap 'kill $ngx 2>/dev/null; rm -rf "$work"' EXIT
sleep 0.5

# run N STRATEGY CONNS
run() {
  local n=$1 strategy=$2 conns=$3 cfg="$work/pool-$1.toml"
  [ -f "$cfg" ] || for ((i = 0; i < n; i++)); do
    printf '[[backends]]\nurl = "http://127.0.%d.%d:29201"\n\n' $((1 + i / 250)) $((1 + i % 250))
  done >"$cfg"
  taskset -c 1 "$bin" serve --config "$cfg" --listen 127.0.0.1:8481 --admin 127.0.0.1:9481 \
    --workers 1 --health-interval 60s --strategy "$strategy" 2>/dev/null &
  local pid=$!
  for _ in $(seq 100); do curl -s -o /dev/null http://127.0.0.1:8481/ && break; sleep 0.1; done
  local rps=$((10000 / conns))
  taskset -c 0 h2load --h1 -c"$conns" -D 3 --rps "$rps" http://127.0.0.1:8481/ >/dev/null 2>&1
  local before after out
  before=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  out=$(taskset -c 0 h2load --h1 -c"$conns" -D 5 --rps "$rps" http://127.0.0.1:8481/ 2>&1)
  after=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  local rss done_
  rss=$(awk '/VmHWM/ {print $2}' "/proc/$pid/status")
  done_=$(grep -oP 'requests: \d+ total, \d+ started, \d+ done, \K\d+' <<<"$out")
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  awk -v n="$n" -v s="$strategy" -v c="$conns" -v t=$((after - before)) -v r="$done_" -v m="$rss" \
    -v hz="$(getconf CLK_TCK)" 'BEGIN {
      printf "backends=%-6d strategy=%-18s conns=%-5d requests=%-6d cpu_us_per_req=%6.1f peak_rss_mib=%6.1f\n",
        n, s, c, r, t * 1e6 / hz / r, m / 1024 }'
}

for n in 3 100 1000 10000; do
  for s in round_robin least_connections power_of_two; do run "$n" "$s" 50; done
done
for c in 50 200 1000; do run 3 round_robin "$c"; done
