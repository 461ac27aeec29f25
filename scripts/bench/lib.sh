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

# nginx's settings every config here starts with: one worker, no log, temp files in $work.
nginx_head() { # nginx_head WORK NAME
  cat <<CONF
daemon off; worker_processes 1; pid $1/$2.pid; error_log $1/$2.log;
worker_rlimit_nofile 65536;
events { worker_connections 16384; }
CONF
}
nginx_http() { # nginx_http WORK: what opens every http block
  echo "access_log off; client_body_temp_path $1/tmp; proxy_temp_path $1/tmp;
  fastcgi_temp_path $1/tmp; uwsgi_temp_path $1/tmp; scgi_temp_path $1/tmp;
  keepalive_requests 10000000;"
}

# The backend every proxy stands in front of: nginx answering 64 bytes on PORT.
write_backend_conf() { # write_backend_conf WORK PORT
  { nginx_head "$1" backend
    echo "http { $(nginx_http "$1")"
    echo "  server { listen $2 backlog=4096; location / { return 200 \"backend ........................................................\\n\"; } } }"
  } >"$1/backend.conf"
}

# nginx proxying to the backend on PORT, its server block opening with LISTEN.
write_nginx_conf() { # write_nginx_conf WORK BACKEND_PORT LISTEN
  { nginx_head "$1" nginx
    echo "http { $(nginx_http "$1")"
    echo "  upstream b { server 127.0.0.1:$2; keepalive 64; }"
    echo "  server { $3"
    echo '    location / { proxy_pass http://b; proxy_http_version 1.1; proxy_set_header Connection ""; } } }'
  } >"$1/nginx.conf"
}

# HAProxy with one thread in front of the backend on PORT, its frontend bound by BIND.
write_haproxy_cfg() { # write_haproxy_cfg WORK BACKEND_PORT BIND
  cat >"$1/haproxy.cfg" <<CONF
global
  nbthread 1
  maxconn 4000
  tune.ssl.default-dh-param 2048
defaults
  mode http
  timeout connect 5s
  timeout client 60s
  timeout server 60s
  http-reuse always
frontend f
  $3
  default_backend b
backend b
  server s1 127.0.0.1:$2
CONF
}

# fulcrum serving WORK/fulcrum.toml with one worker on CPU 1, its flags' pool the backend
# on BACKEND_PORT; sets fulcrum_pid and adds it to pids.
start_fulcrum_config() { # start_fulcrum_config BIN WORK PORT ADMIN BACKEND_PORT
  taskset -c 1 "$1" serve --config "$2/fulcrum.toml" --listen "127.0.0.1:$3" \
    --admin "127.0.0.1:$4" --workers 1 --backend "http://127.0.0.1:$5" \
    --health-interval 60s 2>"$2/fulcrum.log" &
  fulcrum_pid=$!; pids+=($!)
}

# The opening of an nginx config that proxies to the backend on BACKEND_PORT, up to its
# server block's `listen PORT;` (the caller writes the locations and closes both blocks).
nginx_proxy_open() { # nginx_proxy_open WORK BACKEND_PORT PORT
  nginx_head "$1" nginx
  echo "http { $(nginx_http "$1")"
  echo "  upstream b { server 127.0.0.1:$2; keepalive 64; }"
  echo "  server { listen $3;"
}
