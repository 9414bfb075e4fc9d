//! `/ui/sessions`: runtime sessions, filtered by profile, state and label; with
//! `sessions:write`, create from a profile (its token shown on the result page only), extend
//! and revoke. The same governance calls as the JSON API's.

use std::collections::{BTreeMap, HashMap};

use http::{Response, StatusCode};

use super::html::{self, esc};
use super::Signed;
use crate::governance::sessions::{CreateRequest, SessionView};
use crate::policy::access::AdminScope;
use crate::policy::profile::NarrowRequest;
use crate::proxy::Proxy;
use crate::sessions::{filter_of, SessionEnv};
use crate::Body;

pub async fn page(proxy: &Proxy, signed: &Signed, query: &str) -> Response<Body> {
    let Some(sessions) = proxy.sessions() else {
        return unavailable(signed);
    };
    let filter = match filter_of(query) {
        Ok(f) => f,
        Err(why) => {
            return html::message(
                StatusCode::BAD_REQUEST,
                "Bad filter",
                &why,
                Some(signed),
                Some("/ui/sessions"),
            )
        }
    };
    let list = match sessions.list(&filter).await {
        Ok(l) => l,
        Err(e) => {
            return html::message(
                StatusCode::SERVICE_UNAVAILABLE,
                "Sessions are unavailable",
                &e.to_string(),
                Some(signed),
                None,
            )
        }
    };
    let write = signed.may(AdminScope::SessionsWrite);
    let label = filter
        .label
        .as_ref()
        .map(|(k, v)| format!("{k}={v}"))
        .unwrap_or_default();
    let state = filter.state.as_deref().unwrap_or("");
    let mut body = format!(
        "<form method=\"get\" action=\"/ui/sessions\" class=\"inline\">\
<label>Profile <input type=\"text\" name=\"profile\" value=\"{}\"></label>\
<label>State <select name=\"state\">{}</select></label>\
<label>Label <input type=\"text\" name=\"label\" placeholder=\"key=value\" value=\"{}\"></label>\
<button type=\"submit\">Filter</button></form>",
        esc(filter.profile.as_deref().unwrap_or("")),
        ["", "live", "revoked", "expired"]
            .iter()
            .map(|s| format!(
                "<option value=\"{s}\"{}>{}</option>",
                if *s == state { " selected" } else { "" },
                if s.is_empty() { "any" } else { s }
            ))
            .collect::<String>(),
        esc(&label),
    );
    let rows: Vec<Vec<String>> = list.iter().map(|s| row(s, signed, write)).collect();
    let mut heads = vec![
        "id", "profile", "state", "labels", "narrowed", "created", "expires", "by", "reach",
    ];
    if write {
        heads.push("");
    }
    body.push_str(&html::table(&heads, &rows, "no sessions match"));
    if write {
        body.push_str(&create_form(proxy, signed));
    }
    html::page(StatusCode::OK, "Sessions", Some(signed), &body)
}

/// What a session narrows of its profile, in one line (`hosts: a, b; source: 10.0.3.7`).
fn narrowed(s: &SessionView) -> String {
    let mut parts = Vec::new();
    if let Some(h) = &s.narrow.hosts {
        parts.push(format!("hosts: {}", h.join(", ")));
    }
    if let Some(x) = &s.narrow.secrets {
        parts.push(format!("secrets: {}", x.join(", ")));
    }
    if let Some(l) = &s.narrow.limits {
        let each: Vec<String> = l
            .iter()
            .flat_map(|(limit, m)| m.iter().map(move |(k, v)| format!("{limit}.{k}={v}")))
            .collect();
        parts.push(format!("limits: {}", each.join(", ")));
    }
    if let Some(src) = &s.source {
        parts.push(format!("source: {src}"));
    }
    parts.join("; ")
}

