//! A `client_cert` credential (mTLS): a rule with `credential = "NAME"` of that kind makes its
//! upstream connections present the certificate. The upstream here requires a client
//! certificate signed by the test CA and records the one each connection presented. A rule
//! without the credential to the same server fails the handshake; a connection made with the
//! certificate is never reused for it. Bad material fails the request closed, naming the
//! credential and never the key.

use std::path::Path;
use std::time::Duration;

use serde_json::json;

use crate::support::clients::RawResponse;
use crate::support::secrets::assert_refusal;
use crate::support::{assert_record, curl, latchkey, Latchkey, TestCa, Upstream};

/// A refusal latchkey answered for `rule` with `status` and `reason`.
fn refused(resp: &RawResponse, status: u16, rule: &str, reason: &str) {
    assert_refusal(resp, status, reason);
    assert_eq!(resp.header("x-latchkey-rule"), Some(rule), "{resp:#?}");
}

const POLICY: &str = r#"
[credentials.partner_tls]
kind = "client_cert"
cert = "file:CERT"
key  = "file:KEY"

[credentials.mismatched]
kind = "client_cert"
cert = "file:CERT"
key  = "file:OTHER_KEY"

[credentials.not_pem]
kind = "client_cert"
cert = "file:CERT"
key  = "file:GARBAGE"

[[rules]]
name = "mtls"
hosts = ["api.test"]
ports = [PORT]
credential = "partner_tls"

[[rules]]
name = "no-cert"
hosts = ["other.test"]
ports = [PORT]

[[rules]]
name = "mismatched"
hosts = ["mismatch.wild.test"]
ports = [PORT]
credential = "mismatched"

[[rules]]
name = "not-pem"
hosts = ["garbage.wild.test"]
ports = [PORT]
credential = "not_pem"
"#;

struct World {
    lk: Latchkey,
    upstream: Upstream,
    ca: TestCa,
    /// The DER of the certificate latchkey presents, and the PEM files it reads.
    der: Vec<u8>,
    cert: std::path::PathBuf,
    key: std::path::PathBuf,
}

fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

fn world() -> World {
    let ca = TestCa::new();
    let upstream = Upstream::https_requiring_client_cert(&ca);
    let (cert, key, der) = ca.issue_client_pem_files("latchkey-test-client", "client");
    let (_, other_key, _) = ca.issue_client_pem_files("someone-else", "other");
    let garbage = other_key.with_file_name("garbage.pem");
    std::fs::write(&garbage, "this is not a PEM private key\n").expect("write garbage");
    let policy = POLICY
        .replace("OTHER_KEY", path(&other_key))
        .replace("GARBAGE", path(&garbage))
        .replace("CERT", path(&cert))
        .replace("KEY", path(&key))
        .replace("PORT", &upstream.port().to_string());
    let lk = latchkey()
        .upstream_ca(&ca)
        .pin("api.test")
        .pin("other.test")
        .pin("mismatch.wild.test")
        .pin("garbage.wild.test")
        .policy("main.toml", &policy)
        .run();
    World {
        lk,
        upstream,
        ca,
        der,
        cert,
        key,
    }
}

impl World {
    fn get(&self, host: &str, path: &str) -> RawResponse {
        let url = format!("https://{host}:{}{path}", self.upstream.port());
        curl(&self.lk).args([url.as_str()]).run().ok().clone()
    }

    /// No line of any key PEM's base64 in latchkey's log or audit file.
    fn no_key_bytes(&self, keys: &[&Path]) {
        let log = self.lk.stderr_text();
        let audit = self.lk.audit_text();
        for key in keys {
            let pem = std::fs::read_to_string(key).expect("read key");
            for line in pem
                .lines()
                .filter(|l| !l.starts_with("-----") && l.len() > 16)
            {
                assert!(!log.contains(line), "key bytes in the log");
                assert!(!audit.contains(line), "key bytes in the audit file");
            }
        }
    }
}

