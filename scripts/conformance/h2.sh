#!/usr/bin/env bash
# RFC 9113 conformance of fulcrum's HTTP/2 front end: httpwg-cli's 107 tests against
# h2c (prior knowledge) on a plain listener, in front of a backend that answers 200 to
# anything (h2-backend.py).
#
#   scripts/conformance/h2.sh [FULCRUM_BIN] [MINIMUM]
#
# Prints the figure and every failing test; fails when fewer than MINIMUM (default 104)
# pass. Needs httpwg (`cargo install httpwg-cli --version 0.2.5 --locked`) and python3.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${1:-target/release/fulcrum}
minimum=${2:-104}
command -v httpwg >/dev/null || { echo "h2.sh: httpwg is needed (cargo install httpwg-cli --version 0.2.5 --locked)" >&2; exit 1; }
work=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
backend=$(free_port) proxy=$(free_port) admin=$(free_port)
python3 scripts/conformance/h2-backend.py "$backend" 2>/dev/null &
pids+=($!)
"$bin" serve --listen "127.0.0.1:$proxy" --admin "127.0.0.1:$admin" \
  --backend "http://127.0.0.1:$backend" --access-log off --health-interval 60s 2>"$work/fulcrum.log" &
pids+=($!)
for _ in $(seq 50); do
  python3 -c "import socket; socket.create_connection(('127.0.0.1', $proxy), 0.2)" 2>/dev/null && break
  sleep 0.1
done

out="$work/suite.txt"
timeout 300 httpwg -a "127.0.0.1:$proxy" -f "RFC 9113" >"$out" 2>&1 || true
sed -i 's/\x1b\[[0-9;]*m//g' "$out"
figure=$(grep -oE "Passed [0-9]+/[0-9]+" "$out" | tail -1 | cut -d' ' -f2)
if [ -z "$figure" ]; then
  echo "h2.sh: httpwg gave no result:" >&2
  tail -20 "$out" >&2
  exit 1
fi
grep "Test failed" "$out" | sed 's/^/  /' || true
echo "RFC 9113: $figure passed (at least $minimum needed)"
[ "${figure%/*}" -ge "$minimum" ]
