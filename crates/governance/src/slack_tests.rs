//! Unit tests of Slack interactivity: the request signature as Slack computes it, the payload
//! reader on good, odd and arbitrary input (never a panic), button values and the
//! `response_url` host rule.

use std::time::{Duration, SystemTime};

use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::links::LinkError;
use crate::notify::tests::{approval, notice};
use crate::notify::{render, EVENT_REQUESTED};
use crate::policy::NotifyFormat;

const SECRET: &[u8] = b"8f742231b10e8888abcd99yyyzzz85a5";

fn at(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}

/// A form body with `payload` = `value`, as Slack sends it.
fn form(payload: &serde_json::Value) -> Vec<u8> {
    form_urlencoded::Serializer::new(String::new())
        .append_pair("payload", &payload.to_string())
        .finish()
        .into_bytes()
}

fn click(value: &str) -> serde_json::Value {
    json!({
        "type": "block_actions",
        "user": {"id": "U012AB3CD", "username": "ana", "name": "ana", "team_id": "T1"},
        "api_app_id": "A1",
        "actions": [{"action_id": "approve-once", "block_id": "b", "value": value,
                     "type": "button", "action_ts": "1.2"}],
        "response_url": "https://hooks.slack.com/actions/T1/2/xyz",
        "message": {"blocks": []},
    })
}

fn value() -> String {
    json!({"id": "ap_1", "decision": "approve", "scope": "once", "exp": "2000",
           "sig": "ab".repeat(32)})
    .to_string()
}

#[test]
fn slacks_documented_example_signature_verifies() {
    // The example of Slack's "Verifying requests from Slack".
    let body = b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
    let want = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503";
    assert_eq!(signature(SECRET, "1531420618", body), want);
    let now = at(1_531_420_618);
    assert_eq!(
        verify_request(
            SECRET,
            Some(b"1531420618"),
            Some(want.as_bytes()),
            body,
            now
        ),
        Ok(())
    );
}

#[test]
fn a_request_is_refused_for_each_thing_wrong_with_its_signature_or_time() {
    let body = b"payload=%7B%7D";
    let ts = "1800000000";
    let sig = signature(SECRET, ts, body);
    let now = at(1_800_000_000);
    let check = |ts: Option<&str>, sig: Option<&str>, body: &[u8], now| {
        verify_request(
            SECRET,
            ts.map(str::as_bytes),
            sig.map(str::as_bytes),
            body,
            now,
        )
    };
    assert_eq!(check(Some(ts), Some(&sig), body, now), Ok(()));
    // Five minutes either way is in; a second more is stale.
    assert_eq!(check(Some(ts), Some(&sig), body, at(1_800_000_300)), Ok(()));
    assert_eq!(check(Some(ts), Some(&sig), body, at(1_799_999_700)), Ok(()));
    for late in [1_800_000_301, 1_799_999_699, 1_800_000_360, 0] {
        assert_eq!(
            check(Some(ts), Some(&sig), body, at(late)),
            Err(VerifyError::Stale),
            "{late}"
        );
    }
    assert_eq!(
        check(None, Some(&sig), body, now),
        Err(VerifyError::NoTimestamp)
    );
    for bad in [
        "",
        "-1",
        "1e9",
        " 1800000000",
        "18000000000000000000",
        "0x10",
    ] {
        assert_eq!(
            check(Some(bad), Some(&sig), body, now),
            Err(VerifyError::BadTimestamp),
            "{bad:?}"
        );
    }
    assert_eq!(
        check(Some(ts), None, body, now),
        Err(VerifyError::NoSignature)
    );
    let upper = format!("v0={}", sig[3..].to_uppercase());
    for bad in [
        "",
        "v0=",
        &sig[3..],
        &format!("v1={}", &sig[3..]),
        &format!("{sig}00"),
        &format!("v0={}", "zz".repeat(32)),
    ] {
        assert_eq!(
            check(Some(ts), Some(bad), body, now),
            Err(VerifyError::MalformedSignature),
            "{bad:?}"
        );
    }
    // Hex digits in either case decode to the same tag.
    assert_eq!(check(Some(ts), Some(&upper), body, now), Ok(()));
    // Any other body, timestamp or key: a bad signature, even when stale.
    assert_eq!(
        check(Some(ts), Some(&sig), b"payload=%7B%7D ", now),
        Err(VerifyError::BadSignature)
    );
    assert_eq!(
        check(Some("1800000001"), Some(&sig), body, now),
        Err(VerifyError::BadSignature)
    );
    assert_eq!(
        check(Some(ts), Some(&signature(b"other", ts, body)), body, at(0)),
        Err(VerifyError::BadSignature)
    );
    // The messages name neither the secret nor the signature.
    for e in [VerifyError::BadSignature, VerifyError::Stale] {
        let text = e.to_string();
        assert!(
            !text.contains(&sig[3..]) && !text.contains("8f7422"),
            "{text}"
        );
    }
}

