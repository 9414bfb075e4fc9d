"""A raw SOCKS5 client for what no well-behaved client sends.

Usage: socks_probe.py HOST PORT STEP...

Each STEP is `send:HEX` (bytes to send, then a short pause so each step is its own segment)
or `wait:SECONDS`. After the last step the probe reads until latchkey closes the connection
(at most 10 s) and prints one JSON object: `received` (hex of every byte read), `closed`
(whether latchkey closed it within the 10 s) and `elapsed` (seconds from the first byte sent
to the close).
"""

import json
import socket
import sys
import time


def main() -> None:
    host, port, steps = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    sock = socket.create_connection((host, port), timeout=10)
    sock.settimeout(10)
    started = time.monotonic()
    received = b""
    for step in steps:
        kind, _, arg = step.partition(":")
        if kind == "send":
            try:
                sock.sendall(bytes.fromhex(arg))
            except OSError:
                break
            time.sleep(0.2)
        elif kind == "wait":
            time.sleep(float(arg))
        else:
            raise SystemExit(f"unknown step {step!r}")
    closed = False
    deadline = started + 10
    while time.monotonic() < deadline:
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            chunk = sock.recv(4096)
        except socket.timeout:
            break
        except ConnectionResetError:
            closed = True
            break
        if not chunk:
            closed = True
            break
        received += chunk
    elapsed = time.monotonic() - started
    print(json.dumps({"received": received.hex(), "closed": closed, "elapsed": elapsed}))


if __name__ == "__main__":
    main()
