//! Builders around real servers and real clients, shared by every integration test.
//!
//! - [`TestCa`]: a throwaway CA (rcgen) that signs the upstreams' certificates; its PEM is what
//!   `latchkey serve --upstream-ca` trusts.
//! - [`Upstream`]: HTTPS (http/1.1 + h2 via ALPN) or plain HTTP echo servers on `127.0.0.1:0`
//!   that answer with a JSON description of the request they received ([`Echo`]) and count the
//!   TCP connections they accepted.
//! - [`latchkey()`]: a builder that writes policies to a temp dir, spawns the binary, waits for
//!   its listening line, and reads (and schema-checks) its audit log.
//! - [`clients`]: curl, Python `requests`, raw sockets and a rustls client.

pub mod admin;
pub mod approvals;
pub mod audit;
pub mod ca;
pub mod clients;
pub mod credentials;
pub mod docker;
pub mod latchkey;
pub mod netns;
pub mod openapi;
pub mod openbao;
pub mod problems;
pub mod providers;
pub mod redis;
pub mod secrets;
pub mod session;
pub mod sessions;
pub mod toolchain;
pub mod upstream;

pub use audit::{assert_record, check_record};
pub use ca::TestCa;
pub use clients::{
    assert_denial, connect_tunnel, curl, python_request, raw_request, read_response, tls_config,
};
pub use latchkey::{latchkey, policy_dir, run_cli, CliOutput, Latchkey};
pub use problems::{assert_problem, problems_in};
pub use upstream::{Echo, Upstream};

/// The usual setup for HTTPS tests: a test CA, an HTTPS echo upstream signed by it, and latchkey
/// trusting that CA, with the test names pinned to loopback and the policy `policy(port)` where
/// `port` is the upstream's.
pub struct World {
    pub lk: Latchkey,
    pub upstream: Upstream,
    pub ca: TestCa,
}

/// Names every HTTPS world pins to 127.0.0.1. `evil.test` is pinned too, so that a proxy that
/// wrongly dialed it would show up in the upstream's connection count.
pub const PINNED: &[&str] = &[
    "api.test",
    "other.test",
    "tunnel.test",
    "a.wild.test",
    "wild.test",
    "evil.test",
];

pub fn https_world(policy: impl FnOnce(u16) -> String) -> World {
    let ca = TestCa::new();
    let upstream = Upstream::https(&ca);
    let mut builder = latchkey()
        .upstream_ca(&ca)
        .policy("main.toml", &policy(upstream.port()));
    for host in PINNED {
        builder = builder.pin(host);
    }
    World {
        lk: builder.run(),
        upstream,
        ca,
    }
}

/// The policy most HTTPS tests use: `api` (GET under /v1/, with an injected header) and `other`
/// (anything), both on the upstream's port.
pub fn api_policy(port: u16) -> String {
    format!(
        r#"
[[rules]]
name    = "api"
hosts   = ["api.test"]
ports   = [{port}]
methods = ["GET"]
paths   = ["/v1/**"]
[rules.inject.headers]
x-test-injected = "literal value"

[[rules]]
name  = "other"
hosts = ["other.test"]
ports = [{port}]
"#
    )
}
