#!/usr/bin/env bash
# HTTP/3 against fulcrum's own HTTP/2 over TLS, in one run: one fulcrum worker pinned to
# CPU 1 terminates both (the same certificate, the same backend); the clients and the
# backend run on CPU 0.
#
#   cargo build --release --bins --examples && scripts/bench/h3.sh [--quick]
#
# Measurements (figures land in docs/performance.md, "HTTP/3"):
#   load   closed loop, 10 connections × 10 requests in flight, for SECONDS: h2load
#          (ALPN h2) for HTTP/2, examples/h3load.rs (quinn + h3; Debian's h2load has no
#          HTTP/3) for HTTP/3. Requests per second, and fulcrum's CPU-µs per request
#          (utime + stime from /proc/PID/stat, before and after).
#   idle   1 000 QUIC connections opened and held without a request: fulcrum's resident
#          memory before and while they are open, per connection.
# Tools: Debian's nginx (the backend), nghttp2-client (h2load) and openssl.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${FULCRUM_BIN:-target/release/fulcrum}
load=${H3LOAD_BIN:-target/release/examples/h3load}
seconds=10 rounds=3
if [ "${1:-}" = "--quick" ]; then seconds=4 rounds=1; fi
for tool in nginx h2load openssl taskset "$load"; do
  command -v "$tool" >/dev/null || { echo "h3.sh: $tool is needed (apt-get install nginx nghttp2-client openssl; cargo build --release --examples)" >&2; exit 1; }
done
ulimit -n 65536 2>/dev/null || true
work=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT

source scripts/bench/lib.sh
hz=$(getconf CLK_TCK)
now_rss() { awk '/VmRSS/ {print $2}' "/proc/$1/status"; }
# Not lib.sh's make_cert: rustls refuses a CA certificate as the server's own, so this one
# says CA:FALSE, and the client trusts it directly.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
  -subj /CN=localhost -addext subjectAltName=DNS:localhost -addext basicConstraints=critical,CA:FALSE \
  -keyout "$work/key.pem" -out "$work/cert.pem" 2>/dev/null
backend=29501 tls=29511
write_backend_conf "$work" "$backend"
taskset -c 0 nginx -c "$work/backend.conf" -p "$work" & pids+=($!)
taskset -c 1 "$bin" serve --listen 127.0.0.1:29510 --admin 127.0.0.1:29512 --workers 1 \
  --tls-listen "127.0.0.1:$tls" --tls-cert "$work/cert.pem" --tls-key "$work/key.pem" --http3 on \
  --backend "http://127.0.0.1:$backend" --access-log off --health-interval 60s 2>"$work/fulcrum.log" &
pid=$!; pids+=($!)
sleep 1
url="https://localhost:$tls/"

run_h2() { taskset -c 0 h2load -c 10 -m 10 -D "$seconds" "$url" >"$work/h2.out" 2>&1
  grep -E '^requests:' "$work/h2.out" | awk '{print $8}'; }
run_h3() { taskset -c 0 "$load" "$url" --ca "$work/cert.pem" --connections 10 --streams 10 \
  --seconds "$seconds" | sed -E 's/.*"requests":([0-9]+).*/\1/'; }

seconds_warm=$seconds; seconds=2; run_h2 >/dev/null; run_h3 >/dev/null; seconds=$seconds_warm
printf '%-6s %10s %14s\n' proto "req/s" "CPU µs/req"
for round in $(seq "$rounds"); do
  for proto in h2 h3; do
    before=$(cpu "$pid")
    n=$(run_"$proto")
    ticks=$(( $(cpu "$pid") - before ))
    awk -v p="$proto" -v n="$n" -v s="$seconds" -v t="$ticks" -v hz="$hz" \
      'BEGIN { printf "%-6s %10.0f %14.1f\n", p, n / s, t / hz * 1e6 / n }'
  done
done

idle_before=$(now_rss "$pid")
taskset -c 0 "$load" "$url" --ca "$work/cert.pem" --connections 1000 --idle --seconds 5 >"$work/idle.out" &
idle=$!
until [ -s "$work/idle.out" ]; do sleep 0.2; done
sleep 1
idle_during=$(now_rss "$pid")
wait "$idle"
awk -v b="$idle_before" -v d="$idle_during" \
  'BEGIN { printf "idle: RSS %.1f MiB before, %.1f MiB with 1000 QUIC connections open: %.1f KiB each\n", b / 1024, d / 1024, (d - b) / 1000 }'
cat "$work/idle.out"
