#!/usr/bin/env python3
"""A tiny echo upstream for the network-namespace tests, run inside a namespace of their own.

Usage: echo_server.py NAME HOST PORT [--tls CERT KEY] [--close]   (HOST may be IPv6)

Answers every request with JSON {"server": NAME, "method", "path", "headers": [[name, value]],
"body"}. Prints "listening on HOST:PORT" once it accepts connections, then
"connection from IP:PORT" for every TCP connection it accepts, each line flushed, so a test can
count what reached it. --tls serves HTTPS with the PEM certificate chain and key; --close answers
with `connection: close`, so every request needs a new connection (and a new resolution).
"""

import http.server
import json
import socket
import ssl
import sys


def main() -> int:
    args = sys.argv[1:]
    close = "--close" in args
    if close:
        args.remove("--close")
    tls = None
    if "--tls" in args:
        i = args.index("--tls")
        tls = (args[i + 1], args[i + 2])
        del args[i : i + 3]
    name, host, port = args[0], args[1], int(args[2])

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self):
            super().setup()
            peer = self.client_address
            print(f"connection from {peer[0]}:{peer[1]}", flush=True)

        def answer(self):
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else b""
            payload = json.dumps(
                {
                    "server": name,
                    "method": self.command,
                    "path": self.path,
                    "headers": [[k, v] for k, v in self.headers.items()],
                    "body": body.decode("utf-8", "replace"),
                }
            ).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(payload)))
            if close:
                self.send_header("connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = answer

        def log_message(self, *_args):
            pass

    server_class = http.server.ThreadingHTTPServer
    if ":" in host:

        class ServerV6(http.server.ThreadingHTTPServer):
            address_family = socket.AF_INET6

        server_class = ServerV6
    server = server_class((host, port), Handler)
    if tls:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(tls[0], tls[1])
        context.set_alpn_protocols(["http/1.1"])
        server.socket = context.wrap_socket(
            server.socket, server_side=True, do_handshake_on_connect=False
        )
    bound = server.socket.getsockname()
    print(f"listening on {bound[0]}:{bound[1]}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
