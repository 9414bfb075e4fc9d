#!/usr/bin/env python3
"""An AWS-like HTTPS upstream that checks every request's SigV4 signature with botocore.

Usage: verify_sigv4.py --tls CERT KEY

Credentials from the environment: VERIFY_AKID, VERIFY_SECRET, and VERIFY_TOKEN when requests must
carry that session token (without it, a request must carry none).

For each request the signature is recomputed with botocore (`S3SigV4Auth` for service `s3`, which
takes the path as sent; `SigV4Auth` otherwise, which double-encodes it) from what arrived: the
method, the path, the query (decoded, then encoded the way AWS canonicalises it), exactly the
headers the request's `SignedHeaders` names, the body, and the timestamp, region and service its
`Credential` scope claims. Besides the signature, the checks AWS makes:

- one `authorization` (`AWS4-HMAC-SHA256`), one `x-amz-date`, at most one `x-amz-security-token`
  and `x-amz-content-sha256` (a sandbox's own must not survive next to latchkey's);
- the access key is VERIFY_AKID, the scope date is x-amz-date's, x-amz-date within 15 min of now;
- `host` and every `x-amz-*` header received are signed, every signed header was received;
- `x-amz-content-sha256`, when sent, is `UNSIGNED-PAYLOAD` or the SHA-256 of the body received
  (then botocore signs that value; without it, botocore hashes the body itself);
- `x-amz-security-token` present and equal to VERIFY_TOKEN (and signed) iff VERIFY_TOKEN is set;
- no presigned query auth (`X-Amz-Signature`).

Answers 200 `{"valid": true, ...}` (the facts below; an empty body to a valid S3 PUT, which an S3
SDK would otherwise parse as an error document) or 403 `{"valid": false, "errors": [...],
"canonical_request": ...}` (session token values masked), and prints one JSON line per request to
stdout: {"event": "verify", "valid", "errors", "method", "path", "service", "region",
"access_key", "signed_headers", "content_sha256", "body_sha256", "body_len", "token_sent",
"authorization_count"}. Never prints the secret key or the session token.
"""

import datetime
import hashlib
import http.server
import json
import os
import re
import ssl
import sys
import threading
import urllib.parse

from botocore.auth import S3SigV4Auth, SigV4Auth
from botocore.awsrequest import AWSRequest, HTTPHeaders
from botocore.credentials import Credentials

AKID = os.environ["VERIFY_AKID"]
SECRET = os.environ["VERIFY_SECRET"]
TOKEN = os.environ.get("VERIFY_TOKEN") or None
# STS mode: "AKID:SECRET:TOKEN" of the temporary keys a valid AssumeRole call receives.
STS_ISSUE = os.environ.get("VERIFY_STS_ISSUE") or None

PRINT_LOCK = threading.Lock()

AUTH_RE = re.compile(
    r"^AWS4-HMAC-SHA256 Credential=(?P<cred>[^,\s]+),\s*SignedHeaders=(?P<signed>[^,\s]+),"
    r"\s*Signature=(?P<sig>[0-9a-f]{64})$"
)


def emit(event):
    with PRINT_LOCK:
        print(json.dumps(event), flush=True)


def only_signed(auth_class):
    """botocore's signer, restricted to the headers the request says it signed (botocore would
    otherwise pick its own set)."""

    class Verifier(auth_class):
        def __init__(self, credentials, service, region, signed):
            super().__init__(credentials, service, region)
            self._signed = signed

        def headers_to_sign(self, request):
            header_map = HTTPHeaders()
            for name, value in request.headers.items():
                if name.lower() in self._signed:
                    header_map[name.lower()] = value
            return header_map

    return Verifier


S3Verifier = only_signed(S3SigV4Auth)
GenericVerifier = only_signed(SigV4Auth)


