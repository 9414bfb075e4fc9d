#!/usr/bin/env python3
"""moto in server mode (plain HTTP on 127.0.0.1, IAM auth off) with AWS stores to read:
Secrets Manager `lk/plain` (two versions: AWSCURRENT and AWSPREVIOUS), `lk/json` (a JSON
object), and an SSM SecureString `/lk/param` (two versions).

Usage: aws_moto.py --tls CERT KEY   (the TLS arguments are accepted and unused: latchkey may
reach a loopback AWS endpoint over plain http://, which is what this checks)

Prints `listening on 127.0.0.1:PORT` once everything is created, then {"event": "request",
"method", "path", "target", "authorization"} for each request (the Authorization header's
credential scope only, never a signature).
"""

import json
import os
import sys
import threading

os.environ.setdefault("MOTO_CALL_RESET_API", "false")
for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
    os.environ[var] = "testing"
os.environ["AWS_DEFAULT_REGION"] = "us-east-1"

import boto3  # noqa: E402
from moto.moto_server.werkzeug_app import (  # noqa: E402
    DomainDispatcherApplication,
    create_backend_app,
)
from werkzeug.serving import make_server  # noqa: E402

LOCK = threading.Lock()
LIVE = threading.Event()


def emit(obj):
    with LOCK:
        print(json.dumps(obj), flush=True)


def main():
    app = DomainDispatcherApplication(create_backend_app)

    def logged(environ, start_response):
        if LIVE.is_set():
            auth = environ.get("HTTP_AUTHORIZATION", "")
            scope = auth.split("Credential=", 1)[1].split(",", 1)[0] if "Credential=" in auth else ""
            emit({
                "event": "request",
                "method": environ.get("REQUEST_METHOD"),
                "path": environ.get("PATH_INFO"),
                "target": environ.get("HTTP_X_AMZ_TARGET", ""),
                "credential": scope,
            })
        return app(environ, start_response)

    server = make_server("127.0.0.1", 0, logged, threaded=True)
    port = server.server_port
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{port}"
    sm = boto3.client("secretsmanager", endpoint_url=url, region_name="us-east-1")
    sm.create_secret(Name="lk/plain", SecretString="plain-secret-v1")
    sm.put_secret_value(SecretId="lk/plain", SecretString="plain-secret-v2")
    sm.create_secret(
        Name="lk/json",
        SecretString=json.dumps({"username": "app", "password": "json-secret-pw"}),
    )
    ssm = boto3.client("ssm", endpoint_url=url, region_name="us-east-1")
    ssm.put_parameter(Name="/lk/param", Value="param-secret-v1", Type="SecureString")
    ssm.put_parameter(Name="/lk/param", Value="param-secret-v2", Type="SecureString", Overwrite=True)
    iam = boto3.client("iam", endpoint_url=url, region_name="us-east-1")
    iam.create_role(RoleName="lk-role", AssumeRolePolicyDocument="{}")
    LIVE.set()
    print(f"listening on 127.0.0.1:{port}", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    sys.exit(main())
