#!/usr/bin/env bash
# The TCP proxy side by side: fulcrum (a `mode = "tcp"` pool fed by a [[tcp_listeners]]
# entry), HAProxy (`mode tcp`) and nginx (the `stream` module) relay plain TCP to the same
# backend on 127.0.0.1, each with one worker (thread) pinned to CPU 1; the backend and the
# load clients (Python 3, written below; nothing else to install) run on CPU 0.
#
#   cargo build --release && scripts/bench/tcp.sh [--quick]
#
# Environment: FULCRUM_BIN (target/release/fulcrum); PEERS_ONLY=1 measures HAProxy and
# nginx alone (no fulcrum, no ratios); SIZE_MIB (2048), CONNS (20000), IDLE (2000, at most
# 3500) override the sizes below (--quick: 256, 4000, 500); ROUNDS (1): the throughput and
# connection measurements are repeated, the proxies taking turns, and medians printed
# (on a shared virtual machine the copy speed can change by 2× from one minute to the
# next: ROUNDS=3 tells such a change from a difference); NGINX_STREAM_MODULE, the path
# of ngx_stream_module.so when nginx was not built with the stream module in it
# (Debian: apt-get install libnginx-mod-stream, /usr/lib/nginx/modules/ngx_stream_module.so).
#
# What is measured, per proxy (the first three ROUNDS times, once by default):
#   throughput   one connection carries SIZE_MIB MiB client → proxy → backend (the
#                backend reads them and acknowledges), then another SIZE_MIB MiB
#                backend → proxy → client: MiB/s each way, timed by the client.
#                The `direct` row is the same without a proxy: the harness's own ceiling.
#   CPU/MiB      the proxy's CPU time over both transfers (utime + stime of its processes
#                from /proc/PID/stat, before and after) over the 2 × SIZE_MIB MiB moved;
#                busy, that CPU time over the transfers' wall time (near 100 %: the proxy's
#                core is what limits the throughput).
#   CPU/conn     CONNS short connections, 50 at a time: each connects, sends 41 bytes,
#                reads the 32 the backend echoes, closes. The proxy's CPU time over the
#                connections; conn/s is the rate the Python harness reached.
#   idle RSS     IDLE connections opened one by one, each after one echo round trip (so
#                the proxy has its backend connection and has relayed data both ways), then
#                held silent: the growth of the proxy's resident memory (VmRSS of its
#                processes, nginx: master and worker) over them, KiB per connection.
# Targets for fulcrum: throughput ≥ 0.9 × the faster peer (each way); CPU/MiB, CPU/conn
# and idle RSS ≤ both peers. The last lines say which are met.
# The peers run as configured out of the box (16 KiB buffers; HAProxy without splicing).
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${FULCRUM_BIN:-target/release/fulcrum}
peers_only=${PEERS_ONLY:-0}
size_mib=2048 conns=20000 idle=2000
if [ "${1:-}" = "--quick" ]; then size_mib=256 conns=4000 idle=500; shift; fi
size_mib=${SIZE_MIB:-$size_mib} conns=${CONNS:-$conns} idle=${IDLE:-$idle} rounds=${ROUNDS:-1}
for tool in nginx haproxy python3 taskset; do
  command -v "$tool" >/dev/null || { echo "tcp.sh: $tool is needed (apt-get install nginx libnginx-mod-stream haproxy python3 util-linux)" >&2; exit 1; }
done
if [ "$peers_only" != 1 ] && [ ! -x "$bin" ]; then
  echo "tcp.sh: no $bin (cargo build --release, or FULCRUM_BIN=...; PEERS_ONLY=1 runs without fulcrum)" >&2; exit 1
fi
# nginx's stream module: built in, or a dynamic module to load.
load_stream=""
if ! nginx -V 2>&1 | tr ' ' '\n' | grep -qx -- --with-stream; then
  module=${NGINX_STREAM_MODULE:-/usr/lib/nginx/modules/ngx_stream_module.so}
  [ -f "$module" ] || { echo "tcp.sh: nginx has no stream module (apt-get install libnginx-mod-stream, or NGINX_STREAM_MODULE=path/ngx_stream_module.so)" >&2; exit 1; }
  load_stream="load_module $module;"
