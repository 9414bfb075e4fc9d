//! The approvals endpoints of the admin API (behind the admin token, on the admin listener a
//! sandbox cannot reach through the proxy):
//!
//! - `GET /approvals?state=pending|approved|denied|expired|all` (default `pending`);
//! - `GET /approvals/ID`;
//! - `POST /approvals/ID` with `{"decision": "approve"|"deny", "scope", "note", "by"}`;
//! - `GET /grants`: the grants still standing.
//!
//! Every answer taken leaves an audit record (`method = "APPROVAL"`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde::Deserialize;

use super::{json, Body};
use crate::audit::ApprovalInfo;
use crate::governance::approvals::AnswerError;
use crate::governance::record::{Answer, Approval, State};
use crate::governance::Governance;
use crate::proxy::Proxy;
use crate::reason::Reason;

/// Largest answer body accepted.
const MAX_ANSWER: usize = 16 * 1024;

/// What an approver sends.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnswerBody {
    pub decision: String,
    #[serde(default)]
    pub scope: Option<String>,
    #[serde(default)]
    pub note: Option<String>,
    #[serde(default)]
    pub by: Option<String>,
}

/// Routes `/approvals…` and `/grants`; `None` when the path is neither.
pub async fn route(
    proxy: &Arc<Proxy>,
    peer: SocketAddr,
    req: Request<Incoming>,
) -> Option<Response<Body>> {
    let path = req.uri().path().to_string();
    let rest = match path.as_str() {
        "/approvals" | "/grants" => "",
        p => p.strip_prefix("/approvals/")?,
    };
    let Some(gov) = proxy.governance().cloned() else {
        return Some(error(
            StatusCode::SERVICE_UNAVAILABLE,
            "latchkey has no state store: approvals are unavailable",
        ));
    };
    let now = SystemTime::now();
    Some(match (req.method().clone(), path.as_str()) {
        (Method::GET, "/approvals") => list(&gov, req.uri().query().unwrap_or_default(), now).await,
        (Method::GET, "/grants") => match gov.approvals.grants(now).await {
            Ok(g) => json(StatusCode::OK, &serde_json::json!({ "grants": g })),
            Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
        },
        (_, "/approvals" | "/grants") => {
            error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed")
        }
        (Method::GET, _) if !rest.contains('/') => match gov.approvals.get(rest).await {
            Ok(Some(mut a)) => {
                a.state = a.state_at(now);
                json(StatusCode::OK, &shown(&a))
            }
            Ok(None) => error(StatusCode::NOT_FOUND, &format!("no approval {rest:?}")),
            Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
        },
        (Method::POST, _) if !rest.contains('/') => {
            let id = rest.to_string();
            let body = match read_json(req).await {
                Ok(b) => b,
                Err(why) => return Some(error(StatusCode::BAD_REQUEST, &why)),
            };
            let by = body.by.clone().unwrap_or_else(|| "admin-api".to_string());
            answer(proxy, &gov, peer, &id, body, &by).await
        }
        _ => error(
            StatusCode::NOT_FOUND,
            "not found: try /approvals, /approvals/ID, /grants",
        ),
    })
}

async fn list(gov: &Governance, query: &str, now: SystemTime) -> Response<Body> {
    let mut state = Some(State::Pending);
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        if k == "state" {
            state = match &*v {
                "pending" => Some(State::Pending),
                "approved" => Some(State::Approved),
                "denied" => Some(State::Denied),
                "expired" => Some(State::Expired),
                "all" => None,
                other => {
                    return error(
                        StatusCode::BAD_REQUEST,
                        &format!(
                            "state {other:?} is not pending, approved, denied, expired or all"
                        ),
                    )
                }
            };
        }
    }
    match gov.approvals.list(state, now).await {
        Ok(list) => json(
            StatusCode::OK,
            &serde_json::json!({ "approvals": list.iter().map(Approval::public).collect::<Vec<_>>() }),
        ),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
    }
}

/// Takes an answer (from the API, the CLI or a signed link), records it and says how it went.
pub async fn answer(
    proxy: &Arc<Proxy>,
    gov: &Governance,
    peer: SocketAddr,
    id: &str,
    body: AnswerBody,
    by: &str,
) -> Response<Body> {
    match take_answer(proxy, gov, peer, id, body, by).await {
        Ok(a) => json(StatusCode::OK, &shown(&a)),
        Err((status, why)) => error(status, &why),
    }
}

