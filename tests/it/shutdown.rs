//! Graceful shutdown on SIGTERM (and SIGINT): stop accepting, let requests in flight finish up
//! to `--shutdown-timeout`, write their audit records, exit 0. Idle keep-alive connections do not
//! hold the process up; a request that outlasts the deadline is cut off, and still audited.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::admin::admin_request;
use crate::support::clients::{dial, read_response, RawResponse};
use crate::support::session::PySession;
use crate::support::upstream::{echo, handler};
use crate::support::{assert_record, latchkey, Echo, Latchkey, TestCa, Upstream};

/// A plain HTTP echo upstream that takes `delay` to answer paths starting with `/slow`.
fn slow_upstream(delay: Duration) -> Upstream {
    Upstream::http_with(handler(move |req| async move {
        if req.path.starts_with("/slow") {
            tokio::time::sleep(delay).await;
        }
        echo(req).await
    }))
}

fn serve(upstream: &Upstream, args: &[&str]) -> Latchkey {
    let mut builder = latchkey().pin("api.test").policy(
        "main.toml",
        &format!(
            "[[rules]]\nname = \"api\"\nhosts = [\"api.test\"]\nports = [{}]\n",
            upstream.port()
        ),
    );
    for arg in args {
        builder = builder.arg(arg);
    }
    builder.run()
}

fn get(path: &str, port: u16, keep_alive: bool) -> String {
    let connection = if keep_alive { "keep-alive" } else { "close" };
    format!(
        "GET http://api.test:{port}{path} HTTP/1.1\r\nHost: api.test:{port}\r\nConnection: {connection}\r\n\r\n"
    )
}

/// Sends a request from another thread; the handle yields the response or the client's error.
fn in_background(
    proxy: SocketAddr,
    request: String,
) -> thread::JoinHandle<Result<RawResponse, String>> {
    thread::spawn(move || {
        let mut tcp = dial(proxy);
        tcp.set_read_timeout(Some(Duration::from_secs(20)))
            .map_err(|e| e.to_string())?;
        tcp.write_all(request.as_bytes())
            .map_err(|e| e.to_string())?;
        read_response(&mut tcp, false).map_err(|e| format!("{:?}: {e}", e.kind()))
    })
}

fn wait_received(upstream: &Upstream, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while upstream.received().len() < n {
        assert!(
            Instant::now() < deadline,
            "the upstream never got the request"
        );
        thread::sleep(Duration::from_millis(10));
    }
}

/// What a new client sees after shutdown began: `Ok(())` if it could not get served (connect
/// refused, or the connection closed or reset without a response), `Err` describing otherwise.
// The test plays a sandbox dialing the proxy, never an upstream.
#[allow(clippy::disallowed_methods)]
fn new_connection_is_refused(proxy: SocketAddr, port: u16) -> Result<(), String> {
    let mut tcp = match TcpStream::connect_timeout(&proxy, Duration::from_secs(2)) {
        Ok(tcp) => tcp,
        Err(_) => return Ok(()),
    };
    tcp.set_read_timeout(Some(Duration::from_secs(3)))
        .expect("read timeout");
    let _ = tcp.write_all(get("/new", port, false).as_bytes());
    let mut buf = Vec::new();
    match tcp.read_to_end(&mut buf) {
        Ok(_) if buf.is_empty() => Ok(()),
        Ok(_) => Err(format!(
            "a connection made after SIGTERM was served: {:?}",
            String::from_utf8_lossy(&buf)
        )),
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => Err(
            "a connection made after SIGTERM was accepted and left hanging (neither refused nor closed)"
                .into(),
        ),
        Err(_) => Ok(()), // reset
    }
}

fn records_for<'a>(records: &'a [Value], path: &str) -> Vec<&'a Value> {
    records.iter().filter(|r| r["path"] == path).collect()
}

