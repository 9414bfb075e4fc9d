#!/usr/bin/env python3
"""Lists and downloads the objects under a prefix of an S3 bucket with boto3 (path-style), as an
operator would after the machine is gone. Used against tests/clients/s3_moto.py, directly (not
through latchkey).

Usage: s3_objects.py ENDPOINT BUCKET PREFIX OUTDIR
Env: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_CA_BUNDLE (the store's CA).

Writes each object to OUTDIR/<last part of its key> and prints one JSON line:
{"objects": [{"key", "size", "sha256"}...]} in key order.
"""

import hashlib
import json
import os
import sys

import boto3
from botocore.config import Config


def main():
    if len(sys.argv) != 5:
        sys.exit("usage: s3_objects.py ENDPOINT BUCKET PREFIX OUTDIR")
    endpoint, bucket, prefix, out = sys.argv[1:]
    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        verify=os.environ["AWS_CA_BUNDLE"],
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2}),
    )
    objects = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            body = s3.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
            with open(os.path.join(out, item["Key"].rsplit("/", 1)[-1]), "wb") as f:
                f.write(body)
            objects.append(
                {
                    "key": item["Key"],
                    "size": len(body),
                    "sha256": hashlib.sha256(body).hexdigest(),
                }
            )
    objects.sort(key=lambda o: o["key"])
    print(json.dumps({"objects": objects}), flush=True)


if __name__ == "__main__":
    main()