/// Takes an answer (from the API, the CLI, a signed link or the console): the parked request
/// is released, the decision recorded and its notifications queued. `Err`: the status and why.
pub async fn take_answer(
    proxy: &Arc<Proxy>,
    gov: &Governance,
    peer: SocketAddr,
    id: &str,
    body: AnswerBody,
    by: &str,
) -> Result<Approval, (StatusCode, String)> {
    let note = body.note.map(|n| n.chars().take(1024).collect::<String>());
    let answer = Answer {
        decision: body.decision,
        scope: body.scope,
        note,
        by: by.chars().take(128).collect(),
        at: SystemTime::now(),
    };
    match gov.approvals.answer(id, answer, SystemTime::now()).await {
        Ok((a, _grant)) => {
            record(proxy, peer, &a).await;
            tracing::info!(approval.id = %a.id, decision = a.state.as_str(), by = %by, "approval answered");
            if let Err(e) = gov.decided(&proxy.policy(), &a).await {
                tracing::error!(approval.id = %a.id, error = %e, "cannot queue the decision's notifications");
            }
            Ok(a)
        }
        Err(AnswerError::NotFound(_)) => {
            Err((StatusCode::NOT_FOUND, format!("no approval {id:?}")))
        }
        Err(e @ AnswerError::Conflict { .. }) => Err((StatusCode::CONFLICT, e.to_string())),
        Err(e @ AnswerError::Invalid(_)) => Err((StatusCode::BAD_REQUEST, e.to_string())),
        Err(AnswerError::Store(e)) => Err((StatusCode::SERVICE_UNAVAILABLE, e.to_string())),
    }
}

/// The decision's audit record: who answered what, for which request.
async fn record(proxy: &Proxy, peer: SocketAddr, a: &Approval) {
    let policy = proxy.policy();
    let mut entry = crate::proxy::open_record(proxy, peer, &a.identity, &policy).await;
    let answer = a.answer.as_ref();
    entry.set_method("APPROVAL");
    entry.set_target(&a.scheme, &a.host, a.port, a.path.clone());
    entry.set_approval(ApprovalInfo {
        id: a.id.clone(),
        state: a.state.as_str(),
        scope: answer.and_then(|x| x.scope.clone()),
        by: answer.map(|x| x.by.clone()),
        note: answer.and_then(|x| x.note.clone()),
        ..ApprovalInfo::default()
    });
    let reason = if a.state == State::Approved {
        Reason::Allowed
    } else {
        Reason::ApprovalDenied
    };
    entry.outcome(reason, Some(&a.rule), None);
    entry.finish();
}

fn shown(a: &Approval) -> serde_json::Value {
    serde_json::to_value(a.public()).unwrap_or_default()
}

async fn read_json(req: Request<Incoming>) -> Result<AnswerBody, String> {
    let body = Limited::new(req.into_body(), MAX_ANSWER)
        .collect()
        .await
        .map_err(|e| format!("cannot read the answer (at most {MAX_ANSWER} bytes): {e}"))?
        .to_bytes();
    parse_answer(&body)
}

/// An answer body: JSON, or a form (`decision=approve&scope=1h`) as a browser sends it.
pub fn parse_answer(body: &Bytes) -> Result<AnswerBody, String> {
    if body.first().is_some_and(|b| *b == b'{') {
        return serde_json::from_slice(body).map_err(|e| format!("the answer is not valid: {e}"));
    }
    let mut out = AnswerBody {
        decision: String::new(),
        scope: None,
        note: None,
        by: None,
    };
    for (k, v) in form_urlencoded::parse(body) {
        match &*k {
            "decision" => out.decision = v.into_owned(),
            "scope" if !v.is_empty() => out.scope = Some(v.into_owned()),
            "note" if !v.is_empty() => out.note = Some(v.into_owned()),
            "by" if !v.is_empty() => out.by = Some(v.into_owned()),
            _ => {}
        }
    }
    if out.decision.is_empty() {
        return Err(
            "give a decision: {\"decision\": \"approve\" | \"deny\", \"scope\": …}".to_string(),
        );
    }
    Ok(out)
}

fn error(status: StatusCode, message: &str) -> Response<Body> {
    json(status, &serde_json::json!({ "error": message }))
}

