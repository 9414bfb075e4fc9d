#!/usr/bin/env python3
"""A WebSocket server and client (the `websockets` library) for latchkey's WebSocket relay.

  ws_echo.py --tls CERT KEY
      Serves wss:// on 127.0.0.1. Prints "listening on 127.0.0.1:PORT", then one JSON line per
      event: {"event": "handshake", "auth", "extensions", "protocol"} when a socket opens,
      {"event": "message", "text"|"binary_len"} per message received, {"event": "closed",
      "code"} when it ends. Each text message is answered:
        reflect      -> "your credential is <the authorization header it received>"
        fragmented   -> the same sentence sent in 7-byte fragments (one message)
        big:N        -> N bytes of "x"
        close        -> a close with code 4000, reason "bye <authorization>"
        a JSON-RPC tools/list request -> a listing of "search_code" and "delete_repository"
        anything     -> "echo:" + the message
      A binary message is echoed as it came.
  ws_echo.py client URL CA PROXY MESSAGES_JSON
      Connects to URL through the HTTP proxy PROXY (CONNECT), trusting only CA, offering
      subprotocols "chat" and "superchat" and permessage-deflate (the library's default), sends
      each message of the JSON list in turn and waits for its reply (a message "close" waits
      for the server's close instead; {"binary": TEXT} is sent as a binary message). Prints one JSON line: {"replies": [...], "close_code",
      "close_reason", "subprotocol"}, or {"status": N} when the handshake is refused.
  ws_echo.py hold URL CA PROXY SOCKETS SIZE
      Opens SOCKETS sockets at once; on each sends one binary message in 256 KiB fragments, SIZE
      bytes of them, and never its last fragment, then waits (up to 30 s) for the socket to be
      closed. Prints {"close_codes": [...]}: each socket's close code (null: still open; an
      HTTP status when the handshake was refused).
"""

import asyncio
import json
import ssl
import sys

from websockets.asyncio.client import connect
from websockets.asyncio.server import serve
from websockets.exceptions import ConnectionClosed, InvalidStatus


def event(**fields):
    print(json.dumps(fields), flush=True)


def tools_list_id(message):
    """The id of a JSON-RPC tools/list request, or None."""
    try:
        m = json.loads(message)
    except ValueError:
        return None
    if isinstance(m, dict) and m.get("method") == "tools/list":
        return m.get("id")
    return None


async def serve_tls(cert, key):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)

    async def handler(ws):
        headers = ws.request.headers
        auth = headers.get("authorization", "")
        event(
            event="handshake",
            auth=auth,
            extensions=headers.get("sec-websocket-extensions"),
            protocol=ws.subprotocol,
        )
        try:
            async for message in ws:
                if isinstance(message, bytes):
                    event(event="message", binary=message.decode(errors="replace"))
                    await ws.send(message)
                    continue
                event(event="message", text=message)
                if message == "reflect":
                    await ws.send("your credential is " + auth)
                elif message == "fragmented":
                    text = "your credential is " + auth
                    await ws.send([text[i : i + 7] for i in range(0, len(text), 7)])
                elif message.startswith("big:"):
                    await ws.send("x" * int(message[4:]))
                elif message == "close":
                    await ws.close(4000, "bye " + auth)
                elif tools_list_id(message) is not None:
                    tools = [{"name": "search_code"}, {"name": "delete_repository"}]
                    await ws.send(json.dumps(
                        {"jsonrpc": "2.0", "id": tools_list_id(message), "result": {"tools": tools}}
                    ))
                else:
                    await ws.send("echo:" + message)
        except ConnectionClosed:
            pass
        event(event="closed", code=ws.close_code)

    async with serve(
        handler,
        "127.0.0.1",
        0,
        ssl=ctx,
        subprotocols=["superchat", "chat"],
        max_size=None,
    ) as server:
        port = server.sockets[0].getsockname()[1]
        print("listening on 127.0.0.1:%d" % port, flush=True)
        await asyncio.Future()


async def client(url, ca, proxy, messages):
    ctx = ssl.create_default_context(cafile=ca)
    out = {"replies": [], "close_code": None, "close_reason": None, "subprotocol": None}
    try:
        async with connect(
            url,
            ssl=ctx,
            proxy=proxy,
            subprotocols=["chat", "superchat"],
            max_size=None,
            open_timeout=20,
        ) as ws:
            out["subprotocol"] = ws.subprotocol
            try:
                for m in messages:
                    await ws.send(m["binary"].encode() if isinstance(m, dict) else m)
                    if m == "close":
                        await asyncio.wait_for(ws.wait_closed(), 10)
                        break
                    reply = await asyncio.wait_for(ws.recv(), 10)
                    out["replies"].append(reply if isinstance(reply, str) else {"binary_len": len(reply)})
            except ConnectionClosed:
                pass
            await ws.close()
            out["close_code"] = ws.close_code
            out["close_reason"] = ws.close_reason
    except InvalidStatus as e:
        out = {"status": e.response.status_code, "body": e.response.body.decode(errors="replace")}
    print(json.dumps(out), flush=True)


async def hold(url, ca, proxy, sockets, size):
    ctx = ssl.create_default_context(cafile=ca)

    async def one():
        try:
            async with connect(
                url, ssl=ctx, proxy=proxy, subprotocols=["chat"], max_size=None, open_timeout=20
            ) as ws:
                never = asyncio.Event()

                async def fragments():
                    sent = 0
                    while sent < size:
                        yield b"x" * 262144
                        sent += 262144
                    await never.wait()

                sender = asyncio.create_task(ws.send(fragments()))
                try:
                    await asyncio.wait_for(ws.wait_closed(), 30)
                except asyncio.TimeoutError:
                    return None
                finally:
                    sender.cancel()
                return ws.close_code
        except InvalidStatus as e:
            return e.response.status_code

    codes = await asyncio.gather(*[one() for _ in range(sockets)])
    print(json.dumps({"close_codes": codes}), flush=True)


def main():
    if sys.argv[1] == "--tls":
        asyncio.run(serve_tls(sys.argv[2], sys.argv[3]))
    elif sys.argv[1] == "client":
        asyncio.run(client(sys.argv[2], sys.argv[3], sys.argv[4], json.loads(sys.argv[5])))
    elif sys.argv[1] == "hold":
        asyncio.run(hold(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6])))
    else:
        sys.exit("usage: ws_echo.py --tls CERT KEY | client URL CA PROXY MESSAGES_JSON")


if __name__ == "__main__":
    main()
