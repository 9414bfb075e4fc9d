#!/usr/bin/env bash
# Instruction counts per request (issue 33): latchkey runs under `valgrind --tool=callgrind`,
# which counts every instruction of every thread (the request path and the audit writer alike);
# unlike CPU time on a shared VM the count repeats to within a fraction of a percent, so a
# before/after difference of a few percent is real. Loopback only. Writes bench/results-callgrind.md
# (or --report PATH) and keeps each configuration's callgrind file in bench/out/callgrind/.
#
#   bench/callgrind.sh [--requests N] [--warmup N] [--conns N] [--configs LIST] [--report PATH]
#   env: LATCHKEY=PATH (binary; default target/release/latchkey), BASELINE=PATH (a second binary:
#        every configuration is measured for both, one after the other, and the table has both)
#
# Configurations (one latchkey, one policy, each its own port on one nginx):
#   s1      plain HTTP GET /small, keep-alive (bench scenario 1)
#   s2      HTTPS MITM + one injected header, keep-alive (scenario 2)
#   rate    s1 + one token-bucket rate limit that never refuses (embedded state store)
#   llm     POST /v1/chat/completions (plain HTTP, non-streaming answer with usage), no limit
#   tokens  llm + one llm_tokens budget that never runs out (reserve, then settle)
#
# For each configuration: WARMUP requests, then the counters are zeroed (callgrind_control),
# REQUESTS requests, then dumped: Ir / REQUESTS is the figure. The per-function split of each
# dump (inclusive) is in bench/out/callgrind/CONFIG-BINARY.txt.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
REQUESTS=2000 WARMUP=300 CONNS=8 CONFIGS="s1,s2,rate,llm,tokens"
REPORT="$HERE/results-callgrind.md"
while [ $# -gt 0 ]; do
  case "$1" in
    --requests) REQUESTS="$2"; shift ;;
    --warmup) WARMUP="$2"; shift ;;
    --conns) CONNS="$2"; shift ;;
    --configs) CONFIGS="$2"; shift ;;
    --report) REPORT="$2"; shift ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
