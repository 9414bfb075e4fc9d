//! The console's read-only pages: the overview (policy, reloads, connections, audit health),
//! limits and spend, and the policy (reach per identity, and a candidate's diff).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use http::{Response, StatusCode};

use super::html::{self, esc};
use super::Signed;
use crate::policy::compile::{PolicySources, SecretLoading};
use crate::proxy::Proxy;
use crate::ship::Shipper;
use crate::Body;

/// `/ui`: what `GET /status` says, for people.
pub async fn overview(
    proxy: &Proxy,
    ship: Option<&Shipper>,
    chain: &super::chain::ChainCheck,
    signed: &Signed,
) -> Response<Body> {
    let (s, chain) = tokio::join!(crate::status(proxy, ship), chain.current());
    let policy = &s["policy"];
    let files: Vec<String> = policy["files"]
        .as_array()
        .map(|a| a.iter().map(html::text).collect())
        .unwrap_or_default();
    let identities = policy["identities"].as_array().map_or(0, Vec::len);
    let reload = &s["reload"];
    let mut body = String::from("<h2>Policy</h2>");
    let rows = vec![
        vec!["digest".into(), esc(&html::text(&policy["digest"]))],
        vec!["files".into(), esc(&files.join(", "))],
        vec!["rules".into(), esc(&html::text(&policy["rules"]))],
        vec!["identities".into(), identities.to_string()],
        vec!["last reload".into(), esc(&html::text(&reload["last_ok"]))],
        vec![
            "last reload error".into(),
            error_cell(&reload["last_error"]),
        ],
        vec![
            "reloads / failed".into(),
            esc(&format!(
                "{} / {}",
                html::text(&reload["reloads"]),
                html::text(&reload["errors"])
            )),
        ],
    ];
    body.push_str(&html::table(&["", ""], &rows, ""));
    body.push_str("<h2>Process</h2>");
    let rows = vec![
        vec!["uptime".into(), uptime(&s["uptime_seconds"])],
        vec![
            "connections".into(),
            esc(&html::text(&s["connections_active"])),
        ],
        vec![
            "shutting down".into(),
            esc(&html::text(&s["shutting_down"])),
        ],
    ];
    body.push_str(&html::table(&["", ""], &rows, ""));
    body.push_str(&audit_health(&s, chain));
    if !s["state"].is_null() {
        body.push_str("<h2>State store</h2>");
        body.push_str(&html::fields(&s["state"]));
    }
    html::page(StatusCode::OK, "Overview", Some(signed), &body)
}

/// The audit log's health: written, failed, and with `--audit-ship` how far shipping lags.
fn audit_health(s: &serde_json::Value, chain: super::chain::Shown) -> String {
    let audit = &s["audit"];
    let healthy = audit["healthy"].as_bool().unwrap_or(false);
    let mut out = String::from("<h2>Audit health</h2>");
    let rows = vec![
        vec![
            "healthy".into(),
            if healthy {
                "<span class=\"good\">yes</span>".to_string()
            } else {
                "<span class=\"bad\">no: records cannot be written</span>".to_string()
            },
        ],
        vec![
            "records written".into(),
            esc(&html::text(&audit["written"])),
        ],
        vec!["records failed".into(), esc(&html::text(&audit["failed"]))],
    ];
    out.push_str(&html::table(&["", ""], &rows, ""));
    out.push_str("<h3>Hash chain</h3>");
    out.push_str(&chain_health(chain));
    out.push_str("<h3>Shipping</h3>");
    if s["audit_ship"].is_null() {
        out.push_str("<p class=\"empty\">not shipping (no <code>--audit-ship</code>)</p>");
    } else {
        out.push_str(&html::fields(&s["audit_ship"]));
    }
    out
}

