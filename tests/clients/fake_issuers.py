#!/usr/bin/env python3
"""Fake token issuers, and APIs that check the tokens they issued, over HTTPS, for latchkey's
credential tests. Every JWT is verified with PyJWT against a public key (or the shared HMAC key)
the test gave this server, never against anything latchkey says.

Usage: fake_issuers.py --tls CERT KEY

Configuration (environment; a route whose configuration is missing answers 500):
  FAKE_DELAY_MS            delay before answering a token exchange, so concurrent requests overlap
  GitHub App:  FAKE_GH_APP_ID, FAKE_GH_INSTALLATION_ID, FAKE_GH_PUBLIC_KEY (PEM file),
               FAKE_GH_TTL (seconds until the token's expires_at; default 3600)
  Google SA:   FAKE_GSA_PUBLIC_KEY (PEM file), FAKE_GSA_EMAIL, FAKE_GSA_KID, FAKE_GSA_SCOPE
  OAuth2 CC:   FAKE_CC_CLIENT_ID, FAKE_CC_SECRET, FAKE_CC_SCOPE, FAKE_CC_TTL (expires_in, s),
               FAKE_CC_FAIL_FIRST (answer the first N exchanges 503)
  OAuth2 grants (/oauth2/grant): FAKE_O2_CLIENT_ID, FAKE_O2_SECRET (checked when set, form or
               Basic), FAKE_O2_REFRESH (the first refresh token), FAKE_O2_ROTATE ("1": each refresh
               issues a new refresh token and revokes the old), FAKE_O2_USER, FAKE_O2_PASS,
               FAKE_O2_JB_KEY (HS256 key of jwt_bearer assertions), FAKE_O2_HEADER ("name=value"
               the token request must carry), FAKE_O2_TTL (expires_in, s)
  Google ID:   FAKE_GSA_* as above, FAKE_GID_AUDIENCE, FAKE_GID_TTL (the id_token's exp - now)
  HMAC:        FAKE_HMAC_KEY
  Generic JWT: FAKE_JWT_HS_KEY (HMAC secret), FAKE_JWT_ES_PUBLIC_KEY, FAKE_JWT_RS_PUBLIC_KEY,
  FAKE_JWT_ED_PUBLIC_KEY (PEM files)

Routes:
  POST [/api/v3]/app/installations/{id}/access_tokens   GitHub: the app JWT in `Authorization: Bearer`
      (RS256, iss = app id, iat not in the future, exp after now, exp - iat <= 600) → 201
      {"token": "ghs_…", "expires_at": RFC 3339 (now + FAKE_GH_TTL), …}; 401 otherwise.
  GET  /{owner}/{repo}.git/info/refs           git smart HTTP: `Basic x-access-token:<token>` with
      a live installation token → a ref advertisement; 401 with a Basic challenge otherwise.
  POST /google/…                               Google: form grant_type = jwt-bearer, assertion
      RS256 with kid, iss, scope, aud = this URL (https://HOST/PATH), exp - iat = 3600 →
      {"access_token": "ya29.…", "expires_in": 3599, "token_type": "Bearer"}; 400 otherwise.
  POST /oauth/token                            OAuth2 client credentials: client id and secret in
      the form (or Basic), scope → {"access_token": "cc-…", "expires_in": FAKE_CC_TTL}; 401.
  POST /oauth2/grant                           OAuth2 refresh_token, password and jwt_bearer
      (RFC 7523: HS256, aud = this URL, iss, sub, iat, exp, jti) grants → {"access_token": "o2-…",
      "expires_in", "refresh_token" (rotated)}; 400/401 otherwise.
  POST /google/id                              Google ID token: like /google/ but the assertion
      carries target_audience (no scope) → {"id_token": a JWT with aud and exp}.
  ANY  /hmac/generic, /hmac/stripe             HMAC-SHA256 verifiers: x-signature (hex) over
      "METHOD\nPATH?QUERY\nTS\nSHA256(body)" with x-timestamp; Stripe's stripe-signature
      t=TS,v1=HEX over "TS.BODY". Timestamp within 60 s → 200 {"valid": true}; 401.
  ANY  /oauth/redirect                         307 to FAKE_REDIRECT_TO (a client must not follow).
  POST /oauth/fail500, /oauth/badjson          a token endpoint failing: 500; 200 with HTML;
       /oauth/echo400                          400 quoting the request form (client secret and all).
  ANY  /jwt/{hs256,es256,rs256,eddsa}          a JWT in `Authorization: Bearer`, or with
       /jwt/{alg}/bare/{header} the bare JWT in that header: verified (HS256 with the shared key,
       ES256/RS256/EdDSA with the public key), aud = the request's host (no port), numeric iat within 60 s of
       now, exp after now if present → 200 {"valid": true, "claims"}; 401 {"valid": false}.
  anything else                                the GitHub API: `Authorization: Bearer <token>` with
       a live installation token → 200 {"ok": true, "token_index": N}; 401 otherwise.

Prints "listening on 127.0.0.1:PORT", then one JSON line per request: {"event": KIND, "ok",
"error", "minted" (a token it issued), "presented" (the JWT or token it was given), …}. Those
values go to the test only (so it can look for leaks); responses never carry a presented value.
"""

