#!/usr/bin/env python3
"""A gRPC server and client (grpcio) for latchkey's gRPC round trip through the MITM.

  grpc_echo.py --tls CERT KEY
      Serves test.Echo/Call over TLS on 127.0.0.1 (raw bytes, no protobuf): a request `fail`
      is aborted with PERMISSION_DENIED and a message that quotes the `authorization` metadata
      it received (an upstream reflecting a credential in grpc-message, a trailer); any other
      request gets `ok:<length of the authorization metadata>`. Also serves test.Echo/Stream
      (server streaming: a request `N` gets N messages `part-I`, then the call is aborted with
      the reflected credential) and test.Echo/Chat (bidirectional: each message `M` is answered
      `echo:M` at once; a message `fail` aborts the call with the reflected credential). Prints
      "listening on 127.0.0.1:PORT", then one JSON line per call.
  grpc_echo.py call TARGET CA PROXY PAYLOAD
      Calls test.Echo/Call on TARGET through the HTTP CONNECT proxy PROXY, trusting only CA.
      Prints one JSON line: {"ok": true, "reply": ...} or {"ok": false, "code", "details"}.
  grpc_echo.py stream TARGET CA PROXY N
      Calls test.Echo/Stream with N and prints {"replies": [...], "code", "details"}.
  grpc_echo.py chat TARGET CA PROXY N
      Plays ping-pong on test.Echo/Chat: message I is sent only after reply I-1 arrived (a proxy
      that buffered either direction would stall it), N messages then `fail`. Prints
      {"replies": [...], "code", "details"}.
"""

import concurrent.futures
import json
import queue
import sys

import grpc


def serve(cert, key):
    def call(request, context):
        auth = dict(context.invocation_metadata()).get("authorization", "")
        print(json.dumps({"event": "call", "request": request.decode(), "auth": auth}), flush=True)
        if request == b"fail":
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "rejected credential " + auth)
        return ("ok:%d" % len(auth)).encode()

    def stream(request, context):
        auth = dict(context.invocation_metadata()).get("authorization", "")
        print(json.dumps({"event": "stream", "request": request.decode(), "auth": auth}), flush=True)
        for i in range(int(request)):
            yield ("part-%d" % i).encode()
        context.abort(grpc.StatusCode.PERMISSION_DENIED, "stream ended, credential " + auth)

    def chat(requests, context):
        auth = dict(context.invocation_metadata()).get("authorization", "")
        seen = 0
        for m in requests:
            if m == b"fail":
                print(json.dumps({"event": "chat", "messages": seen, "auth": auth}), flush=True)
                context.abort(grpc.StatusCode.PERMISSION_DENIED, "chat over, credential " + auth)
            seen += 1
            yield b"echo:" + m

    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=4))
    handler = grpc.method_handlers_generic_handler(
        "test.Echo",
        {
            "Call": grpc.unary_unary_rpc_method_handler(call),
            "Stream": grpc.unary_stream_rpc_method_handler(stream),
            "Chat": grpc.stream_stream_rpc_method_handler(chat),
        },
    )
    server.add_generic_rpc_handlers((handler,))
    with open(key, "rb") as k, open(cert, "rb") as c:
        creds = grpc.ssl_server_credentials([(k.read(), c.read())])
    port = server.add_secure_port("127.0.0.1:0", creds)
    server.start()
    print("listening on 127.0.0.1:%d" % port, flush=True)
    server.wait_for_termination()


def call(target, ca, proxy, payload):
    with channel(target, ca, proxy) as ch:
        method = ch.unary_unary("/test.Echo/Call")
        try:
            reply = method(payload.encode(), timeout=15)
            print(json.dumps({"ok": True, "reply": reply.decode()}))
        except grpc.RpcError as e:
            print(json.dumps({"ok": False, "code": e.code().name, "details": e.details()}))


def channel(target, ca, proxy):
    with open(ca, "rb") as f:
        creds = grpc.ssl_channel_credentials(root_certificates=f.read())
    options = [("grpc.http_proxy", proxy), ("grpc.enable_retries", 0)]
    return grpc.secure_channel(target, creds, options=options)


def stream(target, ca, proxy, n):
    replies = []
    with channel(target, ca, proxy) as ch:
        method = ch.unary_stream("/test.Echo/Stream")
        try:
            for reply in method(n.encode(), timeout=15):
                replies.append(reply.decode())
            print(json.dumps({"replies": replies, "code": "OK", "details": None}))
        except grpc.RpcError as e:
            print(json.dumps({"replies": replies, "code": e.code().name, "details": e.details()}))


def chat(target, ca, proxy, n):
    n = int(n)
    outbox = queue.Queue()
    done = object()

    def requests():
        while True:
            m = outbox.get(timeout=15)
            if m is done:
                return
            yield m

    replies = []
    with channel(target, ca, proxy) as ch:
        method = ch.stream_stream("/test.Echo/Chat")
        outbox.put(b"m0")
        try:
            for reply in method(requests(), timeout=15):
                replies.append(reply.decode())
                i = len(replies)
                outbox.put(("m%d" % i).encode() if i < n else b"fail")
            print(json.dumps({"replies": replies, "code": "OK", "details": None}))
        except grpc.RpcError as e:
            print(json.dumps({"replies": replies, "code": e.code().name, "details": e.details()}))
        finally:
            outbox.put(done)


if __name__ == "__main__":
    if sys.argv[1] == "--tls":
        serve(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "stream":
        stream(*sys.argv[2:6])
    elif sys.argv[1] == "chat":
        chat(*sys.argv[2:6])
    else:
        call(*sys.argv[2:6])