/// The chain as verified on the box: through which line, the last signed checkpoint, what no
/// signature covers yet, and the first problem if any.
fn chain_health(chain: super::chain::Shown) -> String {
    use super::chain::Shown;
    let pass = match chain {
        Shown::NotHere(why) => return format!("<p class=\"empty\">{}</p>", esc(why)),
        Shown::Pending => {
            return "<p class=\"empty\">being verified (a long log's first pass): reload in a moment</p>"
                .to_string()
        }
        Shown::Checked(p) => p,
    };
    let age = format!(
        "{:.1} s ago, in {} ms",
        pass.at.elapsed().as_secs_f64(),
        pass.took.as_millis()
    );
    let r = match &pass.outcome {
        Ok(r) => r,
        Err(e) => {
            return format!(
                "<p class=\"bad\">could not be read: {}</p><p>checked {}</p>",
                esc(e),
                esc(&age)
            )
        }
    };
    let verdict = match (r.intact(), r.problems.first()) {
        (true, _) => "<span class=\"good\">intact</span>".to_string(),
        (false, Some(p)) => format!(
            "<span class=\"bad\">{}: {}</span>",
            esc(r.verdict.label()),
            esc(&p.message)
        ),
        (false, None) => format!("<span class=\"bad\">{}</span>", esc(r.verdict.label())),
    };
    let opt = |v: Option<u64>| v.map_or_else(|| "none".to_string(), |n| n.to_string());
    let rows = vec![
        vec!["verdict".into(), verdict],
        vec![
            "verified through line".into(),
            esc(&format!("{} (seq {})", r.lines, opt(r.last_seq))),
        ],
        vec![
            "last signed checkpoint".into(),
            esc(&format!("seq {}", opt(r.signed_through))),
        ],
        vec![
            "lines after it, not yet signed".into(),
            esc(&r.unsigned_tail.to_string()),
        ],
        vec!["checked".into(), esc(&age)],
    ];
    format!(
        "{}<p>Verified here as the log grows (only what it gained since the last look); \
<code>latchkey audit verify</code> checks a copy anywhere.</p>",
        html::table(&["", ""], &rows, "")
    )
}

fn error_cell(v: &serde_json::Value) -> String {
    match v.as_str() {
        Some(e) => format!("<pre class=\"bad\">{}</pre>", esc(e)),
        None => "none".to_string(),
    }
}

fn uptime(v: &serde_json::Value) -> String {
    let secs = v.as_u64().unwrap_or(0);
    esc(&humantime::format_duration(std::time::Duration::from_secs(secs)).to_string())
}

/// `/ui/limits`: what `GET /limits` carries, as tables.
pub async fn limits(
    proxy: &Proxy,
    live: &crate::audit::live::Live,
    signed: &Signed,
) -> Response<Body> {
    let l = crate::limits(proxy).await;
    let mut body = String::new();
    let store = match l["store"].as_str() {
        Some(s) => format!(
            "{} ({})",
            s,
            if l["embedded"].as_bool() == Some(true) {
                "this process"
            } else {
                "shared"
            }
        ),
        None => "no limits are charged".to_string(),
    };
    body.push_str(&format!("<p>Counters kept in: {}</p>", esc(&store)));
    let rows: Vec<Vec<String>> = each(&l["limits"])
        .map(|d| {
            ["name", "per", "summary", "on_store_error"]
                .iter()
                .map(|k| esc(&html::text(&d[*k])))
                .collect()
        })
        .collect();
    body.push_str("<h2>Limits in force</h2>");
    body.push_str(&html::table(
        &["limit", "per", "what", "store down"],
        &rows,
        "no [limits] in the policy",
    ));
    let heads = [
        "limit",
        "measure",
        "key",
        "used",
        "limit",
        "remaining",
        "reserved in flight",
        "resets",
    ];
    let keys = [
        "limit",
        "measure",
        "key",
        "used",
        "limit_value",
        "remaining",
        "reserved",
        "resets_at",
    ];
    let rows: Vec<Vec<String>> = each(&l["counters"])
        .map(|c| keys.iter().map(|k| esc(&html::text(&c[*k]))).collect())
        .collect();
    body.push_str("<h2>Counters</h2><p><label>Filter <input type=\"search\" data-filter=\"counters\"></label></p><div id=\"counters\">");
    body.push_str(&html::table(&heads, &rows, "nothing charged yet"));
    body.push_str("</div>");
    body.push_str(&spend_by_model(live));
    body.push_str("<h2>Prices</h2>");
    body.push_str(&html::fields(&l["prices"]));
    html::page(StatusCode::OK, "Limits", Some(signed), &body)
}

