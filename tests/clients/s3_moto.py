#!/usr/bin/env python3
"""A real S3 implementation that verifies SigV4: moto's S3 in server mode with its IAM auth on,
over HTTPS, plus the aws-chunked checks moto leaves out.

Usage: s3_moto.py --tls CERT KEY

At start it creates an IAM user allowed `s3:*`, its access key and the bucket `lk-bucket`, then
switches moto's IAM authentication on (`settings.INITIAL_NO_AUTH_ACTION_COUNT = 0`, what
`POST /moto-api/reset-auth` does): from then on every request must carry a valid SigV4
signature of that user (moto recomputes it with botocore from what arrived) or gets 403
`SignatureDoesNotMatch` / `InvalidAccessKeyId`. It prints
{"event": "keys", "access_key_id", "secret_access_key"} (the test hands them to latchkey) and
`listening on 127.0.0.1:PORT`.

moto verifies the seed signature only. Real S3 also checks what is inside an aws-chunked body;
a WSGI layer in front of moto does that here, strictly, before moto sees the request:
- framing: `HEX[;chunk-signature=SIG]\\r\\n DATA \\r\\n` ... `0...\\r\\n`, trailer lines, `\\r\\n`;
  nothing after; the sum of chunk sizes equals `x-amz-decoded-content-length`;
- `STREAMING-AWS4-HMAC-SHA256-PAYLOAD[-TRAILER]`: every chunk signature (chained from the
  seed signature in `Authorization`) and the `x-amz-trailer-signature`, with the user's secret;
- a `x-amz-checksum-{crc32,sha1,sha256}` trailer (or header) equals the checksum of the data.
A failure answers 403 `SignatureDoesNotMatch` or 400 (`IncompleteBody`, `BadDigest`) like S3.

Prints one JSON line per request: {"event": "request", "method", "path", "content_sha256",
"content_encoding", "transfer_encoding", "content_length", "expect", "signed_headers",
"decoded_length", "chunks", "trailer", "status", "error", "body_length"}. The secret key is printed once, in the keys event, for the test to hold.
"""

import base64
import hashlib
import hmac
import io
import json
import os
import ssl
import sys
import threading
import zlib

os.environ.setdefault("S3_IGNORE_SUBDOMAIN_BUCKETNAME", "true")
os.environ.setdefault("MOTO_CALL_RESET_API", "false")

import boto3  # noqa: E402
import urllib3  # noqa: E402
from botocore.config import Config  # noqa: E402
from moto import settings  # noqa: E402
from moto.moto_server.werkzeug_app import (  # noqa: E402
    DomainDispatcherApplication,
    create_backend_app,
)
from werkzeug.serving import make_server  # noqa: E402

BUCKET = "lk-bucket"
PRINT_LOCK = threading.Lock()
KEYS = {}  # access key id -> secret
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
MAX_BODY = 64 * 1024 * 1024
LIVE = threading.Event()  # set once setup is done: only then are requests reported


def emit(event):
    if event.get("event") == "request" and not LIVE.is_set():
        return
    with PRINT_LOCK:
        print(json.dumps(event), flush=True)


