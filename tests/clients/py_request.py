#!/usr/bin/env python3
"""Send one request through latchkey with Python `requests`, as an agent's SDK would.

Usage: py_request.py PROXY_URL CA_FILE METHOD URL ['Name: value' ...] [--data=BODY]

Trusts only CA_FILE (latchkey's CA), ignores the environment's proxy and CA settings, and prints
the response as JSON: {"status": int, "headers": [[name, value], ...], "body": str}.
"""

import json
import sys

import requests


def main() -> int:
    proxy, ca_file, method, url, *header_args = sys.argv[1:]
    headers = {}
    data = None
    for arg in header_args:
        if arg.startswith("--data="):
            data = arg[len("--data=") :].encode()
            continue
        name, _, value = arg.partition(":")
        headers[name.strip()] = value.strip()

    session = requests.Session()
    session.trust_env = False  # no HTTP(S)_PROXY, NO_PROXY or REQUESTS_CA_BUNDLE from outside
    response = session.request(
        method,
        url,
        headers=headers,
        data=data,
        proxies={"http": proxy, "https": proxy},
        verify=ca_file,
        timeout=20,
    )
    print(
        json.dumps(
            {
                "status": response.status_code,
                "headers": [[k, v] for k, v in response.headers.items()],
                "body": response.text,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
