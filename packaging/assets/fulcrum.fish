# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_fulcrum_global_optspecs
    string join \n h/help V/version
end

function __fish_fulcrum_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_fulcrum_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_fulcrum_using_subcommand
    set -l cmd (__fish_fulcrum_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c fulcrum -n "__fish_fulcrum_needs_command" -s h -l help -d 'Print help'
complete -c fulcrum -n "__fish_fulcrum_needs_command" -s V -l version -d 'Print version'
complete -c fulcrum -n "__fish_fulcrum_needs_command" -f -a "serve" -d 'Run the load balancer'
complete -c fulcrum -n "__fish_fulcrum_needs_command" -f -a "demo" -d 'Run the demo: spawned backends with different latencies plus the balancer'
complete -c fulcrum -n "__fish_fulcrum_needs_command" -f -a "backend" -d 'Run a demo backend'
complete -c fulcrum -n "__fish_fulcrum_needs_command" -f -a "check" -d 'Validate a config file and exit 0 (valid) or 2 (invalid)'
complete -c fulcrum -n "__fish_fulcrum_needs_command" -f -a "lab" -d 'Compare the strategies on one scripted workload (docs/lab.md)'
complete -c fulcrum -n "__fish_fulcrum_needs_command" -f -a "completions" -d 'Print a shell completion script (bash, zsh, fish, elvish, powershell)'
complete -c fulcrum -n "__fish_fulcrum_needs_command" -f -a "manpage" -d 'Print the man page (roff) of fulcrum and every subcommand'
complete -c fulcrum -n "__fish_fulcrum_needs_command" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l config -d 'TOML config file; flags override it' -r -F
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l listen -d 'Proxy listener [default: 127.0.0.1:8080]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l tls-listen -d 'HTTPS listener (TLS 1.2 and 1.3, ALPN h2 and http/1.1); needs a certificate' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l accept-proxy-protocol -d 'Every connection on the listeners starts with a PROXY protocol header (v1 or v2), which names the client; one without is closed [default: off]' -r -f -a "on\t''
off\t''"
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l tls-cert -d 'Certificate chain (PEM) of the HTTPS listener, the default one; more in [[tls.certs]]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l tls-key -d 'Private key (PEM) of --tls-cert' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l redirect-https -d 'Answer every request on the plain listener with 308 to the same URL on https [default: off]' -r -f -a "on\t''
off\t''"
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l http3 -d 'Serve HTTP/3 (QUIC over UDP) on the tls_listen port too; also `http3` in [tls] [default: off]' -r -f -a "on\t''
off\t''"
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l admin -d 'Admin API listener [default: 127.0.0.1:9090]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l backend -d 'Backend `URL[,weight=N][,name=NAME]`; repeatable' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l discover -d 'Find the first pool\'s backends: srv=NAME, dns=NAME:PORT or file=PATH, then [,scheme=https][,interval=DUR]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l strategy -d 'Balancing strategy [default: round_robin]' -r -f -a "round_robin\t''
weighted_round_robin\t''
least_connections\t''
weighted_least_connections\t''
least_response_time\t''
peak_ewma\t''
power_of_two\t''
consistent_hash\t''
ip_hash\t''
maglev\t''
reported_load\t''"
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l hash-key -d 'Key of the hashing strategies: client_ip, header:NAME, cookie:NAME [default: client_ip]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l deny-clients -d 'Client addresses whose connections to the proxy listeners are closed at accept, before any byte or handshake, CIDR[,CIDR…]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l allow-clients -d 'When set, the only client addresses the proxy listeners take (deny_clients first), CIDR[,CIDR…]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l trusted-proxies -d 'Peers whose X-Forwarded-For is believed, CIDR[,CIDR…]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l hash-balance-factor -d 'Bounded load for the hashing strategies: a backend may hold at most F times its share of the requests in flight, F > 1; 0 = off [default: 0]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l health-path -d 'Active health check path [default: /health]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l health-interval -d 'Time between health probes [default: 5s]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l health-timeout -d 'Bound on one health probe [default: 2s]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l healthy-threshold -d 'Consecutive successes to become healthy [default: 2]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l unhealthy-threshold -d 'Consecutive failures to become unhealthy [default: 3]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l outlier-consecutive-failures -d 'Failures in a row on live traffic that eject a backend; 0 = passive checks off [default: 5]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l outlier-base-ejection -d 'Length of a first ejection; the n-th lasts n times as long [default: 30s]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l outlier-max-ejection -d 'Longest ejection [default: 300s]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l outlier-max-ejected-percent -d 'At most P % of a pool\'s backends (rounded down) ejected at once [default: 50]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l outlier-success-rate -d 'Success-rate ejection: interval=10s,min_hosts=3,min_requests=20,stdev_factor=1.9 (any subset), or off [default: off]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l queue-timeout -d 'Longest wait in a pool\'s queue when every eligible backend is at its max_conns, then 503 [default: 5s]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l max-queue -d 'Most requests waiting in a pool\'s queue; over it, 503 at once [default: 1024]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l max-backends -d 'Most backends in a pool, backups and draining ones included; a discovered list over it is refused whole [default: 1000]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l max-conns -d 'Most requests in flight on each backend of a pool that sets none itself: N (0 = no limit), or auto (follows its latency) [default: 0]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l max-conns-auto -d 'Bounds of an adaptive max_conns: min=N,max=N [default: min=1,max=1000]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l sticky-cookie -d 'Cookie-insert stickiness: a client\'s cookie NAME sends it back to the same backend [default: off]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l sticky-max-age -d 'Max-Age of the sticky cookie; 0s = a session cookie [default: 0s]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l panic-threshold -d 'Below P % of a pool\'s primary backends eligible, and no backup, balance over all of them, healthy or not; 0 = off [default: 0]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l connect-timeout -d 'TCP connect bound [default: 3s]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l protocol -d 'HTTP version to the backends: http1 (one request per connection at a time) or h2 (multiplexed; prior knowledge over http://, ALPN over https://) [default: http1]' -r -f -a "http1\t''
h2\t''"
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l send-proxy-protocol -d 'Send a PROXY protocol header naming the client in front of every backend connection (each then carries one client\'s requests) [default: off]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l tls-ca-file -d 'CA certificates (PEM) that https:// backends are verified against, instead of the system roots' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l tls-client-cert -d 'Certificate chain (PEM) presented to https:// backends that ask for a client certificate (with tls_client_key)' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l tls-client-key -d 'The private key (PEM) of tls_client_cert' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l tls-verify -d 'Verify https:// backends\' certificates and names; off only for testing (a warning is logged) [default: on]' -r -f -a "on\t''
off\t''"
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l upstream-timeout -d 'Request sent → response headers bound, then 504 [default: 30s]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l retries -d 'Extra attempts for a failed idempotent request [default: 2]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l retry-on -d 'What sends a request to another backend: connect (always), reset, timeout, a status (503) or a class (5xx), ENTRY[,ENTRY…] [default: connect,reset,timeout]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l retry-non-idempotent -d 'Send any method again after a failure or a retry_on status, not only GET, HEAD, OPTIONS, PUT and DELETE [default: off]' -r -f -a "on\t''
off\t''"
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l retry-body-limit -d 'Largest request body (of stated length) kept so that a retry_on status can send it again; a larger one is not retried on status [default: 64k]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l try-timeout -d 'Each try\'s bound on its answer head, retried as timeout; upstream_timeout bounds them all [default: none]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l hedge-after -d 'Send an idempotent request without a body to another backend too when no answer head came after DUR, or after the pool\'s pNN latency (p95); the first answer wins [default: off]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l hedge-max -d 'Most hedges one request sends, each after hedge.after more; within retries and the retry budget [default: 1]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l max-inflight -d 'Above N requests in flight answer 503 at once; 0 = off [default: 0]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l compress-max-in-flight -d 'Most answers compressed at once; beyond it answers go out uncompressed [default: 1024]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l max-connections-per-client -d 'Connections one client IP may hold open, all listeners together; a new one over it is closed at once (0 = no limit) [default: 0]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l max-connections -d 'Client connections open at once on the proxy listener; at the cap new ones wait in the kernel\'s queue; 0 = from the open-file limit [default: 0]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l send-timeout -d 'A client that takes no byte of an answer for this long is closed, and its slot freed [default: 60s]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l max-request-body -d 'Largest request body (512k, 1m, 2g); a larger one gets 413; 0 = no limit [default: 0]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l upgrade-protocols -d 'Protocols an Upgrade request is tunnelled for, NAME[,NAME…]; any other Upgrade is removed and the request goes on as plain HTTP [default: websocket]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l slow-start -d 'Weight ramp for joining backends [default: 0s]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l ewma-alpha -d 'Smoothing factor of the latency average, 0 < F <= 1 [default: 0.1]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l admin-token-file -d 'File holding the admin bearer token' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l store -d 'Fleet mode: pools, backends and routes live in etcd at etcd://HOST:PORT[,HOST:PORT…]/PREFIX, shared by every instance' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l resolvers -d 'DNS servers that discovery asks (IP or IP:PORT, port 53 by default) [default: the nameservers of /etc/resolv.conf]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l upgrade-socket -d 'Unix socket where a new fulcrum started with --upgrade takes the listening sockets over' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l workers -d 'Threads serving traffic [default: number of CPU cores]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l log-format -d 'Log format on stderr: text or json [default: text]' -r -f -a "text\t''
json\t''"
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l access-log -d 'One access log line per request: on stderr (on, stderr), off, or appended to FILE (reopened on SIGUSR1) [default: on]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l trace-context -d 'Give a request without a W3C traceparent one, its trace id from the request id (a traceparent is always forwarded) [default: off]' -r -f -a "on\t''
off\t''"
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l access-log-format -d 'The access log\'s lines: text, json or combined (Apache\'s) [default: as --log-format]' -r -f -a "text\t''
json\t''
combined\t''"
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -l upgrade -d 'Take the listening sockets over from the fulcrum at --upgrade-socket, which then drains and exits'
complete -c fulcrum -n "__fish_fulcrum_using_subcommand serve" -s h -l help -d 'Print help'
complete -c fulcrum -n "__fish_fulcrum_using_subcommand demo" -l listen -d 'Proxy listener' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand demo" -l admin -d 'Admin API listener' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand demo" -l backends -d 'Number of demo backends' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand demo" -l strategy -d 'Balancing strategy' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand demo" -l tls-listen -d 'HTTPS listener with --tls' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand demo" -l tls -d 'Serve the proxy over HTTPS too, with a self-signed certificate made at start'
complete -c fulcrum -n "__fish_fulcrum_using_subcommand demo" -s h -l help -d 'Print help'
complete -c fulcrum -n "__fish_fulcrum_using_subcommand backend" -l listen -d 'Address to listen on' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand backend" -l name -d 'Name reported in every answer [default: the listen address]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand backend" -l latency-ms -d 'Latency of every answer, in milliseconds' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand backend" -l jitter-ms -d 'Uniform jitter around the latency, ± milliseconds' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand backend" -l error-rate -d 'Share of requests answered with 500, 0..=1' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand backend" -l max-concurrency -d 'At most N requests served at once; the others wait inside the backend' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand backend" -l slow-after -d 'From this long after start on, every answer is --slow-factor times slower' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand backend" -l slow-factor -d 'How much slower after --slow-after' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand backend" -l fail-bursts -d 'Failure bursts: the first half of every period this long is answered 500' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand backend" -l cold-for -d 'A cold start: ten times slower at start, back to normal over this long' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand backend" -l brownout-after -d 'A brownout: from this long after start on, a third of the answers are 503, at once' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand backend" -l listen-fd -d 'Serve on this already-bound listening socket instead of binding --listen (used by fulcrum for the backends it spawns)' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand backend" -l clock-on-stdin -d 'Start the script\'s clock (--slow-after, --fail-bursts, --cold-for, --brownout-after) when a line arrives on stdin instead of at start'
complete -c fulcrum -n "__fish_fulcrum_using_subcommand backend" -l report-load -d 'Report its load in every answer (`endpoint-load-metrics`: utilization = requests in flight ÷ its concurrency, averaged over the last second, and requests per second)'
complete -c fulcrum -n "__fish_fulcrum_using_subcommand backend" -l tcp -d 'Serve a TCP line protocol instead of HTTP: each line is a query, answered with the name after the latency, which grows with the connections held open'
complete -c fulcrum -n "__fish_fulcrum_using_subcommand backend" -s h -l help -d 'Print help'
complete -c fulcrum -n "__fish_fulcrum_using_subcommand check" -l config -d 'The config file to validate' -r -F
complete -c fulcrum -n "__fish_fulcrum_using_subcommand check" -s h -l help -d 'Print help'
complete -c fulcrum -n "__fish_fulcrum_using_subcommand lab" -l scenario -d 'slow-backend, flapping, heterogeneous, warmup, hot-key, overload, brownout or long-lived (a TCP pool)' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand lab" -l strategies -d '`all`, or strategy names separated by commas; a name may end in `+bounded`, `+auto`, `+unlimited` or `+success_rate` (docs/lab.md, "Rows")' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand lab" -l seconds -d 'Seconds of load per strategy (at most 120)' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand lab" -l rps -d 'Requests per second offered [default: the scenario\'s]' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand lab" -l seed -d 'Seed of the schedule: the same seed sends the same requests at the same times' -r
complete -c fulcrum -n "__fish_fulcrum_using_subcommand lab" -l json -d 'Also write the report as JSON here' -r -F
complete -c fulcrum -n "__fish_fulcrum_using_subcommand lab" -l svg -d 'Also write the chart as SVG here' -r -F
complete -c fulcrum -n "__fish_fulcrum_using_subcommand lab" -l progress-json -d 'Progress as one JSON object per line on stderr, for programs'
complete -c fulcrum -n "__fish_fulcrum_using_subcommand lab" -s h -l help -d 'Print help'
complete -c fulcrum -n "__fish_fulcrum_using_subcommand completions" -s h -l help -d 'Print help'
complete -c fulcrum -n "__fish_fulcrum_using_subcommand manpage" -s h -l help -d 'Print help'
complete -c fulcrum -n "__fish_fulcrum_using_subcommand help; and not __fish_seen_subcommand_from serve demo backend check lab completions manpage help" -f -a "serve" -d 'Run the load balancer'
complete -c fulcrum -n "__fish_fulcrum_using_subcommand help; and not __fish_seen_subcommand_from serve demo backend check lab completions manpage help" -f -a "demo" -d 'Run the demo: spawned backends with different latencies plus the balancer'
complete -c fulcrum -n "__fish_fulcrum_using_subcommand help; and not __fish_seen_subcommand_from serve demo backend check lab completions manpage help" -f -a "backend" -d 'Run a demo backend'
complete -c fulcrum -n "__fish_fulcrum_using_subcommand help; and not __fish_seen_subcommand_from serve demo backend check lab completions manpage help" -f -a "check" -d 'Validate a config file and exit 0 (valid) or 2 (invalid)'
complete -c fulcrum -n "__fish_fulcrum_using_subcommand help; and not __fish_seen_subcommand_from serve demo backend check lab completions manpage help" -f -a "lab" -d 'Compare the strategies on one scripted workload (docs/lab.md)'
complete -c fulcrum -n "__fish_fulcrum_using_subcommand help; and not __fish_seen_subcommand_from serve demo backend check lab completions manpage help" -f -a "completions" -d 'Print a shell completion script (bash, zsh, fish, elvish, powershell)'
complete -c fulcrum -n "__fish_fulcrum_using_subcommand help; and not __fish_seen_subcommand_from serve demo backend check lab completions manpage help" -f -a "manpage" -d 'Print the man page (roff) of fulcrum and every subcommand'
complete -c fulcrum -n "__fish_fulcrum_using_subcommand help; and not __fish_seen_subcommand_from serve demo backend check lab completions manpage help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
