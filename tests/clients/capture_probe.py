#!/usr/bin/env python3
"""A client for the gateway-setup tests: tries each probe once and says who answered.

Usage: capture_probe.py [--timeout SECONDS] PROBE...

Each PROBE is PROTO:HOST:PORT (tcp or udp; an IPv6 HOST in brackets) or ping:HOST (an ICMP or
ICMPv6 echo request on a raw socket: needs root, as the tests are). Prints one line per probe,
in order, flushed:

    PROBE answer TEXT     the first line the server sent back (or "echo-reply" for ping)
    PROBE none WHY        no answer within the timeout (default 1.5 s), or an error

Exits 0 whatever the outcome: the test reading the lines decides what should have answered.
"""

import os
import socket
import struct
import sys
import time


def split(spec: str):
    proto, rest = spec.split(":", 1)
    if proto == "ping":
        return proto, rest.strip("[]"), 0
    host, port = rest.rsplit(":", 1)
    return proto, host.strip("[]"), int(port)


def family(host: str):
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return ~total & 0xFFFF


def ping(host: str, timeout: float) -> str:
    ident = os.getpid() & 0xFFFF
    if family(host) == socket.AF_INET6:
        # The kernel fills in an ICMPv6 checksum on raw sockets.
        sock = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)
        request, reply_type, offset = 128, 129, 0
        packet = struct.pack("!BBHHH", request, 0, 0, ident, 1) + b"latchkey"
    else:
        sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
        request, reply_type, offset = 8, 0, 20  # an IPv4 raw socket reads the IP header too
        header = struct.pack("!BBHHH", request, 0, 0, ident, 1) + b"latchkey"
        packet = header[:2] + struct.pack("!H", checksum(header)) + header[4:]
    with sock:
        sock.settimeout(timeout)
        sock.sendto(packet, (host, 0))
        deadline = time.monotonic() + timeout
        while True:
            sock.settimeout(max(deadline - time.monotonic(), 0.01))
            data, addr = sock.recvfrom(4096)
            icmp = data[offset:]
            if (
                addr[0] == host
                and len(icmp) >= 6
                and icmp[0] == reply_type
                and struct.unpack("!H", icmp[4:6])[0] == ident
            ):
                return "echo-reply"


def probe(spec: str, timeout: float) -> str:
    proto, host, port = split(spec)
    if proto == "ping":
        return ping(host, timeout)
    kind = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
    with socket.socket(family(host), kind) as sock:
        sock.settimeout(timeout)
        sock.connect((host, port))
        if kind == socket.SOCK_DGRAM:
            sock.send(b"probe")
            return sock.recv(4096).decode("utf-8", "replace").strip()
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
        return data.decode("utf-8", "replace").strip()


def main() -> int:
    args = sys.argv[1:]
    timeout = 1.5
    if args[:1] == ["--timeout"]:
        timeout, args = float(args[1]), args[2:]
    for spec in args:
        try:
            text = probe(spec, timeout)
            print(f"{spec} answer {text}" if text else f"{spec} none empty", flush=True)
        except (OSError, socket.timeout) as e:
            print(f"{spec} none {type(e).__name__}: {e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