fi
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
work=$(mktemp -d)
mkdir -p "$work/tmp"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
source scripts/bench/lib.sh

backend=29801 fulcrum=29811 nginx=29821 haproxy=29831

# The backend and the clients. Every connection to the backend opens with a command byte
# and a big-endian u64: `U n` (the client sends n bytes, the backend answers n as a u64
# once it has them all), `D n` (the backend sends n bytes and closes), `E 0` (the backend
# echoes whatever follows until the client closes). A connection that closes first (a
# health check) is fine.
cat >"$work/tcpb.py" <<'PY'
import asyncio, socket, struct, sys, threading, time

CHUNK = 1 << 20
ECHO = b"E" + struct.pack(">Q", 0) + b"0123456789abcdef0123456789abcdef"


def recv_exact(s, n):
    out = bytearray()
    while len(out) < n:
        d = s.recv(n - len(out))
        if not d:
            return None
        out += d
    return bytes(out)


def handle(c):
    try:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        head = recv_exact(c, 9)
        if head is None:
            return
        cmd, n = head[:1], struct.unpack(">Q", head[1:])[0]
        if cmd == b"U":
            buf = memoryview(bytearray(CHUNK))
            left = n
            while left:
                k = c.recv_into(buf, min(left, CHUNK))
                if not k:
                    return
                left -= k
            c.sendall(struct.pack(">Q", n))
        elif cmd == b"D":
            buf = memoryview(bytearray(CHUNK))
            left = n
            while left:
                k = min(left, CHUNK)
                c.sendall(buf[:k])
                left -= k
        elif cmd == b"E":
            while True:
                d = c.recv(65536)
                if not d:
                    return
                c.sendall(d)
    except OSError:
        pass
    finally:
        c.close()


def backend(port):
    threading.stack_size(256 * 1024)
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", port))
    ls.listen(4096)
    while True:
        c, _ = ls.accept()
        threading.Thread(target=handle, args=(c,), daemon=True).start()


def echo_once(port, timeout=None):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(ECHO)
    if recv_exact(s, len(ECHO) - 9) != ECHO[9:]:
        s.close()
        raise OSError("bad echo")
    return s


def wait(port):
    """Until an echo goes through PORT (10 s at most)."""
    end = time.time() + 10
    while True:
        try:
            echo_once(port, timeout=1).close()
            return
        except OSError:
            if time.time() > end:
                sys.exit(f"no echo through {port}")
            time.sleep(0.1)


def bulk(port, mib):
    """MIB MiB up, then MIB MiB down; prints both rates in MiB/s."""
    n = mib << 20
    buf = memoryview(bytearray(CHUNK))
    s = socket.create_connection(("127.0.0.1", port))
    t = time.perf_counter()
    s.sendall(b"U" + struct.pack(">Q", n))
    left = n
    while left:
        k = min(left, CHUNK)
        s.sendall(buf[:k])
        left -= k
    if recv_exact(s, 8) != struct.pack(">Q", n):
        sys.exit("upload not acknowledged")
    up = mib / (time.perf_counter() - t)
    s.close()
    s = socket.create_connection(("127.0.0.1", port))
    t = time.perf_counter()
    s.sendall(b"D" + struct.pack(">Q", n))
    left = n
    while left:
        k = s.recv_into(buf, min(left, CHUNK))
        if not k:
            sys.exit("download cut short")
        left -= k
    down = mib / (time.perf_counter() - t)
    s.close()
    print(f"{up:.0f} {down:.0f}")


async def conns_async(port, total, concurrency):
    loop = asyncio.get_running_loop()
    left, ok = [total], [0]
    want = len(ECHO) - 9

    async def worker():
        while left[0] > 0:
            left[0] -= 1
            s = socket.socket()
            s.setblocking(False)
            try:
                await loop.sock_connect(s, ("127.0.0.1", port))
                await loop.sock_sendall(s, ECHO)
                got = 0
                while got < want:
                    d = await loop.sock_recv(s, 256)
                    if not d:
                        break
                    got += len(d)
                if got == want:
                    ok[0] += 1
            except OSError:
                pass
            finally:
                s.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return ok[0]


def conns(port, total, concurrency):
    """TOTAL short echo connections, CONCURRENCY at a time; prints "succeeded seconds"."""
    t = time.perf_counter()
    ok = asyncio.run(conns_async(port, total, concurrency))
    print(f"{ok} {time.perf_counter() - t:.3f}")


