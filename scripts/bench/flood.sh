#!/usr/bin/env bash
# A rate-limited route under a flood of random client keys: fulcrum's peak RSS stays within
# what max_keys bounds, and a legitimate key under its rate keeps getting through.
#
#   cargo build --release && scripts/bench/flood.sh [REQUESTS] [MAX_KEYS]
#
# One nginx (Debian's) answers as the backend; wrk (Debian's) sends REQUESTS (default
# 1 000 000) with a random `x-client` per request, the key of a limit of 10 per second
# with a burst of 10; meanwhile one client with its own key sends 5 per second and counts
# its answers. Prints fulcrum's peak RSS before and after, and that client's statuses.
# Figures land in docs/performance.md ("Route policies").
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/bench/lib.sh
bin=${FULCRUM_BIN:-target/release/fulcrum}
requests=${1:-1000000}
max_keys=${2:-100000}
work=$(mktemp -d)
mkdir -p "$work/tmp"
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

backend=$(port)
write_backend_conf "$work" "$backend"
nginx -c "$work/backend.conf" -p "$work" &
pids+=($!)
listen=$(port)
admin=$(port)
cat >"$work/fulcrum.toml" <<CONF
listen = "127.0.0.1:$listen"
admin = "127.0.0.1:$admin"
workers = 1
access_log = false
[[backends]]
url = "http://127.0.0.1:$backend"
[[routes]]
pool = "default"
rate_limit = { rate = 10, per = "1s", burst = 10, key = "header:x-client", max_keys = $max_keys }
CONF
"$bin" serve --config "$work/fulcrum.toml" 2>"$work/fulcrum.log" &
fulcrum=$!
pids+=($fulcrum)
for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$listen/" && break; sleep 0.1; done
echo "peak RSS before: $(rss "$fulcrum") KiB"

cat >"$work/random.lua" <<'LUA'
math.randomseed(os.time())
request = function()
  return wrk.format("GET", "/", {["x-client"] = tostring(math.random(1, 2147483647))})
end
LUA
# The legitimate client: 5 per second, under its limit of 10.
touch "$work/flooding"
(
  ok=0; other=0
  while [ -e "$work/flooding" ]; do
    code=$(curl -s -o /dev/null -w '%{http_code}' -H 'x-client: legitimate' "http://127.0.0.1:$listen/")
    if [ "$code" = 200 ]; then ok=$((ok + 1)); else other=$((other + 1)); fi
    sleep 0.2
  done
  echo "legitimate client: $ok answered 200, $other otherwise" >"$work/legit"
) &
legit=$!
start=$(date +%s.%N)
# wrk runs for a duration, not a count: it is stopped (SIGINT, which prints its summary)
# once the route has taken REQUESTS, as the admin API counts them.
wrk -t2 -c64 -d3600s -s "$work/random.lua" "http://127.0.0.1:$listen/" >"$work/wrk.out" &
flood=$!
# (The count includes the legitimate client's few requests.)
taken() {
  curl -s "http://127.0.0.1:$admin/admin/routes" |
    python3 -c 'import json,sys; print(sum(r["requests"] for r in json.load(sys.stdin)))' 2>/dev/null || echo 0
}
while [ "$(taken)" -lt "$requests" ]; do
  kill -0 "$flood" 2>/dev/null || { echo "wrk stopped early" >&2; exit 1; }
  sleep 0.5
done
kill -INT "$flood"
wait "$flood" || true
end=$(date +%s.%N)
rm -f "$work/flooding"
wait "$legit"
grep -E 'requests in|Non-2xx' "$work/wrk.out"
echo "flood: $(python3 -c "print(round($(awk '/requests in/ {print $1}' "$work/wrk.out") / ($end - $start)))") requests/s"
echo "peak RSS after: $(rss "$fulcrum") KiB (max_keys $max_keys)"
cat "$work/legit"
