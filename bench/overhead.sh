#!/usr/bin/env bash
# Proxy overhead benchmark (a benchmark, not a test; docs/performance.md "Proxy overhead vs
# nginx"). In one run it measures, with wrk, the same POST /v1/chat/completions
#   direct   wrk -> stub
#   nginx       wrk -> Debian nginx (proxy_pass, keep-alive upstream, round robin) -> 2 stubs
#   haproxy     wrk -> Debian HAProxy (nbthread 1, keep-alive to the stubs, round robin) -> 2 stubs
#   kvroute     wrk -> build/kvroute --policy round_robin -> 2 stubs
#   kvroute-ca  wrk -> build/kvroute --policy cache_aware -> 2 stubs (only the CA_BODIES cells)
# for a 247 B and an 8 KB JSON chat request (both "model":"m"), an SSE answer of 20 events and
# a real multi-turn request ("tau": the first turns of a tau-bench airline conversation from
# data/, ~30 KB, system prompt + user, assistant and tool messages),
# then counts syscalls per request (nginx, kvroute; 8 KB) and profiles kvroute with perf
# (callgrind when perf is not permitted) during extra 8 KB, 247 B and chunked-SSE runs.
# The stubs are one nginx (worker_processes 1) listening on two ports and answering from
# `return 200 '<fixed JSON>'`; SSE comes either from one `return` (cell "sse", as in the issue)
# or chunked with one flush per event via Debian's echo module (cell "ssechunk", closer to how
# vLLM writes a stream; skipped when the module is missing).
#
# Everything binds 127.0.0.1 on free ports; every process started here is recorded by pid and
# only those are stopped (trap on exit). Every wait is bounded.
#
# Usage: bench/overhead.sh            (from the repository root; ~3.5 min with the defaults)
# Environment (defaults in brackets):
#   DURATION [8]   seconds per measured cell      WARMUP [2]   seconds of warm-up per cell
#   CONNS [32]     wrk connections                THREADS [1]  wrk threads
#   REPEAT [1]     runs per cell (the table shows the run with the median req/s)
#   PATHS ["direct nginx haproxy kvroute kvroute-ca"]   BODIES ["247 8k sse ssechunk tau"]
#   CA_BODIES ["tau"]  cells measured on kvroute-ca too
#   TAU_BYTES [30000]  the tau cell's body: the longest conversation prefix not above this
#   KVROUTE [build/kvroute]          PROFILE [1]  (0 = no profile)
#   KVROUTE_ARGS [""]  extra kvroute flags, e.g. "--upstream-client curl" (split on blanks)
#   PROFILE_BODIES ["8k 247 ssechunk"]  cells profiled with perf, one extra run each
#   PROFILE_CA_BODIES ["tau"]            cells profiled on kvroute-ca
#   SYSCALLS [1]   count syscalls per request of nginx and kvroute, one extra run each
#   SYSCALL_BODY [8k]  the cell whose syscalls are counted
#   OUT [out/overhead]  results: overhead.md, results.tsv, raw wrk output, profile reports
#   KEEP_TMP [0]   1 keeps the temp dir (nginx configs, logs, perf.data)
set -euo pipefail

DURATION=${DURATION:-8}
WARMUP=${WARMUP:-2}
CONNS=${CONNS:-32}
THREADS=${THREADS:-1}
REPEAT=${REPEAT:-1}
PATHS=${PATHS:-"direct nginx haproxy kvroute kvroute-ca"}
BODIES=${BODIES:-"247 8k sse ssechunk tau"}
CA_BODIES=${CA_BODIES:-"tau"}
TAU_BYTES=${TAU_BYTES:-30000}
KVROUTE=${KVROUTE:-build/kvroute}
KVROUTE_ARGS=${KVROUTE_ARGS:-}
PROFILE=${PROFILE:-1}
OUT=${OUT:-out/overhead}
KEEP_TMP=${KEEP_TMP:-0}

HERE=$(cd "$(dirname "$0")" && pwd)
LUA="$HERE/overhead.lua"
CLK_TCK=$(getconf CLK_TCK)
NCPU=$(nproc)

die() { echo "overhead.sh: $*" >&2; exit 1; }
log() { echo "[$(date +%H:%M:%S)] $*" >&2; }
for tool in wrk nginx curl python3 awk; do
    command -v "$tool" >/dev/null || die "$tool not found (scripts/install-deps.sh installs it)"
done
NGINX=$(command -v nginx)

