#!/usr/bin/env bash
# Upload memory bench (issue 11 §4), loopback only: latchkey's RSS with 1,000 stalled uploads
# (streamed, and held whole under --max-buffered-bytes), and while one 1 GiB upload streams.
# Not a timed test: run it by hand; it writes bench/out/uploads.json and prints the table for
# bench/results-uploads.md.
#
#   bench/uploads.sh [--no-build] [--stalled N] [--gib N] [--hold S]
#   env: LATCHKEY=PATH (binary to measure; default target/release/latchkey)
#
# Bounded: N connections (default 1000), each stalled for HOLD s (default 5) until
# --body-timeout (HOLD + 5 s) cuts it; one upload of N GiB (default 1). Everything started is
# stopped by PID (uploads.py terminates latchkey and its upstream on exit).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
BUILD=1 ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --no-build) BUILD=0 ;;
    --stalled|--gib|--hold) ARGS+=("$1" "$2"); shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
BIN="${LATCHKEY:-$ROOT/target/release/latchkey}"
if [ "$BUILD" = 1 ] && [ -z "${LATCHKEY:-}" ]; then
  (cd "$ROOT" && cargo build --release --quiet)
fi
# 1,000 sockets each side of latchkey, plus the upstream's.
ulimit -n 16384 2>/dev/null || true
mkdir -p "$HERE/out"
python3 "$HERE/uploads.py" "$BIN" "$HERE/out/uploads.json" "${ARGS[@]}" >/dev/null
python3 - "$HERE/out/uploads.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
mb = lambda k: f"{k / 1024:.0f} MiB"
s, h, u = r["stalled_streamed"], r["stalled_held"], r["upload_1gib"]
z = r["stalled_head_only"]
print(f"| measurement | latchkey RSS |")
print(f"|---|---|")
print(f"| idle | {mb(r['idle_rss_kib'])} |")
for name, x in (("head only, then nothing (`stream.test`)", z), ("64 KiB sent, streamed (`stream.test`)", s), ("64 KiB sent, held whole (`hold.test`, body placeholders)", h)):
    print(f"| {x['uploads']} stalled uploads, {name}: all open | {mb(x['rss_kib_open'])} |")
    print(f"| … {name}: after the hold | {mb(x['rss_kib_after_hold'])} |")
    print(f"| … {name}: after --body-timeout cut them (answers {x['answers']}) | {mb(x['rss_kib_after_cut'])} |")
print(f"| 1 GiB upload streaming: first second / last second / max | {mb(u['rss_kib_first_second'])} / {mb(u['rss_kib_last_second'])} / {mb(u['rss_kib_max'])} |")
print()
print(f"1 GiB upload: {u['seconds']} s ({u['mib_per_s']} MiB/s), answer `{u['status_line']}`, {u['samples']} RSS samples; budget {r['budget']}, body timeout {r['body_timeout_s']} s.")
PY
