#!/usr/bin/env python3
"""Plain TCP and UDP listeners for the gateway-setup tests: they stand in for latchkey's
transparent listener and resolver (or for an upstream), and say what reached them.

Usage: capture_server.py NAME SPEC...

Each SPEC is PROTO:HOST:PORT, PROTO one of tcp, udp (IPv4) or tcp6, udp6 (IPv6, HOST
in brackets), e.g. tcp:0.0.0.0:15001 udp6:[::]:15053. Prints "listening on NAME" once every socket is
bound, then one flushed line per TCP connection or UDP datagram:

    tcp PORT from IP:PORT orig IP:PORT
    udp PORT from IP:PORT

where PORT is the listener's own port and orig the connection's original destination before
the firewall redirected it (SO_ORIGINAL_DST / IP6T_SO_ORIGINAL_DST; the listener's own address
when nothing redirected it). Every connection is answered "NAME PORT\\n" and closed; every
datagram is answered "NAME PORT" to its sender. Runs until killed.
"""

import selectors
import socket
import struct
import sys

SO_ORIGINAL_DST = 80  # linux/netfilter_ipv4.h; IP6T_SO_ORIGINAL_DST has the same value


def original_destination(conn: socket.socket, v6: bool):
    try:
        if v6:
            raw = conn.getsockopt(socket.IPPROTO_IPV6, SO_ORIGINAL_DST, 28)
            port = struct.unpack("!H", raw[2:4])[0]
            return f"[{socket.inet_ntop(socket.AF_INET6, raw[8:24])}]:{port}"
        raw = conn.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
        port = struct.unpack("!H", raw[2:4])[0]
        return f"{socket.inet_ntoa(raw[4:8])}:{port}"
    except OSError:
        host, port = conn.getsockname()[:2]
        return f"[{host}]:{port}" if v6 else f"{host}:{port}"


def peer(addr, v6: bool) -> str:
    return f"[{addr[0]}]:{addr[1]}" if v6 else f"{addr[0]}:{addr[1]}"


def main() -> int:
    name, specs = sys.argv[1], sys.argv[2:]
    selector = selectors.DefaultSelector()
    for spec in specs:
        proto, rest = spec.split(":", 1)
        host, port = rest.rsplit(":", 1)
        host = host.strip("[]")
        v6 = proto.endswith("6")
        family = socket.AF_INET6 if v6 else socket.AF_INET
        kind = socket.SOCK_STREAM if proto.startswith("tcp") else socket.SOCK_DGRAM
        sock = socket.socket(family, kind)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if v6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((host, int(port)))
        if kind == socket.SOCK_STREAM:
            sock.listen(64)
        selector.register(sock, selectors.EVENT_READ, (kind, v6, int(port)))
    print(f"listening on {name}", flush=True)
    while True:
        for key, _ in selector.select():
            sock, (kind, v6, port) = key.fileobj, key.data
            answer = f"{name} {port}".encode()
            if kind == socket.SOCK_STREAM:
                conn, addr = sock.accept()
                with conn:
                    orig = original_destination(conn, v6)
                    print(f"tcp {port} from {peer(addr, v6)} orig {orig}", flush=True)
                    try:
                        conn.sendall(answer + b"\n")
                    except OSError:
                        pass
            else:
                _, addr = sock.recvfrom(4096)
                print(f"udp {port} from {peer(addr, v6)}", flush=True)
                try:
                    sock.sendto(answer, addr)
                except OSError:
                    pass


if __name__ == "__main__":
    sys.exit(main())