def query_params(query):
    """The query decoded (no `+` as space: AWS does not treat it so), pairs in order."""
    params = []
    if not query:
        return params
    for pair in query.split("&"):
        key, _, value = pair.partition("=")
        params.append((urllib.parse.unquote(key), urllib.parse.unquote(value)))
    return params


def mask(text):
    if TOKEN:
        text = text.replace(TOKEN, "<session token>")
    return text


def verify(method, raw_path, headers, body):
    """headers: list of (name, value) as received. Returns (facts, errors, canonical_request)."""
    errors = []
    facts = {
        "method": method,
        "path": raw_path,
        "body_len": len(body),
        "body_sha256": hashlib.sha256(body).hexdigest(),
    }
    by_name = {}
    for name, value in headers:
        by_name.setdefault(name.lower(), []).append(value)

    auths = by_name.get("authorization", [])
    facts["authorization_count"] = len(auths)
    if len(auths) != 1:
        errors.append(f"expected one authorization header, got {len(auths)}")
        return facts, errors, None
    match = AUTH_RE.match(auths[0].strip())
    if not match:
        errors.append("authorization is not AWS4-HMAC-SHA256 Credential=..., SignedHeaders=..., Signature=...")
        return facts, errors, None
    cred = match.group("cred").split("/")
    if len(cred) != 5 or cred[4] != "aws4_request":
        errors.append(f"bad credential scope {'/'.join(cred[1:])!r}")
        return facts, errors, None
    access_key, scope_date, region, service = cred[0], cred[1], cred[2], cred[3]
    signed = match.group("signed").split(";")
    facts.update(
        access_key=access_key,
        region=region,
        service=service,
        signed_headers=signed,
    )
    if access_key != AKID:
        errors.append(f"access key {access_key!r} is not the configured one")
    if signed != sorted(signed) or any(s != s.lower() for s in signed):
        errors.append(f"SignedHeaders not lower-case and sorted: {signed}")

    for name in ("x-amz-date", "x-amz-security-token", "x-amz-content-sha256"):
        if len(by_name.get(name, [])) > 1:
            errors.append(f"{name} sent {len(by_name[name])} times")
    dates = by_name.get("x-amz-date", [])
    if len(dates) != 1:
        errors.append(f"expected one x-amz-date, got {len(dates)}")
        return facts, errors, None
    amz_date = dates[0].strip()
    try:
        when = datetime.datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(
            tzinfo=datetime.timezone.utc
        )
    except ValueError:
        errors.append(f"x-amz-date {amz_date!r} is not YYYYMMDDTHHMMSSZ")
        return facts, errors, None
    skew = abs((datetime.datetime.now(datetime.timezone.utc) - when).total_seconds())
    if skew > 900:
        errors.append(f"x-amz-date is {skew:.0f} s away from now")
    if scope_date != amz_date[:8]:
        errors.append(f"scope date {scope_date} is not x-amz-date's {amz_date[:8]}")

    if "host" not in signed:
        errors.append("host is not signed")
    for name in by_name:
        if name.startswith("x-amz-") and name not in signed:
            errors.append(f"{name} was sent but not signed")
    for name in signed:
        if name not in by_name:
            errors.append(f"signed header {name} did not arrive")

    content_sha = by_name.get("x-amz-content-sha256", [None])[0]
    facts["content_sha256"] = content_sha
    if content_sha is not None and content_sha != "UNSIGNED-PAYLOAD":
        if content_sha != facts["body_sha256"]:
            errors.append("x-amz-content-sha256 is not the SHA-256 of the body received")

    token_sent = by_name.get("x-amz-security-token", [None])[0]
    facts["token_sent"] = token_sent is not None
    if TOKEN is not None:
        if token_sent != TOKEN:
            errors.append("x-amz-security-token is missing or not the configured session token")
    elif token_sent is not None:
        errors.append("x-amz-security-token sent, but no session token is configured")

    path, _, query = raw_path.partition("?")
    if any(k.lower() == "x-amz-signature" for k, _ in query_params(query)):
        errors.append("presigned query auth (X-Amz-Signature) in the query")

    host = by_name.get("host", [""])[0]
    request = AWSRequest(
        method=method, url=f"https://{host}{path}", data=body, params=query_params(query)
    )
    for name, value in headers:
        if name.lower() in signed:
            request.headers[name] = value  # appends: repeated headers stay repeated
    request.context["timestamp"] = amz_date
    auth_class = S3Verifier if service == "s3" else GenericVerifier
    signer = auth_class(Credentials(AKID, SECRET, TOKEN), service, region, set(signed))
    canonical = signer.canonical_request(request)
    string_to_sign = signer.string_to_sign(request, canonical)
    expected = signer.signature(string_to_sign, request)
    if expected != match.group("sig"):
        errors.append("signature mismatch: botocore computes a different signature")
    return facts, errors, canonical