# ---------------------------------------------------------------- process bookkeeping
TMP=$(mktemp -d /tmp/kvr-overhead.XXXXXX)
chmod 755 "$TMP" # nginx workers drop to "nobody" when started as root; they must reach $TMP
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
MAIN_PIDS=()  # processes started here (stopped first, with TERM)
CHILD_PIDS=() # their children we know of (nginx workers), as pid:comm
cleanup() {
    set +e
    local p pid comm i
    for p in "${MAIN_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in "${MAIN_PIDS[@]}"; do
        for ((i = 0; i < 50; i++)); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null
        wait "$p" 2>/dev/null
    done
    for p in "${CHILD_PIDS[@]}"; do
        pid=${p%%:*}
        comm=${p#*:}
        # Only a pid that still is the process recorded (not reused by another program).
        if [[ -r /proc/$pid/comm && "$(cat "/proc/$pid/comm" 2>/dev/null)" == "$comm" ]]; then
            kill -KILL "$pid" 2>/dev/null
        fi
    done
    if [[ $KEEP_TMP == 1 ]]; then echo "temp dir kept: $TMP" >&2; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

forget_pid() { # pid: drop from MAIN_PIDS once we stopped it ourselves
    local keep=() p
    for p in "${MAIN_PIDS[@]}"; do [[ $p == "$1" ]] || keep+=("$p"); done
    MAIN_PIDS=("${keep[@]}")
}

stop_pid() { # pid: TERM, wait <= 10 s, KILL
    local p=$1 i
    kill -TERM "$p" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
    forget_pid "$p"
}

free_ports() { # n: prints n distinct free TCP ports on 127.0.0.1, below the ephemeral range
    python3 - "$1" <<'EOF'
import random, socket, sys
n, got, socks = int(sys.argv[1]), [], []
lo = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
lo, hi = (20000, lo - 1) if lo > 21000 else (10000, 19999)
for _ in range(2000):
    if len(got) == n:
        break
    p = random.randint(lo, hi)
    if p in got:
        continue
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p))
    except OSError:
        s.close()
        continue
    socks.append(s)
    got.append(p)
print(" ".join(map(str, got)))
EOF
}

wait_http() { # url seconds: until the port answers HTTP at all
    local url=$1 secs=$2 i
    for ((i = 0; i < secs * 10; i++)); do
        if curl -s -o /dev/null --max-time 1 "$url"; then return 0; fi
        sleep 0.1
    done
    return 1
}

cpu_ticks() { # pids...: sum of utime+stime (clock ticks) of these processes (all threads)
    local t=0 p s f
    for p in "$@"; do
        s=$(cat "/proc/$p/stat" 2>/dev/null) || continue
        read -r -a f <<<"${s##*) }"
        t=$((t + f[11] + f[12]))
    done
    echo "$t"
}

host_busy() { # prints "busy total" jiffies of all CPUs from /proc/stat
    awk '/^cpu /{b=$2+$3+$4+$7+$8+$9; print b, b+$5+$6; exit}' /proc/stat
}

