//! Per-request decisions inside an intercepted connection: method, path globs, ambiguous paths.

use serde_json::json;

use crate::support::{assert_denial, assert_record, curl, https_world, Echo};

fn policy(port: u16) -> String {
    format!(
        r#"
[[rules]]
name    = "api"
hosts   = ["api.test"]
ports   = [{port}]
methods = ["GET"]
paths   = ["/v1/**"]

[[rules]]
name    = "other"
hosts   = ["other.test"]
ports   = [{port}]
methods = ["GET"]
paths   = ["/v1/*"]
"#
    )
}

#[test]
fn a_post_on_a_get_only_rule_is_refused_with_a_body_naming_the_method_and_url() {
    let w = https_world(policy);
    let port = w.upstream.port();
    let url = format!("https://api.test:{port}/v1/items");

    let out = curl(&w.lk)
        .args(["--http1.1", "-X", "POST", "-d", "x=1", &url])
        .run();
    let resp = out.ok();
    assert_denial(resp, 403, None, "method_not_allowed");
    let body = resp.text();
    assert!(
        body.contains("POST") && body.contains(&url),
        "the denial should name the method and URL {url}: {body:?}"
    );
    assert_eq!(
        w.upstream.connections(),
        0,
        "a denied request was forwarded"
    );

    let records = w.lk.wait_audit(1);
    assert_record(
        &records[0],
        json!({
            "method": "POST",
            "scheme": "https",
            "host": "api.test",
            "port": port,
            "path": "/v1/items",
            "decision": "deny",
            "reason": "method_not_allowed",
            "status": 403,
            "upstream": null,
        }),
    );
}

#[test]
fn a_denied_request_with_a_body_still_gets_its_403_over_http2() {
    // Regression: answering before the request body is read made h2 reset the stream, and curl
    // (h2 by default over TLS) saw "Stream error in the HTTP/2 framing layer" instead of the 403.
    let w = https_world(policy);
    let port = w.upstream.port();
    let url = format!("https://api.test:{port}/v1/items");
    let attempts = 10;

    for attempt in 1..=attempts {
        let out = curl(&w.lk)
            .args(["--http2", "-X", "POST", "-d", "x=1", &url])
            .run();
        assert_eq!(out.exit, Some(0), "attempt {attempt}: {out:#?}");
        assert_eq!(out.http_version, "2", "attempt {attempt}: {out:#?}");
        assert_denial(&out.response, 403, None, "method_not_allowed");
    }
    assert_eq!(
        w.upstream.connections(),
        0,
        "a denied request was forwarded"
    );

    let records = w.lk.wait_audit(attempts);
    for record in &records {
        assert_record(
            record,
            json!({"method": "POST", "reason": "method_not_allowed", "status": 403}),
        );
    }
}

#[test]
fn a_path_outside_the_rule_globs_is_refused_and_a_single_star_does_not_cross_slashes() {
    let w = https_world(policy);
    let port = w.upstream.port();

    let out = curl(&w.lk)
        .args([format!("https://api.test:{port}/v2/items")])
        .run();
    assert_denial(out.ok(), 403, None, "path_not_allowed");
    assert!(out.response.text().contains("/v2/items"), "{out:#?}");

    let out = curl(&w.lk)
        .args([format!("https://other.test:{port}/v1/a/b")])
        .run();
    assert_denial(out.ok(), 403, None, "path_not_allowed");
    assert_eq!(
        w.upstream.connections(),
        0,
        "a denied request was forwarded"
    );

    // The same globs do allow what they cover.
    let out = curl(&w.lk)
        .args([format!("https://other.test:{port}/v1/a")])
        .run();
    assert_eq!(out.ok().status, 200, "{out:#?}");
    assert_eq!(Echo::parse(&out.response.text()).path, "/v1/a");

    let records = w.lk.wait_audit(3);
    let paths: Vec<(&str, &str)> = records
        .iter()
        .map(|r| {
            (
                r["path"].as_str().unwrap_or_default(),
                r["reason"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        paths,
        [
            ("/v2/items", "path_not_allowed"),
            ("/v1/a/b", "path_not_allowed"),
            ("/v1/a", "allowed"),
        ]
    );
}

#[test]
fn dot_segments_and_encoded_slashes_are_rejected_as_ambiguous_paths() {
    let w = https_world(policy);
    let port = w.upstream.port();
    let paths = [
        "/v1/../admin",
        "/v1/%2e%2e/admin",
        "/v1/%2E%2E/admin",
        "/v1/a%2fb",
    ];

    for path in paths {
        let out = curl(&w.lk)
            .args(["--path-as-is", &format!("https://api.test:{port}{path}")])
            .run();
        let resp = out.ok();
        assert_denial(resp, 400, None, "ambiguous_path");
    }
    assert_eq!(
        w.upstream.connections(),
        0,
        "an ambiguous path was forwarded"
    );

    let records = w.lk.wait_audit(paths.len());
    for record in &records {
        assert_record(
            record,
            json!({
                "method": "GET",
                "host": "api.test",
                "decision": "deny",
                "reason": "ambiguous_path",
                "status": 400,
                "upstream": null,
            }),
        );
    }
}
