#!/usr/bin/env python3
"""bench/limits.sh helper.

  row OHA_JSON --pass P --config NAME --shape S --ticks T --clk HZ --ns NS --tids-before L --tids-after L
      one oha result (plus the latchkey CPU the script measured around it) as one JSON line
  show            a row from stdin as one readable line
  report OUT      bench/results-limits.md from OUT/runs.jsonl, OUT/env.txt and the audit logs
  profile --config NAME --out OUT   `perf script -F comm,tid,time,ip,sym` on stdin: the share of samples inside limit code
  check OUT       exit 1 unless every run answered 2xx only and every limited configuration's
                  audit records show the limit charged (and, for the token budget, the usage read)
"""
import argparse
import json
import os
import statistics
import sys

TARGET_EMBEDDED_US = 2.0  # issue 16: embedded store, ≤ 2 µs added per request

LIMIT_DESC = {
    "none": "(a) no limit",
    "rate": '(b) one rate limit, `requests = "1000000/s"`',
    "tokens": '(c) one token budget, `llm_tokens = "1000G/day"`',
}
SHAPE_DESC = {
    "get": "GET /small (100 B)",
    "llm": "POST /v1/chat/completions, non-streaming, usage in the answer",
}
STORE_DESC = {"sqlite": "embedded (`--state sqlite:…`)", "redis": "Redis (`--state redis://…`)"}
MEASURE = {"rate": "requests", "tokens": "llm_tokens"}
# What the fake endpoint's answer reports (bench/conf/limits-nginx.conf.tmpl).
LLM_USAGE = {"input_tokens": 9, "output_tokens": 2}


def load(path):
    if not os.path.exists(path):
        return []
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, spec="{:.1f}"):
    return "—" if x is None else spec.format(x)


def row(argv):
    ap = argparse.ArgumentParser(prog="limits.py row")
    ap.add_argument("path")
    for k in ("pass", "ticks", "clk", "ns"):
        ap.add_argument("--" + k, type=int, required=True)
    for k in ("config", "shape", "tids-before", "tids-after"):
        ap.add_argument("--" + k, required=True)
    a = ap.parse_args(argv)
    limit, store = a.config.split("-", 1)
    rec = {"pass": getattr(a, "pass"), "config": a.config,
           "limit": limit, "store": store, "shape": a.shape, "rps": 0.0, "p50_ms": None,
           "p99_ms": None, "ok": 0, "non2xx": 0, "errors": 0, "status": {},
           "cpu_s": a.ticks / a.clk, "ticks": a.ticks, "clk": a.clk, "cpu_ns": a.ns,
           # The schedstat sum misses threads that ended during the run: flag those runs.
           "threads_stable": set(a.tids_before.split()) <= set(a.tids_after.split()),
           # …or started and ended within it: the two clocks then disagree by more than a tick.
           "clocks_agree": abs(a.ticks / a.clk - a.ns / 1e9) <= 2 / a.clk + 0.02 * a.ticks / a.clk,
           "cpu_us_per_req": None, "cpu_ns_us_per_req": None}
    try:
        with open(a.path) as fh:
            d = json.load(fh)
        s = d["summary"]
        codes = {str(k): v for k, v in (d.get("statusCodeDistribution") or {}).items()}
        ok = sum(v for k, v in codes.items() if k.startswith("2"))
        errd = d.get("errorDistribution") or {}
        lp = d.get("latencyPercentiles") or {}
        rec.update(ok=ok, non2xx=sum(codes.values()) - ok, errors=sum(errd.values()),
                   error_kinds=errd, status=codes,
                   rps=ok / s["total"] if s.get("total") else 0.0,
                   p50_ms=(lp.get("p50") or 0) * 1000, p99_ms=(lp.get("p99") or 0) * 1000)
        if ok:
            rec["cpu_us_per_req"] = round(a.ticks / a.clk * 1e6 / ok, 2)
            rec["cpu_ns_us_per_req"] = round(a.ns / 1000 / ok, 3)
    except (OSError, ValueError, KeyError, TypeError) as e:
        err = ""
        if os.path.exists(a.path + ".err"):
            with open(a.path + ".err") as fh:
                err = fh.read()[-300:]
        rec["failure"] = f"{type(e).__name__}: {e}: {err}"
    print(json.dumps(rec))