import base64
import datetime
import http.server
import json
import os
import re
import secrets
import ssl
import sys
import threading
import time
import urllib.parse

import jwt

LOCK = threading.Lock()
STATE = {"gh_tokens": []}  # [(token, expiry epoch)]


def emit(event):
    with LOCK:
        print(json.dumps(event, sort_keys=True), flush=True)


def env(name, default=None):
    value = os.environ.get(name)
    return value if value else default


def read_file(path):
    with open(path, "rb") as f:
        return f.read()


def rfc3339(epoch):
    return datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )


def delay():
    ms = int(env("FAKE_DELAY_MS", "0"))
    if ms:
        time.sleep(ms / 1000)


def bearer(headers):
    auth = headers.get("authorization") or ""
    scheme, _, value = auth.partition(" ")
    return value.strip() if scheme.lower() == "bearer" else None


def live_gh_token(token):
    now = time.time()
    with LOCK:
        for i, (t, expiry) in enumerate(STATE["gh_tokens"]):
            if t == token:
                return i if now < expiry else None
    return None


class Reject(Exception):
    def __init__(self, status, error):
        super().__init__(error)
        self.status = status
        self.error = error


# ---------------------------------------------------------------------------------------------
# GitHub


def github_access_token(handler, installation, body):
    event = {
        "event": "github_exchange",
        "installation": installation,
        "user_agent": handler.headers.get("user-agent"),
        "accept": handler.headers.get("accept"),
    }
    try:
        app_id = env("FAKE_GH_APP_ID")
        if not app_id:
            raise Reject(500, "FAKE_GH_APP_ID not configured")
        app_jwt = bearer(handler.headers)
        event["presented"] = app_jwt
        if not app_jwt:
            raise Reject(401, "no Bearer app JWT")
        header = jwt.get_unverified_header(app_jwt)
        event["jwt_header"] = header
        claims = jwt.decode(
            app_jwt,
            read_file(env("FAKE_GH_PUBLIC_KEY")),
            algorithms=["RS256"],
            options={"require": ["iat", "exp", "iss"], "verify_iat": False},
        )
        event["claims"] = claims
        now = time.time()
        if str(claims["iss"]) != app_id:
            raise Reject(401, f"iss {claims['iss']!r} is not the app id")
        if not isinstance(claims["iat"], int) or claims["iat"] > now + 5:
            raise Reject(401, "iat is in the future or not an integer")
        if claims["exp"] - claims["iat"] > 600:
            raise Reject(401, "exp - iat is over 10 minutes")
        if installation != env("FAKE_GH_INSTALLATION_ID"):
            raise Reject(404, f"no installation {installation}")
        requested = json.loads(body) if body.strip() else None
        event["body"] = requested
        ttl = int(env("FAKE_GH_TTL", "3600"))
        token = "ghs_" + secrets.token_hex(18)
        expiry = int(now) + ttl
        with LOCK:
            STATE["gh_tokens"].append((token, expiry))
            index = len(STATE["gh_tokens"]) - 1
        event.update(ok=True, minted=token, index=index, expires_at=rfc3339(expiry))
        delay()
        emit(event)
        return 201, {
            "token": token,
            "expires_at": rfc3339(expiry),
            "permissions": (requested or {}).get("permissions", {"contents": "read", "metadata": "read"}),
            "repository_selection": "selected" if (requested or {}).get("repositories") else "all",
        }
    except (Reject, jwt.PyJWTError, ValueError) as e:
        status = e.status if isinstance(e, Reject) else 401
        event.update(ok=False, error=str(e))
        delay()
        emit(event)
        return status, {"message": "A JSON web token could not be decoded", "status": str(status)}