/// Every model-provider call this process wrote since it started, per provider and model.
fn spend_by_model(live: &crate::audit::live::Live) -> String {
    let spend = live.spend();
    let total: f64 = spend.iter().map(|(_, s)| s.cost).sum();
    let rows: Vec<Vec<String>> = spend
        .iter()
        .map(|((provider, model), s)| {
            vec![
                esc(provider),
                esc(model),
                s.calls.to_string(),
                s.input_tokens.to_string(),
                s.output_tokens.to_string(),
                format!("{:.4}", s.cost),
                s.unpriced.to_string(),
            ]
        })
        .collect();
    format!(
        "<h2>Spend by model</h2><p>Since this latchkey started (each replica counts its own): \
<strong>{:.4} USD</strong> in all, under the price table below.</p>{}",
        total,
        html::table(
            &[
                "provider",
                "model",
                "calls",
                "input tokens",
                "output tokens",
                "cost (USD)",
                "calls without a price"
            ],
            &rows,
            "no model-provider call yet",
        )
    )
}

fn each(v: &serde_json::Value) -> impl Iterator<Item = &serde_json::Value> {
    v.as_array().into_iter().flatten()
}

/// `/ui/policy`: the policy in force, the reach of the chosen identity, the diff form.
pub fn policy(proxy: &Proxy, signed: &Signed, query: &str) -> Response<Body> {
    let policy = proxy.policy();
    let reload = proxy.reload_state();
    let chosen = form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == "identity")
        .map(|(_, v)| v.into_owned());
    let mut body = String::from("<h2>In force</h2>");
    let files: Vec<String> = policy
        .files()
        .iter()
        .map(|f| f.display().to_string())
        .collect();
    let rows = vec![
        vec!["digest".into(), esc(policy.digest())],
        vec!["files".into(), esc(&files.join(", "))],
        vec![
            "last reload error".into(),
            error_cell(&serde_json::json!(reload.last_error)),
        ],
    ];
    body.push_str(&html::table(&["", ""], &rows, ""));
    body.push_str("<h2>Reach</h2><form method=\"get\" action=\"/ui/policy\"><label>Identity <select name=\"identity\">");
    let mut names: Vec<&str> = policy
        .identities()
        .iter()
        .map(|i| i.name.as_str())
        .collect();
    if names.is_empty() {
        names.push(crate::policy::DEFAULT_IDENTITY);
    }
    for n in &names {
        let sel = if chosen.as_deref() == Some(n) {
            " selected"
        } else {
            ""
        };
        body.push_str(&format!(
            "<option value=\"{v}\"{sel}>{v}</option>",
            v = esc(n)
        ));
    }
    body.push_str("</select></label> <button type=\"submit\">Show reach</button></form>");
    let mut status = StatusCode::OK;
    if let Some(name) = chosen {
        match crate::policy::reach::reach(&policy, &name) {
            Ok(r) => {
                body.push_str(&format!(
                    "<p>Reach of <strong>{}</strong>: <code>{}</code> (the <code>reach</code> its audit records carry)</p><pre>",
                    esc(&r.identity),
                    esc(&r.reach)
                ));
                for item in &r.items {
                    body.push_str(&esc(item));
                    body.push('\n');
                }
                body.push_str("</pre>");
            }
            Err(e) => {
                status = StatusCode::BAD_REQUEST;
                body.push_str(&format!("<p class=\"bad\">{}</p>", esc(&e.to_string())));
            }
        }
    }
    body.push_str(&format!(
        "<h2>Diff a candidate</h2><p>Paste a complete candidate policy (one TOML file), or choose the file: it is compared with the policy in force, \
as <code>latchkey diff</code> does. Nothing is changed: policy changes go through review.</p>\
<form method=\"post\" action=\"/ui/policy/diff\">{}<p><label>From a file <input type=\"file\" accept=\".toml,text/plain\" data-load=\"candidate\"></label></p>\
<textarea id=\"candidate\" name=\"candidate\" rows=\"16\" required></textarea>\
<p><button type=\"submit\">Compare</button></p></form>",
        html::csrf_field(signed)
    ));
    html::page(status, "Policy", Some(signed), &body)
}

