//! The console's OpenID Connect sign-in (`[admin.oidc]`) against a test issuer on loopback
//! (HTTPS with its own CA; discovery, JWKS, a token endpoint checking PKCE and the client
//! secret, ES256 ID tokens). A person signs in with the code flow and gets the scopes their
//! groups grant; they answer a parked request and the answer names them. Every trick is
//! refused: a callback from another browser, a replayed code, a wrong nonce, audience or key,
//! an issuer error, a wrong client secret, a person no role grants, a discovery document naming
//! another issuer. A reload that changes the roles ends the sessions. No code, ID token or
//! client secret reaches a page or the log.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine as _;
use serde_json::{json, Value};

use crate::support::approvals::{agent, ask_policy, http_call, send, start, Admin, ADMIN_TOKEN};
use crate::support::clients::RawResponse;
use crate::support::toolchain;
use crate::support::upstream::{echo, full_body, handler, Received};
use crate::support::{Latchkey, TestCa, Upstream};

const CLIENT_ID: &str = "latchkey-console";
const CLIENT_SECRET: &str = "oidc-client-secret-5d0b7e91c2a4f638";
const REDIRECT: &str = "http://latchkey-admin.test/ui/oidc/callback";

/// The test issuer's state: codes it has handed out, what it expects and says.
struct Idp {
    issuer: String,
    key: jsonwebtoken::EncodingKey,
    stranger: jsonwebtoken::EncodingKey,
    jwks: Value,
    codes: Mutex<HashMap<String, Grant>>,
    /// The discovery document names this issuer instead, when set.
    claims_issuer: Mutex<Option<String>>,
    /// Every id_token and code handed out (none may show anywhere).
    handed_out: Mutex<Vec<String>>,
    /// The client secret the token endpoint takes.
    client_secret: Mutex<String>,
    /// Where `/authorize` sends a browser back (latchkey's admin address, once known), and
    /// whom it signs in.
    browser: Mutex<Option<(String, Value)>>,
}

struct Grant {
    challenge: String,
    redirect_uri: String,
    claims: Value,
    /// Signed by a key the JWKS does not have.
    stranger: bool,
}

fn ec_key() -> (jsonwebtoken::EncodingKey, Value) {
    let pair = rcgen::KeyPair::generate().expect("P-256 key");
    let raw = pair.public_key_raw();
    assert_eq!(raw.len(), 65, "an uncompressed P-256 point");
    let key = jsonwebtoken::EncodingKey::from_ec_pem(pair.serialize_pem().as_bytes())
        .expect("EC key PEM");
    let jwk = json!({"kty": "EC", "crv": "P-256", "kid": "idp-1", "use": "sig", "alg": "ES256",
        "x": URL_SAFE_NO_PAD.encode(&raw[1..33]), "y": URL_SAFE_NO_PAD.encode(&raw[33..65])});
    (key, jwk)
}

fn json_response(status: u16, value: &Value) -> hyper::Response<crate::support::upstream::UpBody> {
    hyper::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(full_body(value.to_string()))
        .expect("response")
}

impl Idp {
    fn new(issuer: String) -> Self {
        let (key, jwk) = ec_key();
        let (stranger, _) = ec_key();
        Idp {
            issuer,
            key,
            stranger,
            jwks: json!({"keys": [jwk]}),
            codes: Mutex::default(),
            claims_issuer: Mutex::default(),
            handed_out: Mutex::default(),
            client_secret: Mutex::new(CLIENT_SECRET.to_string()),
            browser: Mutex::default(),
        }
    }

    async fn serve(&self, req: Received) -> hyper::Response<crate::support::upstream::UpBody> {
        match req.path_only() {
            "/.well-known/openid-configuration" => {
                let named = self.claims_issuer.lock().expect("lock").clone();
                json_response(
                    200,
                    &json!({
                        "issuer": named.unwrap_or_else(|| self.issuer.clone()),
                        "authorization_endpoint": format!("{}/authorize", self.issuer),
                        "token_endpoint": format!("{}/token", self.issuer),
                        "jwks_uri": format!("{}/keys", self.issuer),
                    }),
                )
            }
            "/keys" => json_response(200, &self.jwks),
            "/token" => self.token(&req),
            "/authorize" => self.authorize(&req),
            _ => echo(req).await,
        }
    }