fn row(s: &SessionView, signed: &Signed, write: bool) -> Vec<String> {
    let labels: Vec<String> = s.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let mut row = vec![
        esc(&s.id),
        esc(&s.profile),
        esc(&s.state),
        esc(&labels.join(", ")),
        esc(&narrowed(s)),
        esc(&s.created_at),
        esc(&s.expires_at),
        esc(s.created_by.as_deref().unwrap_or("")),
        format!("<code>{}</code>", esc(&s.reach)),
    ];
    if write {
        let cell = if s.state == "live" {
            let act = esc(&format!("/ui/sessions/{}", s.id));
            format!(
                "<form class=\"inline\" method=\"post\" action=\"{act}/extend\">{csrf}\
<input type=\"text\" name=\"ttl\" size=\"4\" value=\"1h\"><button type=\"submit\">Extend</button></form>\
<form class=\"inline\" method=\"post\" action=\"{act}/revoke\" data-confirm=\"Revoke this session and cut its connections?\">{csrf}\
<button type=\"submit\">Revoke</button></form>",
                csrf = html::csrf_field(signed)
            )
        } else {
            String::new()
        };
        row.push(cell);
    }
    row
}

fn create_form(proxy: &Proxy, signed: &Signed) -> String {
    let policy = proxy.policy();
    let options: String = policy
        .identities()
        .iter()
        .filter(|i| i.profile.is_some())
        .map(|i| format!("<option value=\"{v}\">{v}</option>", v = esc(&i.name)))
        .collect();
    if options.is_empty() {
        return "<p class=\"empty\">The policy defines no profiles to create sessions from.</p>"
            .to_string();
    }
    format!(
        "<fieldset><legend>Create a session</legend>\
<form method=\"post\" action=\"/ui/sessions\">{}\
<label>Profile <select name=\"profile\">{options}</select></label>\
<label>TTL <input type=\"text\" name=\"ttl\" placeholder=\"the profile's longest\"></label>\
<label>Labels <input type=\"text\" name=\"labels\" placeholder=\"key=value, key=value\"></label>\
<fieldset class=\"narrow\"><legend>Narrow it (optional: only ever narrower than its profile)</legend>\
<label>Hosts <input type=\"text\" name=\"hosts\" placeholder=\"api.github.com, *.s3.amazonaws.com\"></label>\
<label>Secrets <input type=\"text\" name=\"secrets\" placeholder=\"github, openai\"></label>\
<label>Limits <input type=\"text\" name=\"limits\" placeholder=\"llm.llm_tokens=100k/day\"></label>\
<label>Source <input type=\"text\" name=\"source\" placeholder=\"10.0.3.7: the one address it may come from\"></label>\
</fieldset>\
<button type=\"submit\">Create</button></form>\
<p>The session's token is shown once, on the next page. A narrowing wider than the profile is refused, naming what is too wide.</p></fieldset>",
        html::csrf_field(signed)
    )
}

/// `POST /ui/sessions` (create), `/ui/sessions/ID/revoke`, `/ui/sessions/ID/extend`: each
/// refused without `sessions:write`.
pub async fn post(
    proxy: &Proxy,
    env: &SessionEnv,
    signed: &Signed,
    path: &str,
    form: &HashMap<String, String>,
) -> Response<Body> {
    if !signed.may(AdminScope::SessionsWrite) {
        return html::message(
            StatusCode::FORBIDDEN,
            "Refused",
            &format!("{} lacks the sessions:write scope", signed.name),
            Some(signed),
            Some("/ui/sessions"),
        );
    }
    let Some(sessions) = proxy.sessions() else {
        return unavailable(signed);
    };
    let back = Some("/ui/sessions");
    let failed = |status: u16, why: String| {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
        html::message(status, "Not done", &why, Some(signed), back)
    };
    let rest = path.strip_prefix("/ui/sessions").unwrap_or_default();
    match rest.trim_start_matches('/').split_once('/') {
        None if rest.is_empty() => {
            let req = match create_request(form) {
                Ok(r) => r,
                Err(why) => return failed(400, why),
            };
            match sessions
                .create(&proxy.policy(), &req, Some(&signed.name))
                .await
            {
                Ok(made) => created(signed, env, &made.session, &made.token),
                Err(e) => failed(e.status(), e.to_string()),
            }
        }
        Some((id, "revoke")) => match sessions.revoke(id, Some(&signed.name)).await {
            Ok(v) => html::message(
                StatusCode::OK,
                "Revoked",
                &format!("session {} is {}: its connections are cut", v.id, v.state),
                Some(signed),
                back,
            ),
            Err(e) => failed(e.status(), e.to_string()),
        },
        Some((id, "extend")) => {
            let ttl = form.get("ttl").map(String::as_str).unwrap_or_default();
            let ttl = match humantime::parse_duration(ttl) {
                Ok(t) => t,
                Err(e) => {
                    return failed(
                        400,
                        format!("ttl {ttl:?} is not a duration like \"1h\": {e}"),
                    )
                }
            };
            match sessions.extend(id, ttl).await {
                Ok(v) => html::message(
                    StatusCode::OK,
                    "Extended",
                    &format!("session {} now expires at {}", v.id, v.expires_at),
                    Some(signed),
                    back,
                ),
                Err(e) => failed(e.status(), e.to_string()),
            }
        }
        _ => failed(404, "nothing to post to here".to_string()),
    }
}