def rss_kib(pids):
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total


def idle(port, n, pids):
    """N connections, one echo each, then held; prints the RSS growth of PIDS, KiB each."""
    time.sleep(0.5)
    base = rss_kib(pids)
    held = [echo_once(port) for _ in range(n)]
    time.sleep(1.0)
    grown = rss_kib(pids) - base
    print(f"{grown / n:.1f}")
    for s in held:
        s.close()
    time.sleep(0.5)


def report(path):
    """The ratios fulcrum / peer and the targets, from the rows tcp.sh wrote."""
    rows = {}
    with open(path) as f:
        for line in f:
            name, *vals = line.split()
            rows[name] = [float(v) for v in vals]
    if "fulcrum" not in rows:
        print("(no fulcrum row: no ratios)")
        return
    cols = ["up MiB/s", "down MiB/s", "CPU µs/MiB", "CPU µs/conn", "idle KiB/conn"]
    f = rows["fulcrum"]
    peers = [p for p in ("nginx", "haproxy") if p in rows]

    def ratio(a, b):
        return f"{a / b:.2f}" if b else "n/a"

    print(f"\n{'fulcrum /':<10}" + "".join(f"{c:>15}" for c in cols))
    for p in peers:
        print(f"{p:<10}" + "".join(f"{ratio(f[i], rows[p][i]):>15}" for i in range(len(cols))))
    print()
    met = lambda ok: "met" if ok else "NOT met"
    for i, way in ((0, "up"), (1, "down")):
        best = max(rows[p][i] for p in peers)
        print(f"throughput {way}: fulcrum {f[i]:.0f} MiB/s ≥ 0.9 × {best:.0f} (faster peer): {met(f[i] >= 0.9 * best)}")
    for i, what in ((2, "CPU per MiB (µs)"), (3, "CPU per connection (µs)"), (4, "RSS per idle connection (KiB)")):
        vals = ", ".join(f"{p} {rows[p][i]:.1f}" for p in peers)
        print(f"{what}: fulcrum {f[i]:.1f} ≤ both ({vals}): {met(all(f[i] <= rows[p][i] for p in peers))}")


cmd, args = sys.argv[1], sys.argv[2:]
if cmd == "backend":
    backend(int(args[0]))
elif cmd == "wait":
    wait(int(args[0]))
elif cmd == "bulk":
    bulk(int(args[0]), int(args[1]))
elif cmd == "conns":
    conns(int(args[0]), int(args[1]), int(args[2]))
elif cmd == "idle":
    idle(int(args[0]), int(args[1]), [int(p) for p in args[2:]])
elif cmd == "report":
    report(args[0])
PY
py() { taskset -c 0 python3 "$work/tcpb.py" "$@"; }

taskset -c 0 python3 "$work/tcpb.py" backend "$backend" & pids+=($!)
py wait "$backend"

{ echo "$load_stream"
  nginx_head "$work" nginx
  echo "stream { upstream b { server 127.0.0.1:$backend; }"
  echo "  server { listen 127.0.0.1:$nginx backlog=4096; proxy_pass b; } }"
} >"$work/nginx.conf"
cat >"$work/haproxy.cfg" <<CONF
global
  nbthread 1
  maxconn 4000
defaults
  mode tcp
  timeout connect 5s
  timeout client 60s
  timeout server 60s
frontend f
  bind 127.0.0.1:$haproxy backlog 4096
  default_backend b
backend b
  server s1 127.0.0.1:$backend
CONF
cat >"$work/fulcrum.toml" <<CONF
listen = "127.0.0.1:29810"
admin = "127.0.0.1:29812"
access_log = "off"
workers = 1
[[pools]]
name = "bench"
mode = "tcp"
health = { kind = "tcp", interval = "60s" }
[[pools.backends]]
url = "tcp://127.0.0.1:$backend"
[[tcp_listeners]]
listen = "127.0.0.1:$fulcrum"
pool = "bench"
CONF

names="nginx haproxy"
if [ "$peers_only" != 1 ]; then
  names="fulcrum $names"
  taskset -c 1 "$bin" serve --config "$work/fulcrum.toml" 2>"$work/fulcrum.log" &
  fulcrum_pid=$!; pids+=($!)