class Reject(Exception):
    def __init__(self, status, code, message):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def hmac_hex(key, text):
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def signing_key(secret, date, region, service):
    key = ("AWS4" + secret).encode()
    for part in (date, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def parse_authorization(auth):
    """(access key, date, region, service, seed signature) of a SigV4 Authorization header."""
    try:
        _, rest = auth.split(" ", 1)
        fields = dict(p.strip().split("=", 1) for p in rest.split(","))
        akid, date, region, service, _ = fields["Credential"].split("/")
        return akid, date, region, service, fields["Signature"]
    except (ValueError, KeyError):
        raise Reject(403, "AccessDenied", "malformed Authorization header")


def signed_headers(auth):
    """The SignedHeaders list of an Authorization header (empty without one)."""
    for part in auth.split(","):
        name, _, value = part.strip().partition("=")
        if name == "SignedHeaders":
            return value.split(";")
    return []


def checksum(name, data):
    if name == "x-amz-checksum-crc32":
        return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()
    if name == "x-amz-checksum-sha1":
        return base64.b64encode(hashlib.sha1(data).digest()).decode()
    if name == "x-amz-checksum-sha256":
        return base64.b64encode(hashlib.sha256(data).digest()).decode()
    return None  # an algorithm this checker does not compute


def read_line(buf, pos, what):
    end = buf.find(b"\r\n", pos)
    if end < 0:
        raise Reject(400, "IncompleteBody", f"aws-chunked: {what} without CRLF")
    return buf[pos:end].decode("latin-1"), end + 2


def decode_aws_chunked(body, form, environ):
    """Checks an aws-chunked body strictly; returns (decoded data, chunk count, trailer dict)."""
    signed = form.startswith("STREAMING-AWS4-HMAC-SHA256-PAYLOAD")
    trailer_form = form.endswith("-TRAILER")
    if signed:
        akid, date, region, service, seed = parse_authorization(environ.get("HTTP_AUTHORIZATION", ""))
        secret = KEYS.get(akid)
        if secret is None:
            raise Reject(403, "InvalidAccessKeyId", "unknown access key")
        key = signing_key(secret, date, region, service)
        scope = f"{date}/{region}/{service}/aws4_request"
        stamp = environ.get("HTTP_X_AMZ_DATE", "")
        previous = seed
    data = bytearray()
    pos, chunks = 0, 0
    while True:
        line, pos = read_line(body, pos, "chunk header")
        size_text, _, ext = line.partition(";")
        try:
            size = int(size_text, 16)
        except ValueError:
            raise Reject(400, "IncompleteBody", f"aws-chunked: bad chunk size {size_text!r}")
        if signed:
            if not ext.startswith("chunk-signature="):
                raise Reject(403, "SignatureDoesNotMatch", "aws-chunked: chunk without chunk-signature")
        elif ext:
            raise Reject(400, "IncompleteBody", f"aws-chunked: unexpected chunk extension {ext!r}")
        chunk = body[pos : pos + size]
        if len(chunk) != size:
            raise Reject(400, "IncompleteBody", "aws-chunked: chunk shorter than its size")
        pos += size
        if signed:
            to_sign = "\n".join(
                [
                    "AWS4-HMAC-SHA256-PAYLOAD",
                    stamp,
                    scope,
                    previous,
                    EMPTY_SHA256,
                    hashlib.sha256(chunk).hexdigest(),
                ]
            )
            expected = hmac_hex(key, to_sign)
            if ext[len("chunk-signature=") :] != expected:
                raise Reject(403, "SignatureDoesNotMatch", f"aws-chunked: chunk {chunks} signature does not match")
            previous = expected
        chunks += 1
        if size == 0:
            break
        if body[pos : pos + 2] != b"\r\n":
            raise Reject(400, "IncompleteBody", "aws-chunked: chunk data not followed by CRLF")
        pos += 2
        data += chunk
    trailers = {}
    trailer_signature = None
    while True:
        line, pos = read_line(body, pos, "trailer line")
        if line == "":
            break
        name, sep, value = line.partition(":")
        if not sep:
            raise Reject(400, "IncompleteBody", f"aws-chunked: bad trailer line {line!r}")
        name = name.strip().lower()
        if name == "x-amz-trailer-signature":
            trailer_signature = value.strip()
        else:
            if trailer_signature is not None:
                raise Reject(400, "IncompleteBody", "aws-chunked: trailer after its signature")
            trailers[name] = value.strip()
    if pos != len(body):
        raise Reject(400, "IncompleteBody", "aws-chunked: bytes after the final CRLF")
    declared = environ.get("HTTP_X_AMZ_TRAILER", "").strip().lower()
    if trailer_form or declared:
        if declared not in trailers:
            raise Reject(400, "IncompleteBody", f"aws-chunked: trailer {declared!r} declared, not sent")
    elif trailers:
        raise Reject(400, "IncompleteBody", "aws-chunked: trailers on a form without them")
    if signed and trailer_form:
        canonical = "".join(f"{k}:{v}\n" for k, v in sorted(trailers.items()))
        to_sign = "\n".join(
            [
                "AWS4-HMAC-SHA256-TRAILER",
                stamp,
                scope,
                previous,
                hashlib.sha256(canonical.encode()).hexdigest(),
            ]
        )
        if trailer_signature != hmac_hex(key, to_sign):
            raise Reject(403, "SignatureDoesNotMatch", "aws-chunked: trailer signature does not match")
    elif trailer_signature is not None:
        raise Reject(400, "IncompleteBody", "aws-chunked: trailer signature on an unsigned form")
    decoded_length = environ.get("HTTP_X_AMZ_DECODED_CONTENT_LENGTH")
    if decoded_length is None or int(decoded_length) != len(data):
        raise Reject(400, "IncompleteBody", f"aws-chunked: {len(data)} bytes decoded, x-amz-decoded-content-length {decoded_length}")
    return bytes(data), chunks, trailers


def error_response(start_response, status, code, message):
    body = (
        f"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{code}</Code>"
        f"<Message>{message}</Message></Error>"
    ).encode()
    reason = {400: "Bad Request", 403: "Forbidden"}.get(status, "Error")
    start_response(
        f"{status} {reason}",
        [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))],
    )
    return [body]