# ---------------------------------------------------------------- request bodies
make_body() { # size stream(0/1) file: a chat request of exactly `size` bytes
    local size=$1 stream=$2 file=$3 pre post pad text=""
    pre='{"model":"m","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"'
    post='"}],"max_tokens":16,"temperature":0}'
    [[ $stream == 1 ]] && post='"}],"max_tokens":16,"temperature":0,"stream":true}'
    pad=$((size - ${#pre} - ${#post}))
    ((pad > 0)) || die "body size $size too small"
    while ((${#text} < pad)); do
        text+="Explain how a prefix cache lets an inference server reuse the KV cache blocks. "
    done
    printf '%s%s%s' "$pre" "${text:0:pad}" "$post" >"$file"
    [[ $(wc -c <"$file") == "$size" ]] || die "body $file is not $size bytes"
}
make_body 247 0 "$TMP/body-247.json"
make_body 8192 0 "$TMP/body-8k.json"
make_body 247 1 "$TMP/body-sse.json"
cp "$TMP/body-sse.json" "$TMP/body-ssechunk.json"
# The multi-turn cell: a tau-bench conversation's longest prefix of whole messages whose chat
# request stays within TAU_BYTES (the longest such prefix over all conversations).
TAU_DATA="$HERE/../data/tau-bench-airline-gpt4o/trajectories.jsonl"
if [[ " $BODIES " == *" tau "* ]]; then
    if [[ -r $TAU_DATA ]]; then
        python3 - "$TAU_DATA" "$TAU_BYTES" "$TMP/body-tau.json" <<'PYEOF'
import json, sys
src, cap, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
best = b""
for line in open(src, encoding="utf-8"):
    msgs = json.loads(line)["messages"]
    for k in range(2, len(msgs) + 1):
        body = json.dumps({"model": "m", "messages": msgs[:k], "max_tokens": 16,
                           "temperature": 0}, separators=(",", ":")).encode()
        if len(body) > cap:
            break
        if len(body) > len(best):
            best = body
open(out, "wb").write(best)
PYEOF
        TAU_SIZE=$(wc -c <"$TMP/body-tau.json")
    else
        BODIES=${BODIES//tau/}
        log "no $TAU_DATA: skipping the tau cells"
    fi
fi

# ---------------------------------------------------------------- stub responses
# A 285-byte non-streamed chat completion (with usage, so kvroute's usage accounting runs).
JSON_RESP='{"id":"chatcmpl-bench0000000000","object":"chat.completion","created":1700000000,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Prefix caching reuses KV blocks."},"finish_reason":"stop"}],"usage":{"prompt_tokens":42,"total_tokens":51,"completion_tokens":9}}'
# 20 chunk events (the last one with finish_reason and usage), then [DONE].
sse_event() { # i
    local fin=null usage=""
    if (($1 == 20)); then fin='"stop"'; usage=',"usage":{"prompt_tokens":42,"total_tokens":62,"completion_tokens":20}'; fi
    printf 'data: {"id":"chatcmpl-bench0000000000","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[{"index":0,"delta":{"content":"tok%02d "},"logprobs":null,"finish_reason":%s}]%s}\n\n' "$1" "$fin" "$usage"
}
SSE_RESP=""
for i in $(seq 1 20); do SSE_RESP+=$(sse_event "$i"; echo x); SSE_RESP=${SSE_RESP%x}; done
SSE_RESP+=$'data: [DONE]\n\n'
ngx_quote() { # text -> nginx single-quoted string with \n escapes ('$' must not appear)
    local s=$1
    s=${s//\\/\\\\}
    s=${s//\'/\\\'}
    s=${s//$'\n'/\\n}
    printf "'%s'" "$s"
}
[[ $JSON_RESP != *'$'* && $SSE_RESP != *'$'* ]] || die "stub bodies must not contain \$"

ECHO_MOD=/usr/lib/nginx/modules/ngx_http_echo_module.so
ECHO_LOCATION=""
ECHO_LOAD=""
if [[ -r $ECHO_MOD ]]; then
    ECHO_LOAD="load_module $ECHO_MOD;"
    ECHO_LOCATION="location = /__ssechunk { internal; default_type text/event-stream;"
    for i in $(seq 1 20); do
        ev=$(sse_event "$i")
        # echo -n + echo_flush: one chunk and one write per event, like a token stream.
        ECHO_LOCATION+=" echo -n $(ngx_quote "$ev"$'\n\n'); echo_flush;"
    done
    ECHO_LOCATION+=" echo -n $(ngx_quote $'data: [DONE]\n\n'); }"
else
    BODIES=${BODIES//ssechunk/}
    log "echo module not installed: skipping the ssechunk cells"
fi

read -r P_STUB1 P_STUB2 P_NGX P_NGX_SSE P_KVR P_KVR_CG P_HAP P_KCA <<<"$(free_ports 8)"
[[ -n ${P_KCA:-} ]] || die "could not find free ports"

ngx_common() { # name: main-context and http-context lines shared by both nginx instances
    local d="$TMP/$1"
    mkdir -p "$d"
    cat <<EOF
worker_processes 1;
pid $d/nginx.pid;
error_log $d/error.log warn;
$ECHO_LOAD
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $d/client_body_temp;
    proxy_temp_path $d/proxy_temp;
    fastcgi_temp_path $d/fastcgi_temp;
    uwsgi_temp_path $d/uwsgi_temp;
    scgi_temp_path $d/scgi_temp;
    client_body_buffer_size 64k;
    client_max_body_size 1m;
    keepalive_requests 10000000;
    keepalive_timeout 75s;
EOF
}

{
    ngx_common stub
    cat <<EOF
    server {
        listen 127.0.0.1:$P_STUB1;
        listen 127.0.0.1:$P_STUB2;
        location = /v1/chat/completions {
            if (\$http_x_bench_mode = "sse") { rewrite ^ /__sse last; }
            if (\$http_x_bench_mode = "ssechunk") { rewrite ^ /__ssechunk last; }
            default_type application/json;
            return 200 $(ngx_quote "$JSON_RESP");
        }
        location = /__sse { internal; default_type text/event-stream; return 200 $(ngx_quote "$SSE_RESP"); }
        $ECHO_LOCATION
        location = /health { return 200 'ok'; }
    }
}
EOF
} >"$TMP/stub.conf"

{
    ngx_common proxy
    cat <<EOF
    upstream stubs {
        server 127.0.0.1:$P_STUB1;
        server 127.0.0.1:$P_STUB2;
        keepalive 128;
        keepalive_requests 10000000;
    }
    server {   # JSON cells: nginx's default proxy_buffering on
        listen 127.0.0.1:$P_NGX;
        location / {
            proxy_pass http://stubs;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
    server {   # SSE cells: buffering off, as an SSE deployment must
        listen 127.0.0.1:$P_NGX_SSE;
        location / {
            proxy_pass http://stubs;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }
    }
}
EOF
} >"$TMP/proxy.conf"

start_nginx() { # name: starts nginx with $TMP/<name>.conf; sets LAST_PID to the master
    local name=$1
    "$NGINX" -t -q -p "$TMP/$name/" -c "$TMP/$name.conf" -e "$TMP/$name/error.log" \
        >"$TMP/$name.test" 2>&1 || { cat "$TMP/$name.test" >&2; die "nginx $name config invalid"; }
    "$NGINX" -p "$TMP/$name/" -c "$TMP/$name.conf" -e "$TMP/$name/error.log" \
        -g 'daemon off;' >"$TMP/$name.out" 2>&1 &
    LAST_PID=$!
    MAIN_PIDS+=("$LAST_PID")
}
nginx_workers() { # master pid: records its worker pids, sets WORKERS to them
    local w
    WORKERS=""
    for w in $(pgrep -P "$1" || true); do
        CHILD_PIDS+=("$w:$(cat "/proc/$w/comm" 2>/dev/null)")
        WORKERS+="$w "
    done
}

log "starting stub nginx on 127.0.0.1:$P_STUB1 and :$P_STUB2"
start_nginx stub
STUB_PID=$LAST_PID
wait_http "http://127.0.0.1:$P_STUB1/health" 10 || { cat "$TMP/stub/error.log" >&2; die "stub nginx did not start"; }
wait_http "http://127.0.0.1:$P_STUB2/health" 10 || die "stub nginx second port did not start"
nginx_workers "$STUB_PID"
STUB_PIDS="$STUB_PID $WORKERS"

NGX_PIDS=""
if [[ " $PATHS " == *" nginx "* ]]; then
    log "starting proxy nginx on 127.0.0.1:$P_NGX (json) and :$P_NGX_SSE (sse)"
    start_nginx proxy
    NGX_PID=$LAST_PID
    wait_http "http://127.0.0.1:$P_NGX/health" 10 || { cat "$TMP/proxy/error.log" >&2; die "proxy nginx did not start"; }
    nginx_workers "$NGX_PID"
    NGX_PIDS="$NGX_PID $WORKERS"
fi

HAP_PIDS=""
HAP_NOTE=""
if [[ " $PATHS " == *" haproxy "* ]]; then
    if ! command -v haproxy >/dev/null; then
        HAP_NOTE="haproxy not installed (scripts/install-deps.sh installs it)"
    else
        mkdir -p "$TMP/haproxy"
        # One thread like nginx's one worker; HTTP keep-alive to the stubs with connection
        # reuse ("always": the stubs are ours).
        cat >"$TMP/haproxy.cfg" <<HAPEOF
global
    nbthread 1
    maxconn 4096
    pidfile $TMP/haproxy/haproxy.pid
defaults
    mode http
    timeout connect 5s
    timeout client 75s
    timeout server 75s
    timeout http-keep-alive 75s
    option http-keep-alive
    http-reuse always
frontend fe
    bind 127.0.0.1:$P_HAP
    default_backend stubs
backend stubs
    balance roundrobin
    server s1 127.0.0.1:$P_STUB1
    server s2 127.0.0.1:$P_STUB2
HAPEOF
        if haproxy -c -q -f "$TMP/haproxy.cfg" >"$TMP/haproxy.test" 2>&1; then
            log "starting haproxy on 127.0.0.1:$P_HAP"
            haproxy -db -f "$TMP/haproxy.cfg" >"$TMP/haproxy.out" 2>&1 &
            HAP_PIDS=$!
            MAIN_PIDS+=("$HAP_PIDS")
            if ! wait_http "http://127.0.0.1:$P_HAP/health" 10; then
                HAP_NOTE="haproxy did not answer"
                stop_pid "$HAP_PIDS"
                HAP_PIDS=""
            fi
        else
            HAP_NOTE="haproxy config refused: $(head -c 200 "$TMP/haproxy.test" | tr '\n' ' ')"
        fi
    fi
    [[ -z $HAP_NOTE ]] || log "haproxy cells skipped: $HAP_NOTE"
fi

KVR_PID=""
KVR_NOTE=""
KCA_PID=""
start_kvroute() { # port [wrapper...]: starts kvroute, sets LAST_PID (POLICY: round_robin)
    local port=$1
    shift
    "$@" "$KVROUTE" --worker "http://127.0.0.1:$P_STUB1" --worker "http://127.0.0.1:$P_STUB2" \
        --model m --policy "${POLICY:-round_robin}" --host 127.0.0.1 --port "$port" \
        --health-interval-ms 0 --log-level warn $KVROUTE_ARGS >>"$TMP/kvroute-$port.log" 2>&1 &
    LAST_PID=$!
    MAIN_PIDS+=("$LAST_PID")
}
if [[ " $PATHS " == *" kvroute "* ]]; then
    if [[ ! -x $KVROUTE ]]; then
        KVR_NOTE="$KVROUTE not built"
    else
        log "starting kvroute on 127.0.0.1:$P_KVR"
        start_kvroute "$P_KVR"
        KVR_PID=$LAST_PID
        if ! wait_http "http://127.0.0.1:$P_KVR/healthz" 10; then
            KVR_NOTE="kvroute did not answer on :$P_KVR ($(tail -c 300 "$TMP/kvroute-$P_KVR.log" | tr '\n' ' '))"
            stop_pid "$KVR_PID"
            KVR_PID=""
        fi
    fi
    [[ -z $KVR_NOTE ]] || log "kvroute cells skipped: $KVR_NOTE"
fi
if [[ " $PATHS " == *" kvroute-ca "* && -x $KVROUTE ]]; then
    log "starting kvroute --policy cache_aware on 127.0.0.1:$P_KCA"
    POLICY=cache_aware start_kvroute "$P_KCA"
    KCA_PID=$LAST_PID
    if ! wait_http "http://127.0.0.1:$P_KCA/healthz" 10; then
        log "kvroute-ca cells skipped: it did not answer"
        stop_pid "$KCA_PID"
        KCA_PID=""
    fi
fi

url_of() { # path body
    case $1 in
    direct) echo "http://127.0.0.1:$P_STUB1/v1/chat/completions" ;;
    nginx) if [[ $2 == sse* ]]; then echo "http://127.0.0.1:$P_NGX_SSE/v1/chat/completions"; else echo "http://127.0.0.1:$P_NGX/v1/chat/completions"; fi ;;
    haproxy) echo "http://127.0.0.1:$P_HAP/v1/chat/completions" ;;
    kvroute) echo "http://127.0.0.1:$P_KVR/v1/chat/completions" ;;
    kvroute-ca) echo "http://127.0.0.1:$P_KCA/v1/chat/completions" ;;
    esac
}
label() { case $1 in 247) echo "247 B JSON" ;; 8k) echo "8 KB JSON" ;; sse) echo "SSE 20 events (one write)" ;; ssechunk) echo "SSE 20 events (chunked, flush/event)" ;; tau) echo "tau-bench multi-turn, ${TAU_SIZE:-?} B JSON" ;; esac; }
mode_of() { case $1 in sse | ssechunk) echo "$1" ;; *) echo json ;; esac; }
proxy_pids_of() { case $1 in nginx) echo "$NGX_PIDS" ;; haproxy) echo "$HAP_PIDS" ;; kvroute) echo "$KVR_PID" ;; kvroute-ca) echo "$KCA_PID" ;; *) echo "" ;; esac; }