def read_body(handler):
    if handler.headers.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while True:
            size = int(handler.rfile.readline().split(b";")[0].strip(), 16)
            if size == 0:
                while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return body
            body += handler.rfile.read(size)
            handler.rfile.readline()
    length = int(handler.headers.get("content-length") or 0)
    return handler.rfile.read(length) if length else b""


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def answer(self):
        body = read_body(self)
        facts, errors, canonical = verify(self.command, self.path, self.headers.items(), body)
        valid = not errors
        emit({"event": "verify", "valid": valid, "errors": errors, **facts})
        if STS_ISSUE and valid and self.command == "POST":
            form = urllib.parse.parse_qs(body.decode())
            if form.get("Action") == ["AssumeRole"]:
                akid, secret, token = STS_ISSUE.split(":")
                expires = (datetime.datetime.now(datetime.timezone.utc)
                           + datetime.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
                emit({"event": "assume_role", "role_arn": form.get("RoleArn", [""])[0],
                      "session_name": form.get("RoleSessionName", [""])[0],
                      "duration": form.get("DurationSeconds", [""])[0],
                      "service": facts.get("service"), "region": facts.get("region")})
                xml = (
                    "<AssumeRoleResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\">"
                    "<AssumeRoleResult><Credentials>"
                    f"<AccessKeyId>{akid}</AccessKeyId><SecretAccessKey>{secret}</SecretAccessKey>"
                    f"<SessionToken>{token}</SessionToken><Expiration>{expires}</Expiration>"
                    "</Credentials></AssumeRoleResult></AssumeRoleResponse>"
                ).encode()
                self.send_response(200)
                self.send_header("content-type", "text/xml")
                self.send_header("content-length", str(len(xml)))
                self.end_headers()
                self.wfile.write(xml)
                return
        # The access key id stays out of the response (events only): the sandbox has no need for it.
        payload = {"valid": valid, **{k: v for k, v in facts.items() if k != "access_key"}}
        if not valid:
            payload["errors"] = errors
            if canonical is not None:
                payload["canonical_request"] = mask(canonical)
        # An S3 SDK parses a PUT's 200 body as an S3 error document: send none.
        quiet = valid and self.command == "PUT" and facts.get("service") == "s3"
        data = b"" if quiet else json.dumps(payload).encode()
        self.send_response(200 if valid else 403)
        self.send_header("content-type", "application/json")
        self.send_header("x-verify-valid", "true" if valid else "false")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_PATCH = answer

    def log_message(self, *_args):
        pass


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128


def main():
    args = sys.argv[1:]
    if len(args) != 3 or args[0] != "--tls":
        print(__doc__, file=sys.stderr)
        return 2
    server = Server(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(args[1], args[2])
    context.set_alpn_protocols(["http/1.1"])
    server.socket = context.wrap_socket(
        server.socket, server_side=True, do_handshake_on_connect=False
    )
    host, port = server.socket.getsockname()[:2]
    print(f"listening on {host}:{port}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
