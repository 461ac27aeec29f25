#!/usr/bin/env bash
# HTTP/2 from clients side by side: fulcrum, nginx and HAProxy answer h2 (over TLS, ALPN
# `h2`, and cleartext by prior knowledge, h2c) in front of the same HTTP/1.1 backend,
# each with one worker (thread) pinned to CPU 1; h2load and the backend run on CPU 0.
#
#   cargo build --release && scripts/bench/h2.sh [--quick] [tls|h2c]
#
# For each mode the three proxies are started fresh, and each is measured three times,
# the proxies taking turns run by run (medians printed; figures land in
# docs/performance.md, "HTTP/2 from clients"):
#   saturated  h2load -c 20 -m 10 -n 200000: requests/s, and the proxy's CPU-µs per
#              request; and CPU 0's (h2load's and the backend's, "cpu0"): when that
#              times the rate comes near 1 000 000 µs a second, CPU 0 was the limit and
#              the rate no longer tells the proxies apart;
#   rate       a fixed 5 000 requests/s (h2load -c 50 -m 1 --rps 100 -D 8): the proxy's
#              CPU-µs per request at equal load;
#   rss        peak RSS (VmHWM) of the proxy's processes after the runs (nginx: master
#              and worker).
# CPU time is read from /proc/PID/stat (utime + stime) before and after each run.
# Tools: Debian's nginx, haproxy, nghttp2-client (h2load) and openssl.
set -euo pipefail
export LC_ALL=C # `times` and awk read and write a decimal point
cd "$(dirname "$0")/../.."
bin=${FULCRUM_BIN:-target/release/fulcrum}
runs=3 total=200000 seconds=8
if [ "${1:-}" = "--quick" ]; then runs=1 total=50000 seconds=3; shift; fi
modes=${1:-tls h2c}
for tool in nginx haproxy h2load openssl taskset; do
  command -v "$tool" >/dev/null || { echo "h2.sh: $tool is needed (apt-get install nginx haproxy nghttp2-client openssl util-linux)" >&2; exit 1; }
done
ulimit -n 65536 2>/dev/null || true
work=$(mktemp -d)
mkdir -p "$work/tmp"
pids=()
stop_all() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; pids=(); }
trap 'stop_all; rm -rf "$work"' EXIT

source scripts/bench/lib.sh
make_cert "$work"

backend=29501 fulcrum=29511 nginx=29521 haproxy=29531
write_backend_conf "$work" "$backend"
taskset -c 0 nginx -c "$work/backend.conf" -p "$work" &
backend_pid=$!; pids+=($!)

# The proxies' configurations for a mode: `tls` or `h2c`.
configure() {
  local listen bind
  if [ "$1" = tls ]; then
    listen="listen $nginx ssl http2 backlog=4096;
    ssl_certificate $work/cert.pem; ssl_certificate_key $work/key.pem;
    ssl_protocols TLSv1.2 TLSv1.3;"
    bind="bind 127.0.0.1:$haproxy ssl crt $work/both.pem alpn h2,http/1.1"
  else
    listen="listen $nginx http2 backlog=4096;"
    bind="bind 127.0.0.1:$haproxy proto h2"
  fi
  write_nginx_conf "$work" "$backend" "$listen"
  write_haproxy_cfg "$work" "$backend" "$bind"
}

# Starts the three proxies for a mode; sets fulcrum_pid, nginx_pid, haproxy_pid.
start() {
  local tls=()
  if [ "$1" = tls ]; then
    tls=(--tls-listen "127.0.0.1:$fulcrum" --tls-cert "$work/cert.pem" --tls-key "$work/key.pem")
    listen=127.0.0.1:29510
  else
    listen=127.0.0.1:$fulcrum
  fi
  taskset -c 1 "$bin" serve --listen "$listen" --admin 127.0.0.1:29512 --workers 1 "${tls[@]}" \
    --backend "http://127.0.0.1:$backend" --access-log off --health-interval 60s 2>"$work/fulcrum.log" &
  fulcrum_pid=$!; pids+=($!)
  taskset -c 1 nginx -c "$work/nginx.conf" -p "$work" & nginx_pid=$!; pids+=($!)
  taskset -c 1 haproxy -f "$work/haproxy.cfg" -db & haproxy_pid=$!; pids+=($!)
  sleep 1
}

