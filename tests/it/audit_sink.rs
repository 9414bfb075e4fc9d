//! The audit sink: records are written off the request path by one writer thread, none is lost
//! on a graceful stop, and when the log cannot be written latchkey fails closed — it refuses
//! traffic (`503 audit_unavailable`, the first request included: its decision record cannot be
//! committed, so it is never dialed) and says so at `/readyz`, `/status` and `/metrics`.

use std::path::Path;
use std::time::Duration;

use crate::support::admin::{admin_get, metrics, status};
use crate::support::clients::{connect_tunnel, raw_request, RawResponse};
use crate::support::{latchkey, Latchkey, Upstream};

fn serve(upstream: &Upstream, audit: Option<&Path>) -> Latchkey {
    let mut b = latchkey().pin("api.test").policy(
        "main.toml",
        &format!(
            "[[rules]]\nname = \"api\"\nhosts = [\"api.test\"]\nports = [{}]\n",
            upstream.port()
        ),
    );
    if let Some(path) = audit {
        b = b.audit_to(path);
    }
    b.run()
}

fn get(lk: &Latchkey, port: u16, path: &str) -> RawResponse {
    raw_request(
        lk.addr(),
        format!(
            "GET http://api.test:{port}{path} HTTP/1.1\r\nHost: api.test:{port}\r\nConnection: close\r\n\r\n"
        )
        .as_bytes(),
    )
}

#[test]
fn a_full_disk_under_the_audit_log_makes_latchkey_refuse_traffic_and_say_so() {
    let upstream = Upstream::http();
    let port = upstream.port();
    // /dev/full opens fine and fails every write with ENOSPC: a disk that filled up.
    let lk = serve(&upstream, Some(Path::new("/dev/full")));
    assert_eq!(admin_get(&lk, "/readyz").status, 200);

    // The first request is refused too: its decision record must be on disk before the
    // upstream is dialed, and it cannot be written.
    let first = get(&lk, port, "/first");
    assert_eq!(first.status, 503, "{first:#?}");
    assert_eq!(first.header("x-latchkey-reason"), Some("audit_unavailable"));
    assert!(
        lk.wait_stderr_contains("cannot write the audit log", Duration::from_secs(5)),
        "no error about the audit log:\n{}",
        lk.stderr_text()
    );

    // From then on, nothing goes out unrecorded.
    let resp = get(&lk, port, "/second");
    assert_eq!(resp.status, 503, "{resp:#?}");
    assert_eq!(resp.header("x-latchkey-decision"), Some("deny"));
    assert_eq!(resp.header("x-latchkey-reason"), Some("audit_unavailable"));
    assert!(
        resp.text().contains("audit log cannot be written"),
        "{resp:#?}"
    );
    let (_tcp, connect) = connect_tunnel(lk.addr(), &format!("api.test:{port}"));
    assert_eq!(connect.status, 503, "{connect:#?}");
    assert_eq!(
        connect.header("x-latchkey-reason"),
        Some("audit_unavailable")
    );
    let seen: Vec<String> = upstream.received().iter().map(|r| r.path.clone()).collect();
    assert!(
        seen.is_empty(),
        "a request reached the upstream unrecorded: {seen:?}"
    );

    // The operator's view: not ready, unhealthy audit, counted errors.
    let ready = admin_get(&lk, "/readyz");
    assert_eq!(ready.status, 503, "{ready:#?}");
    assert!(ready.text().contains("audit"), "{ready:#?}");
    let st = status(&lk);
    assert_eq!(st["audit"]["healthy"], false, "{st:#}");
    assert!(st["audit"]["failed"].as_u64().unwrap_or(0) >= 1, "{st:#}");
    let m = metrics(&lk);
    assert_eq!(m.value("latchkey_audit_healthy", &[]), 0.0);
    assert!(m.value("latchkey_audit_write_errors_total", &[]) >= 1.0);
    assert!(
        m.value(
            "latchkey_requests_total",
            &[("decision", "deny"), ("reason", "audit_unavailable")]
        ) >= 3.0
    );
}

#[test]
fn every_request_is_recorded_before_a_graceful_stop_completes() {
    let upstream = Upstream::http();
    let port = upstream.port();
    let mut lk = serve(&upstream, None);
    const N: usize = 300;
    let threads: Vec<_> = (0..6)
        .map(|t| {
            let addr = lk.addr();
            std::thread::spawn(move || {
                for i in 0..N / 6 {
                    let req = format!(
                        "GET http://api.test:{port}/r/{t}/{i} HTTP/1.1\r\nHost: api.test:{port}\r\nConnection: close\r\n\r\n"
                    );
                    let resp = raw_request(addr, req.as_bytes());
                    assert_eq!(resp.status, 200, "{resp:#?}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("client thread");
    }
    // Stop at once: records still queued must be written before the process exits.
    lk.signal("TERM");
    let exit = lk
        .wait_exit(Duration::from_secs(15))
        .expect("latchkey exits");
    assert!(exit.success(), "{exit:?}\n{}", lk.stderr_text());
    let records = lk.audit_records();
    assert_eq!(records.len(), N, "records lost at shutdown");
    let mut paths: Vec<&str> = records
        .iter()
        .map(|r| r["path"].as_str().expect("path"))
        .collect();
    paths.sort_unstable();
    paths.dedup();
    assert_eq!(paths.len(), N, "a request recorded twice or not at all");
}
