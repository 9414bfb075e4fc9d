#!/usr/bin/env bash
# Limits benchmark (issue 16): latchkey's CPU per request added by one rate limit and by one
# token budget, on the embedded (SQLite) and the Redis state store, side by side with the same
# requests under no limit. Loopback only. Writes bench/results-limits.md.
#
#   bench/limits.sh            full run: 15 passes of 20,000 requests per configuration (~4 min)
#   bench/limits.sh --smoke    < 30 s: 1 pass of 1,000 requests, debug build (proves the script
#                              works; its numbers mean nothing); writes bench/out/limits/results-smoke.md
#   options: --requests N --warmup N --reps N --conns N
#            --rate N        (a fixed offered load in req/s for every configuration, latency from
#                             when each request was due; default 0: as fast as oha can)
#            --limits LIST   (none,rate,tokens: which policies run; default all)
#            --stores LIST   (sqlite,redis; default both)
#            --no-build --no-install --report PATH
#            --profile       (after the passes, one more run of each limited configuration under
#                             perf record: the share of its samples inside the limit code, a
#                             noise-free lower bound on what the limit adds; in the report, with
#                             the functions in bench/out/limits/profile-CONFIG.txt)
#   env:     LATCHKEY=PATH (binary to measure), BENCH_AUDIT=PATH (latchkey's --audit, e.g. /dev/null)
#
# Configurations: a latchkey per policy (bench/conf/limits-{none,rate,tokens}/) and per store,
# all started at once, each pinned alone to CPU 1 (only the measured one has work); oha, nginx and
# redis-server on CPU 0. Two request shapes through the plain-HTTP forward path:
#   get: GET /small (100 B)                          — (a) none vs (b) rate
#   llm: POST /v1/chat/completions, max_tokens 16,   — (a) none vs (c) tokens
#        a fixed non-streaming answer with usage (reserve, then settle)
# The load saturates latchkey's one worker by default (its CPU per request is then lowest and
# steadiest: at a low fixed --rate each request pays a whole wakeup, ~200 µs on this VM, which
# buries a µs-sized difference).
# Each pass runs every configuration once (after a discarded warm-up of the same shape), in an
# order rotated every pass; a limit's added CPU is the median over passes of (limited − none) of
# the same pass, shape and store. CPU = utime+stime of the latchkey PID from /proc/PID/stat (all
# threads, dead ones included; 10 ms ticks) ÷ 2xx responses; the per-thread schedstat sum (ns)
# is reported beside it as the fine-grained figure.
# Everything this script starts is stopped by PID in the EXIT trap.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
OUT="$HERE/out/limits"
CONF="$HERE/conf"

REQUESTS=20000 WARMUP=3000 REPS=15 CONNS=64 RATE=0 MODE=full
LIMITS="none,rate,tokens" STORES="sqlite,redis"
INSTALL=1 BUILD=1 PROFILE=0
REPORT="$HERE/results-limits.md"
while [ $# -gt 0 ]; do
  case "$1" in
    --smoke) REQUESTS=1000 WARMUP=300 REPS=1 MODE=smoke REPORT="$OUT/results-smoke.md" ;;
    --requests) REQUESTS="$2"; shift ;;
    --warmup) WARMUP="$2"; shift ;;
    --reps) REPS="$2"; shift ;;
    --conns) CONNS="$2"; shift ;;
    --rate) RATE="$2"; shift ;;
    --limits) LIMITS="$2"; shift ;;
    --stores) STORES="$2"; shift ;;
    --no-build) BUILD=0 ;;
    --no-install) INSTALL=0 ;;
    --report) REPORT="$2"; shift ;;
    --profile) PROFILE=1 ;;
    -h|--help) sed -n '2,34p' "$0"; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
for n in "$REQUESTS" "$WARMUP" "$REPS" "$CONNS"; do
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -gt 0 ] || { echo "counts must be positive integers (got '$n')" >&2; exit 2; }
done
[[ "$RATE" =~ ^[0-9]+$ ]] || { echo "--rate takes a whole number of requests a second (0: unpaced)" >&2; exit 2; }

# Ports (loopback only; apart from bench/run.sh's so both can run on one machine).
P_UP=19080 P_REDIS=16379
declare -A P_LK=([none-sqlite]=13211 [rate-sqlite]=13212 [tokens-sqlite]=13213
                 [none-redis]=13214 [rate-redis]=13215 [tokens-redis]=13216)

