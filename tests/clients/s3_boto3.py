#!/usr/bin/env python3
"""S3 uploads from the sandbox: real boto3 with its default settings (only the endpoint,
proxy, CA, path-style addressing and no retries set), and a hand-rolled signed aws-chunked
upload for the form boto3 does not send.

Usage:
  s3_boto3.py put ENDPOINT BUCKET KEY SIZE CHECKSUMS
      PutObject of SIZE bytes, then GetObject; CHECKSUMS is `when_supported` (boto3's default:
      CRC32 in an aws-chunked trailer, STREAMING-UNSIGNED-PAYLOAD-TRAILER) or `when_required`.
  s3_boto3.py multipart ENDPOINT BUCKET KEY SIZE PART CHECKSUMS
      CreateMultipartUpload, UploadPart in PART-byte parts, CompleteMultipartUpload, GetObject.
  s3_boto3.py chunk-signed ENDPOINT BUCKET KEY SIZE CHUNK FORM
      PutObject as `STREAMING-AWS4-HMAC-SHA256-PAYLOAD` (FORM `plain`) or `...-TRAILER` (FORM
      `trailer`, with an x-amz-checksum-crc32 trailer): the seed signed with botocore's
      S3SigV4Auth, each CHUNK-byte chunk and the trailer signed here (HMAC-SHA256, chained
      from the seed), with SDK_SECRET; then GetObject through boto3. FORM `bad-chunk` signs the
      seed right and one chunk with another key (a server that checks chunks must refuse it);
      `malformed` frames the first chunk wrong; `unsigned-trailer` builds boto3's
      STREAMING-UNSIGNED-PAYLOAD-TRAILER form by hand and `unsigned-short` declares one byte
      more in x-amz-decoded-content-length than it sends.
  s3_boto3.py get ENDPOINT BUCKET KEY
      GetObject.

Environment: LATCHKEY_PROXY (omit to connect directly), LATCHKEY_CA (the CA bundle to trust),
SDK_AKID / SDK_SECRET (default: dummy keys), SDK_REGION (default us-east-1).

Prints JSON {"ok": bool, "status", "error", "size", "sha256_sent", "sha256_got", "len_got",
"seconds"}; errors are reported, not raised. The body is deterministic pseudo-random bytes.
"""

import hashlib
import hmac
import json
import os
import sys
import time
import zlib
import base64

import boto3
import requests
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import BotoCoreError, ClientError

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


def body_of(size, seed):
    out = bytearray()
    block = hashlib.sha256(seed.encode()).digest()
    while len(out) < size:
        block = hashlib.sha256(block).digest()
        out += block * 64
    return bytes(out[:size])


def keys():
    return (
        os.environ.get("SDK_AKID", "AKIDSANDBOXDUMMY0000"),
        os.environ.get("SDK_SECRET", "sandbox-dummy-secret-key"),
    )


def region():
    return os.environ.get("SDK_REGION", "us-east-1")


def client(endpoint, checksums):
    proxy = os.environ.get("LATCHKEY_PROXY")
    akid, secret = keys()
    settings = dict(
        proxies={"http": proxy, "https": proxy} if proxy else None,
        retries={"total_max_attempts": 1},
        s3={"addressing_style": "path"},
        connect_timeout=10,
        read_timeout=60,
    )
    if checksums != "default":
        settings["request_checksum_calculation"] = checksums
    return boto3.client(
        "s3",
        region_name=region(),
        endpoint_url=endpoint,
        verify=os.environ["LATCHKEY_CA"],
        aws_access_key_id=akid,
        aws_secret_access_key=secret,
        config=Config(**settings),
    )


def fetch(s3, bucket, key):
    got = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    return {"sha256_got": hashlib.sha256(got).hexdigest(), "len_got": len(got)}


def put(endpoint, bucket, key, size, checksums):
    body = body_of(size, key)
    s3 = client(endpoint, checksums)
    s3.put_object(Bucket=bucket, Key=key, Body=body)
    return body, fetch(s3, bucket, key)


def multipart(endpoint, bucket, key, size, part, checksums):
    body = body_of(size, key)
    s3 = client(endpoint, checksums)
    upload = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    parts = []
    for n, start in enumerate(range(0, size, part), start=1):
        r = s3.upload_part(
            Bucket=bucket, Key=key, UploadId=upload, PartNumber=n, Body=body[start : start + part]
        )
        entry = {"PartNumber": n, "ETag": r["ETag"]}
        for field in ("ChecksumCRC32", "ChecksumCRC32C", "ChecksumSHA1", "ChecksumSHA256"):
            if field in r:
                entry[field] = r[field]
        parts.append(entry)
    s3.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": parts}
    )
    return body, fetch(s3, bucket, key)


class SeedAuth(S3SigV4Auth):
    """botocore's S3 signer with the payload hash set to a streaming literal."""

    literal = None

    def payload(self, request):
        return self.literal


FORMS = {
    # FORM: (x-amz-content-sha256, chunks signed, trailer)
    "plain": ("STREAMING-AWS4-HMAC-SHA256-PAYLOAD", True, False),
    "trailer": ("STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER", True, True),
    "bad-chunk": ("STREAMING-AWS4-HMAC-SHA256-PAYLOAD", True, False),
    "malformed": ("STREAMING-AWS4-HMAC-SHA256-PAYLOAD", True, False),
    "unsigned-trailer": ("STREAMING-UNSIGNED-PAYLOAD-TRAILER", False, True),
    "unsigned-short": ("STREAMING-UNSIGNED-PAYLOAD-TRAILER", False, True),
}


