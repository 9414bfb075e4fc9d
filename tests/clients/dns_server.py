#!/usr/bin/env python3
"""A scripted DNS server for the rebinding tests, run on 127.0.0.1:53 inside a namespace whose
/etc/resolv.conf points at it.

Usage: dns_server.py ANSWERS.json [HOST] [PORT]

ANSWERS.json maps a name to a list of answer sets, e.g.
    {"up.test": [["10.200.1.2"], ["127.0.0.1"]], "mixed.test": [["10.200.1.2", "127.0.0.1"]]}
The n-th A query for a name is answered with the n-th set (the last set from then on), TTL 0,
so a name can answer one address and then another: DNS rebinding. AAAA and other queries for a
known name get an empty NOERROR answer; unknown names get NXDOMAIN. The file is read on every
query. Prints "listening on HOST:PORT", then "query NAME TYPE -> ANSWERS" per query, flushed.
"""

import json
import socket
import struct
import sys

TYPE_A = 1


def parse_question(packet: bytes):
    labels = []
    i = 12
    while True:
        length = packet[i]
        if length == 0:
            i += 1
            break
        labels.append(packet[i + 1 : i + 1 + length].decode("ascii", "replace"))
        i += 1 + length
    qtype, _qclass = struct.unpack("!HH", packet[i : i + 4])
    return ".".join(labels).lower().rstrip("."), qtype, packet[12 : i + 4]


def main() -> int:
    path = sys.argv[1]
    host = sys.argv[2] if len(sys.argv) > 2 else "127.0.0.1"
    port = int(sys.argv[3]) if len(sys.argv) > 3 else 53
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((host, port))
    print(f"listening on {host}:{port}", flush=True)
    asked = {}
    while True:
        packet, peer = sock.recvfrom(4096)
        if len(packet) < 12:
            continue
        try:
            name, qtype, question = parse_question(packet)
        except (IndexError, struct.error):
            continue
        with open(path) as f:
            table = json.load(f)
        (query_id, flags) = struct.unpack("!HH", packet[:4])
        rd = flags & 0x0100
        answers = []
        rcode = 0
        if name not in table:
            rcode = 3
        elif qtype == TYPE_A:
            sets = table[name]
            n = asked.get(name, 0)
            asked[name] = n + 1
            answers = sets[min(n, len(sets) - 1)]
        print(f"query {name} {qtype} -> {answers if rcode == 0 else 'NXDOMAIN'}", flush=True)
        header = struct.pack("!HHHHHH", query_id, 0x8080 | rd | rcode, 1, len(answers), 0, 0)
        body = question
        for ip in answers:
            body += struct.pack("!HHHIH", 0xC00C, TYPE_A, 1, 0, 4) + socket.inet_aton(ip)
        sock.sendto(header + body, peer)


if __name__ == "__main__":
    sys.exit(main())