def git_info_refs(handler):
    event = {"event": "git", "path": handler.path}
    auth = handler.headers.get("authorization") or ""
    scheme, _, value = auth.partition(" ")
    ok = False
    if scheme.lower() == "basic":
        try:
            user, _, password = base64.b64decode(value.strip()).decode().partition(":")
        except ValueError:
            user, password = "", ""
        event.update(user=user, presented=password, scheme="Basic")
        index = live_gh_token(password)
        ok = user == "x-access-token" and index is not None
        event["token_index"] = index
    else:
        event["scheme"] = scheme or None
    event["ok"] = ok
    emit(event)
    if not ok:
        return handler.reply(
            401,
            b"authentication required\n",
            "text/plain",
            [("www-authenticate", 'Basic realm="GitHub"')],
        )
    sha = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"

    def pkt(line):
        data = line.encode()
        return f"{len(data) + 4:04x}".encode() + data

    body = (
        pkt("# service=git-upload-pack\n")
        + b"0000"
        + pkt(f"{sha} HEAD\0symref=HEAD:refs/heads/main agent=fake-issuers/1\n")
        + pkt(f"{sha} refs/heads/main\n")
        + b"0000"
    )
    handler.reply(200, body, "application/x-git-upload-pack-advertisement")


def github_api(handler):
    token = bearer(handler.headers)
    index = live_gh_token(token) if token else None
    ok = index is not None
    emit({"event": "api", "ok": ok, "path": handler.path, "token_index": index, "presented": token,
          "authorization_scheme": (handler.headers.get("authorization") or " ").split(" ")[0] or None})
    if ok:
        handler.reply_json(200, {"ok": True, "token_index": index})
    else:
        handler.reply_json(401, {"message": "Bad credentials"})


# ---------------------------------------------------------------------------------------------
# Google service account


def google_token(handler, body):
    event = {
        "event": "google_exchange",
        "path": handler.path,
        "content_type": handler.headers.get("content-type"),
    }
    try:
        form = dict(urllib.parse.parse_qsl(body.decode(), keep_blank_values=True))
        if form.get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer":
            raise Reject(400, f"grant_type {form.get('grant_type')!r}")
        assertion = form.get("assertion")
        event["presented"] = assertion
        if not assertion:
            raise Reject(400, "no assertion")
        header = jwt.get_unverified_header(assertion)
        event["jwt_header"] = header
        if header.get("kid") != env("FAKE_GSA_KID"):
            raise Reject(400, f"kid {header.get('kid')!r} is not the key's private_key_id")
        audience = f"https://{handler.headers.get('host')}{handler.path.split('?')[0]}"
        event["expected_aud"] = audience
        claims = jwt.decode(
            assertion,
            read_file(env("FAKE_GSA_PUBLIC_KEY")),
            algorithms=["RS256"],
            audience=audience,
            issuer=env("FAKE_GSA_EMAIL"),
            options={"require": ["iat", "exp", "iss", "aud", "scope"]},
            leeway=60,
        )
        event["claims"] = claims
        if claims["scope"] != env("FAKE_GSA_SCOPE"):
            raise Reject(400, f"scope {claims['scope']!r}")
        if claims["exp"] - claims["iat"] != 3600:
            raise Reject(400, "exp - iat is not 3600")
        if abs(claims["iat"] - time.time()) > 60:
            raise Reject(400, "iat is not now")
        token = "ya29.test-" + secrets.token_hex(20)
        event.update(ok=True, minted=token)
        delay()
        emit(event)
        return 200, {"access_token": token, "expires_in": 3599, "token_type": "Bearer"}
    except (Reject, jwt.PyJWTError, ValueError) as e:
        event.update(ok=False, error=str(e))
        delay()
        emit(event)
        return (e.status if isinstance(e, Reject) else 400), {
            "error": "invalid_grant",
            "error_description": "Invalid JWT Signature.",
        }


# ---------------------------------------------------------------------------------------------
# OAuth2 client credentials