/// Whether `path` is a signed link's (`/approvals/ID/answer`): answered without the admin
/// token, because the link's signature is the credential.
pub fn is_link(path: &str) -> bool {
    path.strip_prefix("/approvals/")
        .and_then(|r| r.strip_suffix("/answer"))
        .is_some_and(|id| !id.is_empty() && !id.contains('/'))
}

/// A signed one-click link. `GET` shows what it will do and a button; only the button's `POST`
/// answers, because chat apps and mail scanners open links on their own.
pub async fn link(proxy: &Arc<Proxy>, peer: SocketAddr, req: Request<Incoming>) -> Response<Body> {
    let Some(gov) = proxy.governance().cloned() else {
        return page(
            StatusCode::SERVICE_UNAVAILABLE,
            "Approvals are unavailable",
            "latchkey has no state store.",
            None,
        );
    };
    let path = req.uri().path().to_string();
    let id = path
        .strip_prefix("/approvals/")
        .and_then(|r| r.strip_suffix("/answer"))
        .unwrap_or_default()
        .to_string();
    let query = req.uri().query().unwrap_or_default().to_string();
    let params = match crate::governance::links::LinkParams::from_query(&query) {
        Ok(p) => p,
        Err(e) => {
            return page(
                StatusCode::FORBIDDEN,
                "This link does not work",
                &e.to_string(),
                None,
            )
        }
    };
    if let Err(e) = gov.signer.verify_params(&id, &params, SystemTime::now()) {
        tracing::warn!(client.addr = %peer, approval.id = %id, error = %e, "refused an approval link");
        return page(
            StatusCode::FORBIDDEN,
            "This link does not work",
            &e.to_string(),
            None,
        );
    }
    match *req.method() {
        Method::GET => {
            let approval = match gov.approvals.get(&id).await {
                Ok(Some(a)) => a,
                Ok(None) => return page(StatusCode::NOT_FOUND, "No such approval", &id, None),
                Err(e) => {
                    return page(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "Approvals are unavailable",
                        &e.to_string(),
                        None,
                    )
                }
            };
            let what = match (params.decision.as_str(), params.scope.as_deref()) {
                ("approve", Some(scope)) => format!("Approve (scope {scope})"),
                _ => "Deny".to_string(),
            };
            let detail = format!(
                "{} {} — identity {}, rule {}, state {}",
                approval.method,
                approval.url,
                approval.identity,
                approval.rule,
                approval.state_at(SystemTime::now()).as_str()
            );
            page(StatusCode::OK, &what, &detail, Some((&path, &query, &what)))
        }
        Method::POST => {
            let body = AnswerBody {
                decision: params.decision.clone(),
                scope: params.scope.clone(),
                note: None,
                by: None,
            };
            let res = answer(proxy, &gov, peer, &id, body, "link").await;
            let status = res.status();
            if status.is_success() {
                page(
                    StatusCode::OK,
                    "Answered",
                    &format!("approval {id}: {}", params.decision),
                    None,
                )
            } else {
                page(status, "Not answered", &format!("approval {id} could not be answered ({status}); it may be answered already or expired"), None)
            }
        }
        _ => page(
            StatusCode::METHOD_NOT_ALLOWED,
            "Method not allowed",
            "GET shows the link, POST answers",
            None,
        ),
    }
}

/// A small HTML page; `form` is (path, query, button label) for the confirmation button.
fn page(
    status: StatusCode,
    title: &str,
    detail: &str,
    form: Option<(&str, &str, &str)>,
) -> Response<Body> {
    let esc = crate::console::html::esc;
    let button = form.map_or(String::new(), |(path, query, label)| {
        format!(
            "<form method=\"post\" action=\"{}?{}\"><button type=\"submit\">{}</button></form>",
            esc(path),
            esc(query),
            esc(label)
        )
    });
    let html = format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><meta name=\"robots\" content=\"noindex\"><title>latchkey: {t}</title></head><body><h1>{t}</h1><p>{d}</p>{button}</body></html>\n",
        t = esc(title),
        d = esc(detail),
    );
    let mut res = super::respond(status, "text/html; charset=utf-8", html);
    res.headers_mut().insert(
        http::header::HeaderName::from_static("referrer-policy"),
        http::header::HeaderValue::from_static("no-referrer"),
    );
    res
}