/// `POST /ui/policy/diff`: the pasted candidate against the policy in force. Read-only.
pub fn policy_diff(
    proxy: &Arc<Proxy>,
    signed: &Signed,
    form: &HashMap<String, String>,
) -> Response<Body> {
    let text = form
        .get("candidate")
        .map(String::as_str)
        .unwrap_or_default();
    if text.trim().is_empty() {
        return html::message(
            StatusCode::BAD_REQUEST,
            "Nothing to compare",
            "paste a candidate policy in the candidate field",
            Some(signed),
            Some("/ui/policy"),
        );
    }
    let candidate = PolicySources::from_files(
        Path::new("candidate"),
        vec![(PathBuf::from("candidate/candidate.toml"), text.to_string())],
    )
    .and_then(|s| s.compile(SecretLoading::Skip));
    let candidate = match candidate {
        Ok(p) => p,
        Err(e) => {
            // Every problem, one per line, located in `candidate/candidate.toml`.
            let why = e.to_string();
            let body = format!(
                "<p class=\"bad\">The candidate does not load:</p><pre>{}</pre><p><a href=\"/ui/policy\">Back</a></p>",
                esc(&why)
            );
            return html::page(
                StatusCode::UNPROCESSABLE_ENTITY,
                "Policy diff",
                Some(signed),
                &body,
            );
        }
    };
    let in_force = proxy.policy();
    let d = crate::review::diff::diff((&in_force, "in force"), (&candidate, "candidate"));
    html::page(StatusCode::OK, "Policy diff", Some(signed), &diff_html(&d))
}

fn diff_html(d: &crate::review::diff::Diff) -> String {
    use crate::review::diff::Direction;
    let verdict = d.verdict();
    let class = if d.widening() > 0 {
        "widened"
    } else {
        "narrowed"
    };
    let mut out = format!(
        "<p>In force <code>{}</code> → candidate <code>{}</code></p><p class=\"{class}\"><strong>{}</strong></p>",
        esc(&d.old.policy),
        esc(&d.new.policy),
        esc(&verdict)
    );
    for id in &d.identities {
        out.push_str(&format!(
            "<h2>identity {} ({})</h2><ul>",
            esc(&id.identity),
            esc(id.status.as_str())
        ));
        for c in &id.changes {
            let (mark, class) = match c.direction {
                Direction::Widened => ("+", "widened"),
                Direction::Narrowed => ("−", "narrowed"),
            };
            out.push_str(&format!(
                "<li class=\"{class}\">{mark} {} <span class=\"direction\">({class})</span>",
                esc(&c.summary),
            ));
            if let (Some(rule), Some(origin)) = (&c.rule, &c.origin) {
                out.push_str(&format!(" — rule {}, {}", esc(rule), esc(origin)));
            }
            if let Some(e) = &c.example {
                out.push_str(&format!(
                    "<br><small>e.g. {} {}</small>",
                    esc(&e.method),
                    esc(&e.url)
                ));
            }
            out.push_str("</li>");
        }
        out.push_str("</ul>");
    }
    out.push_str("<p><a href=\"/ui/policy\">Back</a></p>");
    out
}