#[test]
fn sigterm_lets_a_request_in_flight_finish_refuses_new_connections_and_exits_zero() {
    let upstream = slow_upstream(Duration::from_millis(1200));
    let port = upstream.port();
    let mut lk = serve(&upstream, &[]);
    let proxy = lk.addr();

    let slow = in_background(proxy, get("/slow", port, false));
    wait_received(&upstream, 1);
    let signalled = Instant::now();
    lk.signal("TERM");

    thread::sleep(Duration::from_millis(300));
    let refused = new_connection_is_refused(proxy, port);

    let resp = slow.join().expect("client thread").unwrap_or_else(|e| {
        panic!(
            "the request in flight did not complete: {e}\n{}",
            lk.stderr_text()
        )
    });
    assert_eq!(resp.status, 200, "{resp:#?}");
    assert_eq!(Echo::parse(&resp.text()).path, "/slow");

    let status = lk.wait_exit(Duration::from_secs(10)).unwrap_or_else(|| {
        panic!(
            "latchkey still running 10 s after SIGTERM with nothing in flight:\n{}",
            lk.stderr_text()
        )
    });
    assert!(
        status.success(),
        "exit status after SIGTERM: {status}\n{}",
        lk.stderr_text()
    );
    assert!(
        signalled.elapsed() >= Duration::from_millis(800),
        "latchkey exited before the request in flight could finish"
    );
    refused.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(upstream.received().len(), 1, "{:#?}", upstream.received());

    let records = lk.audit_records();
    let slow = records_for(&records, "/slow");
    assert_eq!(slow.len(), 1, "{records:#?}");
    assert_record(
        slow[0],
        json!({"decision": "allow", "reason": "allowed", "status": 200,
               "upstream": upstream.addr_string()}),
    );
    assert!(
        slow[0]["duration_ms"].as_f64() >= Some(1000.0),
        "the record was written before the response ended: {:#}",
        slow[0]
    );
    assert!(
        lk.audit_text().ends_with('\n'),
        "the audit log ends in a torn line"
    );
}

#[test]
fn readyz_answers_503_while_a_shutdown_drains() {
    let upstream = slow_upstream(Duration::from_millis(1500));
    let port = upstream.port();
    let mut lk = serve(&upstream, &[]);
    let admin = lk.admin_addr();
    assert_eq!(admin_request(admin, "GET", "/readyz", &[]).status, 200);

    let slow = in_background(lk.addr(), get("/slow", port, false));
    wait_received(&upstream, 1);
    lk.signal("TERM");
    thread::sleep(Duration::from_millis(200));

    // Still draining: a load balancer asking now must hear "not ready", not a refused connection.
    let readyz = thread::spawn(move || {
        std::panic::catch_unwind(|| admin_request(admin, "GET", "/readyz", &[]).status)
            .map_err(|_| "the admin API refused the connection during the drain".to_string())
    })
    .join()
    .expect("readyz thread");
    assert_eq!(
        slow.join().expect("client").map(|r| r.status),
        Ok(200),
        "the request in flight"
    );
    assert!(lk.wait_exit(Duration::from_secs(10)).is_some());
    assert_eq!(readyz, Ok(503), "GET /readyz during the drain");
}

