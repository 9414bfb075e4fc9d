use http::HeaderValue;
use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::policy::mcp::{NameGlobs, DEFAULT_METHODS};

fn rules() -> McpRules {
    let g = |v: &[&str]| {
        NameGlobs::new(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>(), false).expect("globs")
    };
    McpRules {
        tools: Some(g(&["search_*", "get_issue"])),
        deny_tools: Some(g(&["delete_*"])),
        methods: g(DEFAULT_METHODS),
        args: Vec::new(),
        filter_list: true,
    }
}

const LISTING: &str = r#"{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"search_code"},{"name":"delete_repo"},{"name":"create_issue"}]}}"#;

/// The body `chunks` make, through the filter under `content_type`: the bytes, or the error.
fn run(content_type: Option<&str>, chunks: &[&[u8]]) -> Result<Vec<u8>, String> {
    run_with(content_type, &[], chunks)
}

fn run_with(
    content_type: Option<&str>,
    extra: &[(&'static str, &'static str)],
    chunks: &[&[u8]],
) -> Result<Vec<u8>, String> {
    let frames: Vec<Result<Frame<Bytes>, BoxError>> = chunks
        .iter()
        .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
        .collect();
    let body = http_body_util::StreamBody::new(futures_util::stream::iter(frames)).boxed();
    let mut res = Response::new(body);
    if let Some(ct) = content_type {
        res.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_str(ct).expect("header"));
    }
    for (k, v) in extra {
        res.headers_mut().append(*k, HeaderValue::from_static(v));
    }
    let res = filter_list(res, Arc::new(rules()), vec![json!(1)]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    rt.block_on(async {
        res.into_body()
            .collect()
            .await
            .map(|b| b.to_bytes().to_vec())
            .map_err(|e| e.to_string())
    })
}

fn tools_in(text: &str) -> Vec<String> {
    ["search_code", "delete_repo", "create_issue"]
        .iter()
        .filter(|t| text.contains(*t))
        .map(|t| t.to_string())
        .collect()
}

#[test]
fn json_listings_are_filtered_by_media_type_family() {
    for ct in [
        "application/json",
        "Application/JSON; charset=utf-8",
        "application/json-rpc",
        "application/vnd.x+json",
        "application/problem+json; q=1",
    ] {
        let out = run(
            Some(ct),
            &[&LISTING.as_bytes()[..40], &LISTING.as_bytes()[40..]],
        )
        .unwrap_or_else(|e| panic!("{ct}: {e}"));
        let v: Value = serde_json::from_slice(&out).expect("json");
        assert_eq!(
            v["result"]["tools"],
            json!([{"name":"search_code"}]),
            "{ct}"
        );
    }
    // Another id is left alone, byte for byte.
    let other = LISTING.replace("\"id\":1", "\"id\":2");
    assert_eq!(
        run(Some("application/json"), &[other.as_bytes()]).expect("passes"),
        other.as_bytes()
    );
}

#[test]
fn what_cannot_be_filtered_is_cut_off() {
    for (ct, extra) in [
        (Some("text/plain"), &[][..]),
        (Some("application/jsonx"), &[]),
        (Some("text/html; x=application/json"), &[]),
        (None, &[]),
        (
            Some("application/json"),
            &[("content-type", "text/event-stream")][..],
        ),
        (
            Some("application/json"),
            &[("content-encoding", "gzip")][..],
        ),
        (Some("text/event-stream"), &[("content-encoding", "br")][..]),
    ] {
        let e = run_with(ct, extra, &[LISTING.as_bytes()])
            .err()
            .unwrap_or_else(|| panic!("{ct:?} {extra:?} passed"));
        assert!(e.contains("cannot be filtered"), "{ct:?}: {e}");
    }
    // An empty body has nothing to hide.
    assert_eq!(run(Some("text/plain"), &[]).expect("empty"), b"");
    // Not JSON, or ambiguous keys a client could read otherwise: cut off.
    for body in [
        "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"tools\":[{\"name\":\"delete_repo\"}]},\"x\":NaN}",
        r#"{"jsonrpc":"2.0","id":1,"result":{"tools":[],"Tools":[{"name":"delete_repo"}]}}"#,
        r#"{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"search_code","Name":"delete_repo"}]}}"#,
        r#"{"jsonrpc":"2.0","id":1,"id\u0000":1,"result":{"tools":[{"name":"delete_repo"}]}}"#,
    ] {
        assert!(run(Some("application/json"), &[body.as_bytes()]).is_err(), "{body}");
        let sse = format!("data: {body}\n\n");
        assert!(run(Some("text/event-stream"), &[sse.as_bytes()]).is_err(), "{body}");
    }
    // Too large to hold.
    let big = vec![b' '; MAX_LIST + 1];
    assert!(run(Some("application/json"), &[&big]).is_err());
}

