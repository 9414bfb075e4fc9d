#!/usr/bin/env python3
"""An AWS SDK in the sandbox: botocore clients that sign with whatever keys they were given
(dummy ones in the sandbox), sending through latchkey.

Usage:
  fake_aws_sdk.py s3-put ENDPOINT BUCKET KEY SIZE   # PutObject of SIZE bytes (path-style)
  fake_aws_sdk.py dynamodb-get ENDPOINT             # GetItem (JSON 1.0, x-amz-target)
  fake_aws_sdk.py presign ENDPOINT BUCKET KEY       # prints a presigned GetObject URL, no request

Environment: LATCHKEY_PROXY (omit to connect directly), LATCHKEY_CA (the CA bundle to trust),
SDK_AKID / SDK_SECRET / SDK_TOKEN (default: dummy keys with a dummy session token), SDK_REGION
(default us-west-2).

Prints JSON {"status": int, "headers": {name: value}, "error": str or null}; the SDK makes one
attempt only (no retries) and computes no flexible checksums it was not asked for.
"""

import json
import os
import sys

import botocore.session
from botocore.config import Config
from botocore.exceptions import ClientError


def client(service, endpoint):
    proxy = os.environ.get("LATCHKEY_PROXY")
    config = Config(
        proxies={"http": proxy, "https": proxy} if proxy else None,
        retries={"total_max_attempts": 1},
        s3={"addressing_style": "path"},
        signature_version="s3v4" if service == "s3" else None,
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        connect_timeout=10,
        read_timeout=20,
    )
    session = botocore.session.get_session()
    return session.create_client(
        service,
        region_name=os.environ.get("SDK_REGION", "us-west-2"),
        endpoint_url=endpoint,
        verify=os.environ["LATCHKEY_CA"],
        aws_access_key_id=os.environ.get("SDK_AKID", "AKIDSANDBOXDUMMY0000"),
        aws_secret_access_key=os.environ.get("SDK_SECRET", "sandbox-dummy-secret-key"),
        aws_session_token=os.environ.get("SDK_TOKEN", "sandbox-dummy-session-token"),
        config=config,
    )


def report(call):
    try:
        response = call()
        meta = response["ResponseMetadata"]
        out = {"status": meta["HTTPStatusCode"], "headers": meta["HTTPHeaders"], "error": None}
    except ClientError as e:
        meta = e.response.get("ResponseMetadata", {})
        out = {
            "status": meta.get("HTTPStatusCode"),
            "headers": meta.get("HTTPHeaders", {}),
            "error": str(e),
        }
    print(json.dumps(out))


def main():
    mode, endpoint, *rest = sys.argv[1:]
    if mode == "s3-put":
        bucket, key, size = rest
        body = bytes((i * 7 + 3) % 251 for i in range(int(size)))
        s3 = client("s3", endpoint)
        report(lambda: s3.put_object(Bucket=bucket, Key=key, Body=body))
    elif mode == "dynamodb-get":
        ddb = client("dynamodb", endpoint)
        report(lambda: ddb.get_item(TableName="latchkey-test", Key={"id": {"S": "item-1"}}))
    elif mode == "presign":
        bucket, key = rest
        s3 = client("s3", endpoint)
        print(
            s3.generate_presigned_url(
                "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=300
            )
        )
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
