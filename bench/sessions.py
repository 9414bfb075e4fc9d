#!/usr/bin/env python3
"""Sessions benchmark (issue 34): what runtime sessions cost. Loopback only; stdlib only.

  bench/sessions.py [--sessions N] [--requests N] [--reps N] [--tunnels N] [--smoke]
                    [--latchkey PATH] [--report PATH] [--no-redis]

Measures, on one latchkey (release build, one worker pinned to CPU 1; nginx and oha on CPU 0):
  1. admission CPU per request, plain-HTTP forward path (GET /small, 100 B through nginx):
     a static identity's token vs one session among N live ones (presented as
     Proxy-Authorization Basic SESSION_ID:TOKEN), alternating in each pass; CPU = utime+stime of
     the latchkey PID from /proc/PID/stat ÷ 2xx responses (oha, 64 connections, keep-alive);
  2. memory per session: latchkey's RSS before making N sessions, after (stored only: the
     state store's pages), and after each was presented once (admitted, cached);
  3. revoke-to-cut latency: T open CONNECT tunnels, each its own session; each revoked in turn
     (DELETE /sessions/ID), the time from sending the DELETE to the tunnel's socket closing,
     p50/p99 — on the replica that revoked, and (with redis-server) on another replica sharing
     the store, which learns it by polling (every 250 ms) or the store's event.
Writes bench/results-sessions.md (or --report). Everything it starts is stopped by PID.
"""
import argparse
import base64
import http.client
import json
import os
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
P_UP, P_LK, P_ADMIN, P_LK2, P_ADMIN2, P_REDIS = 19180, 13311, 13312, 13313, 13314, 16479
STATIC_TOKEN = "bench-static-token-0123456789abcdef"
CLK = os.sysconf("SC_CLK_TCK")
PROCS = []