#[test]
fn keys_are_read_as_a_loose_client_reads_them() {
    let folded = r#"{"jsonrpc":"2.0","ID":1,"RESULT":{"TOOLS":[{"NAME":"delete_repo"},{"Name":"search_code"}]}}"#;
    let out = run(Some("application/json"), &[folded.as_bytes()]).expect("filtered");
    assert_eq!(tools_in(&String::from_utf8_lossy(&out)), ["search_code"]);
}

#[test]
fn sse_listings_are_filtered_whatever_the_line_endings() {
    for end in ["\n", "\r\n", "\r"] {
        let stream = format!(
            ": keep-alive{end}{end}event: message{end}id: 7{end}data: {LISTING}{end}{end}data: {{\"jsonrpc\":\"2.0\",\"method\":\"notifications/x\"}}{end}{end}"
        );
        let out = run(Some("text/event-stream"), &[stream.as_bytes()]).expect("filtered");
        let text = String::from_utf8_lossy(&out);
        assert_eq!(tools_in(&text), ["search_code"], "{end:?}: {text:?}");
        assert!(
            text.starts_with(&format!(": keep-alive{end}{end}")),
            "{text:?}"
        );
        assert!(text.contains("event: message\nid: 7\ndata: {"), "{text:?}");
        assert!(text.contains("notifications/x"), "{text:?}");
        // The filtered stream still parses as the same events, the listing changed.
        let mut p = sse::Parser::new(sse::Limits {
            max_data: 1 << 20,
            max_raw: None,
        });
        let mut datas = Vec::new();
        let mut on = |e: sse::Event<'_>| datas.extend(e.data.map(<[u8]>::to_vec));
        p.feed(&out, &mut on).expect("parses");
        p.finish(&mut on).expect("parses");
        assert_eq!(datas.len(), 2, "{text:?}");
    }
}

#[test]
fn a_last_event_without_its_blank_line_is_filtered_not_a_panic() {
    for stream in [
        format!("data: {LISTING}\n"),
        format!("data: {LISTING}"),
        format!("data: {{}}\n\ndata: {LISTING}\r"),
        format!("event: message\r\ndata: {LISTING}\r\n"),
    ] {
        let bytes = stream.as_bytes();
        let out = run(Some("text/event-stream"), &[&bytes[..10], &bytes[10..]])
            .unwrap_or_else(|e| panic!("{stream:?}: {e}"));
        assert_eq!(
            tools_in(&String::from_utf8_lossy(&out)),
            ["search_code"],
            "{stream:?}"
        );
    }
}

/// A listing stream in one of many shapes: line endings, comments, where the listing sits,
/// whether the last event is ended.
fn listing_stream() -> impl Strategy<Value = String> {
    (
        prop_oneof![Just("\n"), Just("\r\n"), Just("\r")],
        any::<bool>(),
        any::<bool>(),
        0usize..3,
    )
        .prop_map(|(end, comment, ended, before)| {
            let mut s = String::new();
            for i in 0..before {
                s.push_str(&format!(
                    "data: {{\"jsonrpc\":\"2.0\",\"method\":\"n{i}\"}}{end}{end}"
                ));
            }
            if comment {
                s.push_str(&format!(":{end}"));
            }
            // Data split over lines: joined with `\n`, still one JSON document.
            let (a, b) = LISTING.split_at(LISTING.find("},{").map_or(0, |i| i + 2));
            s.push_str(&format!("data: {a}{end}data:{b}{end}"));
            if ended {
                s.push_str(end);
            }
            s
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Every split point of every shape: the denied tool never passes, the allowed one does.
    #[test]
    fn every_split_filters_the_listing(stream in listing_stream()) {
        let bytes = stream.as_bytes();
        let whole = run(Some("text/event-stream"), &[bytes]).expect("filtered");
        prop_assert_eq!(tools_in(&String::from_utf8_lossy(&whole)), ["search_code"]);
        for at in 0..=bytes.len() {
            let out = run(Some("text/event-stream"), &[&bytes[..at], &bytes[at..]]).expect("filtered");
            prop_assert_eq!(&out, &whole, "split at {}", at);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Arbitrary upstream bytes, any media type, any chunking: never a panic.
    #[test]
    fn arbitrary_upstream_bytes_never_panic(
        body in proptest::collection::vec(any::<u8>(), 0..1024),
        cut in any::<usize>(),
        which in 0usize..3,
    ) {
        let ct = ["text/event-stream", "application/json", "text/plain"][which];
        let at = cut % (body.len() + 1);
        let _ = run(Some(ct), &[&body[..at], &body[at..]]);
        let _ = filter_document(&body, &rules(), &[json!(1)]);
    }
}
