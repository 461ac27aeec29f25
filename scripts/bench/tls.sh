#!/usr/bin/env bash
# TLS termination side by side: fulcrum, nginx and HAProxy terminate TLS with the same
# ECDSA P-256 certificate in front of the same backend, each with one worker (thread)
# pinned to CPU 1; h2load and the backend run on CPU 0.
#
#   cargo build --release && scripts/bench/tls.sh [--quick]
#
# Three measurements per proxy (figures land in docs/performance.md, "TLS"):
#   handshakes  new connections of one request each (h2load --h1 -c N -n N, several
#               rounds; h2load resumes no session): the proxy's CPU time per full
#               handshake, and so handshakes per second of one core;
#   rate        TLS keep-alive at a fixed offered load (h2load --h1 -c 50 --rps):
#               the proxy's CPU-µs per request at equal load;
#   rss         1000 TLS connections at once (h2load --h1 -c 1000): peak RSS of the
#               proxy's processes (nginx: master and worker).
# CPU time is read from /proc/PID/stat (utime + stime) before and after each run.
# Tools: Debian's nginx, haproxy, nghttp2-client (h2load) and openssl.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${FULCRUM_BIN:-target/release/fulcrum}
rounds=6 conns=500 rate=5000 seconds=10
if [ "${1:-}" = "--quick" ]; then rounds=2 seconds=4; fi
for tool in nginx haproxy h2load openssl taskset; do
  command -v "$tool" >/dev/null || { echo "tls.sh: $tool is needed (apt-get install nginx haproxy nghttp2-client openssl util-linux)" >&2; exit 1; }
done
ulimit -n 65536 2>/dev/null || true
work=$(mktemp -d)
mkdir -p "$work/tmp"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT

source scripts/bench/lib.sh
make_cert "$work"

backend=29401 fulcrum=29411 nginx=29421 haproxy=29431
write_backend_conf "$work" "$backend"
write_nginx_conf "$work" "$backend" "listen $nginx ssl backlog=4096;
    ssl_certificate $work/cert.pem; ssl_certificate_key $work/key.pem;
    ssl_protocols TLSv1.2 TLSv1.3; ssl_session_cache shared:SSL:10m;"
write_haproxy_cfg "$work" "$backend" "bind 127.0.0.1:$haproxy ssl crt $work/both.pem alpn h2,http/1.1"

taskset -c 0 nginx -c "$work/backend.conf" -p "$work" & pids+=($!)
taskset -c 1 "$bin" serve --listen 127.0.0.1:29410 --admin 127.0.0.1:29412 --workers 1 \
  --tls-listen "127.0.0.1:$fulcrum" --tls-cert "$work/cert.pem" --tls-key "$work/key.pem" \
  --backend "http://127.0.0.1:$backend" --access-log off --health-interval 60s 2>"$work/fulcrum.log" &
fulcrum_pid=$!; pids+=($!)
taskset -c 1 nginx -c "$work/nginx.conf" -p "$work" & nginx_pid=$!; pids+=($!)
taskset -c 1 haproxy -f "$work/haproxy.cfg" -db & haproxy_pid=$!; pids+=($!)
sleep 1


h2() { taskset -c 0 h2load --h1 "$@" >"$work/h2load.out" 2>&1; grep -E '^requests:' "$work/h2load.out" | awk '{print $8}'; }

printf '%-8s %12s %14s %12s %10s\n' proxy "handshake µs" "handshakes/s" "rate µs/req" "rss MiB"
for name in fulcrum nginx haproxy; do
  port=${!name} pid_var=${name}_pid; pid=${!pid_var}
  url="https://127.0.0.1:$port/"
  h2 -n 200 -c 50 "$url" >/dev/null # warm up
  before=$(cpu "$pid"); done_n=0
  for _ in $(seq "$rounds"); do
    ok=$(h2 -n "$conns" -c "$conns" "$url"); done_n=$((done_n + ok))
  done
  ticks=$(( $(cpu "$pid") - before ))
  hs_us=$(awk -v t="$ticks" -v hz="$hz" -v n="$done_n" 'BEGIN { printf "%.1f", t / hz * 1e6 / n }')
  hs_rate=$(awk -v us="$hs_us" 'BEGIN { printf "%.0f", 1e6 / us }')
  before=$(cpu "$pid")
  ok=$(h2 -c 50 -D "$seconds" --rps $((rate / 50)) "$url")
  ticks=$(( $(cpu "$pid") - before ))
  rate_us=$(awk -v t="$ticks" -v hz="$hz" -v n="$ok" 'BEGIN { printf "%.1f", t / hz * 1e6 / n }')
  h2 -c 1000 -n 20000 "$url" >/dev/null
  mib=$(awk -v k="$(rss "$pid")" 'BEGIN { printf "%.1f", k / 1024 }')
  printf '%-8s %12s %14s %12s %10s\n' "$name" "$hs_us" "$hs_rate" "$rate_us" "$mib"
done
