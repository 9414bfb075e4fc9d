#!/usr/bin/env bash
# Measures how long each test tier takes on this machine and rewrites docs/src/measured.md, so
# the book and the README quote measured times (and test counts, which change with every
# change) from one generated file instead of hand-edited prose.
#
#   docs/measure-tests.sh TIER...          measure these tiers now (in the repository's target/)
#   docs/measure-tests.sh --render         only rewrite docs/src/measured.md from docs/measured.tsv
#   docs/measure-tests.sh --record TIER SECONDS TESTS COMMIT DATE LOAD SOURCE
#                                          record a measurement another run made (a CI log, cargo's
#                                          own "Finished … in" line; SOURCE says which), then
#                                          rewrite the page
#
# Tiers (the commands docs/src/contributing/tests.md documents):
#   fast   cargo test --lib         the unit tests: no root, no Python, no network
#   full   cargo test               everything, CI's command; needs root (network namespaces, apt)
#   build  cargo test --no-run      a fresh debug build of everything `cargo test` runs, in an
#                                   empty target directory (what a first run pays before testing)
#   pyenv  the Python environment the integration tests build in target/tmp/pyenv, rebuilt from
#          scratch (`rm -rf target/tmp/pyenv`, then the one test that needs it first)
#
# Each measurement replaces its tier's row in docs/measured.tsv: the command, wall seconds, the
# tests it ran (summed from cargo's `test result:` lines), UTC date, commit, cores, and whether it
# ran as root, and the load average when it started (other work on the machine slows a tier).
# A tier whose command fails is not recorded (the script exits non-zero).
set -euo pipefail
cd "$(dirname "$0")/.."

TSV=docs/measured.tsv
OUT=docs/src/measured.md
# The one test that starts a Python client (and so builds the environment first).
PY_TEST=secrets_clients::python_requests_with_a_placeholder_key
HEADER=$'tier\tcommand\tseconds\ttests\tdate\tcommit\tcores\tload\troot\tsource'

command_of() {
    case "$1" in
        fast) echo "cargo test --lib" ;;
        full) echo "cargo test" ;;
        build) echo "cargo test --no-run" ;;
        pyenv) echo "rm -rf target/tmp/pyenv; cargo test --test it $PY_TEST" ;;
        *) echo "docs/measure-tests.sh: unknown tier '$1' (fast, full, build, pyenv)" >&2; return 2 ;;
    esac
}

# Runs one tier; prints "SECONDS TESTS LOAD" (LOAD: the 1-minute load average at its start).
run_tier() {
    local tier=$1 log
    log=$(mktemp)
    # Build first, untimed, so a row is the tests' own time (the build tier is the build's).
    local prebuild=()
    case "$tier" in
        fast) prebuild=(cargo test --lib --no-run) ;;
        full) prebuild=(cargo test --no-run) ;;
        pyenv) prebuild=(cargo test --test it --no-run) ;;
    esac
    if [ "${#prebuild[@]}" -gt 0 ] && ! "${prebuild[@]}" >"$log" 2>&1; then
        echo "docs/measure-tests.sh: ${prebuild[*]} failed; last lines:" >&2
        tail -n 30 "$log" >&2
        rm -f "$log"
        return 1
    fi
    local start end status=0
    start=$(date +%s.%N)
    local load
    load=$(cut -d' ' -f1 /proc/loadavg)
    case "$tier" in
        fast) cargo test --lib >"$log" 2>&1 || status=$? ;;
        full) cargo test >"$log" 2>&1 || status=$? ;;
        build)
            local dir
            dir=$(mktemp -d)
            CARGO_TARGET_DIR="$dir" cargo test --no-run >"$log" 2>&1 || status=$?
            rm -rf "$dir"
            ;;
        pyenv)
            rm -rf target/tmp/pyenv
            cargo test --test it "$PY_TEST" >"$log" 2>&1 || status=$?
            ;;
    esac
    end=$(date +%s.%N)
    if [ "$status" -ne 0 ]; then
        echo "docs/measure-tests.sh: tier $tier failed (exit $status); last lines:" >&2
        tail -n 30 "$log" >&2
        rm -f "$log"
        return "$status"
    fi
    local tests
    tests=$(awk '/^test result: ok\./ { n += $4 } END { print n + 0 }' "$log")
    rm -f "$log"
    awk -v s="$start" -v e="$end" -v t="$tests" -v l="$load" 'BEGIN { printf "%d %d %s\n", e - s + 0.5, t, l }'
}

