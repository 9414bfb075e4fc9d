//! A model-provider call over plain HTTP whose answer has a `content-length` (the usual shape of
//! a non-streaming answer): hyper ends such a body with its last data frame and never polls for
//! the end, so the meter must conclude on that frame (a bug this test pins), not wait for an
//! end-of-stream that never comes.

use std::time::Duration;

use serde_json::json;

use crate::support::upstream::{full_body, handler};
use crate::support::{curl, latchkey, Upstream};

#[test]
fn a_content_length_answer_has_its_usage_read_and_charged() {
    let upstream = Upstream::http_with(handler(|_req| async {
        let doc = json!({
            "id": "chatcmpl-1", "object": "chat.completion", "model": "gpt-4o-2024-08-06",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi."}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 19, "completion_tokens": 3, "total_tokens": 22}
        });
        http::Response::builder()
            .header("content-type", "application/json")
            .body(full_body(doc.to_string()))
            .expect("response")
    }));
    let port = upstream.port();
    let policy = format!(
        "[limits.model]\nllm_tokens = \"2M/day\"\nspend = \"20 USD/day\"\n\n[[rules]]\nname = \"model\"\nhosts = [\"llm.test\"]\nports = [{port}]\nlimits = [\"model\"]\n"
    );
    let lk = latchkey().pin("llm.test").policy("p.toml", &policy).run();
    let out = curl(&lk)
        .args([
            "-H",
            "content-type: application/json",
            "-d",
            r#"{"model":"gpt-4o","max_tokens":256,"messages":[{"role":"user","content":"Say hi."}]}"#,
        ])
        .args([format!("http://llm.test:{port}/v1/chat/completions")])
        .run();
    assert_eq!(out.ok().status, 200, "{out:#?}");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let record = loop {
        if let Some(r) = lk
            .audit_records()
            .into_iter()
            .find(|r| r["usage"].is_object())
        {
            break r;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no record with usage: {}",
            lk.audit_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(record["usage"]["source"], "response", "{record}");
    assert_eq!(record["usage"]["input_tokens"], 19);
    assert_eq!(record["usage"]["output_tokens"], 3);
    let tokens = record["limits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["measure"] == "llm_tokens")
        .unwrap()
        .clone();
    assert_eq!(tokens["charged"], 22, "{record}");
    // 19 × $2.50 + 3 × $10 per million tokens = 77.5 micro-dollars, rounded up.
    let spend = record["limits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["measure"] == "spend")
        .unwrap()
        .clone();
    assert_eq!(spend["charged"], 78, "{record}");
}