check_cell() { # path body: one request by curl; the answer must be the stub's, complete
    local url mode code hdr=() out="$TMP/check.out"
    url=$(url_of "$1" "$2")
    mode=$(mode_of "$2")
    [[ $mode == json ]] || hdr=(-H "X-Bench-Mode: $mode")
    code=$(curl -s -o "$out" -w '%{http_code}' --max-time 5 -X POST \
        -H 'Content-Type: application/json' "${hdr[@]}" \
        --data-binary "@$TMP/body-$2.json" "$url") || code="curl-failed"
    if [[ $code != 200 ]]; then
        echo "HTTP $code: $(head -c 200 "$out" 2>/dev/null | tr '\n' ' ')"
        return 1
    fi
    if [[ $mode == json ]]; then
        [[ "$(cat "$out")" == "$JSON_RESP" ]] || { echo "body differs from the stub's"; return 1; }
    else
        [[ "$(cat "$out"; echo x)" == "${SSE_RESP}x" ]] || { echo "SSE body differs from the stub's"; return 1; }
    fi
}

run_wrk() { # url mode body secs conns out: prints the KVR_RESULT fields and wrk's CPU
    # Runs in a command substitution, so `times` (children's user and system time) is wrk's.
    local t tf="$TMP/times.$BASHPID"
    KVR_BENCH_BODY="$TMP/body-$3.json" KVR_BENCH_MODE=$2 timeout $(($4 + 30)) \
        wrk -t"$THREADS" -c"$5" -d"${4}s" --latency -s "$LUA" "$1" >"$6" 2>&1 || true
    times >"$tf" # not in $(...): that would be another subshell
    t=$(awk 'NR == 2 {
        n = split($1 " " $2, a, " "); s = 0
        for (i = 1; i <= n; i++) { split(a[i], b, "m"); s += b[1] * 60 + b[2] }
        printf "%.3f", s }' "$tf")
    rm -f "$tf"
    echo "$(grep '^KVR_RESULT ' "$6" | head -1 | cut -d' ' -f2-) wrk_cpu_s=$t"
}