fi
taskset -c 1 nginx -c "$work/nginx.conf" -p "$work" & nginx_pid=$!; pids+=($!)
taskset -c 1 haproxy -f "$work/haproxy.cfg" -db & haproxy_pid=$!; pids+=($!)
for name in $names; do
  py wait "${!name}" || { [ "$name" = fulcrum ] && cat "$work/fulcrum.log" >&2; exit 1; }
done

# CPU-µs of `ticks` over `n` units.
per() { awk -v t="$1" -v hz="$hz" -v n="$2" 'BEGIN { if (n > 0) printf "%.1f", t / hz * 1e6 / n; else print "nan" }'; }
median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
# A proxy's figure: the median of its rounds (its only run when ROUNDS=1).
fig() { median <"$work/$1.$2"; }
runs() { paste -sd, "$work/$1.$2"; }

echo "== TCP proxy: ${size_mib} MiB each way on one connection; $conns connections (50 at a time); $idle idle connections"
py bulk "$backend" 64 >/dev/null # warm up
read -r direct_up direct_down < <(py bulk "$backend" "$size_mib")
for name in $names; do
  port=${!name}
  py bulk "$port" 64 >/dev/null; py conns "$port" 1000 50 >/dev/null # warm up
  for what in up down mib busy conn rate idle; do : >"$work/$name.$what"; done
done
# The proxies take turns within each round, so that a change in the machine's speed (a
# shared host) falls on all of them rather than on one.
for round in $(seq "$rounds"); do
  for name in $names; do
    port=${!name} pid_var=${name}_pid; pid=${!pid_var}
    before=$(cpu "$pid")
    read -r up down < <(py bulk "$port" "$size_mib")
    ticks=$(( $(cpu "$pid") - before ))
    echo "$up" >>"$work/$name.up"; echo "$down" >>"$work/$name.down"
    echo "$(per "$ticks" $((2 * size_mib)))" >>"$work/$name.mib"
    awk -v t="$ticks" -v hz="$hz" -v m="$size_mib" -v u="$up" -v d="$down" \
      'BEGIN { printf "%.0f\n", 100 * t / hz / (m / u + m / d) }' >>"$work/$name.busy"
  done
  for name in $names; do
    port=${!name} pid_var=${name}_pid; pid=${!pid_var}
    before=$(cpu "$pid")
    read -r ok secs < <(py conns "$port" "$conns" 50)
    echo "$(per $(( $(cpu "$pid") - before )) "$ok")" >>"$work/$name.conn"
    awk -v n="$ok" -v s="$secs" 'BEGIN { printf "%.0f\n", n / s }' >>"$work/$name.rate"
    [ "$ok" = "$conns" ] || echo "$name: only $ok of $conns connections echoed" >&2
  done
done
for name in $names; do
  port=${!name} pid_var=${name}_pid; pid=${!pid_var}
  py idle "$port" "$idle" $(procs "$pid") >"$work/$name.idle"
done

[ "$rounds" = 1 ] || echo "   (medians of $rounds rounds; the rounds in brackets: up | down | CPU µs/MiB | CPU µs/conn)"
row() { printf '%-8s %10s %10s %11s %6s %12s %8s %14s%s\n' "$@"; }
row proxy "up MiB/s" "down MiB/s" "CPU µs/MiB" busy "CPU µs/conn" "conn/s" "idle KiB/conn" ""
row direct "$direct_up" "$direct_down" - - - - - ""
: >"$work/results"
for name in $names; do
  more=""
  [ "$rounds" = 1 ] || more="   ($(runs "$name" up) | $(runs "$name" down) | $(runs "$name" mib) | $(runs "$name" conn))"
  row "$name" "$(fig "$name" up)" "$(fig "$name" down)" "$(fig "$name" mib)" "$(fig "$name" busy)%" \
    "$(fig "$name" conn)" "$(fig "$name" rate)" "$(cat "$work/$name.idle")" "$more"
  echo "$name $(fig "$name" up) $(fig "$name" down) $(fig "$name" mib) $(fig "$name" conn) $(cat "$work/$name.idle")" >>"$work/results"
done
python3 "$work/tcpb.py" report "$work/results"