NCPU=$(nproc)
if [ "$NCPU" -ge 2 ]; then CPU_LOAD=0 CPU_PROXY=1; else CPU_LOAD=0 CPU_PROXY=0; fi

PIDS=()
cleanup() {
  local rc=$?
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  sleep 0.5
  for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

log() { echo "[limits $(date +%H:%M:%S)] $*" >&2; }
in_list() { [[ ",$2," == *",$1,"* ]]; }
wait_port() { # port [seconds]
  local i
  for i in $(seq 1 $(( ${2:-20} * 10 ))); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

# A port already taken (another run of this script, say) would make wait_port answer for a
# process that is not ours: refuse to start instead.
for port in $P_UP $P_REDIS "${P_LK[@]}"; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "127.0.0.1:$port is already in use (is another bench/limits.sh running?)" >&2; exit 1
  fi
done

# nginx workers run as an unprivileged user and must reach the files they serve: when the
# checkout is not traversable by others, the working directory moves to /tmp.
if [ "$(id -u)" = 0 ] && command -v runuser >/dev/null \
    && ! runuser -u nobody -- test -x "$HERE" 2>/dev/null; then
  OUT=/tmp/latchkey-bench-limits
  log "checkout not readable by service users: working directory $OUT"
fi
rm -rf "$OUT/state" "$OUT/raw" "$OUT/runs.jsonl" "$OUT"/*-audit.jsonl "$OUT"/*.stderr
mkdir -p "$OUT/state" "$OUT/raw" "$OUT/www" "$OUT/nginx-tmp"
chmod 755 "$OUT"

# ---------------------------------------------------------------- install + build
export PATH="$HOME/.cargo/bin:$PATH"
if [ "$INSTALL" = 1 ]; then
  pkgs=()
  if ! command -v oha >/dev/null && ! command -v make >/dev/null; then pkgs+=(make); fi
  command -v nginx >/dev/null || pkgs+=(nginx)
  if in_list redis "$STORES" && ! command -v redis-server >/dev/null; then pkgs+=(redis-server); fi
  if [ ${#pkgs[@]} -gt 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}" >/dev/null
  fi
  command -v oha >/dev/null || cargo install --locked oha
fi
for tool in oha nginx; do
  command -v "$tool" >/dev/null || { echo "$tool not found (or drop --no-install)" >&2; exit 1; }
done
if in_list redis "$STORES"; then
  command -v redis-server >/dev/null || { echo "redis-server not found (or drop --no-install)" >&2; exit 1; }
fi

PROFILE_DIR=release
[ "$MODE" = smoke ] && PROFILE_DIR=debug
if [ "$BUILD" = 1 ] && [ -z "${LATCHKEY:-}" ]; then
  if [ "$PROFILE_DIR" = release ]; then (cd "$ROOT" && cargo build --release --bin latchkey)
  else (cd "$ROOT" && cargo build --bin latchkey); fi
fi
LATCHKEY="${LATCHKEY:-${CARGO_TARGET_DIR:-$ROOT/target}/$PROFILE_DIR/latchkey}"
[ -x "$LATCHKEY" ] || { echo "no latchkey binary at $LATCHKEY" >&2; exit 1; }
if [ "$PROFILE" = 1 ] && ! command -v perf >/dev/null; then echo "--profile: perf not found" >&2; exit 1; fi

if oha --help | grep -q -- '--output-format'; then OHA_JSON=(--output-format json); else OHA_JSON=(--json); fi

# ---------------------------------------------------------------- upstream + store
printf 'x%.0s' $(seq 1 99) > "$OUT/www/small"; printf '\n' >> "$OUT/www/small"   # 100 B
sed "s#@OUT@#$OUT#g" "$CONF/limits-nginx.conf.tmpl" > "$OUT/nginx.conf"
taskset -c "$CPU_LOAD" nginx -p "$OUT" -c "$OUT/nginx.conf" 2>"$OUT/nginx.stderr" &
PIDS+=($!)
wait_port $P_UP || { cat "$OUT/nginx.stderr" "$OUT/nginx-error.log" >&2 2>/dev/null; exit 1; }
log "nginx up on 127.0.0.1:$P_UP"

if in_list redis "$STORES"; then
  # A private, memory-only redis: no RDB/AOF files, loopback only, gone when the script ends.
  taskset -c "$CPU_LOAD" redis-server --bind 127.0.0.1 --port $P_REDIS --save '' --appendonly no \
    --dir "$OUT/state" --logfile "$OUT/redis.log" --protected-mode yes &
  PIDS+=($!)
  wait_port $P_REDIS || { cat "$OUT/redis.log" >&2; exit 1; }
  log "redis-server up on 127.0.0.1:$P_REDIS"
fi

# ---------------------------------------------------------------- latchkeys
export RUST_LOG=warn
declare -A LK_PID
CONFIGS=()
for lim in none rate tokens; do
  in_list "$lim" "$LIMITS" || continue
  for store in sqlite redis; do
    in_list "$store" "$STORES" || continue
    name="$lim-$store" port=${P_LK[$lim-$store]}
    if [ "$store" = sqlite ]; then url="sqlite:$OUT/state/$name.db"; else
      # One Redis database per latchkey, so no two share a counter.
      db=$(( ${port} - 13210 )); url="redis://127.0.0.1:$P_REDIS/$db"; fi
    mkdir -p "$OUT/$name-ca"
    taskset -c "$CPU_PROXY" "$LATCHKEY" serve --policies "$CONF/limits-$lim" --listen "127.0.0.1:$port" \
      --admin off --workers 1 --ca-dir "$OUT/$name-ca" --state "$url" \
      --audit "${BENCH_AUDIT:-$OUT/$name-audit.jsonl}" --allow-private 127.0.0.0/8 2>"$OUT/$name.stderr" &
    pid=$!; PIDS+=($pid)
    if ! wait_port "$port" 30; then
      echo "latchkey $name did not start:" >&2; tail -n 20 "$OUT/$name.stderr" >&2; exit 1
    fi
    LK_PID[$name]=$pid
    log "latchkey $name up (pid $pid, --state $url)"
  done
done
[ ${#LK_PID[@]} -gt 0 ] || { echo "no configuration selected (--limits / --stores)" >&2; exit 2; }

# Which limited configuration compares to which shape (the none policy runs both shapes).
RUNS=()
for name in $(printf '%s\n' "${!LK_PID[@]}" | sort); do
  case "$name" in
    none-*) RUNS+=("$name:get" "$name:llm") ;;
    rate-*) RUNS+=("$name:get") ;;
    tokens-*) RUNS+=("$name:llm") ;;
  esac
done

LLM_BODY='{"model":"gpt-4o-mini","max_tokens":16,"messages":[{"role":"system","content":"You are a terse assistant."},{"role":"user","content":"Say hello."}]}'
CLK_TCK=$(getconf CLK_TCK)
cpu_ticks() { sed 's/^.*) //' "/proc/$1/stat" | awk '{print $12 + $13}'; }   # utime+stime
cpu_ns() { cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{s += $1} END {printf "%.0f", s}'; }
tids() { ls "/proc/$1/task" | sort -n | tr '\n' ' '; }

oha_args() { # shape -> the oha arguments after the common ones
  case "$1" in
    get) echo "http://127.0.0.1:$P_UP/small" ;;
    llm) echo "-m POST -T application/json http://127.0.0.1:$P_UP/v1/chat/completions" ;;
  esac
}
run_oha() { # port shape count out [paced]
  local port=$1 shape=$2 n=$3 out=$4 extra=()
  [ "$shape" = llm ] && extra+=(-d "$LLM_BODY")
  [ "${5:-}" = paced ] && [ "$RATE" -gt 0 ] && extra+=(-q "$RATE" --latency-correction)
  # shellcheck disable=SC2046
  taskset -c "$CPU_LOAD" oha --no-tui "${OHA_JSON[@]}" -n "$n" -c "$CONNS" -x "http://127.0.0.1:$port" \
    "${extra[@]}" $(oha_args "$shape") > "$out" 2>"$out.err" || true
}

run_one() { # pass name:shape
  local pass=$1 name=${2%%:*} shape=${2##*:} port pid f t0 t1 n0 n1 s0 s1
  port=${P_LK[$name]} pid=${LK_PID[$name]}
  f="$OUT/raw/p$pass-$name-$shape.json"
  run_oha "$port" "$shape" "$WARMUP" "$f.warmup"
  s0=$(tids "$pid"); t0=$(cpu_ticks "$pid"); n0=$(cpu_ns "$pid")
  run_oha "$port" "$shape" "$REQUESTS" "$f" paced
  t1=$(cpu_ticks "$pid"); n1=$(cpu_ns "$pid"); s1=$(tids "$pid")
  python3 "$HERE/limits.py" row "$f" --pass "$pass" --config "$name" --shape "$shape" \
    --ticks $(( t1 - t0 )) --clk "$CLK_TCK" --ns $(( n1 - n0 )) --tids-before "$s0" --tids-after "$s1" \
    >> "$OUT/runs.jsonl"
  tail -n 1 "$OUT/runs.jsonl" | python3 "$HERE/limits.py" show >&2
}

LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
for pass in $(seq 1 "$REPS"); do
  log "pass $pass of $REPS: ${#RUNS[@]} configurations × $REQUESTS requests"
  n=${#RUNS[@]}
  for k in $(seq 0 $(( n - 1 ))); do
    run_one "$pass" "${RUNS[$(( (k + pass - 1) % n ))]}"
  done
done

# ---------------------------------------------------------------- profiles (not measured runs)
rm -f "$OUT"/profile-*.json "$OUT"/profile-*.txt
if [ "$PROFILE" = 1 ]; then
  for run in "${RUNS[@]}"; do
    name=${run%%:*} shape=${run##*:}
    [[ "$name" == none-* ]] && continue
    # Software clock sampling works where hardware counters are not exposed (VMs); DWARF call
    # graphs because the release build keeps no frame pointers.
    perf record -e cpu-clock -F 999 --call-graph dwarf,16384 -p "${LK_PID[$name]}" -o "$OUT/perf-$name.data" \
      >/dev/null 2>"$OUT/perf-$name.stderr" &
    perf_pid=$!; PIDS+=($perf_pid); sleep 0.5
    # 10,000 requests are plenty of samples; perf script's DWARF unwinding takes ~1 min for them.
    run_oha "${P_LK[$name]}" "$shape" $(( REQUESTS < 10000 ? REQUESTS : 10000 )) "$OUT/raw/profile-$name.json" paced
    kill -INT "$perf_pid" 2>/dev/null || true; wait "$perf_pid" 2>/dev/null || true
    perf script -i "$OUT/perf-$name.data" -F comm,tid,time,ip,sym 2>/dev/null \
      | python3 "$HERE/limits.py" profile --config "$name" --out "$OUT" || log "profile of $name failed"
    rm -f "$OUT/perf-$name.data"
    log "profile: $OUT/profile-$name.txt"
  done
fi

# ---------------------------------------------------------------- evidence + report
# The limited configurations must have charged their limit: the audit records of a token budget
# carry the usage read from the response, and a Redis store holds the counters.
{
  echo "date=$(date -u +%Y-%m-%dT%H:%MZ)"
  echo "nproc=$NCPU"
  echo "cpu=$(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -n 1)"
  echo "mem=$(free -g | awk '/^Mem:/{print $2}') GiB"
  echo "kernel=$(uname -r)"
  echo "load=$LOAD_START at the first pass, $(cut -d' ' -f1-3 /proc/loadavg) after the last"
  echo "latchkey=$("$LATCHKEY" --version 2>/dev/null || echo '?') (git $(cd "$ROOT" && git rev-parse --short HEAD)$(cd "$ROOT" && git diff --quiet -- src || echo '+dirty src'); $PROFILE_DIR build)"
  echo "oha=$(oha --version 2>/dev/null)"
  echo "nginx=$(nginx -v 2>&1 | sed 's/.*: //')"
  in_list redis "$STORES" && echo "redis=$(redis-server --version | awk '{print $3}')"
  echo "mode=$MODE"
  echo "requests=$REQUESTS"
  echo "warmup=$WARMUP"
  echo "reps=$REPS"
  echo "conns=$CONNS"
  echo "rate=$RATE"
  echo "clk_tck=$CLK_TCK"
  if in_list redis "$STORES" && command -v redis-cli >/dev/null; then
    for name in "${!LK_PID[@]}"; do
      [[ "$name" == *-redis ]] || continue
      db=$(( ${P_LK[$name]} - 13210 ))
      echo "redis_keys_$name=$(redis-cli -p $P_REDIS -n "$db" dbsize 2>/dev/null || echo '?')"
    done
  fi
} > "$OUT/env.txt"
python3 "$HERE/limits.py" report "$OUT" ${BENCH_AUDIT:+--no-audit} > "$REPORT"
log "wrote $REPORT"
python3 "$HERE/limits.py" check "$OUT" ${BENCH_AUDIT:+--no-audit}