class Checker:
    """WSGI layer in front of moto: buffers the body, checks aws-chunked content, logs."""

    def __init__(self, app):
        self.app = app

    def __call__(self, environ, start_response):
        fact = {
            "event": "request",
            "method": environ.get("REQUEST_METHOD"),
            "path": environ.get("PATH_INFO", "") + ("?" + environ["QUERY_STRING"] if environ.get("QUERY_STRING") else ""),
            "content_sha256": environ.get("HTTP_X_AMZ_CONTENT_SHA256"),
            "content_encoding": environ.get("HTTP_CONTENT_ENCODING"),
            "transfer_encoding": environ.get("HTTP_TRANSFER_ENCODING"),
            "content_length": environ.get("CONTENT_LENGTH") or None,
            "expect": environ.get("HTTP_EXPECT"),
            "signed_headers": signed_headers(environ.get("HTTP_AUTHORIZATION", "")),
            "decoded_length": None,
            "chunks": None,
            "trailer": None,
            "status": None,
            "error": None,
        }
        stream = environ["wsgi.input"]
        if environ.get("wsgi.input_terminated") or environ.get("HTTP_TRANSFER_ENCODING"):
            body = stream.read(MAX_BODY + 1)
        else:
            length = int(environ.get("CONTENT_LENGTH") or 0)
            body = stream.read(length) if length else b""
        fact["body_length"] = len(body)
        # moto reads a plain body of a known length.
        environ.pop("wsgi.input_terminated", None)
        environ.pop("HTTP_TRANSFER_ENCODING", None)
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))
        form = fact["content_sha256"] or ""
        try:
            if form.startswith("STREAMING-"):
                data, chunks, trailers = decode_aws_chunked(body, form, environ)
                fact.update(decoded_length=len(data), chunks=chunks, trailer=trailers)
                for name, value in trailers.items():
                    want = checksum(name, data)
                    if want is not None and want != value:
                        raise Reject(400, "BadDigest", f"{name} does not match the data")
            else:
                for name in ("crc32", "sha1", "sha256"):
                    value = environ.get(f"HTTP_X_AMZ_CHECKSUM_{name.upper()}")
                    if value is not None and checksum(f"x-amz-checksum-{name}", body) != value:
                        raise Reject(400, "BadDigest", f"x-amz-checksum-{name} does not match the body")
        except Reject as r:
            fact.update(status=r.status, error=f"{r.code}: {r.message}")
            emit(fact)
            return error_response(start_response, r.status, r.code, r.message)

        def recording_start(status, headers, exc_info=None):
            fact["status"] = int(status.split(" ", 1)[0])
            return start_response(status, headers, exc_info)

        result = self.app(environ, recording_start)
        try:
            out = b"".join(result)
        finally:
            close = getattr(result, "close", None)
            if close:
                close()
        if fact["status"] and fact["status"] >= 400:
            fact["error"] = out[:500].decode("utf-8", "replace")
        emit(fact)
        return [out]


def setup(port):
    """The IAM user, its key and the bucket, made while moto still accepts anything."""
    urllib3.disable_warnings()
    common = dict(
        endpoint_url=f"https://127.0.0.1:{port}",
        region_name="us-east-1",
        verify=False,
        aws_access_key_id="AKIASETUPSETUPSETUP0",
        aws_secret_access_key="setup",
        config=Config(s3={"addressing_style": "path"}),
    )
    iam = boto3.client("iam", **common)
    iam.create_user(UserName="latchkey-agent")
    iam.put_user_policy(
        UserName="latchkey-agent",
        PolicyName="s3-all",
        PolicyDocument=json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
            }
        ),
    )
    key = iam.create_access_key(UserName="latchkey-agent")["AccessKey"]
    boto3.client("s3", **common).create_bucket(Bucket=BUCKET)
    KEYS[key["AccessKeyId"]] = key["SecretAccessKey"]
    return key["AccessKeyId"], key["SecretAccessKey"]


def main():
    if len(sys.argv) != 4 or sys.argv[1] != "--tls":
        sys.exit("usage: s3_moto.py --tls CERT KEY")
    cert, key = sys.argv[2], sys.argv[3]
    app = Checker(DomainDispatcherApplication(create_backend_app))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = make_server("127.0.0.1", 0, app, threaded=True, ssl_context=context)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    akid, secret = setup(port)
    # From here on, moto checks every request's signature and the user's permissions.
    settings.INITIAL_NO_AUTH_ACTION_COUNT = 0
    LIVE.set()
    emit({"event": "keys", "access_key_id": akid, "secret_access_key": secret})
    print(f"listening on 127.0.0.1:{port}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
