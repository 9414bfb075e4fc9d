#!/usr/bin/env python3
"""Turn one oha JSON result into one JSON line: rps, p50/p99, requests, proxy CPU µs/request."""
import json, os, sys

path, pas, scen, proxy, ticks, clk, url = sys.argv[1:8]
rec = {"run": os.environ.get("BENCH_RUN_ID", ""), "pass": int(pas) if pas.isdigit() else pas,
       "rate": int(os.environ["BENCH_RATE"]) if os.environ.get("BENCH_RATE") else None, "scenario": int(scen), "proxy": proxy, "url": url,
       "rps": 0.0, "p50_ms": 0.0, "p99_ms": 0.0, "ok": 0, "errors": 0,
       "cpu_us_per_req": None, "cpu_s": int(ticks) / int(clk) if proxy != "direct" else None}
try:
    d = json.load(open(path))
    s = d["summary"]
    codes = d.get("statusCodeDistribution", {}) or {}
    ok = sum(v for k, v in codes.items() if str(k).startswith("2"))
    total = sum(codes.values())
    # requests cut off when -z expires are not failures
    errd = {k: v for k, v in (d.get("errorDistribution") or {}).items() if "deadline" not in k}
    errs = sum(errd.values()) + (total - ok)
    lp = d.get("latencyPercentiles", {}) or {}
    rec.update(rps=ok / s["total"] if s.get("total") else 0.0,
               p50_ms=(lp.get("p50") or 0) * 1000, p99_ms=(lp.get("p99") or 0) * 1000,
               ok=ok, errors=errs, error_kinds=errd,
               status=codes)
    if proxy != "direct" and ok:
        rec["cpu_us_per_req"] = round(int(ticks) / int(clk) * 1e6 / ok, 1)
except Exception as e:  # noqa: BLE001 - report whatever went wrong as the run's error
    rec["failure"] = f"{type(e).__name__}: {e}: " + open(path + ".err").read()[-300:] if True else ""
print(json.dumps(rec))