def chunk_signed(endpoint, bucket, key, size, chunk, form):
    """A PutObject in aws-chunked framing, built here: the signed forms as the AWS SDKs for
    Java and Go send them, and the unsigned-trailer form as boto3 does. `bad-chunk` signs the
    second chunk with another key; `malformed` puts one byte more in the first chunk than its
    size line says; `unsigned-short` declares one byte more than it sends."""
    body = body_of(size, key)
    akid, secret = keys()
    literal, signed, trailer = FORMS[form]
    pieces = [body[i : i + chunk] for i in range(0, size, chunk)] + [b""]
    crc = base64.b64encode(zlib.crc32(body).to_bytes(4, "big")).decode()
    trailer_line = f"x-amz-checksum-crc32:{crc}"

    url = f"{endpoint}/{bucket}/{key}"
    request = AWSRequest(method="PUT", url=url, data=b"")
    request.headers["Content-Encoding"] = "aws-chunked"
    declared = size + 1 if form == "unsigned-short" else size
    request.headers["X-Amz-Decoded-Content-Length"] = str(declared)
    if trailer:
        request.headers["X-Amz-Trailer"] = "x-amz-checksum-crc32"
    signer = SeedAuth(Credentials(akid, secret), "s3", region())
    signer.literal = literal
    signer.add_auth(request)
    stamp = request.headers["X-Amz-Date"]
    seed = request.headers["Authorization"].rsplit("Signature=", 1)[1]
    date = stamp[:8]
    scope = f"{date}/{region()}/s3/aws4_request"

    def key_for(secret_key):
        k = ("AWS4" + secret_key).encode()
        for part in (date, region(), "s3", "aws4_request"):
            k = hmac.new(k, part.encode(), hashlib.sha256).digest()
        return k

    good, bad = key_for(secret), key_for(secret + "x")
    out = bytearray()
    previous = seed
    for i, p in enumerate(pieces):
        size_line = f"{len(p) - 1 if form == 'malformed' and i == 0 else len(p):x}"
        if signed:
            k = bad if form == "bad-chunk" and i == 1 else good
            to_sign = "\n".join(
                ["AWS4-HMAC-SHA256-PAYLOAD", stamp, scope, previous, EMPTY_SHA256,
                 hashlib.sha256(p).hexdigest()]
            )
            previous = hmac.new(k, to_sign.encode(), hashlib.sha256).hexdigest()
            out += f"{size_line};chunk-signature={previous}\r\n".encode()
        else:
            out += f"{size_line}\r\n".encode()
        out += p
        if p:
            out += b"\r\n"
    if trailer:
        out += f"{trailer_line}\r\n".encode()
        if signed:
            canonical = trailer_line + "\n"
            to_sign = "\n".join(
                ["AWS4-HMAC-SHA256-TRAILER", stamp, scope, previous,
                 hashlib.sha256(canonical.encode()).hexdigest()]
            )
            sig = hmac.new(good, to_sign.encode(), hashlib.sha256).hexdigest()
            out += f"x-amz-trailer-signature:{sig}\r\n".encode()
    out += b"\r\n"
    # Content-Length was not signed (botocore signs what it is given; the SDKs that send this
    # form set it after signing): the framed length.
    headers = {k: v for k, v in request.headers.items()}
    headers["Content-Length"] = str(len(out))
    proxy = os.environ.get("LATCHKEY_PROXY")
    try:
        response = requests.put(
            url,
            data=bytes(out),
            headers=headers,
            proxies={"https": proxy, "http": proxy} if proxy else None,
            verify=os.environ["LATCHKEY_CA"],
            timeout=60,
        )
    except requests.RequestException as e:
        raise Failed(None, f"{type(e).__name__}: {e}")
    if response.status_code != 200:
        raise Failed(response.status_code, response.text[:600])
    return body, fetch(client(endpoint, "when_required"), bucket, key)


def get(endpoint, bucket, key):
    """GetObject: the status, and the object's length and hash when there is one."""
    s3 = client(endpoint, "when_required")
    return fetch(s3, bucket, key)


class Failed(Exception):
    def __init__(self, status, error):
        super().__init__(error)
        self.status, self.error = status, error


def main():
    mode, endpoint, bucket, key, *rest = sys.argv[1:]
    start = time.monotonic()
    out = {"ok": False, "status": None, "error": None}
    try:
        if mode == "put":
            size, checksums = rest
            body, got = put(endpoint, bucket, key, int(size), checksums)
        elif mode == "multipart":
            size, part, checksums = rest
            body, got = multipart(endpoint, bucket, key, int(size), int(part), checksums)
        elif mode == "get":
            got = get(endpoint, bucket, key)
            out.update(got, status=200, ok=True)
            body = None
        elif mode == "chunk-signed":
            size, chunk, form = rest
            body, got = chunk_signed(endpoint, bucket, key, int(size), int(chunk), form)
        else:
            sys.exit(f"unknown mode {mode}")
        if body is not None:
            out.update(got)
            out.update(size=len(body), sha256_sent=hashlib.sha256(body).hexdigest(), status=200)
            out["ok"] = out["sha256_got"] == out["sha256_sent"] and out["len_got"] == len(body)
    except ClientError as e:
        meta = e.response.get("ResponseMetadata", {})
        out.update(status=meta.get("HTTPStatusCode"), error=str(e))
    except Failed as e:
        out.update(status=e.status, error=e.error)
    except (BotoCoreError, requests.RequestException) as e:
        out.update(error=f"{type(e).__name__}: {e}")
    out["seconds"] = round(time.monotonic() - start, 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
