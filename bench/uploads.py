#!/usr/bin/env python3
"""Upload memory bench (issue 11 §4): latchkey's RSS with many stalled uploads, and while one
1 GiB upload streams through it. Loopback only; every loop is bounded in count and time.

Usage: uploads.py LATCHKEY_BIN OUT_JSON [--stalled N] [--gib N] [--hold S]

Starts, each on 127.0.0.1:0: a sink upstream (asyncio; reads request bodies and discards them),
and latchkey with two rules — `stream.test` (bodies stream) and `hold.test` (body placeholders:
bodies are held whole, so they are charged to --max-buffered-bytes). Then:

1. stalled: N connections each send a head with `Content-Length: 8 MiB` and 64 KiB of body (or
   none: head only), then stop. RSS is sampled once all are open and again HOLD seconds later; then --body-timeout
   (HOLD + 5 s) cuts them and RSS is sampled after.
2. the same against hold.test: bodies latchkey must hold whole; the budget refuses what does
   not fit (503 too_busy) and RSS stays under the budget.
3. one upload of N GiB (Content-Length, 1 MiB writes) to stream.test; RSS sampled every 100 ms.

Everything started here is stopped by PID on exit.
"""

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

SECRET = "sk-bench-0123456789abcdef"
MIB = 1024 * 1024


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Sink:
    """A plain HTTP/1.1 upstream that reads and discards bodies (Content-Length only)."""

    def __init__(self):
        self.open = 0
        self.bytes = 0
        self.done = 0

    async def handle(self, reader, writer):
        self.open += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                m = re.search(rb"(?i)\r\ncontent-length:\s*(\d+)", head)
                left = int(m.group(1)) if m else 0
                while left > 0:
                    chunk = await reader.read(min(left, 1 << 20))
                    if not chunk:
                        return
                    left -= len(chunk)
                    self.bytes += len(chunk)
                self.done += 1
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.open -= 1
            writer.close()


async def stalled(proxy, host, port, n, first, hold_s, pid, timeout_s):
    """N uploads that send a head and `first` bytes, then stall. Returns RSS samples."""
    conns = []
    head = (
        f"POST http://{host}:{port}/up HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Length: {8 * MIB}\r\n\r\n"
    ).encode()
    body = (b"__LATCHKEY_bench__" if host == "hold.test" else b"") + b"x" * first
    body = body[:first]
    for _ in range(n):
        r, w = await asyncio.open_connection(*proxy)
        w.write(head + body)
        conns.append((r, w))
    await asyncio.gather(*(w.drain() for _, w in conns))
    await asyncio.sleep(1.0)
    open_rss = rss_kib(pid)
    await asyncio.sleep(hold_s)
    held_rss = rss_kib(pid)
    # Answers: 503 too_busy (budget) arrive at once; the rest are cut by --body-timeout.
    statuses = {}

    async def answer(r):
        try:
            line = await asyncio.wait_for(r.readline(), timeout_s + 10)
            code = line.split()[1].decode() if line else "eof"
        except (asyncio.TimeoutError, ConnectionError, IndexError):
            code = "none"
        statuses[code] = statuses.get(code, 0) + 1

    await asyncio.gather(*(answer(r) for r, _ in conns))
    for _, w in conns:
        w.close()
    await asyncio.sleep(1.0)
    return {
        "uploads": n,
        "sent_each": first,
        "rss_kib_open": open_rss,
        "rss_kib_after_hold": held_rss,
        "rss_kib_after_cut": rss_kib(pid),
        "answers": statuses,
    }


