_fulcrum() {
    local i cur prev opts cmd
    COMPREPLY=()
    if [[ "${BASH_VERSINFO[0]}" -ge 4 ]]; then
        cur="$2"
    else
        cur="${COMP_WORDS[COMP_CWORD]}"
    fi
    prev="$3"
    cmd=""
    opts=""

    for i in "${COMP_WORDS[@]:0:COMP_CWORD}"
    do
        case "${cmd},${i}" in
            ",$1")
                cmd="fulcrum"
                ;;
            fulcrum,backend)
                cmd="fulcrum__subcmd__backend"
                ;;
            fulcrum,check)
                cmd="fulcrum__subcmd__check"
                ;;
            fulcrum,completions)
                cmd="fulcrum__subcmd__completions"
                ;;
            fulcrum,demo)
                cmd="fulcrum__subcmd__demo"
                ;;
            fulcrum,help)
                cmd="fulcrum__subcmd__help"
                ;;
            fulcrum,lab)
                cmd="fulcrum__subcmd__lab"
                ;;
            fulcrum,manpage)
                cmd="fulcrum__subcmd__manpage"
                ;;
            fulcrum,serve)
                cmd="fulcrum__subcmd__serve"
                ;;
            fulcrum__subcmd__help,backend)
                cmd="fulcrum__subcmd__help__subcmd__backend"
                ;;
            fulcrum__subcmd__help,check)
                cmd="fulcrum__subcmd__help__subcmd__check"
                ;;
            fulcrum__subcmd__help,completions)
                cmd="fulcrum__subcmd__help__subcmd__completions"
                ;;
            fulcrum__subcmd__help,demo)
                cmd="fulcrum__subcmd__help__subcmd__demo"
                ;;
            fulcrum__subcmd__help,help)
                cmd="fulcrum__subcmd__help__subcmd__help"
                ;;
            fulcrum__subcmd__help,lab)
                cmd="fulcrum__subcmd__help__subcmd__lab"
                ;;
            fulcrum__subcmd__help,manpage)
                cmd="fulcrum__subcmd__help__subcmd__manpage"
                ;;
            fulcrum__subcmd__help,serve)
                cmd="fulcrum__subcmd__help__subcmd__serve"
                ;;
            *)
                ;;
        esac
    done

    case "${cmd}" in
        fulcrum)
            opts="-h -V --help --version serve demo backend check lab completions manpage help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 1 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        fulcrum__subcmd__backend)
            opts="-h --listen --name --latency-ms --jitter-ms --error-rate --max-concurrency --slow-after --slow-factor --fail-bursts --cold-for --brownout-after --clock-on-stdin --report-load --tcp --listen-fd --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --listen)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --name)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --latency-ms)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --jitter-ms)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --error-rate)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-concurrency)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --slow-after)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --slow-factor)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --fail-bursts)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --cold-for)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --brownout-after)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --listen-fd)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        fulcrum__subcmd__check)
            opts="-h --config --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --config)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        fulcrum__subcmd__completions)
            opts="-h --help bash elvish fish powershell zsh"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        fulcrum__subcmd__demo)
            opts="-h --listen --admin --backends --strategy --tls --tls-listen --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --listen)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --admin)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --backends)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --strategy)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --tls-listen)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        fulcrum__subcmd__help)
            opts="serve demo backend check lab completions manpage help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        fulcrum__subcmd__help__subcmd__backend)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        fulcrum__subcmd__help__subcmd__check)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        fulcrum__subcmd__help__subcmd__completions)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        fulcrum__subcmd__help__subcmd__demo)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        fulcrum__subcmd__help__subcmd__help)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        fulcrum__subcmd__help__subcmd__lab)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        fulcrum__subcmd__help__subcmd__manpage)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        fulcrum__subcmd__help__subcmd__serve)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        fulcrum__subcmd__lab)
            opts="-h --scenario --strategies --seconds --rps --seed --json --progress-json --svg --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --scenario)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --strategies)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --seconds)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --rps)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --seed)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --json)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --svg)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        fulcrum__subcmd__manpage)
            opts="-h --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        fulcrum__subcmd__serve)
            opts="-h --config --upgrade --listen --tls-listen --accept-proxy-protocol --tls-cert --tls-key --redirect-https --http3 --admin --backend --discover --strategy --hash-key --deny-clients --allow-clients --trusted-proxies --hash-balance-factor --health-path --health-interval --health-timeout --healthy-threshold --unhealthy-threshold --outlier-consecutive-failures --outlier-base-ejection --outlier-max-ejection --outlier-max-ejected-percent --outlier-success-rate --queue-timeout --max-queue --max-backends --max-conns --max-conns-auto --sticky-cookie --sticky-max-age --panic-threshold --connect-timeout --protocol --send-proxy-protocol --tls-ca-file --tls-client-cert --tls-client-key --tls-verify --upstream-timeout --retries --retry-on --retry-non-idempotent --retry-body-limit --try-timeout --hedge-after --hedge-max --max-inflight --compress-max-in-flight --max-connections-per-client --max-connections --send-timeout --max-request-body --upgrade-protocols --slow-start --ewma-alpha --admin-token-file --store --resolvers --upgrade-socket --workers --log-format --access-log --trace-context --access-log-format --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --config)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --listen)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --tls-listen)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --accept-proxy-protocol)
                    COMPREPLY=($(compgen -W "on off" -- "${cur}"))
                    return 0
                    ;;
                --tls-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --tls-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --redirect-https)
                    COMPREPLY=($(compgen -W "on off" -- "${cur}"))
                    return 0
                    ;;
                --http3)
                    COMPREPLY=($(compgen -W "on off" -- "${cur}"))
                    return 0
                    ;;
                --admin)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --backend)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --discover)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --strategy)
                    COMPREPLY=($(compgen -W "round_robin weighted_round_robin least_connections weighted_least_connections least_response_time peak_ewma power_of_two consistent_hash ip_hash maglev reported_load" -- "${cur}"))
                    return 0
                    ;;
                --hash-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --deny-clients)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --allow-clients)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --trusted-proxies)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --hash-balance-factor)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --health-path)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --health-interval)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --health-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --healthy-threshold)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --unhealthy-threshold)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --outlier-consecutive-failures)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --outlier-base-ejection)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --outlier-max-ejection)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --outlier-max-ejected-percent)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --outlier-success-rate)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --queue-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-queue)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-backends)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-conns)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-conns-auto)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --sticky-cookie)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --sticky-max-age)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --panic-threshold)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --connect-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --protocol)
                    COMPREPLY=($(compgen -W "http1 h2" -- "${cur}"))
                    return 0
                    ;;
                --send-proxy-protocol)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --tls-ca-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --tls-client-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --tls-client-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --tls-verify)
                    COMPREPLY=($(compgen -W "on off" -- "${cur}"))
                    return 0
                    ;;
                --upstream-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --retries)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --retry-on)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --retry-non-idempotent)
                    COMPREPLY=($(compgen -W "on off" -- "${cur}"))
                    return 0
                    ;;
                --retry-body-limit)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --try-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --hedge-after)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --hedge-max)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-inflight)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --compress-max-in-flight)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-connections-per-client)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-connections)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --send-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-request-body)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --upgrade-protocols)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --slow-start)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --ewma-alpha)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --admin-token-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --store)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --resolvers)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --upgrade-socket)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --workers)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --log-format)
                    COMPREPLY=($(compgen -W "text json" -- "${cur}"))
                    return 0
                    ;;
                --access-log)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --trace-context)
                    COMPREPLY=($(compgen -W "on off" -- "${cur}"))
                    return 0
                    ;;
                --access-log-format)
                    COMPREPLY=($(compgen -W "text json combined" -- "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
    esac
}

if [[ "${BASH_VERSINFO[0]}" -eq 4 && "${BASH_VERSINFO[1]}" -ge 4 || "${BASH_VERSINFO[0]}" -gt 4 ]]; then
    complete -F _fulcrum -o nosort -o bashdefault -o default fulcrum
else
    complete -F _fulcrum -o bashdefault -o default fulcrum
fi