    /// The authorization endpoint, for a browser: signs the configured person in at once and
    /// sends the browser back to latchkey's callback with a code.
    fn authorize(&self, req: &Received) -> hyper::Response<crate::support::upstream::UpBody> {
        let query = req.path.split_once('?').map(|(_, q)| q).unwrap_or_default();
        let q: HashMap<String, String> = url::form_urlencoded::parse(query.as_bytes())
            .into_owned()
            .collect();
        let Some((admin, mut claims)) = self.browser.lock().expect("lock").clone() else {
            return json_response(400, &json!({"error": "no browser sign-in set up"}));
        };
        claims["nonce"] = json!(q.get("nonce").cloned().unwrap_or_default());
        let code = format!(
            "browser-code-{}",
            self.handed_out.lock().expect("lock").len()
        );
        self.handed_out.lock().expect("lock").push(code.clone());
        self.codes.lock().expect("lock").insert(
            code.clone(),
            Grant {
                challenge: q.get("code_challenge").cloned().unwrap_or_default(),
                redirect_uri: q.get("redirect_uri").cloned().unwrap_or_default(),
                claims,
                stranger: false,
            },
        );
        // Back to latchkey as the browser reaches it (the policy's redirect_uri names a host
        // this test cannot serve; the token request must still carry it).
        let back = format!(
            "{admin}/ui/oidc/callback?code={code}&state={}",
            q.get("state").cloned().unwrap_or_default()
        );
        hyper::Response::builder()
            .status(302)
            .header("location", back)
            .body(full_body(""))
            .expect("response")
    }

    /// The token endpoint: the client authenticated, the code known (once), PKCE and the
    /// redirect URI matching.
    fn token(&self, req: &Received) -> hyper::Response<crate::support::upstream::UpBody> {
        let form: HashMap<String, String> = url::form_urlencoded::parse(&req.body)
            .into_owned()
            .collect();
        let secret = self.client_secret.lock().expect("lock").clone();
        let basic = format!("Basic {}", STANDARD.encode(format!("{CLIENT_ID}:{secret}")));
        if req.header("authorization") != Some(basic.as_str()) {
            return json_response(401, &json!({"error": "invalid_client"}));
        }
        let grant = form
            .get("code")
            .and_then(|c| self.codes.lock().expect("lock").remove(c));
        let Some(grant) = grant else {
            return json_response(400, &json!({"error": "invalid_grant"}));
        };
        let verifier = form.get("code_verifier").cloned().unwrap_or_default();
        let challenge = URL_SAFE_NO_PAD.encode(
            aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, verifier.as_bytes()).as_ref(),
        );
        if form.get("grant_type").map(String::as_str) != Some("authorization_code")
            || challenge != grant.challenge
            || form.get("redirect_uri") != Some(&grant.redirect_uri)
            || form.get("client_id").map(String::as_str) != Some(CLIENT_ID)
        {
            return json_response(400, &json!({"error": "invalid_grant"}));
        }
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
        header.kid = Some("idp-1".to_string());
        let key = if grant.stranger {
            &self.stranger
        } else {
            &self.key
        };
        let token = jsonwebtoken::encode(&header, &grant.claims, key).expect("sign");
        self.handed_out.lock().expect("lock").push(token.clone());
        json_response(
            200,
            &json!({"access_token": "opaque", "token_type": "Bearer", "id_token": token}),
        )
    }
}