async def big_upload(proxy, port, gib, pid):
    total = gib * 1024 * MIB
    r, w = await asyncio.open_connection(*proxy)
    w.write(
        (
            f"POST http://stream.test:{port}/big HTTP/1.1\r\nHost: stream.test:{port}\r\n"
            f"Content-Length: {total}\r\n\r\n"
        ).encode()
    )
    chunk = b"y" * MIB
    samples = []
    stop = asyncio.Event()

    async def sample():
        while not stop.is_set():
            samples.append(rss_kib(pid))
            await asyncio.sleep(0.1)

    sampler = asyncio.create_task(sample())
    start = time.monotonic()
    for _ in range(total // MIB):
        w.write(chunk)
        await w.drain()
    line = await asyncio.wait_for(r.readline(), 60)
    elapsed = time.monotonic() - start
    stop.set()
    await sampler
    w.close()
    return {
        "bytes": total,
        "seconds": round(elapsed, 2),
        "mib_per_s": round(total / MIB / elapsed, 1),
        "status_line": line.decode().strip(),
        "rss_kib_min": min(samples),
        "rss_kib_max": max(samples),
        "rss_kib_first_second": max(samples[:10]),
        "rss_kib_last_second": max(samples[-10:]),
        "samples": len(samples),
    }


async def main():
    args = sys.argv[1:]
    binary, out = args[0], args[1]
    n = int(args[args.index("--stalled") + 1]) if "--stalled" in args else 1000
    gib = int(args[args.index("--gib") + 1]) if "--gib" in args else 1
    hold = float(args[args.index("--hold") + 1]) if "--hold" in args else 5.0
    sink = Sink()
    server = await asyncio.start_server(sink.handle, "127.0.0.1", 0, backlog=4096)
    port = server.sockets[0].getsockname()[1]
    tmp = tempfile.mkdtemp(prefix="lk-bench-uploads")
    pol = os.path.join(tmp, "policies")
    os.mkdir(pol)
    with open(os.path.join(pol, "main.toml"), "w") as f:
        f.write(
            f"""[secrets.bench]
source = "env:BENCH_SECRET"

[[rules]]
name  = "stream"
hosts = ["stream.test"]
ports = [{port}]

[[rules]]
name = "hold"
hosts = ["hold.test"]
ports = [{port}]
secrets = ["bench"]
placeholders = ["body"]
"""
        )
    timeout_s = int(hold + 5)
    budget = "64MiB"
    cmd = [
        binary, "serve", "--policies", pol, "--listen", "127.0.0.1:0",
        "--ca-dir", os.path.join(tmp, "ca"), "--audit", "/dev/null", "--admin", "off",
        "--allow-private", "127.0.0.0/8",
        "--resolve", "stream.test=127.0.0.1", "--resolve", "hold.test=127.0.0.1",
        "--max-connections-per-client", str(n + 100), "--max-connections", str(n + 200),
        "--body-timeout", f"{timeout_s}s", "--max-buffered-bytes", budget,
        "--max-buffered-bytes-per-client", budget,
    ]
    env = dict(os.environ, BENCH_SECRET=SECRET, RUST_LOG="warn")
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)
    try:
        addr = None
        deadline = time.monotonic() + 20
        while addr is None and time.monotonic() < deadline:
            line = proc.stderr.readline().decode()
            m = re.search(r"proxy listening on (\S+)", line)
            if m:
                addr = m.group(1)
        if addr is None:
            raise SystemExit("latchkey did not start")
        # Keep draining its stderr so it never blocks on a full pipe.
        loop = asyncio.get_running_loop()
        loop.run_in_executor(None, lambda: proc.stderr.read())
        host, p = addr.rsplit(":", 1)
        proxy = (host, int(p))
        result = {"idle_rss_kib": rss_kib(proc.pid), "budget": budget,
                  "body_timeout_s": timeout_s}
        result["stalled_head_only"] = await asyncio.wait_for(
            stalled(proxy, "stream.test", port, n, 0, hold, proc.pid, timeout_s),
            timeout_s + 60,
        )
        result["stalled_streamed"] = await asyncio.wait_for(
            stalled(proxy, "stream.test", port, n, 64 * 1024, hold, proc.pid, timeout_s),
            timeout_s + 60,
        )
        result["stalled_held"] = await asyncio.wait_for(
            stalled(proxy, "hold.test", port, n, 64 * 1024, hold, proc.pid, timeout_s),
            timeout_s + 60,
        )
        result["upload_1gib"] = await asyncio.wait_for(
            big_upload(proxy, port, gib, proc.pid), 600
        )
        result["sink_bytes"] = sink.bytes
        with open(out, "w") as f:
            json.dump(result, f, indent=2)
        print(json.dumps(result, indent=2))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        server.close()


if __name__ == "__main__":
    asyncio.run(main())
