//! A session bound to the sandbox's source address, through the transparent listener: a client
//! that knows nothing of a proxy (curl `--noproxy '*'`) presents nothing, and is admitted as
//! the session its address was bound to; every record names the session; once it is revoked
//! the same client is refused.

use serde_json::{json, Value};

use super::{
    direct_curl, gateway_latchkey_with, python_in, record_with, redirect_ruleset, upstreams,
};
use super::{PROXY_IP, TRANSPARENT_PORT};
use crate::support::netns::{Gateway, SANDBOX_IP, UPSTREAM_IP};
use crate::support::TestCa;

/// `METHOD URL [JSON]` to the admin API from inside latchkey's namespace: `STATUS BODY`.
const ADMIN_CLIENT: &str = r#"
import json, sys, urllib.request
body = sys.argv[3].encode() if len(sys.argv) > 3 else None
req = urllib.request.Request(sys.argv[2], data=body, method=sys.argv[1],
                             headers={"content-type": "application/json"})
try:
    with urllib.request.urlopen(req, timeout=10) as r:
        print(r.status, r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode())
"#;

#[test]
fn a_session_bound_to_the_sandboxs_address_admits_its_captured_connections() {
    let gw = Gateway::new();
    let ca = TestCa::new();
    let (plain, _tls) = upstreams(&gw, &ca);
    gw.proxy.nft(&redirect_ruleset());
    let listen = format!("{PROXY_IP}:{TRANSPARENT_PORT}");
    let profile = "[profiles.sandbox]\nrules = [\"upstream\"]\nttl = \"1h\"\n";
    let lk = gateway_latchkey_with(&gw, &ca, &["--transparent", &listen], Some(profile));
    let admin = format!("http://{}", lk.admin_addr());

    // Before any session: the sandbox's address names nobody.
    let before = direct_curl(
        &gw,
        &lk,
        ("up.test", 80, UPSTREAM_IP),
        "http://up.test/before",
    );
    // Refused and closed without an answer: a captured connection names nobody.
    assert_ne!(before.exit, Some(0), "{before:#?}");
    assert_eq!(plain.connections(), 0);

    let body = json!({"profile": "sandbox", "source": SANDBOX_IP, "labels": {"pod": "p-1"}});
    let made = python_in(
        &gw.proxy,
        ADMIN_CLIENT,
        &["POST", &format!("{admin}/sessions"), &body.to_string()],
    );
    let (status, answer) = made.stdout.trim().split_once(' ').expect("STATUS BODY");
    assert_eq!(status, "201", "{made:#?}");
    let session: Value = serde_json::from_str(answer).expect("session JSON");
    let id = session["id"].as_str().expect("id");

    let out = direct_curl(
        &gw,
        &lk,
        ("up.test", 80, UPSTREAM_IP),
        "http://up.test/bound",
    );
    assert_eq!(out.ok().status, 200, "{out:#?}");
    let r = record_with(&lk, json!({"path": "/bound"}));
    assert_eq!(r["session"], id, "{r:#}");
    assert_eq!(r["profile"], "sandbox", "{r:#}");
    assert_eq!(r["labels"], json!({"pod": "p-1"}), "{r:#}");
    super::from_sandbox(&r);
    assert_eq!(plain.connections(), 1);

    let revoked = python_in(
        &gw.proxy,
        ADMIN_CLIENT,
        &["DELETE", &format!("{admin}/sessions/{id}")],
    );
    assert!(revoked.stdout.starts_with("204"), "{revoked:#?}");
    let after = direct_curl(
        &gw,
        &lk,
        ("up.test", 80, UPSTREAM_IP),
        "http://up.test/after",
    );
    assert_ne!(after.exit, Some(0), "{after:#?}");
    let refused = record_with(
        &lk,
        json!({"identity": "unidentified", "reason": "proxy_auth_required", "path": null}),
    );
    super::from_sandbox(&refused);
    assert_eq!(
        plain.connections(),
        1,
        "nothing was dialed for the revoked session"
    );
}
