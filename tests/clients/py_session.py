#!/usr/bin/env python3
"""A long-lived Python `requests.Session` through latchkey, driven line by line.

Usage: py_session.py PROXY_URL CA_FILE

Reads one request per stdin line, `METHOD URL`, sends it on the same session (so the client
keeps its pooled keep-alive connection: one CONNECT tunnel per host, reused), and prints one JSON
line per response: {"status": int, "headers": [[name, value], ...], "body": str}, flushed, so the
caller can change things between requests. Exits at end of input. Trusts only CA_FILE and ignores
the environment's proxy and CA settings.
"""

import json
import sys

import requests


def main() -> int:
    proxy, ca_file = sys.argv[1:]
    session = requests.Session()
    session.trust_env = False
    session.proxies = {"http": proxy, "https": proxy}
    session.verify = ca_file
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        method, url = line.split(" ", 1)
        try:
            response = session.request(method, url, timeout=20)
            out = {
                "status": response.status_code,
                "headers": [[k, v] for k, v in response.headers.items()],
                "body": response.text,
            }
        except requests.RequestException as e:
            out = {"status": 0, "headers": [], "body": f"{type(e).__name__}: {e}"}
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