def client_credentials(handler, body):
    event = {
        "event": "cc_exchange",
        "path": handler.path,
        "content_type": handler.headers.get("content-type"),
    }
    form = dict(urllib.parse.parse_qsl(body.decode(errors="replace"), keep_blank_values=True))
    client_id, secret = form.get("client_id"), form.get("client_secret")
    event["client_auth"] = "form"
    auth = handler.headers.get("authorization") or ""
    if auth.lower().startswith("basic "):
        try:
            user, _, password = base64.b64decode(auth[6:].strip()).decode().partition(":")
            client_id, secret = urllib.parse.unquote(user), urllib.parse.unquote(password)
            event["client_auth"] = "basic"
        except ValueError:
            pass
    event.update(grant_type=form.get("grant_type"), client_id=client_id, scope=form.get("scope"))
    event["presented"] = secret
    errors = []
    with LOCK:
        STATE["cc_calls"] = STATE.get("cc_calls", 0) + 1
        calls = STATE["cc_calls"]
    if calls <= int(env("FAKE_CC_FAIL_FIRST", "0")):
        delay()
        event.update(ok=False, error=f"configured to fail the first calls (503), call {calls}")
        emit(event)
        return 503, {"error": "temporarily_unavailable"}
    if form.get("grant_type") != "client_credentials":
        errors.append("grant_type is not client_credentials")
    if client_id != env("FAKE_CC_CLIENT_ID") or secret != env("FAKE_CC_SECRET"):
        errors.append("client id or secret is wrong")
    if env("FAKE_CC_SCOPE") and form.get("scope") != env("FAKE_CC_SCOPE"):
        errors.append(f"scope {form.get('scope')!r}")
    delay()
    if errors:
        event.update(ok=False, error="; ".join(errors))
        emit(event)
        return 401, {"error": "invalid_client"}
    token = "cc-test-" + secrets.token_hex(20)
    ttl = int(env("FAKE_CC_TTL", "3600"))
    event.update(ok=True, minted=token, expires_in=ttl)
    emit(event)
    return 200, {"access_token": token, "expires_in": ttl, "token_type": "Bearer"}



# ---------------------------------------------------------------------------------------------
# OAuth2 grants


def oauth2_grant(handler, body):
    event = {"event": "o2_exchange", "path": handler.path,
             "x_header": None}
    form = dict(urllib.parse.parse_qsl(body.decode(errors="replace"), keep_blank_values=True))
    grant = form.get("grant_type")
    event["grant_type"] = grant
    client_id, secret = form.get("client_id"), form.get("client_secret")
    event["client_auth"] = "form" if secret else "none"
    auth = handler.headers.get("authorization") or ""
    if auth.lower().startswith("basic "):
        try:
            user, _, password = base64.b64decode(auth[6:].strip()).decode().partition(":")
            client_id, secret = urllib.parse.unquote_plus(user), urllib.parse.unquote_plus(password)
            event["client_auth"] = "basic"
        except ValueError:
            pass
    event["client_id"] = client_id
    presented = [secret] if secret else []
    errors = []
    want_header = env("FAKE_O2_HEADER")
    if want_header:
        name, _, value = want_header.partition("=")
        event["x_header"] = handler.headers.get(name)
        presented.append(handler.headers.get(name))
        if handler.headers.get(name) != value:
            errors.append(f"header {name} missing or wrong")
    if env("FAKE_O2_SECRET") and (client_id != env("FAKE_O2_CLIENT_ID") or secret != env("FAKE_O2_SECRET")):
        errors.append("client id or secret is wrong")
    new_refresh = None
    with LOCK:
        current = STATE.setdefault("refresh", env("FAKE_O2_REFRESH"))
    if grant == "refresh_token":
        rt = form.get("refresh_token")
        presented.append(rt)
        event["refresh_presented"] = rt
        if not current or rt != current:
            errors.append("refresh token is not the live one")
        elif env("FAKE_O2_ROTATE") == "1" and not errors:
            new_refresh = "rt-rotated-" + secrets.token_hex(16)
            with LOCK:
                STATE["refresh"] = new_refresh
    elif grant == "password":
        presented.extend([form.get("username"), form.get("password")])
        if form.get("username") != env("FAKE_O2_USER") or form.get("password") != env("FAKE_O2_PASS"):
            errors.append("username or password is wrong")
    elif grant == "urn:ietf:params:oauth:grant-type:jwt-bearer":
        assertion = form.get("assertion")
        presented.append(assertion)
        try:
            audience = f"https://{handler.headers.get('host')}{handler.path.split('?')[0]}"
            claims = jwt.decode(assertion or "", env("FAKE_O2_JB_KEY"), algorithms=["HS256"],
                                audience=audience,
                                options={"require": ["iss", "sub", "aud", "exp", "iat", "jti"]})
            event["claims"] = claims
        except jwt.PyJWTError as e:
            errors.append(f"assertion: {e}")
    else:
        errors.append(f"grant_type {grant!r}")
    event["presented"] = [p for p in presented if p]
    delay()
    if errors:
        event.update(ok=False, error="; ".join(errors))
        emit(event)
        return 401 if grant != "refresh_token" else 400, {"error": "invalid_grant"}
    token = "o2-test-" + secrets.token_hex(20)
    answer = {"access_token": token, "expires_in": int(env("FAKE_O2_TTL", "3600")),
              "token_type": "Bearer"}
    if new_refresh:
        answer["refresh_token"] = new_refresh
        event["minted_refresh"] = new_refresh
    event.update(ok=True, minted=token)
    emit(event)
    return 200, answer


