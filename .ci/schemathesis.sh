#!/usr/bin/env bash
# Fuzzes the admin API against its own OpenAPI document (src/admin/openapi.json, served at
# GET /admin/openapi.json) with schemathesis.
#
#   .ci/schemathesis.sh [FULCRUM_BINARY] [EXTRA SCHEMATHESIS OPTIONS…]
#
# FULCRUM_BINARY defaults to target/debug/fulcrum; build it first. Extra options go to
# `schemathesis run` as they are (e.g. `--max-examples 200` or `--include-path-regex '^/admin/backends'`).
#
# It installs schemathesis in a cached virtualenv, starts two `fulcrum backend` processes and
# `fulcrum serve` with a config file and an admin token, runs schemathesis with the checks below,
# stops the traffic generator and the lab, and stops every process it started whatever happens. The exit
# status is schemathesis's.
#
# Fuzzing adds backends with arbitrary URLs, which the health checks and the traffic generator
# would then contact. So the run happens in a network namespace of its own that has nothing but
# loopback (when `unshare --net` is allowed, as for root), and every backend URL in a request is
# rewritten to a closed loopback address before it is sent.
#
# Environment: FULCRUM_ST_VENV (virtualenv directory), FULCRUM_ST_MAX_EXAMPLES (per operation,
# default 100), FULCRUM_ST_TIMEOUT (hard limit on the run in seconds, default 600),
# FULCRUM_ST_SCHEMA_FILE (test against this file instead of the served document, e.g. while
# editing it before a rebuild), FULCRUM_ST_NETNS=0 (stay in the host network), FULCRUM_ST_KEEP=1
# (keep the logs and generated files).
set -euo pipefail

ST_VERSION=4.32.5

if [[ -z "${FULCRUM_ST_INSIDE:-}" ]]; then
    # Resolve the binary against the caller's directory, then work from the repository root.
    bin_arg=${1:-}
    repo=$(cd "$(dirname "$0")/.." && pwd)
    if [[ -z "$bin_arg" ]]; then
        BIN="$repo/target/debug/fulcrum"
    else
        BIN="$(cd "$(dirname "$bin_arg")" && pwd)/$(basename "$bin_arg")"
    fi
    if [[ ! -x "$BIN" ]]; then
        echo "schemathesis.sh: no fulcrum binary at $BIN (run cargo build first)" >&2
        exit 2
    fi
    export FULCRUM_ST_BIN="$BIN" FULCRUM_ST_REPO="$repo"
    if [[ -n "${FULCRUM_ST_SCHEMA_FILE:-}" ]]; then
        FULCRUM_ST_SCHEMA_FILE="$(cd "$(dirname "$FULCRUM_ST_SCHEMA_FILE")" && pwd)/$(basename "$FULCRUM_ST_SCHEMA_FILE")"
        export FULCRUM_ST_SCHEMA_FILE
    fi

    # ---- a virtualenv with schemathesis, reused between runs -------------------------------
    VENV=${FULCRUM_ST_VENV:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/fulcrum-ci/schemathesis-$ST_VERSION}
    if [[ ! -f "$VENV/.installed-$ST_VERSION" ]]; then
        echo "--- installing schemathesis $ST_VERSION in $VENV"
        if ! command -v python3 >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [[ $(id -u) == 0 ]]; then
            apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv python3-pip >/dev/null
        fi
        rm -rf "$VENV"
        mkdir -p "$(dirname "$VENV")"
        if ! python3 -m venv "$VENV" >/dev/null 2>&1; then
            rm -rf "$VENV"
            if command -v apt-get >/dev/null 2>&1 && [[ $(id -u) == 0 ]]; then
                echo "--- python3 -m venv failed; installing python3-venv and python3-pip"
                apt-get update -qq
                DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv python3-pip >/dev/null
                python3 -m venv "$VENV"
            else
                echo "schemathesis.sh: python3 -m venv failed; install python3-venv" >&2
                exit 2
            fi
        fi
        "$VENV/bin/python" -m pip install -q --disable-pip-version-check "schemathesis==$ST_VERSION"
        touch "$VENV/.installed-$ST_VERSION"
    fi
    export FULCRUM_ST_PY="$VENV/bin/python" FULCRUM_ST_CLI="$VENV/bin/schemathesis"

    # ---- the rest in a network namespace with loopback only, where allowed ----------------
    export FULCRUM_ST_INSIDE=1
    if [[ "${FULCRUM_ST_NETNS:-1}" != 0 ]] && command -v unshare >/dev/null 2>&1 \
        && unshare --net true >/dev/null 2>&1; then
        echo "--- running in a network namespace with loopback only"
        FULCRUM_ST_NETNS_ACTIVE=1 exec unshare --net -- "$BASH" "$0" "$@"
    fi
    echo "--- no network namespace (unshare --net refused, or FULCRUM_ST_NETNS=0): host network; backend URLs are still rewritten to loopback"