#[test]
fn a_block_actions_click_is_read_with_who_clicked_and_where_to_answer() {
    let got = parse_interaction(&form(&click(&value()))).expect("a click");
    assert_eq!(got.user_id, "U012AB3CD");
    assert_eq!(got.user_name.as_deref(), Some("ana"));
    assert_eq!(got.by(), "slack:U012AB3CD (ana)");
    assert_eq!(got.value.id, "ap_1");
    assert_eq!(got.value.scope.as_deref(), Some("once"));
    assert_eq!(
        got.response_url.as_ref().map(url::Url::as_str),
        Some("https://hooks.slack.com/actions/T1/2/xyz")
    );
    // A user name is reduced to a name; without one, the ID alone.
    let mut odd = click(&value());
    odd["user"] = json!({"id": "W0ABC", "username": "<!channel> a\u{202e}b\n(x)"});
    let got = parse_interaction(&form(&odd)).expect("a click");
    assert_eq!(got.by(), "slack:W0ABC (channelabx)");
    odd["user"] = json!({"id": "W0ABC", "name": "***"});
    assert_eq!(parse_interaction(&form(&odd)).unwrap().by(), "slack:W0ABC");
    odd["response_url"] = json!(null);
    assert_eq!(parse_interaction(&form(&odd)).unwrap().response_url, None);
}

