#!/usr/bin/env python3
"""A local OAuth 2.0 authorization server with a protected API, and an authlib client, for
latchkey's token capture.

  oauth_flow.py --tls CERT KEY
      Serves on 127.0.0.1 over TLS:
        POST /oauth/token   grant_type=password (user ana / pw) issues an access token
                            (expires_in 3600) and a refresh token; grant_type=refresh_token
                            with the refresh token it issued last issues new ones (rotation);
                            anything else is 400 invalid_grant. JSON (which also carries
                            a nested copy of the access token, session.token), or a form
                            with ?format=form.
        GET  /api/me        200 {"user": "ana", "seen": <the Authorization header>} for the
                            access token issued last, else 401.
        GET  /api/debug     200 {"access", "refresh"}: the tokens issued last, to anyone, also
                            in an x-debug-token header (a server that leaks what it issued).
      Prints "listening on 127.0.0.1:PORT", then one JSON line per event: {"event": "issued",
      "grant", "access_token", "refresh_token"}, {"event": "refresh", "received"},
      {"event": "api", "auth", "ok"}.
  oauth_flow.py client BASE CA PROXY
      authlib's OAuth2Session through PROXY, trusting only CA: fetch_token (password grant),
      GET /api/me, refresh_token, GET /api/me again. Prints {"first", "me1", "refreshed",
      "me2"} (tokens as the client holds them; each "me" is {"status", "body"}).
  oauth_flow.py use BASE CA PROXY ACCESS_TOKEN
      GET /api/me with `Authorization: Bearer ACCESS_TOKEN`; prints {"status", "body"}.
  oauth_flow.py get BASE CA PROXY PATH
      GET PATH with no Authorization header; prints {"status", "body", "headers"}.
  oauth_flow.py form-token BASE CA PROXY
      The password grant with requests, asking for a form-encoded answer; prints {"status",
      "body"}.
"""

import json
import secrets
import ssl
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STATE = {"access": None, "refresh": None}
LOCK = threading.Lock()


def event(**fields):
    print(json.dumps(fields), flush=True)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, status, body, form=False):
        if form:
            data = urllib.parse.urlencode(body).encode()
            ctype = "application/x-www-form-urlencoded"
        else:
            data = json.dumps(body).encode()
            ctype = "application/json"
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(data)))
        self.send_header("cache-control", "no-store")
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        url = urllib.parse.urlparse(self.path)
        length = int(self.headers.get("content-length", "0"))
        form = dict(urllib.parse.parse_qsl(self.rfile.read(length).decode()))
        as_form = "format=form" in (url.query or "")
        if url.path != "/oauth/token":
            return self.reply(404, {"error": "not_found"})
        grant = form.get("grant_type")
        with LOCK:
            if grant == "password" and form.get("username") == "ana" and form.get("password") == "pw":
                pass
            elif grant == "refresh_token":
                event(event="refresh", received=form.get("refresh_token"))
                if form.get("refresh_token") != STATE["refresh"] or STATE["refresh"] is None:
                    return self.reply(400, {"error": "invalid_grant"})
            else:
                return self.reply(400, {"error": "invalid_grant"})
            STATE["access"] = "at-" + secrets.token_urlsafe(24)
            STATE["refresh"] = "rt-" + secrets.token_urlsafe(24)
            event(event="issued", grant=grant, access_token=STATE["access"], refresh_token=STATE["refresh"])
            body = {
                "access_token": STATE["access"],
                "refresh_token": STATE["refresh"],
                "token_type": "Bearer",
                "expires_in": 3600,
            }
            if not as_form:
                # A copy of the token where no capture names it: it must not get through.
                body["session"] = {"token": STATE["access"]}
        self.reply(200, body, form=as_form)

    def do_GET(self):
        if self.path == "/api/debug":
            with LOCK:
                body = json.dumps({"access": STATE["access"], "refresh": STATE["refresh"]}).encode()
                leak = STATE["access"] or ""
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.send_header("x-debug-token", leak)
            self.end_headers()
            self.wfile.write(body)
            return
        if self.path != "/api/me":
            return self.reply(404, {"error": "not_found"})
        auth = self.headers.get("authorization", "")
        ok = STATE["access"] is not None and auth == "Bearer " + STATE["access"]
        event(event="api", auth=auth, ok=ok)
        if ok:
            self.reply(200, {"user": "ana", "seen": auth})
        else:
            self.reply(401, {"error": "invalid_token", "seen": auth})


def serve(cert, key):
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    print("listening on 127.0.0.1:%d" % server.server_address[1], flush=True)
    server.serve_forever()


def client(base, ca, proxy):
    from authlib.integrations.requests_client import OAuth2Session

    token_url = base + "/oauth/token"
    session = OAuth2Session("agent-cli", "client-secret", token_endpoint=token_url)
    session.trust_env = False
    session.proxies = {"https": proxy, "http": proxy}
    session.verify = ca

    def me():
        r = session.get(base + "/api/me", timeout=20)
        return {"status": r.status_code, "body": r.json()}

    out = {}
    out["first"] = dict(session.fetch_token(token_url, grant_type="password", username="ana", password="pw"))
    out["me1"] = me()
    out["refreshed"] = dict(session.refresh_token(token_url))
    out["me2"] = me()
    print(json.dumps(out), flush=True)


def use(base, ca, proxy, token):
    import requests

    s = requests.Session()
    s.trust_env = False
    r = s.get(
        base + "/api/me",
        headers={"authorization": "Bearer " + token},
        proxies={"https": proxy},
        verify=ca,
        timeout=20,
    )
    print(json.dumps({"status": r.status_code, "body": r.text}), flush=True)


def get(base, ca, proxy, path):
    import requests

    s = requests.Session()
    s.trust_env = False
    r = s.get(base + path, proxies={"https": proxy}, verify=ca, timeout=20)
    print(json.dumps({"status": r.status_code, "body": r.text, "headers": dict(r.headers)}), flush=True)


def form_token(base, ca, proxy):
    import requests

    s = requests.Session()
    s.trust_env = False
    r = s.post(
        base + "/oauth/token?format=form",
        data={"grant_type": "password", "username": "ana", "password": "pw"},
        proxies={"https": proxy},
        verify=ca,
        timeout=20,
    )
    print(json.dumps({"status": r.status_code, "body": r.text}), flush=True)


def main():
    if sys.argv[1] == "--tls":
        serve(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "client":
        client(sys.argv[2], sys.argv[3], sys.argv[4])
    elif sys.argv[1] == "form-token":
        form_token(sys.argv[2], sys.argv[3], sys.argv[4])
    elif sys.argv[1] == "get":
        get(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5])
    elif sys.argv[1] == "use":
        use(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5])
    else:
        sys.exit("usage: oauth_flow.py --tls CERT KEY | client BASE CA PROXY | form-token BASE CA PROXY | use BASE CA PROXY TOKEN | get BASE CA PROXY PATH")


if __name__ == "__main__":
    main()