def google_id_token(handler, body):
    event = {"event": "gid_exchange", "path": handler.path}
    try:
        form = dict(urllib.parse.parse_qsl(body.decode(), keep_blank_values=True))
        if form.get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer":
            raise Reject(400, f"grant_type {form.get('grant_type')!r}")
        assertion = form.get("assertion")
        event["presented"] = assertion
        audience = f"https://{handler.headers.get('host')}{handler.path.split('?')[0]}"
        claims = jwt.decode(
            assertion or "",
            read_file(env("FAKE_GSA_PUBLIC_KEY")),
            algorithms=["RS256"],
            audience=audience,
            issuer=env("FAKE_GSA_EMAIL"),
            options={"require": ["iat", "exp", "iss", "aud", "target_audience"]},
            leeway=60,
        )
        event["claims"] = claims
        if jwt.get_unverified_header(assertion).get("kid") != env("FAKE_GSA_KID"):
            raise Reject(400, "kid is not the key's private_key_id")
        if claims["target_audience"] != env("FAKE_GID_AUDIENCE"):
            raise Reject(400, f"target_audience {claims['target_audience']!r}")
        if "scope" in claims:
            raise Reject(400, "an ID token assertion carries no scope")
        now = int(time.time())
        token = jwt.encode(
            {"aud": claims["target_audience"], "iss": "https://accounts.google.com",
             "email": claims["iss"], "iat": now, "exp": now + int(env("FAKE_GID_TTL", "3600")),
             "nonce": secrets.token_hex(8)},
            "google-side-signing-key-for-the-fake-0123456789",
            algorithm="HS256",
        )
        event.update(ok=True, minted=token)
        emit(event)
        return 200, {"id_token": token}
    except (Reject, jwt.PyJWTError, ValueError) as e:
        event.update(ok=False, error=str(e))
        emit(event)
        return (e.status if isinstance(e, Reject) else 400), {"error": "invalid_grant"}


def hmac_check(handler, style, body):
    import hashlib
    import hmac as hmac_mod

    key = (env("FAKE_HMAC_KEY") or "").encode()
    event = {"event": "hmac", "style": style, "path": handler.path, "body_len": len(body)}
    try:
        if style == "stripe":
            header = handler.headers.get("stripe-signature") or ""
            parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
            ts, sig = parts.get("t"), parts.get("v1")
            message = f"{ts}.".encode() + body
        else:
            ts, sig = handler.headers.get("x-timestamp"), handler.headers.get("x-signature")
            message = "\n".join([handler.command, handler.path, ts or "",
                                 hashlib.sha256(body).hexdigest()]).encode()
        event.update(presented=sig, timestamp=ts)
        if not ts or not sig:
            raise Reject(401, "no signature or timestamp")
        if abs(int(ts) - time.time()) > 60:
            raise Reject(401, "timestamp is not now")
        want = hmac_mod.new(key, message, hashlib.sha256).hexdigest()
        if not hmac_mod.compare_digest(want, sig):
            raise Reject(401, "signature mismatch")
        event["ok"] = True
        emit(event)
        handler.reply_json(200, {"valid": True})
    except (Reject, ValueError) as e:
        event.update(ok=False, error=str(e))
        emit(event)
        handler.reply_json(401, {"valid": False, "error": str(e)})

# ---------------------------------------------------------------------------------------------
# Generic JWT