#[test]
fn anything_but_one_click_on_a_latchkey_button_is_refused() {
    let good = click(&value());
    let mut cases: Vec<(Vec<u8>, &str)> = vec![
        (b"".to_vec(), "no payload"),
        (b"payload=".to_vec(), "not a Slack interaction"),
        (b"payload=%7B".to_vec(), "not a Slack interaction"),
        (b"payload=null".to_vec(), "not a Slack interaction"),
        (b"token=x".to_vec(), "no payload"),
    ];
    let mut twice = form(&good);
    twice.extend_from_slice(b"&");
    twice.extend_from_slice(&form(&good));
    cases.push((twice, "more than one payload"));
    let mut edits: Vec<(serde_json::Value, &str)> = Vec::new();
    let mut v = good.clone();
    v["type"] = json!("view_submission");
    edits.push((v, "is not block_actions"));
    let mut v = good.clone();
    v["user"]["id"] = json!("ana");
    edits.push((v, "not a Slack user ID"));
    let mut v = good.clone();
    v["user"] = json!("U012AB3CD");
    edits.push((v, "not a Slack interaction"));
    let mut v = good.clone();
    v["actions"] = json!([]);
    edits.push((v, "0 actions"));
    let mut v = good.clone();
    v["actions"] = json!([good["actions"][0], good["actions"][0]]);
    edits.push((v, "2 actions"));
    let mut v = good.clone();
    v["actions"][0]["value"] = json!(null);
    edits.push((v, "no value"));
    let mut v = good.clone();
    v["actions"][0]["value"] = json!("x".repeat(MAX_VALUE + 1));
    edits.push((v, "no value"));
    let mut v = good.clone();
    v["actions"][0]["value"] = json!(r#"{"id":"ap_1","decision":"approve"}"#);
    edits.push((v, "not an answer"));
    let mut v = good.clone();
    let mut extra: serde_json::Value = serde_json::from_str(&value()).unwrap();
    extra["note"] = json!("x");
    v["actions"][0]["value"] = json!(extra.to_string());
    edits.push((v, "not an answer"));
    let mut v = good.clone();
    v["response_url"] = json!("/actions/relative");
    edits.push((v, "not an absolute URL"));
    for (v, why) in edits {
        cases.push((form(&v), why));
    }
    for (body, why) in cases {
        let e = parse_interaction(&body).expect_err(why);
        assert!(e.contains(why), "{why}: {e}");
    }
}

#[test]
fn button_values_answer_through_their_notifier_only() {
    let signer = Signer::new([3u8; 32]);
    let a = approval();
    let actions = actions_for("chat", &a, &signer);
    assert_eq!(actions.approve.len(), a.scopes.len());
    for (scope, value) in &actions.approve {
        assert!(value.len() <= MAX_VALUE);
        let v: ActionValue = serde_json::from_str(value).unwrap();
        assert_eq!((v.id.as_str(), v.decision.as_str()), ("ap_1234", "approve"));
        assert_eq!(v.scope.as_deref(), Some(scope.as_str()));
        assert_eq!(v.verify(&signer, "chat", a.created), Ok(()));
        assert_eq!(
            v.verify(&signer, "ops", a.created),
            Err(LinkError::BadSignature)
        );
        assert_eq!(
            v.verify(&signer, "chat", a.expires + Duration::from_secs(1)),
            Err(LinkError::Expired)
        );
    }
    let deny: ActionValue = serde_json::from_str(&actions.deny).unwrap();
    assert_eq!(
        (deny.decision.as_str(), deny.scope.as_deref()),
        ("deny", None)
    );
    assert_eq!(deny.verify(&signer, "chat", a.created), Ok(()));
    let mut forged = deny.clone();
    forged.decision = "approve".into();
    forged.scope = Some("once".into());
    assert_eq!(
        forged.verify(&signer, "chat", a.created),
        Err(LinkError::BadSignature)
    );
}

#[test]
fn an_interactive_message_has_value_buttons_and_no_link() {
    let signer = Signer::new([3u8; 32]);
    let mut n = notice(EVENT_REQUESTED, None);
    n.actions = Some(actions_for("ops", &approval(), &signer));
    let v: serde_json::Value =
        serde_json::from_slice(&render(NotifyFormat::Slack, "d", &n, None)).unwrap();
    let blocks = v["blocks"].as_array().unwrap();
    let actions = blocks.iter().find(|b| b["type"] == "actions").unwrap();
    let elements = actions["elements"].as_array().unwrap();
    assert_eq!(elements.len(), 3, "{actions}");
    let ids: Vec<&str> = elements
        .iter()
        .map(|b| b["action_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["approve-once", "approve-1h", "deny"]);
    for b in elements {
        assert!(b.get("url").is_none(), "{b}");
        let value: ActionValue = serde_json::from_str(b["value"].as_str().unwrap()).unwrap();
        assert_eq!(value.id, "ap_1234");
    }
    assert!(elements[0]["confirm"]["text"]["text"]
        .as_str()
        .is_some_and(|t| t.contains("POST https://api.prod.test/v1/items")));
    assert!(!v.to_string().contains("/answer?"), "{v}");
}

#[test]
fn the_replacement_shows_the_outcome_and_no_button() {
    let mut a = approval();
    a.state = crate::record::State::Approved;
    a.answer = Some(crate::record::Answer {
        decision: "approve".into(),
        scope: Some("1h".into()),
        note: None,
        by: "slack:U012AB3CD (ana)".into(),
        at: a.created,
    });
    let v = replacement("ops", &a);
    assert_eq!(v["replace_original"], true);
    let text = v["text"].as_str().unwrap();
    assert!(
        text.starts_with("latchkey: slack:U012AB3CD (ana) approved (1h) identity agent"),
        "{text}"
    );
    assert!(v["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .all(|b| b["type"] != "actions"));
    let e = ephemeral("no");
    assert_eq!(
        e,
        json!({"response_type": "ephemeral", "replace_original": false, "text": "no"})
    );
}

#[test]
fn a_response_url_must_be_on_the_webhooks_host_and_port() {
    let hook = url::Url::parse("https://hooks.slack.com/services/T/B/X").unwrap();
    let ok = |u: &str| response_target(&hook, &url::Url::parse(u).unwrap());
    assert_eq!(ok("https://hooks.slack.com/actions/T/1/abc"), Ok(()));
    assert_eq!(ok("https://HOOKS.slack.com:443/actions/T/1/abc"), Ok(()));
    for bad in [
        "http://hooks.slack.com/actions/T/1/abc",
        "https://hooks.slack.com:8443/actions/T/1/abc",
        "https://evil.test/actions/T/1/abc",
        "https://hooks.slack.com.evil.test/actions/T/1/abc",
        "https://u:p@hooks.slack.com/actions/T/1/abc",
        "ftp://hooks.slack.com/actions/T/1/abc",
    ] {
        let e = ok(bad).expect_err(bad);
        assert!(!e.contains("/actions/"), "the path is a capability: {e}");
    }
    // A plain-HTTP webhook (a test receiver) allows its own scheme, on its own host and port.
    let local = url::Url::parse("http://127.0.0.1:8080/hook").unwrap();
    let ok = |u: &str| response_target(&local, &url::Url::parse(u).unwrap());
    assert_eq!(ok("http://127.0.0.1:8080/actions/1"), Ok(()));
    assert!(ok("http://127.0.0.1:8081/actions/1").is_err());
    assert!(ok("http://localhost:8080/actions/1").is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Arbitrary bytes, as a body or headers, never panic and are never taken as Slack's.
    #[test]
    fn arbitrary_bytes_never_panic(
        body in proptest::collection::vec(any::<u8>(), 0..512),
        ts in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..24)),
        sig in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..80)),
        now in any::<u64>(),
    ) {
        let _ = parse_interaction(&body);
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(now % (1 << 40));
        prop_assert!(verify_request(SECRET, ts.as_deref(), sig.as_deref(), &body, now).is_err());
    }

    /// Arbitrary JSON-ish payloads inside a well-formed form never panic; whatever parses
    /// names a valid user ID.
    #[test]
    fn arbitrary_payloads_never_panic(
        kind in "[a-z_]{0,16}",
        user in "[A-Za-z0-9]{0,12}",
        value in ".{0,64}",
        url in ".{0,40}",
        raw in ".{0,200}",
    ) {
        let v = json!({"type": kind, "user": {"id": user}, "actions": [{"value": value}],
                       "response_url": url});
        if let Ok(got) = parse_interaction(&form(&v)) {
            prop_assert!(crate::policy::ask::is_slack_user_id(&got.user_id));
        }
        let body = form_urlencoded::Serializer::new(String::new())
            .append_pair("payload", &raw)
            .finish();
        let _ = parse_interaction(body.as_bytes());
    }
}