LATCHKEY="${LATCHKEY:-${CARGO_TARGET_DIR:-$ROOT/target}/release/latchkey}"
# Installs what it needs, as bench/run.sh does (Debian packages; oha with cargo).
pkgs=()
command -v valgrind >/dev/null || pkgs+=(valgrind)
command -v nginx >/dev/null || pkgs+=(nginx)
command -v openssl >/dev/null || pkgs+=(openssl)
if [ ${#pkgs[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}" >/dev/null
fi
export PATH="$HOME/.cargo/bin:$PATH"
command -v oha >/dev/null || cargo install --locked oha
for tool in valgrind callgrind_control callgrind_annotate oha nginx openssl; do
  command -v "$tool" >/dev/null || { echo "callgrind.sh: $tool not found" >&2; exit 1; }
done
[ -x "$LATCHKEY" ] || { echo "no latchkey binary at $LATCHKEY" >&2; exit 1; }
[ -z "${BASELINE:-}" ] || [ -x "$BASELINE" ] || { echo "no baseline binary at $BASELINE" >&2; exit 1; }

# nginx's worker runs as nobody: the working directory must be traversable.
OUT=/tmp/latchkey-callgrind
rm -rf "$OUT" && mkdir -p "$OUT/www" "$OUT/nginx-tmp" "$OUT/policies" && chmod 755 "$OUT"
mkdir -p "$HERE/out/callgrind"
PIDS=()
cleanup() { local rc=$?; for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; exit $rc; }
trap cleanup EXIT
log() { echo "[callgrind $(date +%H:%M:%S)] $*" >&2; }
wait_port() { local i; for i in $(seq 1 $(( ${2:-20} * 10 ))); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; return 1; }

P_PLAIN=19180 P_RATE=19181 P_TOK=19182 P_TLS=19443 P_LK=19128
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj "/CN=callgrind CA" \
  -keyout "$OUT/ca.key" -out "$OUT/ca.pem" -addext "basicConstraints=critical,CA:TRUE" \
  -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=127.0.0.1" \
  -keyout "$OUT/up.key" -out "$OUT/up.csr" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' > "$OUT/up.ext"
openssl x509 -req -in "$OUT/up.csr" -CA "$OUT/ca.pem" -CAkey "$OUT/ca.key" -CAcreateserial -days 2 \
  -extfile "$OUT/up.ext" -out "$OUT/up.pem" 2>/dev/null
head -c 99 /dev/zero | tr '\0' x > "$OUT/www/small" && echo >> "$OUT/www/small"
cat > "$OUT/nginx.conf" <<EOF
worker_processes 1;
pid $OUT/nginx.pid;
error_log $OUT/nginx-error.log warn;
daemon off;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $OUT/nginx-tmp; proxy_temp_path $OUT/nginx-tmp;
    fastcgi_temp_path $OUT/nginx-tmp; uwsgi_temp_path $OUT/nginx-tmp; scgi_temp_path $OUT/nginx-tmp;
    keepalive_requests 1000000; keepalive_timeout 300s;
    default_type application/octet-stream;
    server {
        listen 127.0.0.1:$P_PLAIN; listen 127.0.0.1:$P_RATE; listen 127.0.0.1:$P_TOK;
        listen 127.0.0.1:$P_TLS ssl;
        ssl_certificate $OUT/up.pem; ssl_certificate_key $OUT/up.key;
        root $OUT/www;
        location / { }
        location = /v1/chat/completions {
            default_type application/json;
            return 200 '{"id":"chatcmpl-bench","object":"chat.completion","created":1764633600,"model":"gpt-4o-mini-2024-07-18","choices":[{"index":0,"message":{"role":"assistant","content":"Hello."},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}';
        }
    }
}
EOF
cat > "$OUT/policies/bench.toml" <<EOF
[secrets.bench]
source = "env:BENCH_KEY"

[limits.rate]
requests = "1000000/s"

[limits.tokens]
llm_tokens = "1000G/day"

[[rules]]
name = "plain"
hosts = ["127.0.0.1"]
ports = [$P_PLAIN]

[[rules]]
name = "rate"
hosts = ["127.0.0.1"]
ports = [$P_RATE]
limits = ["rate"]

[[rules]]
name = "tokens"
hosts = ["127.0.0.1"]
ports = [$P_TOK]
limits = ["tokens"]

[[rules]]
name = "mitm"
hosts = ["127.0.0.1"]
ports = [$P_TLS]
[rules.inject.headers]
authorization = "Bearer {{secret.bench}}"
EOF
nginx -p "$OUT" -c "$OUT/nginx.conf" 2>"$OUT/nginx.stderr" &
PIDS+=($!)
wait_port $P_PLAIN || { cat "$OUT/nginx.stderr" >&2; exit 1; }
export BENCH_KEY="callgrind-secret-value-0123456789" RUST_LOG=warn

LLM_BODY='{"model":"gpt-4o-mini","max_tokens":16,"messages":[{"role":"system","content":"You are a terse assistant."},{"role":"user","content":"Say hello."}]}'
load() { # config count
  local args=(--no-tui -n "$2" -c "$CONNS" -x "http://127.0.0.1:$P_LK")
  case "$1" in
    s1) args+=("http://127.0.0.1:$P_PLAIN/small") ;;
    rate) args+=("http://127.0.0.1:$P_RATE/small") ;;
    llm) args+=(-m POST -T application/json -d "$LLM_BODY" "http://127.0.0.1:$P_PLAIN/v1/chat/completions") ;;
    tokens) args+=(-m POST -T application/json -d "$LLM_BODY" "http://127.0.0.1:$P_TOK/v1/chat/completions") ;;
    s2) args+=(--cacert "$OUT/lk-ca/latchkey-ca.pem" "https://127.0.0.1:$P_TLS/small") ;;
  esac
  oha "${args[@]}" > "$OUT/oha.txt" 2>&1 || true
  grep -q "\[200\] $2 responses" "$OUT/oha.txt" || { echo "callgrind.sh: $1: not every request got a 200:" >&2; cat "$OUT/oha.txt" >&2; exit 1; }
}