def show():
    r = json.loads(sys.stdin.read())
    print("  %-14s %-3s p%s %8.0f req/s p50 %s ms p99 %s ms cpu %s µs/req (schedstat %s) 2xx %s non-2xx %s err %s%s" % (
        r["config"], r["shape"], r["pass"], r["rps"], fmt(r["p50_ms"], "{:.2f}"), fmt(r["p99_ms"], "{:.2f}"),
        fmt(r["cpu_us_per_req"], "{:.2f}"), fmt(r["cpu_ns_us_per_req"], "{:.2f}"), r["ok"], r["non2xx"],
        r["errors"], (" FAILED: " + r["failure"]) if r.get("failure") else
        ("" if r.get("clocks_agree", True) else " (schedstat and utime+stime disagree)")))


def audit_evidence(out, configs):
    """Per limited configuration: how many audit records show the limit charged as expected."""
    ev = {}
    for cfg in configs:
        limit = cfg.split("-", 1)[0]
        if limit == "none":
            continue
        path = os.path.join(out, f"{cfg}-audit.jsonl")
        e = {"records": 0, "charged": 0, "usage_read": 0, "last_used": None, "key": None, "bad": []}
        if os.path.exists(path):
            with open(path) as fh:
                for line in fh:
                    if not line.strip():
                        continue
                    try:
                        r = json.loads(line)
                    except ValueError:
                        e["records"] += 1
                        e["bad"].append("unparsable audit line")
                        continue
                    # A request's outcome record is its full record (a decision line carries
                    # what was decided, not the charges; checkpoint lines carry no phase).
                    if r.get("phase", "outcome") != "outcome" or "checkpoint" in r:
                        continue
                    e["records"] += 1
                    charges = [c for c in r.get("limits") or [] if c.get("measure") == MEASURE[limit]]
                    if charges and not any(c.get("refused") or c.get("unchecked") for c in charges):
                        e["charged"] += 1
                        e["last_used"] = charges[-1].get("used")
                        e["key"] = charges[-1].get("key")
                    u = r.get("usage") or {}
                    if limit == "tokens" and u.get("source") == "response" and all(
                            u.get(k) == v for k, v in LLM_USAGE.items()):
                        e["usage_read"] += 1
        ev[cfg] = e
    return ev


def paired_added(rows, limit, store, shape, key):
    """Median over passes of (limited − none) in the same pass, store and shape."""
    diffs = []
    for p in sorted({r["pass"] for r in rows}):
        a = [r[key] for r in rows if r["pass"] == p and r["config"] == f"{limit}-{store}" and r["shape"] == shape]
        b = [r[key] for r in rows if r["pass"] == p and r["config"] == f"none-{store}" and r["shape"] == shape]
        if a and b and a[0] is not None and b[0] is not None:
            diffs.append(a[0] - b[0])
    return (statistics.median(diffs), min(diffs), max(diffs)) if diffs else (None, None, None)


