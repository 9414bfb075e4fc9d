#!/usr/bin/env python3
"""One chat completion with the official `openai` SDK through latchkey, as an agent would.

Usage: openai_chat.py BASE_URL

Reads LATCHKEY_PROXY (proxy URL), LATCHKEY_CA (latchkey's CA, the only one trusted) and
OPENAI_API_KEY (the placeholder the sandbox holds) from the environment. Prints JSON:
{"content": str, "model": str, "headers": [[name, value], ...]}. Exits 3 if `openai` is not
installed, so the caller can tell a missing SDK from a failure.
"""

import json
import os
import ssl
import sys

try:
    import openai
except ImportError as e:  # pragma: no cover - reported by the caller
    print(f"openai SDK not importable: {e}", file=sys.stderr)
    sys.exit(3)


def main() -> int:
    (base_url,) = sys.argv[1:]
    trust = ssl.create_default_context(cafile=os.environ["LATCHKEY_CA"])
    # DefaultHttpxClient keeps the SDK's defaults (timeouts, limits) and takes httpx's options:
    # the proxy, the CA, and no proxy/CA settings from the environment.
    http_client = openai.DefaultHttpxClient(
        proxy=os.environ["LATCHKEY_PROXY"], verify=trust, trust_env=False
    )
    client = openai.OpenAI(
        base_url=base_url,
        api_key=os.environ["OPENAI_API_KEY"],
        http_client=http_client,
        max_retries=0,
        timeout=20,
    )
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-test",
        messages=[{"role": "user", "content": "say hi"}],
    )
    completion = raw.parse()
    print(
        json.dumps(
            {
                "content": completion.choices[0].message.content,
                "model": completion.model,
                "headers": [[k, v] for k, v in raw.headers.items()],
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