#[test]
fn the_rule_with_the_credential_presents_the_certificate_and_a_rule_without_it_fails_the_handshake()
{
    let w = world();
    let resp = w.get("api.test", "/hello");
    assert_eq!(resp.status, 200, "{resp:#?}");
    let seen = w.upstream.received();
    assert_eq!(seen.len(), 1, "{seen:#?}");
    let presented = seen[0]
        .client_cert
        .as_deref()
        .expect("a client certificate");
    assert_eq!(
        presented,
        w.der.as_slice(),
        "the upstream saw another certificate"
    );
    assert!(
        presented
            .windows(b"latchkey-test-client".len())
            .any(|w| w == b"latchkey-test-client"),
        "the subject is CN=latchkey-test-client"
    );
    // The credential adds nothing to the request.
    assert!(seen[0].header("authorization").is_none(), "{seen:#?}");

    // Same server, a rule without the credential: its own pool, no certificate, no handshake.
    let no_cert = w.get("other.test", "/hello");
    refused(&no_cert, 502, "no-cert", "upstream_tls");
    assert_eq!(w.upstream.received().len(), 1);

    // And the credentialed rule still works after it.
    assert_eq!(w.get("api.test", "/again").status, 200);

    let records = w.lk.wait_audit(3);
    assert_record(
        &records[0],
        json!({"host": "api.test", "rule": "mtls", "decision": "allow", "status": 200}),
    );
    assert_record(
        &records[1],
        json!({"host": "other.test", "rule": "no-cert", "reason": "upstream_tls"}),
    );
    w.no_key_bytes(&[&w.key]);
}

#[test]
fn a_rotated_certificate_is_presented_from_the_next_request_on() {
    let w = world();
    assert_eq!(w.get("api.test", "/before").status, 200);
    // Rotate both files (written in place, as a secret manager's sync would).
    let (cert, key, der) = w.ca.issue_client_pem_files("rotated-client", "rotated");
    std::fs::copy(&cert, &w.cert).expect("rotate cert");
    std::fs::copy(&key, &w.key).expect("rotate key");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        assert_eq!(w.get("api.test", "/after").status, 200);
        let seen = w.upstream.received();
        let last = seen.last().and_then(|r| r.client_cert.clone());
        if last.as_deref() == Some(der.as_slice()) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the rotated certificate was never presented"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    w.no_key_bytes(&[&w.key, &key]);
}

#[test]
fn bad_material_fails_closed_naming_the_credential_and_never_the_key() {
    let w = world();
    for (host, rule, credential, why) in [
        (
            "mismatch.wild.test",
            "mismatched",
            "mismatched",
            "does not belong to the certificate",
        ),
        (
            "garbage.wild.test",
            "not-pem",
            "not_pem",
            "not a PEM private key",
        ),
    ] {
        let resp = w.get(host, "/x");
        refused(&resp, 502, rule, "credential_failed");
        let text = resp.text();
        assert!(
            text.contains(&format!("credential '{credential}'")) && text.contains(why),
            "{text}"
        );
    }
    assert!(w.upstream.received().is_empty());
    let other_key = w.key.with_file_name("other-key.pem");
    w.no_key_bytes(&[&w.key, &other_key]);
}

#[test]
fn explain_says_the_rule_presents_a_client_certificate() {
    let dir = crate::support::policy_dir(&[(
        "main.toml",
        &POLICY
            .replace("OTHER_KEY", "/nonexistent/other.pem")
            .replace("GARBAGE", "/nonexistent/garbage.pem")
            .replace("CERT", "/nonexistent/cert.pem")
            .replace("KEY", "/nonexistent/key.pem")
            .replace("PORT", "443"),
    )]);
    let p = dir.path().to_str().expect("utf-8");
    let out = crate::support::run_cli(["explain", "--policies", p, "GET", "https://api.test/x"]);
    assert!(
        out.stdout.contains(
            "credential partner_tls (client_cert), a TLS client certificate its upstream connections present"
        ),
        "{out:#?}"
    );
}