fi

# ============================ inside: start fulcrum, fuzz, clean up ============================
BIN=$FULCRUM_ST_BIN
PY=$FULCRUM_ST_PY
shift || true # the binary; what is left goes to schemathesis

WORK=$(mktemp -d "${TMPDIR:-/tmp}/fulcrum-st.XXXXXX")
PIDS=()
SERVE_PID=
ST_PID=

# Process ids whose parent is $1, from /proc (no procps needed).
children_of() {
    local parent=$1 stat line rest fields
    for stat in /proc/[0-9]*/stat; do
        line=$(cat "$stat" 2>/dev/null) || continue
        rest=${line##*) }
        read -r -a fields <<<"$rest"
        if [[ "${fields[1]:-}" == "$parent" ]]; then
            stat=${stat#/proc/}
            echo "${stat%/stat}"
        fi
    done
}

# Whether process $1 still runs (a zombie does not count).
alive() {
    local line rest fields
    line=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    rest=${line##*) }
    read -r -a fields <<<"$rest"
    [[ "${fields[0]:-}" != Z ]]
}

# Sends TERM, waits up to $1 tenths of a second, then KILL.
stop_pids() {
    local tenths=$1 pid i
    shift
    for pid in "$@"; do kill -TERM "$pid" 2>/dev/null || true; done
    for ((i = 0; i < tenths; i++)); do
        local any=0
        for pid in "$@"; do alive "$pid" && any=1; done
        ((any)) || break
        sleep 0.1
    done
    for pid in "$@"; do
        if alive "$pid"; then
            echo "--- process $pid did not stop after TERM; killing it" >&2
            kill -KILL "$pid" 2>/dev/null || true
        fi
    done
    for pid in "$@"; do wait "$pid" 2>/dev/null || true; done
}

cleanup() {
    local status=$?
    trap - EXIT INT TERM
    if [[ -n "$ST_PID" ]]; then
        stop_pids 100 "$ST_PID"
    fi
    local kids=()
    if [[ -n "$SERVE_PID" ]]; then
        # Spawned backends are fulcrum's children: note them before fulcrum goes.
        mapfile -t kids < <(children_of "$SERVE_PID")
        stop_pids 150 "$SERVE_PID"
    fi
    # fulcrum stops its spawned backends as it exits; give them a moment to go.
    local left=() i pid
    for ((i = 0; i < 30; i++)); do
        left=()
        for pid in "${kids[@]}"; do alive "$pid" && left+=("$pid"); done
        ((${#left[@]})) || break
        sleep 0.1
    done
    if ((${#left[@]})); then
        echo "--- still running 3 s after fulcrum stopped (its children):" >&2
        for pid in "${left[@]}"; do
            echo "    $pid $(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)" >&2
        done
        stop_pids 20 "${left[@]}"
    fi
    if ((${#PIDS[@]})); then stop_pids 20 "${PIDS[@]}"; fi
    if ((status != 0)) && [[ -f "$WORK/serve.log" ]]; then
        echo "--- last lines of fulcrum serve's log" >&2
        tail -n 30 "$WORK/serve.log" >&2 || true
    fi
    if [[ -n "${FULCRUM_ST_KEEP:-}" ]]; then
        echo "--- logs and configuration kept in $WORK"
    else
        rm -rf "$WORK"
    fi
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- helpers in Python (ports, waiting, plain HTTP) ---------------------------------------------
cat >"$WORK/st_util.py" <<'EOF'
import fcntl, socket, struct, sys, time, urllib.request, urllib.error

def lo_up():
    """Brings the loopback interface of a new network namespace up."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    ifreq = struct.pack("16sH", b"lo", 0)
    flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, ifreq)[:18])[1]  # SIOCGIFFLAGS
    fcntl.ioctl(s, 0x8914, struct.pack("16sH", b"lo", flags | 0x1))     # SIOCSIFFLAGS, IFF_UP

def ports(n):
    socks = [socket.socket() for _ in range(int(n))]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    print(" ".join(str(s.getsockname()[1]) for s in socks))
    for s in socks:
        s.close()

def request(method, url, token=None, timeout=5):
    req = urllib.request.Request(url, method=method)
    if token:
        req.add_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()

def wait(url, token=None, seconds=15):
    deadline = time.monotonic() + float(seconds)
    while True:
        try:
            status, _ = request("GET", url, token, timeout=1)
            if status == 200:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            sys.exit(f"{url} did not answer 200 within {seconds} s")
        time.sleep(0.1)

def status(method, url, token=None):
    try:
        print(request(method, url, token)[0])
    except OSError:
        print(0)

if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    {"lo_up": lo_up, "ports": ports, "wait": wait, "status": status}[cmd](*args)
EOF
util() { "$PY" "$WORK/st_util.py" "$@"; }

if [[ -n "${FULCRUM_ST_NETNS_ACTIVE:-}" ]]; then
    util lo_up
fi

read -r P_B1 P_B2 P_PROXY P_ADMIN P_DEAD <<<"$(util ports 5)"
TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
ADMIN="http://127.0.0.1:$P_ADMIN"

# ---- two demo backends and the balancer --------------------------------------------------------
"$BIN" backend --listen "127.0.0.1:$P_B1" --name st-a >"$WORK/backend-a.log" 2>&1 &
PIDS+=($!)
"$BIN" backend --listen "127.0.0.1:$P_B2" --name st-b --latency-ms 5 >"$WORK/backend-b.log" 2>&1 &
PIDS+=($!)

# A config file, so that POST /admin/reload has something to re-read.
cat >"$WORK/fulcrum.toml" <<EOF
listen = "127.0.0.1:$P_PROXY"
admin = "127.0.0.1:$P_ADMIN"
strategy = "round_robin"
workers = 1

[[backends]]
url = "http://127.0.0.1:$P_B1"
name = "st-a"

[[backends]]
url = "http://127.0.0.1:$P_B2"
name = "st-b"
EOF

util wait "http://127.0.0.1:$P_B1/health"
util wait "http://127.0.0.1:$P_B2/health"
FULCRUM_ADMIN_TOKEN=$TOKEN "$BIN" serve --config "$WORK/fulcrum.toml" >"$WORK/serve.log" 2>&1 &
SERVE_PID=$!
util wait "$ADMIN/admin/status" "$TOKEN"
echo "--- fulcrum serve (pid $SERVE_PID): proxy 127.0.0.1:$P_PROXY, admin $ADMIN; backends (pids ${PIDS[*]}): 127.0.0.1:$P_B1, 127.0.0.1:$P_B2"

SCHEMA="$ADMIN/admin/openapi.json"
SCHEMA_ARGS=("$SCHEMA")
if [[ -n "${FULCRUM_ST_SCHEMA_FILE:-}" ]]; then
    SCHEMA_ARGS=("$FULCRUM_ST_SCHEMA_FILE" --url "$ADMIN")
elif [[ "$(util status GET "$SCHEMA" "$TOKEN")" != 200 ]]; then
    echo "--- WARNING: $SCHEMA does not answer 200; testing against src/admin/openapi.json instead" >&2
    SCHEMA_ARGS=("$FULCRUM_ST_REPO/src/admin/openapi.json" --url "$ADMIN")
fi

# ---- schemathesis configuration and hooks ------------------------------------------------------
cat >"$WORK/schemathesis.toml" <<EOF
[generation]
max-examples = ${FULCRUM_ST_MAX_EXAMPLES:-100}
database = "none"

[phases.stateful]
max-steps = 10

# An endless text/event-stream: nothing to fuzz, and it would never end.
[[operations]]
include-operation-id = "streamEvents"
enabled = false

# Each accepted call starts a process or a load run: a few are enough.
[[operations]]
include-operation-id = ["spawnBackend", "startTraffic"]
generation.max-examples = 5

# Any string is a well-formed request here, and only strategy names are accepted: most
# generated values are refused by design, which schemathesis would otherwise warn about.
[[operations]]
include-operation-id = ["setStrategy", "setPoolStrategy"]
warnings = false

# The same for a pool's values (strategy names, durations with a unit) and for routes, whose
# pools must exist: most generated values are refused by design.
[[operations]]
include-operation-id = ["addPool", "setRoutes"]
warnings = false
EOF

cat >"$WORK/fulcrum_st_hooks.py" <<EOF
"""Keeps the fuzzing on this machine and its load small."""
import zlib

import schemathesis

DEAD_PORT = $P_DEAD  # free when the run started; nothing here listens on it


def _loopback(url):
    # fulcrum accepts only URLs that start with http:// (in any case). Point each one at a
    # closed loopback address that depends on the original, keeping what follows the host so
    # that paths, queries and user info still exercise validation.
    if not isinstance(url, str) or url[:7].lower() != "http://":
        return url
    rest = url[7:]
    cut = min([i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0] or [len(rest)])
    h = zlib.crc32(rest[:cut].encode("utf-8", "surrogatepass"))
    host = f"127.{1 + h % 254}.{(h >> 8) % 256}.{(h >> 16) % 256}"
    return f"{url[:7]}{host}:{DEAD_PORT}{rest[cut:]}"


def _int_in(v, lo, hi):
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


_STRATEGIES = {
    "round_robin", "weighted_round_robin", "least_connections", "weighted_least_connections",
    "least_response_time", "peak_ewma", "power_of_two", "consistent_hash", "ip_hash", "maglev",
}


@schemathesis.hook
def before_call(context, case, kwargs):
    op = case.operation
    body = case.body
    if not isinstance(body, dict):
        return
    if op.method.upper() == "POST" and op.path == "/admin/backends" and "url" in body:
        body["url"] = _loopback(body["url"])
    elif op.method.upper() == "POST" and op.path == "/admin/traffic":
        # Valid values stay valid, just smaller; invalid ones are sent as generated.
        if _int_in(body.get("rps"), 1, 5000):
            body["rps"] = min(body["rps"], 200)
        if _int_in(body.get("seconds"), 1, 600):
            body["seconds"] = min(body["seconds"], 2)
    elif op.method.upper() == "POST" and op.path == "/admin/lab":
        # A valid run stays valid, just short: one strategy for one second. Invalid
        # values are sent as generated.
        if body.get("seconds") is None or _int_in(body.get("seconds"), 1, 120):
            body["seconds"] = 1
        st = body.get("strategies")
        if st is None or isinstance(st, str) and "," in st or st == "all" or (
            isinstance(st, list) and st and all(isinstance(s, str) and s in _STRATEGIES for s in st)
        ):
            body["strategies"] = "round_robin"
        if _int_in(body.get("rps"), 1, 5000):
            body["rps"] = min(body["rps"], 100)
EOF

CHECKS=not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance
CHECKS+=,response_schema_conformance,negative_data_rejection,unsupported_method,allow_header_conformance
CHECKS+=,ignored_auth,use_after_free,ensure_resource_availability

cd "$WORK"
echo "--- schemathesis $ST_VERSION against ${SCHEMA_ARGS[0]}"
# In the background, so that a signal to this script is handled at once (bash runs traps
# only between foreground commands); cleanup stops it first. One worker: with several,
# hypothesis's threads can trip CPython 3.11's "AST constructor recursion depth mismatch".
PYTHONPATH="$WORK" SCHEMATHESIS_HOOKS=fulcrum_st_hooks \
    timeout --signal=INT --kill-after=30 "${FULCRUM_ST_TIMEOUT:-600}" \
    "$FULCRUM_ST_CLI" --config-file "$WORK/schemathesis.toml" run "${SCHEMA_ARGS[@]}" \
    --header "Authorization: Bearer $TOKEN" \
    --checks "$CHECKS" \
    --workers 1 \
    --request-timeout 15 \
    --no-color \
    "$@" &
ST_PID=$!
ST_STATUS=0
wait "$ST_PID" || ST_STATUS=$?
ST_PID=

# Leave no load running, even for the time it takes to stop.
util status DELETE "$ADMIN/admin/traffic" "$TOKEN" >/dev/null || true
util status DELETE "$ADMIN/admin/lab" "$TOKEN" >/dev/null || true
echo "--- schemathesis exit status: $ST_STATUS"
exit "$ST_STATUS"
