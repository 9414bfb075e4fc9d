//! The console's HTML: the one escaper every shown value goes through, the shared layout (nav
//! bar, who is signed in, sign-out), the headers every `/ui` response carries, and the two
//! assets compiled into the binary.

use http::header::{HeaderName, HeaderValue};
use http::{Response, StatusCode};

use super::Signed;
use crate::{respond, Body};

/// `s` safe as HTML text and as a double-quoted attribute value.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const CSS: &str = include_str!("assets/console.css");
const JS: &str = include_str!("assets/console.js");
const ICON: &str = include_str!("assets/favicon.svg");

/// The pages the nav bar lists: (path, label).
const NAV: &[(&str, &str)] = &[
    ("/ui", "Overview"),
    ("/ui/traffic", "Traffic"),
    ("/ui/approvals", "Approvals"),
    ("/ui/sessions", "Sessions"),
    ("/ui/limits", "Limits"),
    ("/ui/policy", "Policy"),
];

/// The headers every `/ui` response carries: a strict CSP (no inline script or style, nothing
/// from elsewhere), no framing, no sniffing, no referrer, no caching.
pub fn secure(res: &mut Response<Body>) {
    let h = res.headers_mut();
    for (name, value) in [
        (
            "content-security-policy",
            "default-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'; object-src 'none'",
        ),
        ("x-content-type-options", "nosniff"),
        // same-origin, not no-referrer: under no-referrer a browser sends `Origin: null` with
        // every form, which the origin check (rightly) refuses. Nothing here links elsewhere.
        ("referrer-policy", "same-origin"),
        ("x-frame-options", "DENY"),
        ("cache-control", "no-store"),
    ] {
        h.insert(
            HeaderName::from_static(name),
            HeaderValue::from_static(value),
        );
    }
}

/// `/ui/assets/NAME`, when it is one of the console's.
pub fn asset(path: &str) -> Option<Response<Body>> {
    match path {
        "/ui/assets/console.css" => Some(respond(StatusCode::OK, "text/css; charset=utf-8", CSS)),
        "/ui/assets/console.js" => Some(respond(
            StatusCode::OK,
            "text/javascript; charset=utf-8",
            JS,
        )),
        // Named by every page, so the browser never asks /favicon.ico (an admin API path).
        "/ui/assets/favicon.svg" => Some(respond(StatusCode::OK, "image/svg+xml", ICON)),
        _ => None,
    }
}

/// The hidden field every state-changing form carries.
pub fn csrf_field(signed: &Signed) -> String {
    format!(
        "<input type=\"hidden\" name=\"csrf\" value=\"{}\">",
        esc(&signed.csrf)
    )
}

/// A page in the shared layout; `body` is HTML already escaped.
pub fn page(
    status: StatusCode,
    title: &str,
    signed: Option<&Signed>,
    body: &str,
) -> Response<Body> {
    page_with_head(status, title, signed, body, "")
}

/// [`page`] with `head` (HTML already escaped) added to its `<head>`.
pub fn page_with_head(
    status: StatusCode,
    title: &str,
    signed: Option<&Signed>,
    body: &str,
    head: &str,
) -> Response<Body> {
    let mut nav = String::new();
    if let Some(s) = signed {
        nav.push_str("<nav><ul>");
        for (path, label) in NAV {
            nav.push_str(&format!("<li><a href=\"{path}\">{label}</a></li>"));
        }
        nav.push_str("</ul><div class=\"who\">");
        let scopes: Vec<&str> = s.scopes.iter().map(|s| s.as_str()).collect();
        nav.push_str(&format!(
            "signed in as <strong>{}</strong> <span class=\"scopes\">({})</span>",
            esc(&s.name),
            esc(&scopes.join(", "))
        ));
        nav.push_str(&format!(
            "<form method=\"post\" action=\"/ui/logout\">{}<button type=\"submit\">Sign out</button></form></div></nav>",
            csrf_field(s)
        ));
    }
    let html = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"robots\" content=\"noindex\">\
<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>latchkey: {t}</title>\
{head}<link rel=\"icon\" href=\"/ui/assets/favicon.svg\" type=\"image/svg+xml\"><link rel=\"stylesheet\" href=\"/ui/assets/console.css\"><script src=\"/ui/assets/console.js\" defer></script></head>\
<body><header><span class=\"brand\">latchkey</span>{nav}</header><main><h1>{t}</h1>{body}</main></body></html>\n",
        t = esc(title),
    );
    respond(status, "text/html; charset=utf-8", html)
}

/// A page that says one thing (an error, a result), with a link back.
pub fn message(
    status: StatusCode,
    title: &str,
    text: &str,
    signed: Option<&Signed>,
    back: Option<&str>,
) -> Response<Body> {
    let mut body = format!("<p class=\"message\">{}</p>", esc(text));
    if let Some(back) = back {
        body.push_str(&format!("<p><a href=\"{}\">Back</a></p>", esc(back)));
    }
    page(status, title, signed, &body)
}

/// A table; `rows`' cells are HTML already escaped. An empty table says `empty`.
pub fn table(heads: &[&str], rows: &[Vec<String>], empty: &str) -> String {
    if rows.is_empty() {
        return format!("<p class=\"empty\">{}</p>", esc(empty));
    }
    let mut out = String::from("<table><thead><tr>");
    for h in heads {
        out.push_str(&format!("<th>{}</th>", esc(h)));
    }
    out.push_str("</tr></thead><tbody>");
    for row in rows {
        out.push_str("<tr>");
        for cell in row {
            out.push_str(&format!("<td>{cell}</td>"));
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table>");
    out
}

/// A JSON value as text: strings bare, `null` as `—`, the rest as JSON.
pub fn text(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "—".to_string(),
        other => other.to_string(),
    }
}

/// A JSON object as a two-column table of its keys and (escaped) values; nested objects nest.
pub fn fields(v: &serde_json::Value) -> String {
    let Some(map) = v.as_object() else {
        return esc(&text(v));
    };
    let rows: Vec<Vec<String>> = map
        .iter()
        .map(|(k, v)| {
            let value = if v.is_object() {
                fields(v)
            } else {
                esc(&text(v))
            };
            vec![esc(k), value]
        })
        .collect();
    table(&["", ""], &rows, "nothing")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_escaper_leaves_no_markup_or_attribute_break() {
        assert_eq!(
            esc("<a href=\"x\" onclick='y'>&</a>"),
            "&lt;a href=&quot;x&quot; onclick=&#39;y&#39;&gt;&amp;&lt;/a&gt;"
        );
    }
}