#[test]
fn idle_keep_alive_connections_and_tunnels_do_not_hold_up_shutdown() {
    let ca = TestCa::new();
    let https = Upstream::https(&ca);
    let http = slow_upstream(Duration::ZERO);
    let mut lk = latchkey()
        .upstream_ca(&ca)
        .pin("api.test")
        .policy(
            "main.toml",
            &format!(
                "[[rules]]\nname = \"api\"\nhosts = [\"api.test\"]\nports = [{}, {}]\n",
                https.port(),
                http.port()
            ),
        )
        .run();

    // A plain keep-alive connection, idle after one request.
    let mut idle = dial(lk.addr());
    idle.write_all(get("/idle", http.port(), true).as_bytes())
        .expect("send");
    let resp = read_response(&mut idle, false).expect("response");
    assert_eq!(resp.status, 200);
    // An intercepted tunnel, idle after one request.
    let mut session = PySession::start(&lk, None);
    let resp = session.request("GET", &format!("https://api.test:{}/tunnel", https.port()));
    assert_eq!(resp.status, 200, "{resp:#?}");
    lk.wait_audit(2);

    let signalled = Instant::now();
    lk.signal("TERM");
    let status = lk.wait_exit(Duration::from_secs(8)).unwrap_or_else(|| {
        panic!(
            "idle connections held latchkey up for 8 s after SIGTERM (deadline 30 s):\n{}",
            lk.stderr_text()
        )
    });
    assert!(status.success(), "{status}");
    assert!(signalled.elapsed() < Duration::from_secs(8));
    idle.set_read_timeout(Some(Duration::from_secs(2)))
        .expect("timeout");
    let mut rest = Vec::new();
    let _ = idle.read_to_end(&mut rest); // EOF or reset: the process is gone
    assert!(
        rest.is_empty(),
        "unexpected bytes on the idle connection: {rest:?}"
    );
    drop(session);
    assert_eq!(lk.audit_records().len(), 2);
}

#[test]
fn a_request_outlasting_the_shutdown_deadline_is_cut_off_and_still_audited() {
    let upstream = slow_upstream(Duration::from_secs(15));
    let port = upstream.port();
    let mut lk = serve(&upstream, &["--shutdown-timeout", "1s"]);

    let stuck = in_background(lk.addr(), get("/slow-stuck", port, false));
    wait_received(&upstream, 1);
    let signalled = Instant::now();
    lk.signal("TERM");
    let status = lk.wait_exit(Duration::from_secs(6)).unwrap_or_else(|| {
        panic!(
            "latchkey ignored --shutdown-timeout 1s:\n{}",
            lk.stderr_text()
        )
    });
    let took = signalled.elapsed();
    assert!(status.success(), "exit status: {status}");
    assert!(
        took >= Duration::from_millis(900),
        "exited after {took:?}, before the deadline"
    );
    let resp = stuck.join().expect("client");
    assert!(
        resp.as_ref().map_or(true, |r| r.status != 200),
        "the cut-off request got a 200: {resp:?}"
    );

    // Exactly one record per request, even one cut off at the deadline.
    let records = lk.audit_records();
    let stuck = records_for(&records, "/slow-stuck");
    assert_eq!(
        stuck.len(),
        1,
        "a request cut off at the shutdown deadline left no record: {records:#?}"
    );
    // Policy allowed it and the exchange never completed: not a denial, not the client's fault.
    // (The dialed address is known only once response headers arrive, so it may be null.)
    assert_record(
        stuck[0],
        json!({"method": "GET", "decision": "allow", "rule": "api", "reason": "upstream_error"}),
    );
    assert!(
        stuck[0]["upstream"].is_null() || stuck[0]["upstream"] == upstream.addr_string().as_str(),
        "{:#}",
        stuck[0]
    );
    assert_ne!(stuck[0]["status"], 200, "{:#}", stuck[0]);
}

#[test]
fn sigint_shuts_down_like_sigterm() {
    let upstream = slow_upstream(Duration::from_millis(800));
    let port = upstream.port();
    let mut lk = serve(&upstream, &[]);

    let slow = in_background(lk.addr(), get("/slow-int", port, false));
    wait_received(&upstream, 1);
    lk.signal("INT");
    assert_eq!(
        slow.join().expect("client").map(|r| r.status),
        Ok(200),
        "the request in flight"
    );
    let status = lk
        .wait_exit(Duration::from_secs(10))
        .expect("latchkey still running after SIGINT");
    assert!(status.success(), "{status}");
    let records = lk.audit_records();
    assert_eq!(records_for(&records, "/slow-int").len(), 1, "{records:#?}");
}