# Seconds of CPU the shell's waited-for children used, from `times` saved in file $1.
children_s() { awk 'NR == 2 { s = 0; for (i = 1; i <= 2; i++) { split($i, t, "m"); s += t[1] * 60 + t[2] } print s }' "$1"; }
# Runs h2load on CPU 0; prints "succeeded req/s cpu0": the last, in clock ticks, the CPU time
# spent on CPU 0 — h2load's own and the backend's. When it is about the run's length, CPU 0
# was the limit, not the proxy.
load() {
  local b0 b1 ok rps
  b0=$(cpu "$backend_pid")
  times >"$work/times.0" # a builtin: no fork, so h2load is the only child in between
  taskset -c 0 h2load "$@" >"$work/h2load.out" 2>&1 || true
  times >"$work/times.1"
  b1=$(cpu "$backend_pid")
  ok=$(awk '/^requests:/ {print $8}' "$work/h2load.out")
  rps=$(awk '/^finished in/ {print $4}' "$work/h2load.out")
  awk -v a="$(children_s "$work/times.0")" -v b="$(children_s "$work/times.1")" -v hz="$hz" \
    -v bt=$((b1 - b0)) -v n="${ok:-0}" -v r="${rps:-0}" \
    'BEGIN { printf "%d %s %.0f\n", n, r, (b - a) * hz + bt }'
}
# CPU-µs per request of `pid` over one h2load run; prints "µs/req req/s cpu0-µs/req".
measure() {
  local pid=$1; shift
  local before ticks ok rps cpu0
  before=$(cpu "$pid")
  read -r ok rps cpu0 < <(load "$@")
  ticks=$(( $(cpu "$pid") - before ))
  awk -v t="$ticks" -v c="$cpu0" -v hz="$hz" -v n="$ok" -v r="$rps" \
    'BEGIN { if (n == 0) { print "nan", 0, "nan" } else { printf "%.1f %.0f %.1f\n", t / hz * 1e6 / n, r, c / hz * 1e6 / n } }'
}
median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

for mode in $modes; do
  configure "$mode"
  start "$mode"
  scheme=http; [ "$mode" = tls ] && scheme=https
  echo "== h2 $mode: median of $runs (saturated: -c 20 -m 10 -n $total; rate: 5000 req/s for ${seconds}s)"
  printf '%-8s %12s %12s %12s %12s %10s\n' proxy "sat req/s" "sat µs/req" "cpu0 µs/req" "rate µs/req" "rss MiB"
  for name in fulcrum nginx haproxy; do
    port=${!name}
    load -c 20 -m 10 -n 20000 "$scheme://127.0.0.1:$port/" >/dev/null # warm up
    : >"$work/$name.sat_rps"; : >"$work/$name.sat_us"; : >"$work/$name.cpu0_us"; : >"$work/$name.rate_us"
  done
  # The proxies take turns, run by run: this machine's speed drifts by more than the
  # proxies differ over a few minutes, and a drift then touches all three alike.
  for _ in $(seq "$runs"); do
    for name in fulcrum nginx haproxy; do
      port=${!name} pid_var=${name}_pid; pid=${!pid_var}
      url="$scheme://127.0.0.1:$port/"
      read -r us rps cpu0 < <(measure "$pid" -c 20 -m 10 -n "$total" "$url")
      echo "$rps" >>"$work/$name.sat_rps"; echo "$us" >>"$work/$name.sat_us"
      echo "$cpu0" >>"$work/$name.cpu0_us"
      read -r us _ < <(measure "$pid" -c 50 -m 1 --rps 100 -D "$seconds" "$url")
      echo "$us" >>"$work/$name.rate_us"
    done
  done
  for name in fulcrum nginx haproxy; do
    pid_var=${name}_pid; pid=${!pid_var}
    mib=$(awk -v k="$(rss "$pid")" 'BEGIN { printf "%.1f", k / 1024 }')
    printf '%-8s %12s %12s %12s %12s %10s   (runs: %s | %s | %s)\n' "$name" \
      "$(median <"$work/$name.sat_rps")" "$(median <"$work/$name.sat_us")" \
      "$(median <"$work/$name.cpu0_us")" "$(median <"$work/$name.rate_us")" "$mib" "$(paste -sd, "$work/$name.sat_rps")" \
      "$(paste -sd, "$work/$name.sat_us")" "$(paste -sd, "$work/$name.rate_us")"
  done
  kill "$fulcrum_pid" "$nginx_pid" "$haproxy_pid" 2>/dev/null || true
  wait "$fulcrum_pid" "$nginx_pid" "$haproxy_pid" 2>/dev/null || true
  pids=("$backend_pid")
done