RESULTS="$OUT/results.tsv"
printf 'path\tbody\trep\trps\tp50_ms\tp99_ms\tproxy_cpu_us\tstub_cpu_us\thost_busy_pct\terrors\trequests\twrk_cpu_us\tother_cores\n' >"$RESULTS"
declare -A SKIP
measure() { # path body rep
    local path=$1 body=$2 rep=$3 url mode ppids raw res why
    url=$(url_of "$path" "$body")
    mode=$(mode_of "$body")
    ppids=$(proxy_pids_of "$path")
    if [[ $path == kvroute && -z $KVR_PID ]]; then SKIP[$path/$body]=$KVR_NOTE; return; fi
    if [[ $path == haproxy && -z $HAP_PIDS ]]; then SKIP[$path/$body]=$HAP_NOTE; return; fi
    if [[ $path == kvroute-ca ]]; then
        [[ " $CA_BODIES " == *" $body "* ]] || return 0
        [[ -n $KCA_PID ]] || { SKIP[$path/$body]="kvroute-ca not running"; return; }
    fi
    if ! why=$(check_cell "$path" "$body"); then
        SKIP[$path/$body]="check failed: $why"
        log "$path/$body: check failed: $why"
        return
    fi
    raw="$OUT/wrk-$path-$body-$rep.txt"
    run_wrk "$url" "$mode" "$body" "$WARMUP" "$CONNS" "$raw.warmup" >/dev/null
    local c0 s0 h0 c1 s1 h1
    # shellcheck disable=SC2086 # pid lists are split on purpose
    {
        c0=$(cpu_ticks $ppids)
        s0=$(cpu_ticks $STUB_PIDS)
        h0=$(host_busy)
    }
    res=$(run_wrk "$url" "$mode" "$body" "$DURATION" "$CONNS" "$raw")
    # shellcheck disable=SC2086
    {
        c1=$(cpu_ticks $ppids)
        s1=$(cpu_ticks $STUB_PIDS)
        h1=$(host_busy)
    }
    rm -f "$raw.warmup"
    if [[ $res != *requests=* ]]; then
        SKIP[$path/$body]="wrk gave no result (see $raw)"
        log "$path/$body: wrk gave no result"
        return
    fi
    local -A r
    local kv
    for kv in $res; do r[${kv%%=*}]=${kv#*=}; done
    awk -v path="$path" -v body="$body" -v rep="$rep" -v req="${r[requests]}" \
        -v dur="${r[duration_us]}" -v p50="${r[p50_us]}" -v p99="${r[p99_us]}" \
        -v c="$((c1 - c0))" -v s="$((s1 - s0))" -v tck="$CLK_TCK" -v ppids="$ppids" \
        -v hb="$h0" -v he="$h1" -v wcpu="${r[wrk_cpu_s]}" -v ncpu="$NCPU" \
        -v errs="$((r[err_connect] + r[err_read] + r[err_write] + r[err_status] + r[err_timeout]))" \
        'BEGIN {
            split(hb, a, " "); split(he, b, " ");
            busy = (b[2] - a[2]) > 0 ? 100 * (b[1] - a[1]) / (b[2] - a[2]) : 0;
            # CPU of everything that is not wrk, the proxy or the stubs (other users of the
            # machine), in cores: host busy time minus ours, over the wall time of the cell.
            wall = (b[2] - a[2]) / tck / ncpu;
            other = wall > 0 ? ((b[1] - a[1]) / tck - (c + s) / tck - wcpu) / wall : 0;
            if (other < 0) other = 0;
            pc = (ppids == "" || req == 0) ? "-" : sprintf("%.1f", c * 1e6 / tck / req);
            sc = req == 0 ? "-" : sprintf("%.1f", s * 1e6 / tck / req);
            printf "%s\t%s\t%d\t%.0f\t%.3f\t%.3f\t%s\t%s\t%.0f\t%d\t%d\t%.1f\t%.2f\n", path, body,
                rep, req / (dur / 1e6), p50 / 1000, p99 / 1000, pc, sc, busy, errs, req,
                req ? wcpu * 1e6 / req : 0, other
        }' >>"$RESULTS"
    log "$(tail -1 "$RESULTS" | awk -F'\t' '{printf "%-8s %-9s %8s req/s  p50 %s ms  p99 %s ms  proxy %s us/req  errors %s", $1, $2, $4, $5, $6, $7, $10}')"
}

