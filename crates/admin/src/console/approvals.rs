//! `/ui/approvals`: requests waiting for a person, across replicas (the state store's), with
//! their scrubbed preview as stored; approve/deny forms for `approvals:answer`; the answered
//! ones with who answered. Answers take the API's path (`approvals::take_answer`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::SystemTime;

use http::{Response, StatusCode};

use super::html::{self, esc};
use super::Signed;
use crate::approvals::{take_answer, AnswerBody};
use crate::governance::record::{Approval, State};
use crate::policy::access::AdminScope;
use crate::proxy::Proxy;
use crate::Body;

/// Answered approvals shown in the history, newest first.
const HISTORY: usize = 100;

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

pub async fn page(proxy: &Proxy, signed: &Signed) -> Response<Body> {
    let Some(gov) = proxy.governance() else {
        return unavailable(
            signed,
            "latchkey has no state store: approvals are unavailable",
        );
    };
    let now = SystemTime::now();
    let pending = match gov.approvals.list(Some(State::Pending), now).await {
        Ok(l) => l,
        Err(e) => return unavailable(signed, &e.to_string()),
    };
    let mut body = format!("<h2>Pending ({})</h2>", pending.len());
    if pending.is_empty() {
        body.push_str("<p class=\"empty\">nothing is waiting</p>");
    }
    for a in &pending {
        body.push_str(&pending_html(a, signed));
    }
    let mut answered = match gov.approvals.list(None, now).await {
        Ok(l) => l,
        Err(e) => return unavailable(signed, &e.to_string()),
    };
    answered.retain(|a| a.answer.is_some());
    answered.sort_by(|a, b| {
        let at = |x: &Approval| x.answer.as_ref().map(|y| y.at);
        at(b).cmp(&at(a))
    });
    let rows: Vec<Vec<String>> = answered
        .iter()
        .take(HISTORY)
        .map(|a| {
            let ans = a.answer.as_ref();
            vec![
                esc(&a.id),
                esc(&format!("{} {}", a.method, a.url)),
                esc(&a.identity),
                esc(a.state.as_str()),
                esc(ans.and_then(|x| x.scope.as_deref()).unwrap_or("—")),
                esc(ans.map_or("", |x| x.by.as_str())),
                esc(&ans.map(|x| rfc3339(x.at)).unwrap_or_default()),
                esc(ans.and_then(|x| x.note.as_deref()).unwrap_or("")),
            ]
        })
        .collect();
    body.push_str("<h2>Answered</h2>");
    body.push_str(&html::table(
        &[
            "id", "request", "identity", "decision", "scope", "by", "at", "note",
        ],
        &rows,
        "nothing answered yet",
    ));
    html::page(StatusCode::OK, "Approvals", Some(signed), &body)
}

/// One pending approval: who asks, what, the rule's message, the preview, and the forms.
fn pending_html(a: &Approval, signed: &Signed) -> String {
    let labels: Vec<String> = a.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let rows = vec![
        vec!["request".into(), esc(&format!("{} {}", a.method, a.url))],
        vec!["identity".into(), esc(&a.identity)],
        vec!["labels".into(), esc(&labels.join(", "))],
        vec!["client".into(), esc(&a.client)],
        vec!["rule".into(), esc(&a.rule)],
        vec!["message".into(), esc(a.message.as_deref().unwrap_or("—"))],
        vec![
            "body".into(),
            esc(&format!("{} bytes, sha256 {}", a.body_bytes, a.body_sha256)),
        ],
        vec!["asked".into(), esc(&rfc3339(a.created))],
        vec!["expires".into(), esc(&rfc3339(a.expires))],
        vec!["audit id".into(), esc(&a.request_id)],
    ];
    let mut out = format!(
        "<section class=\"approval\"><h3>{}</h3>{}",
        esc(&a.id),
        html::table(&["", ""], &rows, "")
    );
    if let Some(p) = &a.preview {
        out.push_str(&format!(
            "<p>Preview (secret values redacted, as stored):</p><pre>{}</pre>",
            esc(p)
        ));
    }
    if signed.may(AdminScope::ApprovalsAnswer) {
        out.push_str(&forms(a, signed));
    } else {
        out.push_str(
            "<p class=\"empty\">Answering needs the <code>approvals:answer</code> scope.</p>",
        );
    }
    out.push_str("</section>");
    out
}

fn forms(a: &Approval, signed: &Signed) -> String {
    let action = format!("/ui/approvals/{}", a.id);
    let mut options = String::new();
    for s in &a.scopes {
        options.push_str(&format!("<option value=\"{v}\">{v}</option>", v = esc(s)));
    }
    format!(
        "<form class=\"inline\" method=\"post\" action=\"{act}\" data-confirm=\"Approve this request?\">{csrf}\
<input type=\"hidden\" name=\"decision\" value=\"approve\">\
<label>Scope <select name=\"scope\">{options}</select></label>\
<label>Note <input type=\"text\" name=\"note\" maxlength=\"1024\"></label>\
<button type=\"submit\">Approve</button></form>\
<form class=\"inline\" method=\"post\" action=\"{act}\" data-confirm=\"Deny this request?\">{csrf}\
<input type=\"hidden\" name=\"decision\" value=\"deny\">\
<label>Note <input type=\"text\" name=\"note\" maxlength=\"1024\"></label>\
<button type=\"submit\">Deny</button></form>",
        act = esc(&action),
        csrf = html::csrf_field(signed),
    )
}

/// `POST /ui/approvals/ID`: refused without `approvals:answer`, else answered as the API
/// answers, `by` the signed-in name.
pub async fn answer(
    proxy: &Arc<Proxy>,
    peer: SocketAddr,
    signed: &Signed,
    id: &str,
    form: &HashMap<String, String>,
) -> Response<Body> {
    if !signed.may(AdminScope::ApprovalsAnswer) {
        return html::message(
            StatusCode::FORBIDDEN,
            "Refused",
            &format!("{} lacks the approvals:answer scope", signed.name),
            Some(signed),
            Some("/ui/approvals"),
        );
    }
    let Some(gov) = proxy.governance().cloned() else {
        return unavailable(
            signed,
            "latchkey has no state store: approvals are unavailable",
        );
    };
    let field = |k: &str| form.get(k).filter(|v| !v.is_empty()).cloned();
    let Some(decision) = field("decision") else {
        return html::message(
            StatusCode::BAD_REQUEST,
            "Not answered",
            "the form has no decision (approve or deny)",
            Some(signed),
            Some("/ui/approvals"),
        );
    };
    let body = AnswerBody {
        scope: field("scope").filter(|_| decision == "approve"),
        decision,
        note: field("note"),
        by: None,
    };
    match take_answer(proxy, &gov, peer, id, body, &signed.name).await {
        Ok(a) => html::message(
            StatusCode::OK,
            "Answered",
            &format!(
                "approval {}: {}{}",
                a.id,
                a.state.as_str(),
                a.answer
                    .as_ref()
                    .and_then(|x| x.scope.as_deref())
                    .map(|s| format!(" (scope {s})"))
                    .unwrap_or_default()
            ),
            Some(signed),
            Some("/ui/approvals"),
        ),
        Err((status, why)) => html::message(
            status,
            "Not answered",
            &why,
            Some(signed),
            Some("/ui/approvals"),
        ),
    }
}

fn unavailable(signed: &Signed, why: &str) -> Response<Body> {
    html::message(
        StatusCode::SERVICE_UNAVAILABLE,
        "Approvals are unavailable",
        why,
        Some(signed),
        None,
    )
}
