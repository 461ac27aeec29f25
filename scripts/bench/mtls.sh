#!/usr/bin/env bash
# What verifying client certificates costs a full TLS handshake: fulcrum without
# [tls.client_auth], then with it (mode = "require", the client presenting an ECDSA P-256
# certificate signed by the bundle's CA), and nginx both ways (ssl_verify_client on) for
# reference. Each proxy has one worker pinned to CPU 1; the client (openssl s_time: a
# new full handshake per connection, TLS 1.3, no resumption) and the backend run on
# CPU 0. The proxy's CPU time (/proc/PID/stat) over the handshakes it completed gives
# its µs per handshake.
#
#   cargo build --release && scripts/bench/mtls.sh [--quick]
#
# Figures land in docs/performance.md, "Mutual TLS". Tools: Debian's nginx and openssl.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${FULCRUM_BIN:-target/release/fulcrum}
seconds=10
if [ "${1:-}" = "--quick" ]; then seconds=4; fi
for tool in nginx openssl taskset; do
  command -v "$tool" >/dev/null || { echo "mtls.sh: $tool is needed (apt-get install nginx openssl util-linux)" >&2; exit 1; }
done
work=$(mktemp -d)
mkdir -p "$work/tmp"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT

source scripts/bench/lib.sh
make_cert "$work"
# The clients' CA and one client certificate it signs.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
  -subj "/CN=clients CA" -keyout "$work/ca.key" -out "$work/ca.pem" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=web \
  -keyout "$work/client.key" -out "$work/client.csr" 2>/dev/null
printf 'subjectAltName=URI:spiffe://bench.example/web\n' >"$work/ext.cnf"
openssl x509 -req -in "$work/client.csr" -CA "$work/ca.pem" -CAkey "$work/ca.key" \
  -CAcreateserial -days 2 -extfile "$work/ext.cnf" -out "$work/client.pem" 2>/dev/null

backend=29501
write_backend_conf "$work" "$backend"
taskset -c 0 nginx -c "$work/backend.conf" -p "$work" & pids+=($!)

# start NAME PORT [client_auth]: a fulcrum on PORT, its pid in $started.
start_fulcrum() {
  local auth=""
  if [ "${3:-}" = client_auth ]; then
    auth="[tls.client_auth]
ca_file = \"$work/ca.pem\"
mode = \"require\""
  fi
  cat >"$work/$1.toml" <<TOML
tls_listen = "127.0.0.1:$2"
access_log = "off"
[[tls.certs]]
cert = "$work/cert.pem"
key = "$work/key.pem"
$auth
TOML
  taskset -c 1 "$bin" serve --config "$work/$1.toml" --listen "127.0.0.1:$(($2 + 1))" \
    --admin "127.0.0.1:$(($2 + 2))" --workers 1 --backend "http://127.0.0.1:$backend" \
    --health-interval 60s 2>"$work/$1.log" &
  started=$!; pids+=($!)
}
start_fulcrum plain 29510; plain_pid=$started
start_fulcrum verify 29520 client_auth; verify_pid=$started
write_nginx_conf "$work" "$backend" "listen 29530 ssl; ssl_certificate $work/cert.pem;
    ssl_certificate_key $work/key.pem; ssl_protocols TLSv1.3;"
cp "$work/nginx.conf" "$work/nginx-plain.conf"
write_nginx_conf "$work" "$backend" "listen 29540 ssl; ssl_certificate $work/cert.pem;
    ssl_certificate_key $work/key.pem; ssl_protocols TLSv1.3;
    ssl_client_certificate $work/ca.pem; ssl_verify_client on;"
sed -i "s|pid $work/nginx.pid|pid $work/nginx-verify.pid|" "$work/nginx.conf"
taskset -c 1 nginx -c "$work/nginx-plain.conf" -p "$work" & nginx_plain_pid=$!; pids+=($!)
taskset -c 1 nginx -c "$work/nginx.conf" -p "$work" & nginx_verify_pid=$!; pids+=($!)
sleep 1

# handshakes PID PORT [client]: µs of the proxy's CPU per full handshake.
handshakes() {
  local cert=()
  if [ "${3:-}" = client ]; then cert=(-cert "$work/client.pem" -key "$work/client.key"); fi
  local before; before=$(cpu "$1")
  taskset -c 0 openssl s_time -connect "127.0.0.1:$2" -new -time "$seconds" "${cert[@]}" \
    >"$work/s_time.out" 2>&1 || true
  local ticks=$(( $(cpu "$1") - before ))
  local n; n=$(awk '/connections in .* real seconds/ {print $1; exit}' "$work/s_time.out")
  awk -v t="$ticks" -v hz="$hz" -v n="${n:-0}" 'BEGIN { if (n == 0) print "n/a"; else printf "%.1f", t / hz * 1e6 / n }'
}

printf '%-8s %22s %22s %8s\n' proxy "handshake µs, no cert" "handshake µs, verified" ratio
for name in fulcrum nginx; do
  if [ "$name" = fulcrum ]; then a=$plain_pid; pa=29510; b=$verify_pid; pb=29520;
  else a=$nginx_plain_pid; pa=29530; b=$nginx_verify_pid; pb=29540; fi
  without=$(handshakes "$a" "$pa")
  with=$(handshakes "$b" "$pb" client)
  ratio=$(awk -v a="$without" -v b="$with" 'BEGIN { if (a + 0 == 0) print "n/a"; else printf "%.2f", b / a }')
  printf '%-8s %22s %22s %8s\n' "$name" "$without" "$with" "$ratio"
done
