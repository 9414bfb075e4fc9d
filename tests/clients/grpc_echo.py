#!/usr/bin/env python3
"""A gRPC server and client (grpcio) for latchkey's gRPC round trip through the MITM.

  grpc_echo.py --tls CERT KEY
      Serves test.Echo/Call over TLS on 127.0.0.1 (raw bytes, no protobuf): a request `fail`
      is aborted with PERMISSION_DENIED and a message that quotes the `authorization` metadata
      it received (an upstream reflecting a credential in grpc-message, a trailer); any other
      request gets `ok:<length of the authorization metadata>`. Prints
      "listening on 127.0.0.1:PORT", then one JSON line per call.
  grpc_echo.py call TARGET CA PROXY PAYLOAD
      Calls test.Echo/Call on TARGET through the HTTP CONNECT proxy PROXY, trusting only CA.
      Prints one JSON line: {"ok": true, "reply": ...} or {"ok": false, "code", "details"}.
"""

import concurrent.futures
import json
import sys

import grpc


def serve(cert, key):
    def call(request, context):
        auth = dict(context.invocation_metadata()).get("authorization", "")
        print(json.dumps({"event": "call", "request": request.decode(), "auth": auth}), flush=True)
        if request == b"fail":
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "rejected credential " + auth)
        return ("ok:%d" % len(auth)).encode()

    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=4))
    handler = grpc.method_handlers_generic_handler(
        "test.Echo", {"Call": grpc.unary_unary_rpc_method_handler(call)}
    )
    server.add_generic_rpc_handlers((handler,))
    with open(key, "rb") as k, open(cert, "rb") as c:
        creds = grpc.ssl_server_credentials([(k.read(), c.read())])
    port = server.add_secure_port("127.0.0.1:0", creds)
    server.start()
    print("listening on 127.0.0.1:%d" % port, flush=True)
    server.wait_for_termination()


def call(target, ca, proxy, payload):
    with open(ca, "rb") as f:
        creds = grpc.ssl_channel_credentials(root_certificates=f.read())
    options = [("grpc.http_proxy", proxy), ("grpc.enable_retries", 0)]
    with grpc.secure_channel(target, creds, options=options) as channel:
        method = channel.unary_unary("/test.Echo/Call")
        try:
            reply = method(payload.encode(), timeout=15)
            print(json.dumps({"ok": True, "reply": reply.decode()}))
        except grpc.RpcError as e:
            print(json.dumps({"ok": False, "code": e.code().name, "details": e.details()}))


if __name__ == "__main__":
    if sys.argv[1] == "--tls":
        serve(sys.argv[2], sys.argv[3])
    else:
        call(*sys.argv[2:6])
