#!/usr/bin/env python3
"""Make one request through latchkey the way an agent's code does, and report what a person sees
when latchkey refuses it: the exception the client raises and what Python prints for it.

Usage: refusal_reason.py CLIENT URL

CLIENT is `requests`, `httpx` or `openai` (the OpenAI SDK, `models.list()` with URL as its base
URL). The proxy and CA come from LATCHKEY_PROXY and LATCHKEY_CA; the environment's own proxy and CA
settings are ignored. A response with an error status is raised as the client's own error
(`raise_for_status()`; the SDK raises by itself), as agent code does. Prints JSON:
{"raised": bool, "type": the exception's class, "message": str(exception), "printed": the
traceback Python prints for it, chained causes included, "status": the status when a response
came back, "phrase": the reason phrase of the response the exception holds, if it holds one}.
"""

import json
import os
import sys
import traceback


def with_requests(proxy, ca, url):
    import requests

    session = requests.Session()
    session.trust_env = False
    response = session.get(url, proxies={"http": proxy, "https": proxy}, verify=ca, timeout=20)
    return response.status_code, response.raise_for_status


def with_httpx(proxy, ca, url):
    import httpx

    with httpx.Client(proxy=proxy, verify=ca, trust_env=False, timeout=20) as client:
        response = client.get(url)
    return response.status_code, response.raise_for_status


def with_openai(proxy, ca, url):
    import httpx
    import openai

    http_client = httpx.Client(proxy=proxy, verify=ca, trust_env=False, timeout=20)
    client = openai.OpenAI(api_key="sk-placeholder", base_url=url, http_client=http_client, max_retries=0)
    client.models.list()
    return None, lambda: None


CLIENTS = {"requests": with_requests, "httpx": with_httpx, "openai": with_openai}


def main() -> int:
    name, url = sys.argv[1:]
    proxy, ca = os.environ["LATCHKEY_PROXY"], os.environ["LATCHKEY_CA"]
    status = None
    try:
        status, raise_for_status = CLIENTS[name](proxy, ca, url)
        raise_for_status()
    except Exception as e:  # what the client raises is the point: report it, whatever it is
        report = {
            "raised": True,
            "type": type(e).__name__,
            "message": str(e),
            "printed": "".join(traceback.format_exception(e)),
            "status": status,
            "phrase": getattr(getattr(e, "response", None), "reason_phrase", None),
        }
    else:
        report = {"raised": False, "type": None, "message": "", "printed": "", "status": status, "phrase": None}
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