def log(msg):
    print(f"[sessions {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def spawn(args, **kw):
    p = subprocess.Popen(args, **kw)
    PROCS.append(p)
    return p


def stop_all():
    for p in PROCS:
        if p.poll() is None:
            p.terminate()
    deadline = time.time() + 3
    for p in PROCS:
        try:
            p.wait(max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()


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


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def policy(port):
    return f"""
[[rules]]
name  = "plain"
hosts = ["127.0.0.1"]
ports = [{port}]

[[rules]]
name   = "tunnel"
hosts  = ["127.0.0.1"]
ports  = [{port + 1}]
tunnel = true

[identities.static]
token = "env:BENCH_STATIC_TOKEN"
rules = ["plain", "tunnel"]

[profiles.agent]
rules = ["plain", "tunnel"]
ttl   = "2h"
"""


def start_latchkey(binary, work, name, listen, admin, state):
    pol = os.path.join(work, f"policies-{name}")
    os.makedirs(pol, exist_ok=True)
    with open(os.path.join(pol, "main.toml"), "w") as f:
        f.write(policy(P_UP))
    env = dict(os.environ, BENCH_STATIC_TOKEN=STATIC_TOKEN)
    args = ["taskset", "-c", CPU_PROXY, binary, "serve", "--policies", pol,
            "--listen", f"127.0.0.1:{listen}", "--admin", f"127.0.0.1:{admin}",
            "--ca-dir", os.path.join(work, f"ca-{name}"), "--workers", "1",
            "--audit", os.environ.get("BENCH_AUDIT", os.path.join(work, f"{name}-audit.jsonl")),
            "--allow-private", "127.0.0.0/8", "--state", state]
    p = spawn(args, env=env, stderr=open(os.path.join(work, f"{name}.stderr"), "w"))
    wait_port(listen)
    wait_port(admin)
    return p


def admin(port, method, path, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    data = json.dumps(body).encode() if body is not None else None
    c.request(method, path, body=data, headers={"content-type": "application/json"})
    r = c.getresponse()
    text = r.read()
    c.close()
    return r.status, (json.loads(text) if text else None)


def make_sessions(port, n):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    out = []
    for _ in range(n):
        c.request("POST", "/sessions", body=b'{"profile": "agent"}',
                  headers={"content-type": "application/json"})
        r = c.getresponse()
        made = json.loads(r.read())
        if r.status != 201:
            raise SystemExit(f"POST /sessions: {r.status} {made}")
        out.append((made["id"], made["token"]))
    c.close()
    return out


def basic(sid, token):
    return "Basic " + base64.b64encode(f"{sid}:{token}".encode()).decode()


def present_all(port, sessions):
    """One request per session, on one keep-alive connection each time it allows."""
    for sid, token in sessions:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        c.request("GET", f"http://127.0.0.1:{P_UP}/small",
                  headers={"proxy-authorization": basic(sid, token)})
        r = c.getresponse()
        r.read()
        c.close()
        if r.status != 200:
            raise SystemExit(f"presenting {sid}: {r.status}")


def oha(port, auth, n):
    args = ["taskset", "-c", CPU_LOAD, "oha", "--no-tui", "--output-format", "json", "-n", str(n),
            "-c", "64", "-x", f"http://127.0.0.1:{port}", "--proxy-header", f"proxy-authorization: {auth}",
            f"http://127.0.0.1:{P_UP}/small"]
    out = subprocess.run(args, capture_output=True, text=True, check=True)
    v = json.loads(out.stdout)
    return sum(c for s, c in v.get("statusCodeDistribution", {}).items() if s.startswith("2"))


def cpu_per_request(pid, port, auth, n):
    before = cpu_ticks(pid)
    ok = oha(port, auth, n)
    after = cpu_ticks(pid)
    if ok < n * 0.99:
        raise SystemExit(f"only {ok} of {n} requests answered 2xx")
    return (after - before) * 1e6 / CLK / ok


def open_tunnel(port, sid, token):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall((f"CONNECT 127.0.0.1:{P_UP + 1} HTTP/1.1\r\nHost: 127.0.0.1:{P_UP + 1}\r\n"
               f"Proxy-Authorization: {basic(sid, token)}\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(1)
        if not chunk:
            raise SystemExit("tunnel closed before its answer")
        head += chunk
    if b" 200 " not in head.split(b"\r\n")[0]:
        raise SystemExit(f"CONNECT refused: {head!r}")
    return s


def cut_latencies(tunnel_port, revoke_port, sessions):
    tunnels = [open_tunnel(tunnel_port, sid, tok) for sid, tok in sessions]
    out = []
    c = http.client.HTTPConnection("127.0.0.1", revoke_port, timeout=30)
    for (sid, _), s in zip(sessions, tunnels):
        t0 = time.perf_counter()
        c.request("DELETE", f"/sessions/{sid}")
        r = c.getresponse()
        r.read()
        if r.status != 204:
            raise SystemExit(f"DELETE {sid}: {r.status}")
        ready, _, _ = select.select([s], [], [], 5)
        if not ready or s.recv(1) != b"":
            raise SystemExit(f"tunnel of {sid} not closed within 5 s")
        out.append((time.perf_counter() - t0) * 1000)
        s.close()
    c.close()
    return out


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main():
    global CPU_LOAD, CPU_PROXY
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=10000)
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--tunnels", type=int, default=200)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--latchkey", default=os.environ.get("LATCHKEY", os.path.join(ROOT, "target/release/latchkey")))
    ap.add_argument("--report", default=os.path.join(HERE, "results-sessions.md"))
    ap.add_argument("--no-redis", action="store_true")
    a = ap.parse_args()
    if a.smoke:
        a.sessions, a.requests, a.reps, a.tunnels = 50, 500, 1, 5
        a.report = os.path.join(HERE, "out", "results-sessions-smoke.md")
    for tool in ("oha", "nginx", "taskset"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} not found")
    if not os.path.exists(a.latchkey):
        raise SystemExit(f"{a.latchkey}: no latchkey binary (cargo build --release)")
    ncpu = os.cpu_count() or 1
    CPU_LOAD, CPU_PROXY = ("0", "1") if ncpu >= 2 else ("0", "0")
    work = tempfile.mkdtemp(prefix="latchkey-bench-sessions-")
    os.chmod(work, 0o755)
    os.makedirs(os.path.join(work, "www"))
    os.makedirs(os.path.join(work, "nginx-tmp"))
    with open(os.path.join(work, "www", "small"), "wb") as f:
        f.write(b"x" * 100)
    conf = open(os.path.join(HERE, "conf", "limits-nginx.conf.tmpl")).read()
    conf = conf.replace("@OUT@", work).replace("19080", str(P_UP))
    # A second server for the tunnels: it accepts and holds connections.
    conf = conf.replace("    server {", f"    server {{ listen 127.0.0.1:{P_UP + 1}; location / {{ }} }}\n    server {{", 1)
    with open(os.path.join(work, "nginx.conf"), "w") as f:
        f.write(conf)
    try:
        spawn(["taskset", "-c", CPU_LOAD, "nginx", "-p", work, "-c", os.path.join(work, "nginx.conf")],
              stderr=subprocess.DEVNULL)
        wait_port(P_UP)
        lk = start_latchkey(a.latchkey, work, "a", P_LK, P_ADMIN, f"sqlite:{work}/state.db")
        time.sleep(0.5)
        rss0 = rss_kib(lk.pid)
        log(f"making {a.sessions} sessions")
        t = time.perf_counter()
        sessions = make_sessions(P_ADMIN, a.sessions)
        made_s = time.perf_counter() - t
        rss1 = rss_kib(lk.pid)
        log("presenting each once")
        present_all(P_LK, sessions)
        rss2 = rss_kib(lk.pid)
        static = "Basic " + base64.b64encode(f"static:{STATIC_TOKEN}".encode()).decode()
        one = basic(*sessions[len(sessions) // 2])
        cpu_static, cpu_session = [], []
        oha(P_LK, static, a.requests // 4)  # warm-up
        for rep in range(a.reps):
            order = [("static", static), ("session", one)]
            if rep % 2:
                order.reverse()
            for name, auth in order:
                v = cpu_per_request(lk.pid, P_LK, auth, a.requests)
                (cpu_static if name == "static" else cpu_session).append(v)
            log(f"pass {rep + 1}: static {cpu_static[-1]:.1f} µs, session {cpu_session[-1]:.1f} µs")
        log(f"revoke-to-cut, {a.tunnels} tunnels on the replica that revokes")
        local = cut_latencies(P_LK, P_ADMIN, make_sessions(P_ADMIN, a.tunnels))
        remote = None
        if not a.no_redis and shutil.which("redis-server"):
            spawn(["taskset", "-c", CPU_LOAD, "redis-server", "--port", str(P_REDIS), "--bind", "127.0.0.1",
                   "--save", "", "--appendonly", "no", "--dir", work], stdout=subprocess.DEVNULL)
            wait_port(P_REDIS)
            url = f"redis://127.0.0.1:{P_REDIS}/0"
            start_latchkey(a.latchkey, work, "r1", P_LK2, P_ADMIN2, url)
            start_latchkey(a.latchkey, work, "r2", P_LK2 + 10, P_ADMIN2 + 10, url)
            log(f"revoke-to-cut, {a.tunnels} tunnels on another replica (redis)")
            remote = cut_latencies(P_LK2, P_ADMIN2 + 10, make_sessions(P_ADMIN2, a.tunnels))
        report(a, rss0, rss1, rss2, made_s, cpu_static, cpu_session, local, remote)
    finally:
        stop_all()
        shutil.rmtree(work, ignore_errors=True)


def report(a, rss0, rss1, rss2, made_s, cpu_static, cpu_session, local, remote):
    st, se = statistics.median(cpu_static), statistics.median(cpu_session)
    diffs = [b - s for s, b in zip(cpu_static, cpu_session)]
    lines = [
        "# Sessions: what they cost (issue 34)",
        "",
        f"`bench/sessions.py{' --smoke' if a.smoke else ''}` on {time.strftime('%Y-%m-%d')}: "
        f"{os.cpu_count()} CPUs, latchkey `--workers 1` pinned alone to one CPU, nginx and oha on "
        "the other; plain-HTTP forward path, GET /small (100 B), 64 keep-alive connections.",
        "",
        "## Admission CPU per request",
        "",
        f"{a.reps} passes of {a.requests} requests each, alternating; CPU = utime+stime of the "
        "latchkey process ÷ 2xx answers (10 ms ticks).",
        "",
        "| presented as | CPU µs/request (median) | passes |",
        "|---|---:|---|",
        f"| a static identity's token | {st:.1f} | {', '.join(f'{x:.1f}' for x in cpu_static)} |",
        f"| one session among {a.sessions} live | {se:.1f} | {', '.join(f'{x:.1f}' for x in cpu_session)} |",
        "",
        f"Session minus static, per pass (median): **{statistics.median(diffs):+.1f} µs**.",
        "",
        "## Memory per session",
        "",
        "| after | RSS (KiB) | per session |",
        "|---|---:|---:|",
        f"| start | {rss0} | |",
        f"| {a.sessions} made (stored in SQLite) | {rss1} | {(rss1 - rss0) * 1024 / a.sessions:.0f} B |",
        f"| each presented once (admitted, cached) | {rss2} | {(rss2 - rss0) * 1024 / a.sessions:.0f} B |",
        "",
        f"Making them took {made_s:.1f} s ({a.sessions / made_s:.0f}/s, one admin connection, "
        "each a SQLite write).",
        "",
        "## Revoke-to-cut latency",
        "",
        "From sending `DELETE /sessions/ID` to the session's open CONNECT tunnel closing, "
        f"{a.tunnels} tunnels each.",
        "",
        "| where the tunnel is | p50 ms | p99 ms | max ms |",
        "|---|---:|---:|---:|",
        f"| the replica that revoked (SQLite) | {pct(local, .5):.2f} | {pct(local, .99):.2f} | {max(local):.2f} |",
    ]
    if remote:
        lines.append(
            f"| another replica (Redis, poll 250 ms or event) | {pct(remote, .5):.2f} | "
            f"{pct(remote, .99):.2f} | {max(remote):.2f} |")
    lines.append("")
    os.makedirs(os.path.dirname(a.report), exist_ok=True)
    with open(a.report, "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    main()