/// The create form as the API's request: `labels` and `limits` are `key=value` pairs, `hosts`
/// and `secrets` names, each list split by commas, spaces or line breaks; empty fields narrow
/// nothing. What is wider than the profile is refused by `Sessions::create`, as for the API.
fn create_request(form: &HashMap<String, String>) -> Result<CreateRequest, String> {
    let profile = form.get("profile").cloned().unwrap_or_default();
    if profile.is_empty() {
        return Err("choose a profile".to_string());
    }
    let field = |name: &str| form.get(name).map(String::as_str).unwrap_or_default();
    let list = |name: &str| -> Option<Vec<String>> {
        let items: Vec<String> = field(name)
            .split([',', ' ', '\n', '\r', '\t'])
            .filter(|p| !p.is_empty())
            .map(str::to_string)
            .collect();
        (!items.is_empty()).then_some(items)
    };
    let mut labels = BTreeMap::new();
    for (k, v) in pairs(field("labels"), "label")? {
        labels.insert(k, v);
    }
    let mut limits: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for (k, v) in pairs(field("limits"), "limit")? {
        let Some((limit, measure)) = k
            .split_once('.')
            .filter(|(l, m)| !l.is_empty() && !m.is_empty())
        else {
            return Err(format!(
                "limit {k:?}: use LIMIT.MEASURE=VALUE (llm.llm_tokens=100k/day)"
            ));
        };
        limits
            .entry(limit.to_string())
            .or_default()
            .insert(measure.to_string(), v);
    }
    let source = field("source").trim();
    Ok(CreateRequest {
        profile,
        ttl: form.get("ttl").filter(|t| !t.trim().is_empty()).cloned(),
        labels,
        source: (!source.is_empty()).then(|| source.to_string()),
        narrow: NarrowRequest {
            hosts: list("hosts"),
            secrets: list("secrets"),
            limits: (!limits.is_empty()).then_some(limits),
        },
    })
}

/// `key=value` pairs split by commas or line breaks; `what` names them in the error.
fn pairs(text: &str, what: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for pair in text
        .split([',', '\n'])
        .map(str::trim)
        .filter(|p| !p.is_empty())
    {
        let Some((k, v)) = pair.split_once('=') else {
            return Err(format!("{what} {pair:?}: use key=value"));
        };
        out.push((k.trim().to_string(), v.trim().to_string()));
    }
    Ok(out)
}

/// The result of a create: the token and proxy URL, shown this once (never logged or kept).
fn created(signed: &Signed, env: &SessionEnv, s: &SessionView, token: &str) -> Response<Body> {
    let url = env.proxy_url(&s.id, token);
    let body = format!(
        "<p>Session <strong>{}</strong> from profile {} expires at {}.</p>\
<p>Its token, shown <strong>only this once</strong>:</p><p class=\"token\">{}</p>\
<p>The proxy URL a sandbox uses:</p><p class=\"token\">{}</p>\
<p><a href=\"/ui/sessions\">Back to sessions</a></p>",
        esc(&s.id),
        esc(&s.profile),
        esc(&s.expires_at),
        esc(token),
        esc(&url)
    );
    html::page(StatusCode::CREATED, "Session created", Some(signed), &body)
}

fn unavailable(signed: &Signed) -> Response<Body> {
    html::message(
        StatusCode::SERVICE_UNAVAILABLE,
        "Sessions are unavailable",
        "latchkey has no state store: sessions are unavailable",
        Some(signed),
        None,
    )
}