def report(argv):
    ap = argparse.ArgumentParser(prog="limits.py report")
    ap.add_argument("out")
    ap.add_argument("--no-audit", action="store_true")
    a = ap.parse_args(argv)
    rows = load(os.path.join(a.out, "runs.jsonl"))
    with open(os.path.join(a.out, "env.txt")) as fh:
        env = dict(line.rstrip("\n").split("=", 1) for line in fh if "=" in line)
    n = int(env.get("requests", "0") or 0)
    clk = int(env.get("clk_tck", "100") or 100)
    configs = sorted({r["config"] for r in rows})
    P = print
    P("# Limits benchmark (issue 16)\n")
    P("Generated by `bench/limits.sh`. latchkey's CPU per request with one rate limit and with one "
      "token budget, on the embedded and the Redis state store, beside the same requests under no "
      "limit. All traffic on 127.0.0.1.\n")
    if env.get("mode") == "smoke":
        P("**Smoke run** (`--smoke`): it proves the script works; its numbers mean nothing.\n")
    P("## How this was run\n")
    P(f"- date: {env.get('date')}; mode: `{env.get('mode')}`")
    P(f"- machine: {env.get('nproc')} CPUs ({env.get('cpu')}), {env.get('mem')}, Linux {env.get('kernel')}")
    if env.get("load"):
        P(f"- load average (1, 5, 15 min): {env['load']} — anything above ~1.5 on this 2-CPU machine means "
          "other work shared the CPUs, which inflates every CPU figure and widens the ranges")
    for k in ("latchkey", "oha", "nginx", "redis"):
        if env.get(k):
            P(f"- {k}: {env[k]}")
    P(f"- each configuration is its own `latchkey serve --workers 1 --admin off` with its policy "
      f"(`bench/conf/limits-{{none,rate,tokens}}/`) and `--state` (a fresh SQLite file, or its own "
      f"database of a memory-only `redis-server`), audit log to a file; all pinned to CPU 1, idle "
      f"but the one measured. oha, nginx (the upstream) and redis-server on CPU 0.")
    P(f"- per pass and configuration: a discarded warm-up of {env.get('warmup')} requests, then "
      f"`oha -n {n} -c {env.get('conns')}` keep-alive through the plain-HTTP forward path, "
      + (f"at a fixed {int(env['rate']):,} req/s (`-q`, latency from when each request was due) for every "
         f"configuration; " if int(env.get("rate", "0") or 0) else "as fast as oha can; ")
      + f"{env.get('reps')} passes, the order rotated every pass. Figures are medians over passes.")
    P(f"- CPU µs/req = latchkey's utime+stime (`/proc/PID/stat`, all threads, {1000 // clk} ms ticks) "
      f"over the measured run ÷ 2xx answers; one tick is {1e6 / clk / n:.2f} µs/req at this count "
      f"(so ±{2e6 / clk / n:.2f} µs on a difference)." if n else "")
    P("  schedstat µs/req = the sum of every thread's `/proc/PID/task/TID/schedstat` run time (ns), "
      "the fine-grained figure (it would miss a thread that ended mid-run: a run where it disagrees with utime+stime by more than a tick is flagged).")
    P("- added = median over passes of (limited − none) from the same pass, store and request shape; "
      "the range over passes in brackets.\n")

    P("## Results\n")
    P("| request | limit | store | req/s | p50 ms | p99 ms | CPU µs/req | schedstat µs/req | added µs (utime+stime) | added µs (schedstat) [range] |")
    P("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    verdicts = []
    for shape in ("get", "llm"):
        for limit in ("none", "rate", "tokens"):
            for store in ("sqlite", "redis"):
                rs = [r for r in rows if r["config"] == f"{limit}-{store}" and r["shape"] == shape]
                if not rs:
                    continue
                added, added_ns = "", ""
                if limit != "none":
                    d, _, _ = paired_added(rows, limit, store, shape, "cpu_us_per_req")
                    dn, lo, hi = paired_added(rows, limit, store, shape, "cpu_ns_us_per_req")
                    added = fmt(d, "{:+.2f}")
                    added_ns = f"**{fmt(dn, '{:+.2f}')}** [{fmt(lo, '{:+.2f}')} … {fmt(hi, '{:+.2f}')}]" if dn is not None else "—"
                    if store == "sqlite" and dn is not None:
                        verdicts.append((limit, dn, d))
                flag = "" if all(r.get("threads_stable") and r.get("clocks_agree") for r in rs) \
                    else " (schedstat missed a thread: use utime+stime)"
                P(f"| {SHAPE_DESC[shape]} | {LIMIT_DESC[limit]} | {STORE_DESC[store]} | "
                  f"{fmt(med(r['rps'] for r in rs), '{:,.0f}')} | {fmt(med(r['p50_ms'] for r in rs), '{:.2f}')} | "
                  f"{fmt(med(r['p99_ms'] for r in rs), '{:.2f}')} | {fmt(med(r['cpu_us_per_req'] for r in rs), '{:.2f}')} | "
                  f"{fmt(med(r['cpu_ns_us_per_req'] for r in rs), '{:.2f}')}{flag} | {added} | {added_ns} |")
    P()
    if verdicts:
        P(f"## Against the target (embedded store: ≤ {TARGET_EMBEDDED_US:g} µs added)\n")
        for limit, dn, d in verdicts:
            ok = dn <= TARGET_EMBEDDED_US
            P(f"- {LIMIT_DESC[limit]}: {dn:+.2f} µs (schedstat; utime+stime {fmt(d, '{:+.2f}')}) — "
              f"{'meets' if ok else '**misses**'} the target.")
        P()
    profs = [json.load(open(os.path.join(a.out, f))) for f in sorted(os.listdir(a.out))
             if f.startswith("profile-") and f.endswith(".json")]
    if profs:
        P("## Profile (`--profile`)\n")
        P("One more run of each limited configuration under `perf record -e cpu-clock --call-graph dwarf` "
          "(not one of the measured passes): the share of samples with a frame of the limit's code on the "
          f"stack ({', '.join('`' + f + '`' for f in LIMIT_FRAMES)}), times that configuration's median "
          "CPU µs/req. It leaves out what the limit costs elsewhere (the socket wake-ups of a Redis reply, "
          "allocator work), so it is a lower bound, but it is not at the mercy of run-to-run noise.\n")
        P("| configuration | samples | with a limit frame | share | ≈ µs/req in limit code |")
        P("|---|---:|---:|---:|---:|")
        for pr in profs:
            cpu = med(r["cpu_ns_us_per_req"] for r in rows if r["config"] == pr["config"])
            us = pr["share"] * cpu if pr["share"] is not None and cpu is not None else None
            P(f"| {pr['config']} | {pr['samples']} | {pr['limit_samples']} | "
              f"{fmt(None if pr['share'] is None else 100 * pr['share'], '{:.2f} %')} | {fmt(us, '{:.2f}')} |")
        P()
    if not a.no_audit:
        ev = audit_evidence(a.out, configs)
        if ev:
            P("## Evidence that the limits ran\n")
            P("From each limited latchkey's audit log (warm-ups included): records whose `limits` show "
              "the measure charged (not refused, not unchecked), and for the token budget records whose "
              f"`usage` was read from the answer ({LLM_USAGE['input_tokens']} in, "
              f"{LLM_USAGE['output_tokens']} out, `source = \"response\"`).\n")
            P("| configuration | audit records | limit charged | usage read | key | counter at the end |")
            P("|---|---:|---:|---:|---|---:|")
            for cfg, e in ev.items():
                usage = str(e["usage_read"]) if cfg.startswith("tokens") else "—"
                P(f"| {cfg} | {e['records']} | {e['charged']} | {usage} | {e['key'] or '—'} | {e['last_used'] if e['last_used'] is not None else '—'} |")
            keys = {k[len("redis_keys_"):]: v for k, v in env.items() if k.startswith("redis_keys_")}
            if keys:
                P("\nRedis keys after the run (`DBSIZE` of each latchkey's database): "
                  + ", ".join(f"{k} {v}" for k, v in sorted(keys.items())) + ".")
            P()
    fails = [r for r in rows if r.get("failure") or r["errors"] or r["non2xx"] or r["ok"] != n]
    if fails:
        P("## Failed runs\n")
        for r in fails:
            P(f"- pass {r['pass']} {r['config']} {r['shape']}: 2xx {r['ok']} of {n}, non-2xx {r['non2xx']} "
              f"{r['status']}, errors {r['errors']} {r.get('error_kinds', {})} {r.get('failure', '')}")
        P()


# Frames that belong to a limit's work: the engine, its pipeline phase, the usage meter, the
# state stores and their clients. A sample counts when any frame of its stack matches.
LIMIT_FRAMES = ("latchkey::governance::limits", "latchkey::proxy::pipeline::limits",
                "latchkey::governance::usage", "latchkey::state::", "redis::", "rusqlite::",
                "sqlite3", "limits_for")


def profile(argv):
    """Reads `perf script -F comm,tid,time,ip,sym` (DWARF call graphs) from stdin."""
    ap = argparse.ArgumentParser(prog="limits.py profile")
    ap.add_argument("--config", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    total = hits = 0
    leaf_all, leaf_hit = {}, {}
    stack = []

    def flush():
        nonlocal total, hits
        if not stack:
            return
        total += 1
        leaf = stack[0]
        leaf_all[leaf] = leaf_all.get(leaf, 0) + 1
        hit = next((f for f in stack if any(p in f for p in LIMIT_FRAMES)), None)
        if hit is not None:
            hits += 1
            leaf_hit[hit] = leaf_hit.get(hit, 0) + 1
        stack.clear()

    for line in sys.stdin:
        if not line.strip():
            flush()
        elif line.startswith("\t"):
            # "\tADDRESS SYMBOL": the symbol may hold spaces (`<T as Trait>::f`).
            parts = line.strip().split(None, 1)
            stack.append(parts[1] if len(parts) > 1 else parts[0])
        else:
            flush()
    flush()
    res = {"config": a.config, "samples": total, "limit_samples": hits,
           "share": hits / total if total else None}
    with open(os.path.join(a.out, f"profile-{a.config}.json"), "w") as fh:
        json.dump(res, fh)
    with open(os.path.join(a.out, f"profile-{a.config}.txt"), "w") as fh:
        fh.write(f"{a.config}: {hits} of {total} samples have a limit frame on the stack "
                 f"({100 * hits / total if total else 0:.2f} %)\n\nInnermost limit frame of those samples:\n")
        for sym, c in sorted(leaf_hit.items(), key=lambda kv: -kv[1])[:40]:
            fh.write(f"{c:7d}  {sym}\n")
        fh.write("\nLeaf functions of all samples:\n")
        for sym, c in sorted(leaf_all.items(), key=lambda kv: -kv[1])[:60]:
            fh.write(f"{c:7d}  {sym}\n")


def check(argv):
    ap = argparse.ArgumentParser(prog="limits.py check")
    ap.add_argument("out")
    ap.add_argument("--no-audit", action="store_true")
    a = ap.parse_args(argv)
    rows = load(os.path.join(a.out, "runs.jsonl"))
    with open(os.path.join(a.out, "env.txt")) as fh:
        env = dict(line.rstrip("\n").split("=", 1) for line in fh if "=" in line)
    n = int(env.get("requests", "0") or 0)
    problems = []
    if not rows:
        problems.append("no runs recorded")
    for r in rows:
        if r.get("failure") or r["errors"] or r["non2xx"] or r["ok"] != n:
            problems.append(f"pass {r['pass']} {r['config']} {r['shape']}: 2xx {r['ok']} of {n}, "
                            f"status {r['status']}, errors {r.get('error_kinds', {})} {r.get('failure', '')}")
    if not a.no_audit:
        for cfg, e in audit_evidence(a.out, sorted({r["config"] for r in rows})).items():
            if e["records"] == 0 or e["charged"] != e["records"]:
                problems.append(f"{cfg}: {e['charged']} of {e['records']} audit records show the limit charged")
            if cfg.startswith("tokens") and e["usage_read"] != e["records"]:
                problems.append(f"{cfg}: {e['usage_read']} of {e['records']} audit records carry the usage read from the answer")
    for p in problems:
        print("limits bench:", p, file=sys.stderr)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    cmd, rest = (sys.argv[1], sys.argv[2:]) if len(sys.argv) > 1 else ("", [])
    if cmd == "row":
        row(rest)
    elif cmd == "show":
        show()
    elif cmd == "report":
        report(rest)
    elif cmd == "profile":
        profile(rest)
    elif cmd == "check":
        check(rest)
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