measure() { # label binary -> appends "label config Ir" rows to $OUT/rows
  local label=$1 bin=$2 pid cfg dump
  rm -rf "$OUT/lk-ca" "$OUT/state.db"* "$OUT/audit.jsonl" "$OUT"/callgrind.out.*
  mkdir -p "$OUT/lk-ca"
  valgrind --tool=callgrind --callgrind-out-file="$OUT/callgrind.out.%p" --dump-instr=no \
    "$bin" serve --policies "$OUT/policies" --listen "127.0.0.1:$P_LK" --admin off --workers 1 \
    --ca-dir "$OUT/lk-ca" --audit "$OUT/audit.jsonl" --upstream-ca "$OUT/ca.pem" \
    --allow-private 127.0.0.0/8 --state "sqlite:$OUT/state.db" 2>"$OUT/lk.stderr" &
  pid=$!; PIDS+=($pid)
  wait_port $P_LK 120 || { tail "$OUT/lk.stderr" >&2; exit 1; }
  IFS=, read -r -a list <<< "$CONFIGS"
  for cfg in "${list[@]}"; do
    log "$label $cfg: $WARMUP warm-up + $REQUESTS measured requests"
    load "$cfg" "$WARMUP"
    callgrind_control -z "$pid" >/dev/null
    load "$cfg" "$REQUESTS"
    sleep 0.5   # the audit writer's linger: its share of these requests is counted too
    callgrind_control -d "$cfg-$label" "$pid" >/dev/null
    dump=$(ls -t "$OUT"/callgrind.out.* | head -n 1)
    ir=$(awk '/^(summary|totals):/ {print $2; exit}' "$dump")
    echo "$label $cfg $ir" >> "$OUT/rows"
    callgrind_annotate --inclusive=yes --threshold=99 "$dump" 2>/dev/null | head -n 140 \
      > "$HERE/out/callgrind/$cfg-$label.txt" || true
    cp "$dump" "$HERE/out/callgrind/callgrind.out.$cfg-$label"
  done
  kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true
}

: > "$OUT/rows"
measure after "$LATCHKEY"
[ -n "${BASELINE:-}" ] && measure before "$BASELINE"

python3 - "$OUT/rows" "$REPORT" "$REQUESTS" "$WARMUP" "$CONNS" "$LATCHKEY" "${BASELINE:-}" "$(cd "$ROOT" && git rev-parse --short HEAD)" <<'EOF'
import sys
rows, report, n, warm, conns, lk, base, head = sys.argv[1:9]
n = int(n)
data = {}
for line in open(rows):
    label, cfg, ir = line.split()
    data.setdefault(cfg, {})[label] = int(ir) / n
desc = {"s1": "plain HTTP GET, keep-alive", "s2": "HTTPS MITM + injected header, keep-alive",
        "rate": "s1 + one rate limit (embedded)", "llm": "POST chat completion, no limit",
        "tokens": "llm + one token budget (embedded)"}
out = ["# Instructions per request (callgrind)", "",
       f"Generated by `bench/callgrind.sh` at git {head}: {warm} warm-up then {n} measured requests per",
       f"configuration, {conns} keep-alive connections, latchkey `--workers 1` under",
       "`valgrind --tool=callgrind` (every thread counted: the request path and the audit writer).",
       "Instruction counts repeat to well under 1 % between runs; they are not CPU time (cache misses,",
       "system calls and the kernel's share are not in them), so compare them with each other.", ""]
hdr = "| configuration | instructions / request |" + (" before | after / before |" if base else "")
out += [hdr, "|---|---:|" + ("---:|---:|" if base else "")]
for cfg in ["s1", "s2", "rate", "llm", "tokens"]:
    if cfg not in data: continue
    a = data[cfg].get("after")
    row = f"| {cfg}: {desc[cfg]} | {a:,.0f} |"
    if base:
        b = data[cfg].get("before")
        row += f" {b:,.0f} | {a / b:.2f}× |"
    out.append(row)
if "s1" in data and "rate" in data:
    out += ["", "Added by the rate limit: " + ", ".join(f"{k} {data['rate'][k] - data['s1'][k]:,.0f}" for k in data["s1"] if k in data["rate"]) + " instructions / request."]
if "llm" in data and "tokens" in data:
    out += ["Added by the token budget: " + ", ".join(f"{k} {data['tokens'][k] - data['llm'][k]:,.0f}" for k in data["llm"] if k in data["tokens"]) + " instructions / request."]
out += ["", f"Binaries: after = `{lk}`" + (f", before = `{base}`" if base else "") + ".",
        "Per-function inclusive split of each dump: bench/out/callgrind/CONFIG-LABEL.txt.", ""]
open(report, "w").write("\n".join(out))
print("\n".join(out))
EOF
