#!/usr/bin/env python3
"""Model-provider calls with the official `openai` and `anthropic` SDKs through latchkey, as an
agent would make them: streaming or not, one call or many at once.

Usage: llm_sdk.py SPEC

SPEC is JSON:
  {"api": "openai-chat" | "openai-responses" | "anthropic",
   "base_url": "https://HOST:PORT/v1"  (anthropic: "https://HOST:PORT", the SDK adds /v1),
   "model": "gpt-4o", "stream": true, "max_tokens": 100 (or null: none sent),
   "include_usage": true (openai-chat streaming only: stream_options.include_usage),
   "headers": {"x-fake-input-tokens": "40"}  (extra request headers),
   "count": 20  (calls made at once, each from its own thread; default 1)}

Environment: HTTPS_PROXY (latchkey, with the identity's credentials in its userinfo when the
sandbox has one), LATCHKEY_CA (latchkey's CA: the only certificate trusted; the SDKs' own
environment handling is turned off, so this machine's SSL_CERT_FILE and friends play no part),
and no API key: the SDKs get a placeholder, latchkey injects the real one.

Prints JSON: {"results": [...]} in call order, each either
  {"status": 200, "text": ..., "model": ..., "usage": {...} or null, "events": N,
   "headers": {...}}
or, for an HTTP error the SDK raised,
  {"status": 429, "error": "RateLimitError", "headers": {...}, "body": "..."}
or, for anything else, {"status": null, "error": "..."}.
Exits 3 if an SDK is not installed, so the caller can tell a missing SDK from a failure.
"""

import json
import os
import ssl
import sys
import threading

try:
    import anthropic
    import openai
except ImportError as e:  # pragma: no cover - reported by the caller
    print(f"SDK not importable: {e}", file=sys.stderr)
    sys.exit(3)

PLACEHOLDER_KEY = "placeholder-latchkey-injects-the-real-key"


def trust() -> ssl.SSLContext:
    return ssl.create_default_context(cafile=os.environ["LATCHKEY_CA"])


def openai_client(spec):
    http_client = openai.DefaultHttpxClient(
        proxy=os.environ["HTTPS_PROXY"], verify=trust(), trust_env=False
    )
    return openai.OpenAI(
        base_url=spec["base_url"],
        api_key=PLACEHOLDER_KEY,
        http_client=http_client,
        max_retries=0,
        timeout=30,
    )


def anthropic_client(spec):
    http_client = anthropic.DefaultHttpxClient(
        proxy=os.environ["HTTPS_PROXY"], verify=trust(), trust_env=False
    )
    return anthropic.Anthropic(
        base_url=spec["base_url"],
        api_key=PLACEHOLDER_KEY,
        http_client=http_client,
        max_retries=0,
        timeout=30,
    )


def as_dict(obj):
    if obj is None:
        return None
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json")
    return dict(obj)


def headers_of(response):
    return {k.lower(): v for k, v in response.headers.items()}


def openai_chat(spec):
    client = openai_client(spec)
    args = {
        "model": spec["model"],
        "messages": [{"role": "user", "content": "Say hello."}],
        "extra_headers": spec.get("headers") or {},
    }
    if spec.get("max_tokens") is not None:
        args["max_tokens"] = spec["max_tokens"]
    if not spec.get("stream"):
        raw = client.chat.completions.with_raw_response.create(**args)
        completion = raw.parse()
        return {
            "status": raw.status_code,
            "text": completion.choices[0].message.content,
            "model": completion.model,
            "usage": as_dict(completion.usage),
            "events": 0,
            "headers": headers_of(raw),
        }
    if spec.get("include_usage"):
        args["stream_options"] = {"include_usage": True}
    stream = client.chat.completions.create(stream=True, **args)
    text, model, usage, events = "", None, None, 0
    for chunk in stream:
        events += 1
        model = chunk.model or model
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
        if chunk.usage is not None:
            usage = as_dict(chunk.usage)
    return {
        "status": stream.response.status_code,
        "text": text,
        "model": model,
        "usage": usage,
        "events": events,
        "headers": headers_of(stream.response),
    }


def openai_responses(spec):
    client = openai_client(spec)
    args = {
        "model": spec["model"],
        "input": "Say hello.",
        "extra_headers": spec.get("headers") or {},
    }
    if spec.get("max_tokens") is not None:
        args["max_output_tokens"] = spec["max_tokens"]
    if not spec.get("stream"):
        raw = client.responses.with_raw_response.create(**args)
        response = raw.parse()
        return {
            "status": raw.status_code,
            "text": response.output_text,
            "model": response.model,
            "usage": as_dict(response.usage),
            "events": 0,
            "headers": headers_of(raw),
        }
    stream = client.responses.create(stream=True, **args)
    text, model, usage, events = "", None, None, 0
    for event in stream:
        events += 1
        if event.type == "response.output_text.delta":
            text += event.delta
        if event.type == "response.completed":
            model = event.response.model
            usage = as_dict(event.response.usage)
    return {
        "status": stream.response.status_code,
        "text": text,
        "model": model,
        "usage": usage,
        "events": events,
        "headers": headers_of(stream.response),
    }


def anthropic_messages(spec):
    client = anthropic_client(spec)
    args = {
        "model": spec["model"],
        "max_tokens": spec.get("max_tokens") or 1024,
        "messages": [{"role": "user", "content": "Say hello."}],
        "extra_headers": spec.get("headers") or {},
    }
    if not spec.get("stream"):
        raw = client.messages.with_raw_response.create(**args)
        message = raw.parse()
        return {
            "status": raw.status_code,
            "text": "".join(b.text for b in message.content if b.type == "text"),
            "model": message.model,
            "usage": as_dict(message.usage),
            "events": 0,
            "headers": headers_of(raw),
        }
    stream = client.messages.create(stream=True, **args)
    text, model, usage, events = "", None, {}, 0
    for event in stream:
        events += 1
        if event.type == "message_start":
            model = event.message.model
            usage.update(as_dict(event.message.usage))
        elif event.type == "content_block_delta" and event.delta.type == "text_delta":
            text += event.delta.text
        elif event.type == "message_delta":
            usage["output_tokens"] = event.usage.output_tokens
    return {
        "status": stream.response.status_code,
        "text": text,
        "model": model,
        "usage": usage or None,
        "events": events,
        "headers": headers_of(stream.response),
    }


CALLS = {
    "openai-chat": openai_chat,
    "openai-responses": openai_responses,
    "anthropic": anthropic_messages,
}


def one(spec):
    try:
        return CALLS[spec["api"]](spec)
    except (openai.APIStatusError, anthropic.APIStatusError) as e:
        return {
            "status": e.status_code,
            "error": type(e).__name__,
            "headers": headers_of(e.response),
            "body": e.response.text,
        }
    except Exception as e:  # noqa: BLE001 - every failure is a result the test reads
        return {"status": None, "error": f"{type(e).__name__}: {e}"}


def main() -> int:
    (raw,) = sys.argv[1:]
    spec = json.loads(raw)
    if spec["api"] not in CALLS:
        print(f"unknown api {spec['api']!r}", file=sys.stderr)
        return 2
    count = int(spec.get("count", 1))
    results = [None] * count
    start = threading.Barrier(count)

    def worker(i):
        start.wait()
        results[i] = one(spec)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps({"results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