# Paths interleaved per body so that drift on the shared machine hits them alike.
for ((rep = 1; rep <= REPEAT; rep++)); do
    for body in $BODIES; do
        for path in $PATHS; do measure "$path" "$body" "$rep"; done
    done
done

# ---------------------------------------------------------------- syscalls per request
# Counted with perf stat on syscall tracepoints (counting mode: no per-event cost in user
# space) during one extra run per proxy; setup (accepts, connects) is amortised over the run.
SYSCALL_LIST="read write readv writev recvfrom sendto recvmsg sendmsg epoll_wait epoll_pwait epoll_ctl poll ppoll ioctl accept4 close shutdown getsockopt setsockopt getsockname getpeername socket connect fcntl futex clone clone3 brk mmap munmap madvise openat"
SYSCALL_MD=""
syscall_count() { # path body secs: writes $OUT/syscalls-<path>-<body>.txt (name count/req)
    local path=$1 body=$2 secs=$3 ev="raw_syscalls:sys_enter" sc pids res req=0 kv pp
    for sc in $SYSCALL_LIST; do ev+=",syscalls:sys_enter_$sc"; done
    pids=$(proxy_pids_of "$path")
    [[ $path == nginx ]] && pids=${pids#* } # workers only (the master is idle)
    pp=$(echo "$pids" | xargs | tr ' ' ',')
    [[ -n $pp ]] || return 1
    run_wrk "$(url_of "$path" "$body")" "$(mode_of "$body")" "$body" 1 "$CONNS" \
        "$OUT/wrk-syscalls-$path-$body-warmup.txt" >/dev/null
    timeout $((secs + 30)) perf stat -x, -e "$ev" -p "$pp" -o "$TMP/pstat-$path.txt" \
        -- sleep "$((secs + 1))" >/dev/null 2>&1 &
    PERF_PID=$!
    MAIN_PIDS+=("$PERF_PID")
    sleep 0.3
    res=$(run_wrk "$(url_of "$path" "$body")" "$(mode_of "$body")" "$body" "$secs" "$CONNS" \
        "$OUT/wrk-syscalls-$path-$body.txt")
    wait "$PERF_PID" 2>/dev/null || true
    forget_pid "$PERF_PID"
    for kv in $res; do [[ $kv == requests=* ]] && req=${kv#requests=}; done
    ((req > 0)) || return 1
    awk -F, -v r="$req" '$3 ~ /sys_enter/ {
            n = $3; sub(/.*sys_enter_?/, "", n); if (n == "") n = "all syscalls";
            c = ($1 ~ /^[0-9]+$/) ? $1 : 0; printf "%s\t%.3f\n", n, c / r }' \
        "$TMP/pstat-$path.txt" >"$OUT/syscalls-$path-$body.txt"
}
if [[ ${SYSCALLS:-1} == 1 && -n $KVR_PID && -n $NGX_PIDS ]] && command -v perf >/dev/null; then
    SB=${SYSCALL_BODY:-8k}
    log "counting syscalls per request ($(label "$SB")) for nginx and kvroute"
    if syscall_count nginx "$SB" 4 && syscall_count kvroute "$SB" 4; then
        SYSCALL_MD+=$'\nSyscalls per request, '"$(label "$SB")"$' (perf stat on syscall tracepoints, one extra 4 s run each; zero rows omitted):\n\n'
        SYSCALL_MD+=$'| syscall | nginx worker | kvroute |\n|---|---:|---:|\n'
        SYSCALL_MD+=$(join -t $'\t' -a1 -a2 -e 0 -o 0,1.2,2.2 \
            <(sort "$OUT/syscalls-nginx-$SB.txt") <(sort "$OUT/syscalls-kvroute-$SB.txt") |
            awk -F'\t' '$2 + 0 > 0.0005 || $3 + 0 > 0.0005 { printf "| %s | %.2f | %.2f |\n", $1, $2, $3 }' |
            sort -t'|' -k4,4gr)
        SYSCALL_MD+=$'\n'
    fi
fi

# ---------------------------------------------------------------- profile
# perf with DWARF call graphs (kvroute is built without frame pointers). Percentages are of
# kvroute's samples; "µs/req" converts them with kvroute's CPU per request during that run.
PROFILE_MD=""
pct_us() { # cpu_us_per_req: appends "≈ N µs/req" to perf report lines (first % column)
    awk -v c="$1" '/^ *[0-9.]+%/ { p = $1; sub("%", "", p); printf "%s  (≈ %.1f µs/req)\n", $0, p * c / 100 }'
}
perf_profile() { # body [path]: profiles kvroute (or kvroute-ca) during a run; 1 when perf failed
    local body=$1 path=${2:-kvroute} res c0 c1 req cpu kv exe pid tag
    tag=$body
    [[ $path == kvroute ]] || tag="$path-$body"
    local data="$TMP/perf-$tag.data"
    pid=$(proxy_pids_of "$path")
    exe=$(basename "$KVROUTE")
    run_wrk "$(url_of "$path" "$body")" "$(mode_of "$body")" "$body" 1 "$CONNS" \
        "$OUT/wrk-profile-$tag-warmup.txt" >/dev/null
    log "perf record -p $pid during a $body run (${DURATION}s)"
    timeout $((DURATION + 30)) perf record -F 999 --call-graph dwarf,16384 -p "$pid" \
        -o "$data" -- sleep "$DURATION" >"$TMP/perf-record-$tag.log" 2>&1 &
    PERF_PID=$!
    MAIN_PIDS+=("$PERF_PID")
    sleep 0.3
    c0=$(cpu_ticks "$pid")
    res=$(run_wrk "$(url_of "$path" "$body")" "$(mode_of "$body")" "$body" "$((DURATION - 1))" \
        "$CONNS" "$OUT/wrk-profile-$tag.txt")
    c1=$(cpu_ticks "$pid")
    wait "$PERF_PID" 2>/dev/null || true
    forget_pid "$PERF_PID"
    req=0
    for kv in $res; do [[ $kv == requests=* ]] && req=${kv#requests=}; done
    if [[ ! -s $data ]] || ! perf report -i "$data" --stdio --no-children --sort dso \
        >"$OUT/perf-$tag-dso.txt" 2>/dev/null || ((req == 0)); then
        log "perf failed: $(tail -c 300 "$TMP/perf-record-$tag.log" | tr '\n' ' ')"
        return 1
    fi
    cpu=$(awk -v c="$((c1 - c0))" -v t="$CLK_TCK" -v r="$req" 'BEGIN { printf "%.1f", c * 1e6 / t / r }')
    perf report -i "$data" --stdio --no-children --sort dso,symbol -g none --percent-limit 0.2 \
        >"$OUT/perf-$tag-self.txt" 2>/dev/null || true
    perf report -i "$data" --stdio --children --sort dso,symbol -g none --percent-limit 0.5 \
        >"$OUT/perf-$tag-children.txt" 2>/dev/null || true
    perf report -i "$data" --stdio --no-children --sort dso,symbol \
        -g caller,0.5,callee,function,percent --percent-limit 1 \
        >"$OUT/perf-$tag-callers.txt" 2>/dev/null || true
    PROFILE_MD+=$'\n'"**$path, $(label "$body")** — \`perf record -F 999 --call-graph dwarf -p <kvroute>\`;"
    PROFILE_MD+=" $req requests in $((DURATION - 1)) s under perf, kvroute CPU $cpu µs/req."$'\n\n'
    PROFILE_MD+=$'Self time by library:\n\n```\n'
    PROFILE_MD+=$(pct_us "$cpu" <"$OUT/perf-$tag-dso.txt" | head -10)
    PROFILE_MD+=$'\n```\n\nTop functions by self time (unnamed addresses are static functions of stripped Debian libraries):\n\n```\n'
    PROFILE_MD+=$(pct_us "$cpu" <"$OUT/perf-$tag-self.txt" | sed 's/  *- *- *  (/  (/' | head -25)
    PROFILE_MD+=$'\n```\n\nInclusive time of kvroute functions and library entry points (children):\n\n```\n'
    PROFILE_MD+=$(awk -v exe="$exe" '/^ *[0-9.]+%/ && ($3 == exe || $5 ~ /^(json_loadb|json_dumps|curl_multi_socket_action|curl_multi_add_handle|curl_multi_remove_handle|curl_multi_info_read|curl_easy_setopt|curl_easy_pause|http_parser_execute|uv_write|uv_try_write|uv__io_poll|epoll_wait|malloc|free)$/)' \
        "$OUT/perf-$tag-children.txt" | pct_us "$cpu" | sed 's/  *- *- *  (/  (/' | head -40)
    PROFILE_MD+=$'\n```\n'
    return 0
}

PROFILE_BODIES=${PROFILE_BODIES:-"8k 247 ssechunk"}
if [[ $PROFILE == 1 && -n $KVR_PID ]]; then
    PROFILE_TOOL=""
    if command -v perf >/dev/null; then
        PROFILE_TOOL=perf
        for body in $PROFILE_BODIES; do
            if [[ " $BODIES " != *" $body "* || -n ${SKIP[kvroute/$body]:-} ]]; then continue; fi
            perf_profile "$body" || { PROFILE_TOOL=""; break; }
        done
        for body in ${PROFILE_CA_BODIES:-tau}; do
            [[ -n $PROFILE_TOOL && -n $KCA_PID && " $BODIES " == *" $body "* ]] || continue
            [[ -z ${SKIP[kvroute-ca/$body]:-} ]] || continue
            perf_profile "$body" kvroute-ca || PROFILE_TOOL=""
        done
    fi
    if [[ -z $PROFILE_TOOL ]] && command -v valgrind >/dev/null; then
        log "callgrind: kvroute under valgrind on :$P_KVR_CG, 10 connections, ${DURATION}s"
        start_kvroute "$P_KVR_CG" valgrind --tool=callgrind \
            --callgrind-out-file="$TMP/callgrind.out"
        CG_PID=$LAST_PID
        if wait_http "http://127.0.0.1:$P_KVR_CG/healthz" 60; then
            run_wrk "http://127.0.0.1:$P_KVR_CG/v1/chat/completions" json 8k "$DURATION" 10 \
                "$OUT/wrk-callgrind.txt" >/dev/null
            stop_pid "$CG_PID"
            if [[ -s $TMP/callgrind.out ]]; then
                PROFILE_TOOL=callgrind
                callgrind_annotate --inclusive=no "$TMP/callgrind.out" 2>/dev/null |
                    head -60 >"$OUT/callgrind-self.txt" || true
                callgrind_annotate --inclusive=yes "$TMP/callgrind.out" 2>/dev/null |
                    head -80 >"$OUT/callgrind-inclusive.txt" || true
                PROFILE_MD+=$'\nProfile: callgrind (perf not permitted), 8 KB JSON, 10 connections. Self cost:\n\n```\n'
                PROFILE_MD+=$(cat "$OUT/callgrind-self.txt")
                PROFILE_MD+=$'\n```\n'
            fi
        else
            stop_pid "$CG_PID"
        fi
    fi
    [[ -n $PROFILE_TOOL ]] || PROFILE_MD+=$'\nProfile: none (neither perf nor callgrind worked).\n'
elif [[ $PROFILE == 1 ]]; then
    PROFILE_MD+=$'\nProfile: skipped (kvroute not running).\n'
fi

# ---------------------------------------------------------------- report
median_row() { # path body: the result row with the median req/s among the repeats
    awk -F'\t' -v p="$1" -v b="$2" '$1 == p && $2 == b' "$RESULTS" | sort -t$'\t' -k4,4n |
        awk '{rows[NR] = $0} END {if (NR) print rows[int((NR + 1) / 2)]}'
}
{
    echo "Run: $(date -u +%Y-%m-%dT%H:%MZ); wrk ${THREADS} thread, ${CONNS} connections, ${DURATION} s per cell after ${WARMUP} s warm-up, ${REPEAT} run(s) per cell (median shown)."
    echo "Machine: ${NCPU} vCPU ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')), kernel $(uname -r); wrk, proxy and stubs share these cores. $(nginx -v 2>&1 | sed 's/.*: //'), wrk $(dpkg-query -W -f='${Version}' wrk 2>/dev/null || echo '?'), libcurl $(dpkg-query -W -f='${Version}' libcurl4 2>/dev/null || echo '?'), libuv $(dpkg-query -W -f='${Version}' libuv1 2>/dev/null || echo '?')."
    echo "Load average before the run: $(cut -d' ' -f1-3 /proc/loadavg).${KVROUTE_ARGS:+ kvroute flags: $KVROUTE_ARGS.}"
    echo
    echo "| path | request / response | req/s | p50 ms | p99 ms | proxy CPU µs/req | stub CPU µs/req | wrk CPU µs/req | host busy | other load (cores) | errors |"
    echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    for body in $BODIES; do
        for path in $PATHS; do
            [[ $path != kvroute-ca || " $CA_BODIES " == *" $body "* ]] || continue
            row=$(median_row "$path" "$body")
            if [[ -n $row ]]; then
                echo "$row" | awk -F'\t' -v l="$(label "$body")" \
                    '{printf "| %s | %s | %s | %.2f | %.2f | %s | %s | %s | %s%% | %s | %s |\n", $1, l, $4, $5, $6, $7, $8, $12, $9, $13, $10}'
            else
                echo "| $path | $(label "$body") | n/a | | | | | | | | ${SKIP[$path/$body]:-not run} |"
            fi
        done
    done
    if [[ " $PATHS " == *" nginx "* ]]; then
        echo
        echo "Ratios to nginx in the same cell (kvroute-ca: cache_aware against nginx's round robin):"
        echo
        echo "| path / nginx | cell | req/s | p50 | p99 | proxy CPU per request | req/s one core sustains (10⁶ / CPU µs): path vs nginx |"
        echo "|---|---|---:|---:|---:|---:|---|"
        for body in $BODIES; do
            n=$(median_row nginx "$body")
            [[ -n $n ]] || continue
            for path in kvroute kvroute-ca haproxy; do
                [[ " $PATHS " == *" $path "* ]] || continue
                k=$(median_row "$path" "$body")
                [[ -n $k ]] || continue
                printf '%s\n%s\n' "$n" "$k" | awk -F'\t' -v l="$(label "$body")" -v p="$path" '
                    NR == 1 {r = $4; a = $5; b = $6; c = $7}
                    NR == 2 {printf "| %s | %s | %.2f× | %.2f× | %.2f× | %s | %s |\n", p, l, $4 / r, $5 / a, $6 / b,
                             (c + 0 > 0 && $7 != "-") ? sprintf("%.2f×", $7 / c) : "-",
                             (c + 0 > 0 && $7 + 0 > 0) ? sprintf("%.1f k vs %.1f k", 1000 / $7, 1000 / c) : "-"}'
            done
        done
    fi
    printf '%s' "$SYSCALL_MD"
    printf '%s' "$PROFILE_MD"
} >"$OUT/overhead.md"
cat "$OUT/overhead.md"
log "results in $OUT (overhead.md, results.tsv, wrk-*.txt, profile reports)"
