# Helpers the side-by-side benchmarks share (sourced by tls.sh and h2.sh).

# The processes of a proxy: its main process and, for nginx, its worker.
procs() { echo "$1 $(pgrep -P "$1" | tr '\n' ' ')"; }
# CPU time of a proxy's processes, in clock ticks.
cpu() { local t=0; for p in $(procs "$1"); do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo $t; }
# Peak RSS of a proxy's processes, KiB.
rss() { local t=0; for p in $(procs "$1"); do t=$((t + $(awk '/VmHWM/ {print $2}' "/proc/$p/status"))); done; echo $t; }
hz=$(getconf CLK_TCK)

# A self-signed ECDSA P-256 certificate for localhost in $1: cert.pem, key.pem, and both.pem
# (HAProxy's form).
make_cert() {
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -subj /CN=localhost -addext subjectAltName=DNS:localhost \
    -keyout "$1/key.pem" -out "$1/cert.pem" 2>/dev/null
  cat "$1/cert.pem" "$1/key.pem" >"$1/both.pem"
}
