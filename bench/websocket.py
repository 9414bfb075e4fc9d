#!/usr/bin/env python3
"""WebSocket relay cost: the same wss:// echo workload direct and through latchkey.

  bench/websocket.py LATCHKEY_BINARY [ROUND_TRIPS] [BULK_MESSAGES] [BULK_SIZE]

Starts, on loopback only: a TLS WebSocket echo server (tests/clients/ws_echo.py, certificate
from a throwaway CA made here) and `latchkey serve` with a rule allowing WebSockets to it (with
a bound secret, so every message down is scrubbed and every message up is checked). Then, with
the `websockets` client, once direct and once through latchkey (CONNECT):
  - ROUND_TRIPS sequential echo round trips of a 64-byte message (latency);
  - BULK_MESSAGES messages of BULK_SIZE bytes sent back to back, each echo awaited in order
    (throughput).
Prints one JSON line per path and their ratios. Bounded in count and time; nothing leaves
loopback. Run it with the tests' Python environment (target/tmp/pyenv/bin/python).
"""

import asyncio
import datetime
import json
import os
import ssl
import subprocess
import sys
import tempfile
import threading
import time

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from websockets.asyncio.client import connect

HERE = os.path.dirname(os.path.abspath(__file__))
ECHO = os.path.join(HERE, "..", "tests", "clients", "ws_echo.py")


def make_certs(dir):
    def name(cn):
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(name("bench ca"))
        .issuer_name(name("bench ca"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name("ws.bench"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("ws.bench")]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = {k: os.path.join(dir, k) for k in ("ca.pem", "cert.pem", "key.pem")}
    with open(paths["ca.pem"], "wb") as f:
        f.write(ca.public_bytes(serialization.Encoding.PEM))
    with open(paths["cert.pem"], "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(paths["key.pem"], "wb") as f:
        f.write(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    return paths


def wait_line(proc, prefix, timeout=20, stream=None):
    stream = stream or proc.stdout
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = stream.readline()
        if not line:
            break
        if line.startswith(prefix):
            return line
    sys.exit(f"no {prefix!r} line in time")


async def workload(url, ctx, round_trips, bulk, size, **connect_args):
    """ROUND_TRIPS small echoes, then BULK messages of SIZE bytes, on one socket."""
    async with connect(
        url, ssl=ctx, max_size=None, compression=None, open_timeout=20,
        subprotocols=["chat"], **connect_args
    ) as ws:
        msg = "m" * 64
        start = time.perf_counter()
        for _ in range(round_trips):
            await ws.send(msg)
            await ws.recv()
        rtt = (time.perf_counter() - start) / round_trips
        payload = b"b" * size
        start = time.perf_counter()
        for _ in range(bulk):
            await ws.send(payload)
            await ws.recv()
        bulk_s = time.perf_counter() - start
    return {
        "round_trip_us": round(rtt * 1e6, 1),
        "bulk_mib_per_s": round(bulk * size * 2 / bulk_s / 2**20, 1),
    }


def main():
    binary = sys.argv[1]
    round_trips = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    bulk = int(sys.argv[3]) if len(sys.argv) > 3 else 500
    size = int(sys.argv[4]) if len(sys.argv) > 4 else 64 * 1024
    with tempfile.TemporaryDirectory() as dir:
        certs = make_certs(dir)
        server = subprocess.Popen(
            [sys.executable, ECHO, "--tls", certs["cert.pem"], certs["key.pem"]],
            stdout=subprocess.PIPE,
            text=True,
        )
        lk = None
        try:
            port = int(wait_line(server, "listening on").strip().rsplit(":", 1)[1])
            # The echo server prints a line per message: keep its pipe drained.
            threading.Thread(target=lambda: server.stdout.read(), daemon=True).start()
            policies = os.path.join(dir, "policies")
            os.mkdir(policies)
            with open(os.path.join(policies, "bench.toml"), "w") as f:
                f.write(
                    '[secrets.key]\nsource = "env:BENCH_WS_KEY"\n\n'
                    f'[[rules]]\nname = "ws"\nhosts = ["ws.bench"]\nports = [{port}]\n'
                    'websocket = true\n[rules.inject.headers]\nauthorization = "Bearer {{secret.key}}"\n'
                )
            env = dict(os.environ, BENCH_WS_KEY="sk-bench-0123456789abcdef", RUST_LOG="warn")
            lk = subprocess.Popen(
                [binary, "serve", "--policies", policies, "--listen", "127.0.0.1:0",
                 "--admin", "off", "--ca-dir", os.path.join(dir, "ca"),
                 "--audit", os.path.join(dir, "audit.jsonl"), "--upstream-ca", certs["ca.pem"],
                 "--resolve", "ws.bench=127.0.0.1", "--allow-private", "127.0.0.0/8",
                 "--state", "sqlite:" + os.path.join(dir, "state.db")],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
            )
            line = wait_line(lk, "latchkey: proxy listening on ", stream=lk.stderr)
            addr = line.strip().rsplit(" ", 1)[1]
            threading.Thread(target=lambda: lk.stderr.read(), daemon=True).start()
            results = {}
            # Direct: by address, with the name the certificate carries.
            direct = ssl.create_default_context(cafile=certs["ca.pem"])
            results["direct"] = asyncio.run(
                workload(f"wss://127.0.0.1:{port}/", direct, round_trips, bulk, size,
                         server_hostname="ws.bench", proxy=None)
            )
            through = ssl.create_default_context(
                cafile=os.path.join(dir, "ca", "latchkey-ca.pem")
            )
            results["latchkey"] = asyncio.run(
                workload(f"wss://ws.bench:{port}/", through, round_trips, bulk, size,
                         proxy=f"http://{addr}")
            )
            d, l = results["direct"], results["latchkey"]
            results["ratios"] = {
                "round_trip": round(l["round_trip_us"] / d["round_trip_us"], 2),
                "bulk_throughput": round(l["bulk_mib_per_s"] / d["bulk_mib_per_s"], 2),
            }
            print(json.dumps(results))
        finally:
            for p in (lk, server):
                if p:
                    p.kill()


if __name__ == "__main__":
    main()
