//! Streaming through redaction: each event of a streamed response reaches the sandbox as soon as
//! the upstream sends it, redacted. The upstream sends one event, then waits until the test has
//! seen that event (out of band) before sending the rest: a proxy that buffers, or that holds
//! the end of an event back until more bytes arrive, never lets the first event through.

use std::io::Write;
use std::time::Duration;

use serde_json::json;

use crate::support::assert_record;
use crate::support::secrets::{
    assert_no_leak, contains, count, env_secrets_world, redacted, redactions_of, tls_through,
    StreamedResponse,
};

const RULES: &str = r#"
[[rules]]
name  = "openai"
hosts = ["api.test"]
ports = [PORT]
[rules.inject.headers]
authorization = "Bearer {{secret.openai}}"
x-weird       = "{{secret.weird}}"
"#;

fn first_event_arrives_before_the_upstream_sends_the_rest(path: &str, content_type: &str) {
    let w = env_secrets_world(&["openai", "weird"], RULES);
    let authority = format!("api.test:{}", w.port());
    let mut tls = tls_through(&w.lk, &authority);
    write!(
        tls,
        "GET {path} HTTP/1.1\r\nHost: {authority}\r\nAccept: {content_type}\r\nConnection: close\r\n\r\n"
    )
    .expect("send the request");

    let mut resp = match StreamedResponse::start(tls, Duration::from_secs(10)) {
        Ok(resp) => resp,
        Err(e) => {
            w.gate.notify_one();
            panic!("no response head within 10 s ({e}): the proxy waited for the whole body?");
        }
    };
    assert_eq!(resp.status, 200, "{:?}", resp.headers);
    assert!(
        resp.header("content-type")
            .is_some_and(|ct| ct.starts_with(content_type)),
        "{:?}",
        resp.headers
    );

    // The first event, whole (up to its blank line), before the upstream may send more.
    let first = resp.read_until(|body| contains(body, b"\n\n"), Duration::from_secs(5));
    let before_signal = resp.body.clone();
    w.gate.notify_one();
    if let Err(e) = first {
        let late = resp.read_to_end(Duration::from_secs(10));
        panic!(
            "the first event did not reach the client before the upstream was let go on ({e}); \
             received by then: {:?}\nafter the signal ({late:?}): {:?}",
            String::from_utf8_lossy(&before_signal),
            String::from_utf8_lossy(&resp.body),
        );
    }
    let first_event = String::from_utf8_lossy(&before_signal).into_owned();
    assert!(
        first_event.starts_with("data: ") && first_event.contains(r#""n":1"#),
        "{first_event:?}"
    );
    assert!(
        first_event.contains(&redacted("openai")),
        "the first event must arrive redacted: {first_event:?}"
    );
    assert!(
        !first_event.contains(r#""n":2"#),
        "the second event cannot exist before the signal: {first_event:?}"
    );

    resp.read_to_end(Duration::from_secs(10))
        .expect("the rest of the stream");
    let body = String::from_utf8_lossy(&resp.body).into_owned();
    w.saw(&format!("the {path} stream"), &resp.body);
    assert!(
        body.contains(r#""n":2"#) && body.ends_with("data: [DONE]\n\n"),
        "{body:?}"
    );
    assert_eq!(
        count(body.as_bytes(), redacted("openai").as_bytes()),
        2,
        "{body:?}"
    );
    assert_no_leak("the streamed body", body.as_bytes(), &w.tracked());

    let records = w.lk.wait_audit(1);
    assert_record(
        &records[0],
        json!({"rule": "openai", "status": 200, "decision": "allow"}),
    );
    assert!(redactions_of(&records[0]) >= 2, "{:#}", records[0]);
    w.sweep();
}

#[test]
fn each_server_sent_event_reaches_the_client_as_soon_as_it_is_sent_and_redacted() {
    first_event_arrives_before_the_upstream_sends_the_rest("/sse", "text/event-stream");
}

#[test]
fn a_chunked_plain_text_stream_is_passed_on_incrementally_and_redacted() {
    first_event_arrives_before_the_upstream_sends_the_rest("/sse?ct=text%2Fplain", "text/plain");
}