def jwt_check(handler, alg, bare_header):
    if bare_header:
        token = handler.headers.get(bare_header)
    else:
        token = bearer(handler.headers)
    host = (handler.headers.get("host") or "").rsplit(":", 1)[0]
    event = {
        "event": "jwt",
        "alg": alg,
        "presented": token,
        "host": host,
        "header_name": bare_header or "authorization",
        "authorization": handler.headers.get("authorization"),
    }
    try:
        if not token:
            raise Reject(401, "no token")
        sent = handler.headers.get_all(bare_header or "authorization") or []
        if len(sent) != 1:
            raise Reject(401, f"{len(sent)} {bare_header or 'authorization'} headers")
        if alg == "hs256":
            key, algorithms = env("FAKE_JWT_HS_KEY"), ["HS256"]
        elif alg == "rs256":
            key, algorithms = read_file(env("FAKE_JWT_RS_PUBLIC_KEY")), ["RS256"]
        elif alg == "eddsa":
            key, algorithms = read_file(env("FAKE_JWT_ED_PUBLIC_KEY")), ["EdDSA"]
        else:
            key, algorithms = read_file(env("FAKE_JWT_ES_PUBLIC_KEY")), ["ES256"]
        event["jwt_header"] = jwt.get_unverified_header(token)
        claims = jwt.decode(
            token, key, algorithms=algorithms, audience=host, options={"require": ["iat"]}
        )
        event["claims"] = claims
        if not isinstance(claims["iat"], int) or isinstance(claims["iat"], bool):
            raise Reject(401, "iat is not a number")
        if abs(claims["iat"] - time.time()) > 60:
            raise Reject(401, "iat is not now")
        event["ok"] = True
        emit(event)
        handler.reply_json(200, {"valid": True, "claims": claims})
    except (Reject, jwt.PyJWTError, ValueError) as e:
        if "claims" not in event and token:
            try:
                event["claims"] = jwt.decode(token, options={"verify_signature": False})
            except jwt.PyJWTError:
                pass
        event.update(ok=False, error=str(e))
        emit(event)
        handler.reply_json(401, {"valid": False, "error": str(e)})


# ---------------------------------------------------------------------------------------------


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


GH_TOKENS = re.compile(r"^(?:/api/v3)?/app/installations/([^/]+)/access_tokens$")
JWT_ROUTE = re.compile(r"^/jwt/(hs256|es256|rs256|eddsa)(?:/bare/([A-Za-z0-9-]+))?$")


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def reply(self, status, data, content_type, extra=()):
        self.send_response(status)
        self.send_header("content-type", content_type)
        for name, value in extra:
            self.send_header(name, value)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def reply_json(self, status, value):
        self.reply(status, json.dumps(value).encode(), "application/json")

    def answer(self):
        body = read_body(self)
        path = self.path.split("?")[0]
        m = GH_TOKENS.match(path)
        if m and self.command == "POST":
            status, value = github_access_token(self, m.group(1), body)
            return self.reply_json(status, value)
        if path.endswith(".git/info/refs"):
            return git_info_refs(self)
        if path == "/google/id" and self.command == "POST":
            return self.reply_json(*google_id_token(self, body))
        if path == "/oauth2/grant" and self.command == "POST":
            return self.reply_json(*oauth2_grant(self, body))
        if path in ("/hmac/generic", "/hmac/stripe"):
            return hmac_check(self, path.rsplit("/", 1)[1], body)
        if path.startswith("/google/") and self.command == "POST":
            return self.reply_json(*google_token(self, body))
        if path == "/oauth/token" and self.command == "POST":
            return self.reply_json(*client_credentials(self, body))
        if path == "/oauth/fail500":
            delay()
            emit({"event": "cc_exchange", "ok": False, "error": "configured to fail (500)"})
            return self.reply(500, b"internal error\n", "text/plain")
        if path == "/oauth/badjson":
            delay()
            emit({"event": "cc_exchange", "ok": False, "error": "configured to fail (bad JSON)"})
            return self.reply(200, b"<html>not json</html>", "text/html")
        if path == "/oauth/redirect":
            # A token endpoint that moved (or was tampered with): 307 keeps the POST and its body.
            target = os.environ.get("FAKE_REDIRECT_TO", "")
            emit({"event": "redirect", "host": self.headers.get("host"), "to": target})
            return self.reply(307, b"", "text/plain", [("location", target)])
        if path == "/oauth/echo400":
            # Like OAuth servers that quote the request in their error: the client secret is in
            # this response, and latchkey must not pass it on to the sandbox or its logs.
            delay()
            emit({"event": "cc_exchange", "ok": False, "error": "configured to fail (400 echo)"})
            return self.reply_json(
                400,
                {"error": "invalid_request", "error_description": f"rejected: {body.decode()}"},
            )
        m = JWT_ROUTE.match(path)
        if m:
            return jwt_check(self, m.group(1), m.group(2))
        return github_api(self)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = answer

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