record() {
    local tier=$1 seconds=$2 tests=$3
    local commit=${4:-$(git rev-parse --short HEAD 2>/dev/null || echo -)}
    local date=${5:-$(date -u +%Y-%m-%dT%H:%MZ)}
    local load=${6:--}
    local source=${7:-docs/measure-tests.sh}
    local row
    row=$(printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s' "$tier" "$(command_of "$tier")" "$seconds" \
        "$tests" "$date" "$commit" "$(nproc)" "$load" "$([ "$(id -u)" -eq 0 ] && echo yes || echo no)" "$source")
    local tmp
    tmp=$(mktemp)
    { echo "$HEADER"; [ -f "$TSV" ] && tail -n +2 "$TSV" | awk -F'\t' -v t="$tier" '$1 != t'; echo "$row"; } >"$tmp"
    mv "$tmp" "$TSV"
}

minutes() {
    awk -v s="$1" 'BEGIN { if (s < 90) printf "%d s", s; else printf "%d min %02d s", s / 60, s % 60 }'
}

render() {
    [ -f "$TSV" ] || { echo "docs/measure-tests.sh: no $TSV yet" >&2; return 1; }
    {
        echo "# Measured test times"
        echo
        echo "<!-- Generated by docs/measure-tests.sh from docs/measured.tsv: do not edit by hand. -->"
        echo
        echo "What each test tier took when it was last measured, with the cores and the load its row"
        echo "gives. These numbers change with every change to the code and with the machine's load;"
        echo "the README and the Tests chapter only round them. Re-measure with"
        echo "\`docs/measure-tests.sh TIER...\` (tiers: \`fast\`, \`full\`, \`build\`, \`pyenv\`); what each"
        echo "tier runs and which needs root: [Tests](contributing/tests.md)."
        echo
        echo "| tier | command | took | tests passed | measured (UTC) | commit | cores | load at start | as root | measured by |"
        echo "|---|---|---:|---:|---|---|---:|---:|---|---|"
        local order
        for order in build pyenv fast full; do
            tail -n +2 "$TSV" | awk -F'\t' -v t="$order" '$1 == t' | while IFS=$'\t' read -r tier cmd secs tests date commit cores load root source; do
                local shown=$tests
                [ "$tier" = build ] && shown="— (builds only)"
                [ "$tests" = 0 ] && shown="—"
                printf '| %s | `%s` | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$tier" "$cmd" "$(minutes "$secs")" \
                    "$shown" "$date" "$commit" "$cores" "$load" "$root" "$source"
            done
        done
        echo
        echo "- **build**: from an empty target directory, crates downloaded (or in cargo's cache);"
        echo "  \`cargo run --locked -- demo\` the first time builds a subset of it."
        echo "- **pyenv**: the Python virtual environment the integration tests create once in"
        echo "  \`target/tmp/pyenv\`; every later run reuses it."
        echo "- **fast**, **full** and **pyenv**: with the build already done (the build is its own row)."
        echo "  A first \`cargo test\` on a fresh machine costs about build + pyenv + full, plus any"
        echo "  Debian tools \`apt-get\` installs."
    } >"$OUT"
}

if [ "$#" -eq 0 ]; then
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
fi
if [ "$1" = "--record" ]; then
    [ "$#" -eq 8 ] || { echo "usage: docs/measure-tests.sh --record TIER SECONDS TESTS COMMIT DATE LOAD SOURCE" >&2; exit 2; }
    command_of "$2" >/dev/null
    case "$3" in *[!0-9]* | '') echo "docs/measure-tests.sh: SECONDS must be a whole number, not '$3'" >&2; exit 2 ;; esac
    case "$4" in *[!0-9]* | '') echo "docs/measure-tests.sh: TESTS must be a whole number, not '$4'" >&2; exit 2 ;; esac
    record "$2" "$3" "$4" "$5" "$6" "$7" "$8"
    render
    exit 0
fi
if [ "$1" = "--render" ]; then
    render
    exit 0
fi
for tier in "$@"; do
    command_of "$tier" >/dev/null
done
for tier in "$@"; do
    echo "== measuring $tier: $(command_of "$tier")" >&2
    result=$(run_tier "$tier")
    read -r seconds tests load <<<"$result"
    record "$tier" "$seconds" "$tests" "" "" "$load"
    echo "   $(minutes "$seconds"), $tests tests" >&2
done
render
