#!/usr/bin/env bash
# Tail-latency experiment (issue 13): scenario 1 at a fixed rate through direct, nginx as a
# reverse proxy pinned to the proxy's core (a control for the topology), and latchkey variants
# (audit to /dev/null, audit writer moved to CPU 0, default workers, mimalloc never decommitting).
# Needs a previous bench/run.sh (its bench/out: nginx.conf, ca.pem, www/). Loopback only.
#   LATCHKEY=target/release/latchkey RATE=2370 DUR=8 REPS=3 bench/tail.sh
set -u
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="$HERE/out"; RATE=${RATE:-2000}; DUR=${DUR:-8}; REPS=${REPS:-3}
LK=${LATCHKEY:-$HERE/../target/release/latchkey}
[ -f "$OUT/nginx.conf" ] || { echo "run bench/run.sh first (needs $OUT/nginx.conf)" >&2; exit 1; }
export BENCH_KEY="bench-secret-value-0123456789abcdef" RUST_LOG=warn
T=$(mktemp -d); PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$T"' EXIT
cat > "$T/rp.conf" <<CONF
worker_processes 1; pid $T/rp.pid; error_log $T/rp-error.log warn; daemon off;
events { worker_connections 4000; }
http { access_log off; client_body_temp_path $T; proxy_temp_path $T; fastcgi_temp_path $T;
  uwsgi_temp_path $T; scgi_temp_path $T; keepalive_requests 1000000;
  upstream origin { server 127.0.0.1:18080; keepalive 64; }
  server { listen 127.0.0.1:18081;
    location / { proxy_pass http://origin; proxy_http_version 1.1; proxy_set_header Connection ""; } } }
CONF
taskset -c 0 nginx -p "$OUT" -c "$OUT/nginx.conf" 2>/dev/null & PIDS+=($!)
taskset -c 1 nginx -p "$T" -c "$T/rp.conf" 2>/dev/null & PIDS+=($!)
start() { # port args...
  local port=$1; shift
  mkdir -p "$T/ca-$port"
  taskset -c 1 "$LK" serve --policies "$HERE/conf/policies" --listen 127.0.0.1:$port --admin off \
    --ca-dir "$T/ca-$port" --upstream-ca "$OUT/ca.pem" --allow-private 127.0.0.0/8 "$@" >/dev/null 2>"$T/lk-$port.err" &
  PIDS+=($!); LAST=$!
}
start 13201 --workers 1 --audit "$T/a.jsonl"
start 13202 --workers 1 --audit /dev/null
start 13203 --workers 1 --audit "$T/c.jsonl"; C=$LAST
start 13204 --audit "$T/d.jsonl"
MIMALLOC_PURGE_DELAY=-1 start 13205 --workers 1 --audit "$T/e.jsonl"
sleep 2
for t in /proc/$C/task/*; do [ "$(cat "$t/comm")" = latchkey-audit ] && taskset -p -c 0 "$(basename "$t")" >/dev/null; done
one() { taskset -c 0 oha --no-tui --output-format json -c 64 -q "$RATE" --latency-correction -z "${DUR}s" "$@" | python3 -c '
import json,sys; d=json.load(sys.stdin); p=d["latencyPercentiles"]; print("p50 %.2f p99 %.2f p99.9 %.2f max %.1f ms" % (p["p50"]*1e3, p["p99"]*1e3, p["p99.9"]*1e3, d["summary"]["slowest"]*1e3))'; }
U=http://127.0.0.1:18080/small
taskset -c 0 oha --no-tui -c 64 -z 2s http://127.0.0.1:18081/small >/dev/null 2>&1
for p in 13201 13202 13203 13204 13205; do taskset -c 0 oha --no-tui -c 64 -z 2s -x http://127.0.0.1:$p $U >/dev/null 2>&1; done
for i in $(seq 1 "$REPS"); do
  echo "direct                        : $(one $U)"
  echo "nginx reverse proxy on CPU 1  : $(one http://127.0.0.1:18081/small)"
  echo "latchkey --workers 1          : $(one -x http://127.0.0.1:13201 $U)"
  echo "  audit to /dev/null          : $(one -x http://127.0.0.1:13202 $U)"
  echo "  audit writer on CPU 0       : $(one -x http://127.0.0.1:13203 $U)"
  echo "  default workers             : $(one -x http://127.0.0.1:13204 $U)"
  echo "  MIMALLOC_PURGE_DELAY=-1     : $(one -x http://127.0.0.1:13205 $U)"
done