fn policy(roles: &str) -> String {
    format!(
        "{}\n\
[admin.oidc]\nissuer = \"https://other.test:PORT\"\nclient_id = \"{CLIENT_ID}\"\n\
client_secret = \"env:LK_OIDC_SECRET\"\nredirect_uri = \"{REDIRECT}\"\n\n{roles}",
        ask_policy("30s", r#""once", "1h""#)
    )
}

const ROLES: &str = "[admin.oidc.roles.security]\nclaim = \"groups\"\nequals = \"security\"\n\
scopes = [\"read\", \"approvals:answer\"]\n\n\
[admin.oidc.roles.staff]\nclaim = \"groups\"\nequals = \"staff\"\nscopes = [\"read\"]\n";

struct World {
    lk: Latchkey,
    idp: Arc<Idp>,
    admin: Admin,
    upstream: Upstream,
    _ca: TestCa,
}

fn world() -> World {
    let ca = TestCa::new();
    let slot: Arc<Mutex<Option<Arc<Idp>>>> = Arc::default();
    let served = Arc::clone(&slot);
    let upstream = Upstream::https_with(
        &ca,
        handler(move |req| {
            let idp = served.lock().expect("lock").clone();
            async move {
                match idp {
                    Some(idp) => idp.serve(req).await,
                    None => echo(req).await,
                }
            }
        }),
    );
    let idp = Arc::new(Idp::new(format!("https://other.test:{}", upstream.port())));
    *slot.lock().expect("lock") = Some(Arc::clone(&idp));
    let lk = start(&ca, &upstream, &policy(ROLES), |b| {
        b.arg("--console")
            .arg("--admin-token")
            .arg("env:LK_ADMIN_TOKEN")
            .env("LK_OIDC_SECRET", CLIENT_SECRET)
    });
    let admin = Admin::new(lk.admin_addr(), Some(ADMIN_TOKEN));
    World {
        lk,
        idp,
        admin,
        upstream,
        _ca: ca,
    }
}

fn get(w: &World, path: &str, cookie: Option<&str>) -> RawResponse {
    let headers: Vec<(&str, &str)> = cookie.map(|c| ("Cookie", c)).into_iter().collect();
    http_call(w.lk.admin_addr(), "GET", path, &headers, b"")
}

/// A started sign-in: what the browser was sent to the issuer with.
struct Started {
    state: String,
    nonce: String,
    challenge: String,
    redirect_uri: String,
    cookie: String,
}

fn start_sign_in(w: &World, seen: &mut Vec<RawResponse>) -> Started {
    let resp = get(w, "/ui/oidc/start", None);
    assert_eq!(resp.status, 303, "{resp:#?}");
    let location = resp.header("location").expect("location").to_string();
    let url = url::Url::parse(&location).expect("an absolute URL");
    assert_eq!(
        url.as_str().split('?').next(),
        Some(format!("{}/authorize", w.idp.issuer).as_str())
    );
    let q: HashMap<String, String> = url.query_pairs().into_owned().collect();
    assert_eq!(q["response_type"], "code");
    assert_eq!(q["client_id"], CLIENT_ID);
    assert_eq!(q["code_challenge_method"], "S256");
    assert!(q["scope"].split(' ').any(|s| s == "openid"), "{q:?}");
    let set = resp
        .header("set-cookie")
        .expect("a state cookie")
        .to_string();
    for attr in ["HttpOnly", "SameSite=Lax", "Path=/ui/oidc"] {
        assert!(set.contains(attr), "state cookie without {attr}: {set}");
    }
    let cookie = set.split(';').next().unwrap_or_default().to_string();
    assert_eq!(cookie, format!("latchkey_oidc={}", q["state"]));
    seen.push(resp);
    Started {
        state: q["state"].clone(),
        nonce: q["nonce"].clone(),
        challenge: q["code_challenge"].clone(),
        redirect_uri: q["redirect_uri"].clone(),
        cookie,
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn claims(w: &World, nonce: &str, email: &str, groups: &[&str]) -> Value {
    json!({"iss": w.idp.issuer, "aud": CLIENT_ID, "sub": format!("sub-{email}"),
        "email": email, "groups": groups, "nonce": nonce, "iat": now(), "exp": now() + 300})
}

/// The issuer "signs the person in": a code for `claims`, then the browser's callback.
fn finish(
    w: &World,
    s: &Started,
    claims: Value,
    stranger: bool,
    cookie: Option<&str>,
) -> RawResponse {
    let code = format!("code-{}", s.state.get(..12).unwrap_or_default());
    w.idp.handed_out.lock().expect("lock").push(code.clone());
    w.idp.codes.lock().expect("lock").insert(
        code.clone(),
        Grant {
            challenge: s.challenge.clone(),
            redirect_uri: s.redirect_uri.clone(),
            claims,
            stranger,
        },
    );
    callback(w, &format!("code={code}&state={}", s.state), cookie)
}

fn callback(w: &World, query: &str, cookie: Option<&str>) -> RawResponse {
    get(w, &format!("/ui/oidc/callback?{query}"), cookie)
}

/// The session cookie a successful callback set.
fn session_cookie(resp: &RawResponse) -> String {
    assert_eq!(resp.status, 200, "{resp:#?}");
    assert!(
        resp.text()
            .contains("http-equiv=\"refresh\" content=\"0;url=/ui\""),
        "{resp:#?}"
    );
    let set: Vec<&str> = resp
        .headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("set-cookie"))
        .map(|(_, v)| v.as_str())
        .collect();
    let session = set
        .iter()
        .find(|v| v.starts_with("latchkey_console="))
        .unwrap_or_else(|| panic!("no session cookie: {set:?}"));
    for attr in ["HttpOnly", "SameSite=Strict", "Path=/ui"] {
        assert!(session.contains(attr), "{session}");
    }
    assert!(set
        .iter()
        .any(|v| v.starts_with("latchkey_oidc=;") && v.contains("Max-Age=0")));
    session.split(';').next().unwrap_or_default().to_string()
}

fn refused(resp: &RawResponse, why: &str) {
    assert_eq!(resp.status, 403, "{resp:#?}");
    assert!(resp.text().contains(why), "{why:?} not in {}", resp.text());
    assert!(
        !resp.headers.iter().any(
            |(n, v)| n.eq_ignore_ascii_case("set-cookie") && v.starts_with("latchkey_console=")
        ),
        "a refused sign-in got a session: {resp:#?}"
    );
}

#[test]
fn an_issuer_signs_a_person_in_with_their_groups_scopes_and_every_trick_is_refused() {
    let w = world();
    let mut seen = Vec::new();
    let login = get(&w, "/ui/login", None);
    assert!(
        login.text().contains("href=\"/ui/oidc/start\"") && login.text().contains("other.test"),
        "{login:#?}"
    );
    assert_eq!(get(&w, "/ui", None).status, 303, "the console is open");

    // A discovery document naming another issuer: nothing starts.
    *w.idp.claims_issuer.lock().expect("lock") = Some("https://evil.test".to_string());
    let bad = get(&w, "/ui/oidc/start", None);
    assert_eq!(bad.status, 502, "{bad:#?}");
    assert!(bad.text().contains("not the configured"), "{}", bad.text());
    *w.idp.claims_issuer.lock().expect("lock") = None;

    // Another browser's callback (no state cookie), a wrong nonce, audience and key, a person
    // no role grants, the issuer's own refusal: each refused, no session.
    let s = start_sign_in(&w, &mut seen);
    let c = claims(&w, &s.nonce, "alice@example.com", &["security"]);
    refused(
        &finish(&w, &s, c, false, None),
        "not started by this browser",
    );
    let s = start_sign_in(&w, &mut seen);
    let c = claims(&w, "another-nonce", "alice@example.com", &["security"]);
    refused(&finish(&w, &s, c, false, Some(&s.cookie)), "nonce");
    let s = start_sign_in(&w, &mut seen);
    let mut c = claims(&w, &s.nonce, "alice@example.com", &["security"]);
    c["aud"] = json!("someone-else");
    refused(
        &finish(&w, &s, c, false, Some(&s.cookie)),
        "ID token was refused",
    );
    let s = start_sign_in(&w, &mut seen);
    let c = claims(&w, &s.nonce, "alice@example.com", &["security"]);
    refused(
        &finish(&w, &s, c, true, Some(&s.cookie)),
        "ID token was refused",
    );
    let s = start_sign_in(&w, &mut seen);
    let c = claims(&w, &s.nonce, "mallory@example.com", &["contractors"]);
    refused(
        &finish(&w, &s, c, false, Some(&s.cookie)),
        "oidc:mallory@example.com signed in at the issuer, and no [admin.oidc.roles] grants them anything",
    );
    let s = start_sign_in(&w, &mut seen);
    refused(
        &callback(
            &w,
            &format!("error=access_denied&state={}", s.state),
            Some(&s.cookie),
        ),
        "the issuer refused the sign-in: access_denied",
    );

    // The person in the security group signs in: read and approvals:answer.
    let s = start_sign_in(&w, &mut seen);
    let c = claims(&w, &s.nonce, "alice@example.com", &["staff", "security"]);
    let done = finish(&w, &s, c, false, Some(&s.cookie));
    let alice = session_cookie(&done);
    seen.push(done);
    // The same code and state again: the sign-in was taken once.
    let again = callback(
        &w,
        &format!("code=code-{}&state={}", &s.state[..12], s.state),
        Some(&s.cookie),
    );
    refused(&again, "unknown or expired");
    let overview = get(&w, "/ui", Some(&alice));
    assert_eq!(overview.status, 200, "{overview:#?}");
    assert!(
        overview.text().contains("oidc:alice@example.com")
            && overview.text().contains("read, approvals:answer"),
        "{}",
        overview.text()
    );
    seen.push(overview);

    // She answers a parked request; the answer names her.
    let url = format!("https://api.test:{}/v1/items", w.upstream.port());
    thread::scope(|sc| {
        let held = sc.spawn(|| send(&w.lk, Some(&agent()), "POST", &url, Some("{}")));
        let pending = w.admin.wait_pending(1, Duration::from_secs(15));
        let id = pending[0]["id"].as_str().expect("id").to_string();
        let page = get(&w, "/ui/approvals", Some(&alice));
        let text = page.text();
        assert!(text.contains(">Approve</button>"), "{text}");
        let at = text.find("name=\"csrf\" value=\"").expect("a CSRF field");
        let csrf = text[at + 19..at + 19 + 64].to_string();
        let body = format!("csrf={csrf}&decision=approve&scope=once&note=ok");
        let answered = http_call(
            w.lk.admin_addr(),
            "POST",
            &format!("/ui/approvals/{id}"),
            &[
                ("Cookie", &alice),
                ("Content-Type", "application/x-www-form-urlencoded"),
            ],
            body.as_bytes(),
        );
        assert_eq!(answered.status, 200, "{answered:#?}");
        assert_eq!(w.admin.show(&id)["answer"]["by"], "oidc:alice@example.com");
        let out = held.join().expect("curl thread");
        assert_eq!(out.ok().status, 200);
        seen.push(page);
        seen.push(answered);
    });
    let records = w.lk.audit_records();
    assert!(
        records
            .iter()
            .any(|r| r["method"] == "APPROVAL" && r.to_string().contains("oidc:alice@example.com")),
        "no APPROVAL record naming her"
    );

    // The issuer does not take latchkey's client secret: refused with its error code.
    *w.idp.client_secret.lock().expect("lock") = "rotated-at-the-issuer".to_string();
    let s = start_sign_in(&w, &mut seen);
    let c = claims(&w, &s.nonce, "bob@example.com", &["staff"]);
    refused(
        &finish(&w, &s, c, false, Some(&s.cookie)),
        "the token endpoint refused the code: 401 Unauthorized (invalid_client)",
    );

    // A reload that changes the roles ends her session.
    let changed = policy(&ROLES.replace("equals = \"security\"", "equals = \"sec-team\""))
        .replace("PORT", &w.upstream.port().to_string());
    let dir = w.lk.scratch().join("policies");
    let aside = dir.join(".main.toml.new");
    std::fs::write(&aside, &changed).expect("write policy aside");
    std::fs::rename(&aside, dir.join("main.toml")).expect("rename policy into place");
    assert_eq!(w.admin.call("POST", "/reload", None).status, 200);
    let after = get(&w, "/ui", Some(&alice));
    assert_eq!(
        after.status, 303,
        "her session outlived the roles it was granted under"
    );

    // Nothing handed out, and no secret, reaches a page or the log.
    let mut secrets: Vec<String> = w.idp.handed_out.lock().expect("lock").clone();
    secrets.push(CLIENT_SECRET.to_string());
    secrets.push(STANDARD.encode(format!("{CLIENT_ID}:{CLIENT_SECRET}")));
    let log = w.lk.stderr_text() + &w.lk.audit_text();
    for secret in &secrets {
        assert!(
            !log.contains(secret.as_str()),
            "the log shows {secret:.16}…"
        );
        for resp in &seen {
            assert!(
                !resp.text().contains(secret.as_str()),
                "a page shows {secret:.16}…"
            );
        }
    }
}

/// With `[admin.oidc]` and no admin token anywhere, the console still asks for a sign-in (the
/// API itself is open, on loopback, as without the console), and no token gives one.
#[test]
fn with_oidc_and_no_admin_token_the_console_is_not_open() {
    let ca = TestCa::new();
    let upstream = Upstream::https(&ca);
    let lk = start(&ca, &upstream, &policy(ROLES), |b| {
        b.arg("--console").env("LK_OIDC_SECRET", CLIENT_SECRET)
    });
    let addr = lk.admin_addr();
    let page = http_call(addr, "GET", "/ui", &[], b"");
    assert_eq!(page.status, 303, "{page:#?}");
    assert_eq!(page.header("location"), Some("/ui/login"));
    let login = http_call(
        addr,
        "POST",
        "/ui/login",
        &[("Content-Type", "application/x-www-form-urlencoded")],
        b"token=anything-at-all-0123456789",
    );
    assert_eq!(login.status, 401, "{login:#?}");
    assert!(login.text().contains("sign in with the identity provider"));
    assert!(!login
        .headers
        .iter()
        .any(|(n, v)| n.eq_ignore_ascii_case("set-cookie") && v.starts_with("latchkey_console=")));
}

/// In a real browser: the sign-in page's button, the issuer, the callback, and the console with
/// the person's name. The callback's page moves on by itself, so the SameSite=Strict session
/// cookie is sent (a redirect would still count as the issuer's cross-site navigation).
#[test]
fn a_person_signs_in_through_the_issuer_in_chromium() {
    toolchain::tool("chromium");
    let w = world();
    let admin = format!("http://{}", w.lk.admin_addr());
    let claims = json!({"iss": w.idp.issuer, "aud": CLIENT_ID, "sub": "sub-alice",
        "email": "alice@example.com", "groups": ["security"], "iat": now(), "exp": now() + 300});
    *w.idp.browser.lock().expect("lock") = Some((admin.clone(), claims));
    let shot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("console-screenshots")
        .join("console-login.png");
    std::fs::create_dir_all(shot.parent().expect("dir")).expect("mkdir");
    let config = json!({
        "admin": admin,
        "issuer_host": "other.test",
        "chromium": "/usr/bin/chromium",
        "shot": shot,
    });
    let mut cmd = std::process::Command::new(toolchain::python());
    cmd.arg(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/clients/console_oidc_browser.py"
    ))
    .arg(config.to_string());
    let out = crate::support::latchkey::wait_with_timeout(&mut cmd, Duration::from_secs(120));
    let result: Value = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .and_then(|j| serde_json::from_str(j).ok())
        .unwrap_or_else(|| panic!("console_oidc_browser.py: {out:#?}"));
    assert_eq!(result["url"], format!("{admin}/ui"), "{result:#}");
    let who = result["who"].as_str().unwrap_or_default();
    assert!(
        who.contains("oidc:alice@example.com") && who.contains("approvals:answer"),
        "{result:#}"
    );
    assert_eq!(result["console_errors"], json!([]), "{result:#}");
    let text = result.to_string();
    for secret in w.idp.handed_out.lock().expect("lock").iter() {
        assert!(
            !text.contains(secret.as_str()),
            "a page shows what the issuer handed out"
        );
    }
    assert!(!text.contains(CLIENT_SECRET));
}
