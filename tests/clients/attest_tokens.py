#!/usr/bin/env python3
"""Workload tokens from a test issuer, for latchkey's attestation tests (PyJWT, cryptography).

  attest_tokens.py DIR ISSUER AUDIENCE

Writes DIR/jwks.json (the issuer's public keys: RSA kid "k1", EC P-256 kid "k2") and prints one
JSON object of tokens by name:
  good          RS256, kid k1, the right iss/aud, 10 minutes, Kubernetes-style claims
  good_ec       ES256, kid k2, another namespace
  wrong_aud     aud "someone-else"
  wrong_iss     iss "https://evil.example"
  expired       exp an hour ago
  unknown_kid   signed by a key not in the JWKS, kid "k9"
  alg_none      {"alg": "none"} and no signature
  hs256_pubkey  HS256 "signed" with the RSA public key (PEM) as the HMAC secret
  rs_on_ec_kid  RS256 signed with the RSA key but naming kid k2 (the EC key)
  tampered      the good token with its payload changed after signing
  no_namespace  valid, but without the kubernetes.io claims
"""

import base64
import hashlib
import hmac
import json
import sys
import time

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def main() -> None:
    out_dir, issuer, audience = sys.argv[1], sys.argv[2], sys.argv[3]
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ec_key = ec.generate_private_key(ec.SECP256R1())
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def jwk(public, kid, alg):
        algo = jwt.algorithms.RSAAlgorithm if alg.startswith("RS") else jwt.algorithms.ECAlgorithm
        d = json.loads(algo.to_jwk(public))
        d.update({"kid": kid, "use": "sig", "alg": alg})
        return d

    jwks = {"keys": [jwk(rsa_key.public_key(), "k1", "RS256"), jwk(ec_key.public_key(), "k2", "ES256")]}
    with open(f"{out_dir}/jwks.json", "w") as f:
        json.dump(jwks, f)

    now = int(time.time())

    def claims(**over):
        c = {
            "iss": issuer,
            "aud": [audience],
            "sub": "system:serviceaccount:agents:runner",
            "iat": now,
            "exp": now + 600,
            "kubernetes.io": {"namespace": "agents", "pod": {"name": "runner-7"}},
        }
        c.update(over)
        return {k: v for k, v in c.items() if v is not None}

    def sign(payload, key=rsa_key, alg="RS256", kid="k1"):
        return jwt.encode(payload, key, algorithm=alg, headers={"kid": kid})

    good = sign(claims())
    header, payload, signature = good.split(".")
    forged = json.loads(base64.urlsafe_b64decode(payload + "=="))
    forged["kubernetes.io"]["namespace"] = "kube-system"
    tampered = ".".join([header, b64(json.dumps(forged).encode()), signature])

    pem = rsa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    hs_head = b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": "k1"}).encode())
    hs_body = b64(json.dumps(claims()).encode())
    hs_sig = b64(hmac.new(pem, f"{hs_head}.{hs_body}".encode(), hashlib.sha256).digest())
    none_head = b64(json.dumps({"alg": "none", "typ": "JWT"}).encode())

    tokens = {
        "good": good,
        "good_ec": sign(claims(**{"kubernetes.io": {"namespace": "batch"}}), ec_key, "ES256", "k2"),
        "wrong_aud": sign(claims(aud="someone-else")),
        "wrong_iss": sign(claims(iss="https://evil.example")),
        "expired": sign(claims(iat=now - 7200, exp=now - 3600)),
        "unknown_kid": sign(claims(), stranger, "RS256", "k9"),
        "alg_none": f"{none_head}.{hs_body}.",
        "hs256_pubkey": f"{hs_head}.{hs_body}.{hs_sig}",
        "rs_on_ec_kid": sign(claims(), rsa_key, "RS256", "k2"),
        "tampered": tampered,
        "no_namespace": sign(claims(**{"kubernetes.io": None})),
    }
    print(json.dumps(tokens))


if __name__ == "__main__":
    main()
