//! The admin API's OpenAPI document (`crates/admin/openapi.json`) as a test oracle: which
//! documented operation a request is, and whether an answer is one the document allows: its
//! status listed for that path and method, its content type one of that response's, its
//! required headers present, and its body valid against the response's schema (JSON bodies as
//! JSON, text bodies as a JSON string).
//!
//! Schemas are JSON Schema 2020-12 (OpenAPI 3.1). A schema is validated inside a wrapper that
//! carries the document's `components`, so `#/components/schemas/X` references resolve.
//! A method a path does not list is checked against the path's `x-latchkey-other-methods`.
//!
//! [`Api`] calls the admin API and checks every answer, with a token per scope
//! ([`scoped_tokens_toml`]): the one with only the scope an operation documents, or the one
//! with every other scope.

use std::collections::BTreeSet;
use std::sync::Mutex;

use serde_json::{json, Value};

use super::approvals::{http_call, ADMIN_TOKEN};
use super::clients::RawResponse;
use super::latchkey::LatchkeyBuilder;

/// The checked-in document.
pub const DOC_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/crates/admin/openapi.json");

/// The HTTP methods an OpenAPI path item may list, as its keys spell them.
pub const METHODS: &[&str] = &[
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

/// The document, and which (path, method, status) answers were checked against it.
pub struct Spec {
    pub doc: Value,
    pub text: String,
    seen: Mutex<BTreeSet<(String, String, u16)>>,
}

impl Spec {
    /// Reads and parses the checked-in document.
    pub fn load() -> Spec {
        let text =
            std::fs::read_to_string(DOC_PATH).unwrap_or_else(|e| panic!("read {DOC_PATH}: {e}"));
        Spec::parse(&text)
    }

    pub fn parse(text: &str) -> Spec {
        let doc: Value =
            serde_json::from_str(text).unwrap_or_else(|e| panic!("{DOC_PATH} is not JSON: {e}"));
        Spec {
            doc,
            text: text.to_string(),
            seen: Mutex::new(BTreeSet::new()),
        }
    }

    /// Every path template the document has.
    pub fn paths(&self) -> BTreeSet<String> {
        self.doc["paths"]
            .as_object()
            .expect("the document has paths")
            .keys()
            .cloned()
            .collect()
    }

    /// Every (path template, METHOD) the document lists.
    pub fn operations(&self) -> BTreeSet<(String, String)> {
        let mut out = BTreeSet::new();
        for (path, item) in self.doc["paths"].as_object().expect("paths") {
            for m in METHODS {
                if item.get(*m).is_some() {
                    out.insert((path.clone(), m.to_uppercase()));
                }
            }
        }
        out
    }

    /// The template `path` (a query, if any, is ignored) is an instance of: an exact path
    /// first, else one whose `{param}` segments each match one non-empty segment.
    pub fn template_of(&self, path: &str) -> Option<String> {
        let path = path.split('?').next().unwrap_or_default();
        let paths = self.paths();
        if paths.contains(path) {
            return Some(path.to_string());
        }
        let segments: Vec<&str> = path.split('/').collect();
        paths.into_iter().find(|t| {
            let ts: Vec<&str> = t.split('/').collect();
            ts.len() == segments.len()
                && ts.iter().zip(&segments).all(|(t, s)| {
                    *t == *s || (t.starts_with('{') && t.ends_with('}') && !s.is_empty())
                })
        })
    }

    /// The operation `METHOD path` is, if the document lists it.
    pub fn operation(&self, method: &str, path: &str) -> Option<&Value> {
        let template = self.template_of(path)?;
        self.doc["paths"][&template].get(method.to_lowercase())
    }

    /// The scope `METHOD path` needs (`x-latchkey-scope`); `None` when it needs no token.
    pub fn scope(&self, method: &str, path: &str) -> Option<String> {
        let op = self
            .operation(method, path)
            .unwrap_or_else(|| panic!("{method} {path} is not a documented operation"));
        op.get("x-latchkey-scope")
            .and_then(Value::as_str)
            .map(str::to_string)
    }

    /// Follows `$ref`s (`#/…` pointers into the document) until a non-reference.
    pub fn resolve<'a>(&'a self, mut v: &'a Value) -> &'a Value {
        for _ in 0..16 {
            let Some(r) = v.get("$ref").and_then(Value::as_str) else {
                return v;
            };
            let pointer = r
                .strip_prefix('#')
                .unwrap_or_else(|| panic!("external reference {r:?} in the document"));
            v = self
                .doc
                .pointer(pointer)
                .unwrap_or_else(|| panic!("reference {r:?} points at nothing"));
        }
        panic!("a reference cycle in the document")
    }

    /// Validates `instance` against `schema` (a schema of the document, references and all).
    pub fn validate(&self, schema: &Value, instance: &Value) -> Result<(), String> {
        let validator = self.compile(schema)?;
        let errors: Vec<String> = validator
            .iter_errors(instance)
            .map(|e| format!("at {:?}: {e}", e.instance_path().as_str()))
            .collect();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("\n"))
        }
    }

    /// A validator of `schema` (a schema of the document): the schema in a wrapper carrying the
    /// document's `components`, so its `#/components/...` references resolve. Formats
    /// (`date-time`) are checked.
    pub fn compile(&self, schema: &Value) -> Result<jsonschema::Validator, String> {
        let wrapper = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "allOf": [schema],
            "components": self.doc["components"],
        });
        jsonschema::options()
            .should_validate_formats(true)
            .build(&wrapper)
            .map_err(|e| format!("the schema {schema} does not compile: {e}"))
    }

    /// The response the document gives for `status` to `METHOD path` (the path's
    /// `x-latchkey-other-methods` for a method it does not list).
    fn documented(&self, method: &str, path: &str, status: u16) -> Result<&Value, String> {
        let template = self
            .template_of(path)
            .ok_or_else(|| format!("{path} is not a documented path"))?;
        let item = &self.doc["paths"][&template];
        let op = item
            .get(method.to_lowercase())
            .or_else(|| item.get("x-latchkey-other-methods"))
            .ok_or_else(|| format!("{method} {template} is not documented"))?;
        op["responses"]
            .get(status.to_string())
            .map(|r| self.resolve(r))
            .ok_or_else(|| {
                format!(
                    "status {status} is not documented for {method} {template} (documented: {:?})",
                    op["responses"]
                        .as_object()
                        .map(|o| o.keys().collect::<Vec<_>>())
                        .unwrap_or_default()
                )
            })
    }

    /// Whether `resp` (the answer to `METHOD path`) is one the document allows; records it as
    /// seen when it is.
    pub fn check(&self, method: &str, path: &str, resp: &RawResponse) -> Result<(), String> {
        let documented = self.documented(method, path, resp.status)?;
        for (name, header) in documented["headers"].as_object().into_iter().flatten() {
            let required = header["required"].as_bool().unwrap_or(false);
            match resp.header(name) {
                Some(v) => self
                    .validate(&header["schema"], &Value::from(v))
                    .map_err(|e| format!("header {name}: {e}"))?,
                None if required => return Err(format!("no {name} header")),
                None => {}
            }
        }
        let content_type = resp.header("content-type");
        match documented["content"].as_object() {
            None => {
                if !resp.body.is_empty() || content_type.is_some() {
                    return Err(format!(
                        "the document gives {} no content, but it has {content_type:?}: {:?}",
                        resp.status,
                        resp.text()
                    ));
                }
            }
            Some(content) => {
                let ct = content_type.ok_or("no content-type")?;
                let media = content.get(ct).ok_or_else(|| {
                    format!(
                        "content-type {ct:?} is not documented for {} (documented: {:?})",
                        resp.status,
                        content.keys().collect::<Vec<_>>()
                    )
                })?;
                let body = if ct == "application/json" {
                    serde_json::from_slice(&resp.body)
                        .map_err(|e| format!("the body is not JSON: {e}"))?
                } else {
                    Value::from(
                        String::from_utf8(resp.body.clone())
                            .map_err(|e| format!("the body is not UTF-8: {e}"))?,
                    )
                };
                self.validate(&media["schema"], &body)
                    .map_err(|e| format!("the body does not match the schema:\n{e}"))?;
            }
        }
        let template = self.template_of(path).unwrap_or_default();
        self.seen
            .lock()
            .expect("seen")
            .insert((template, method.to_uppercase(), resp.status));
        Ok(())
    }

    /// Panics unless `resp` is an answer the document allows to `METHOD path`.
    pub fn assert(&self, method: &str, path: &str, resp: &RawResponse) {
        if let Err(why) = self.check(method, path, resp) {
            panic!("{method} {path}: the answer does not match {DOC_PATH}: {why}\n{resp:#?}");
        }
    }

    /// Every (path template, METHOD, status) checked so far.
    pub fn seen(&self) -> BTreeSet<(String, String, u16)> {
        self.seen.lock().expect("seen").clone()
    }
}

// ---------------------------------------------------------------------------------------------
// A client of the admin API that checks every answer against the document, with a token per
// scope

/// The scopes of `[admin.tokens.NAME]`, as `scope_for` in `crates/admin/src/lib.rs` uses them.
pub const SCOPES: &[&str] = &["read", "sessions:write", "approvals:answer", "reload"];

/// The token names' part for `scope`: `only-X` has just that scope, `not-X` every other.
fn short(scope: &str) -> &'static str {
    match scope {
        "read" => "read",
        "sessions:write" => "sessions",
        "approvals:answer" => "answer",
        "reload" => "reload",
        other => panic!("unknown scope {other:?}"),
    }
}

/// The value of token `name` (set in latchkey's environment by [`with_scoped_tokens`]).
fn token_value(name: &str) -> String {
    format!("adm-{name}-5b8e1d0c7f3a9246")
}

/// `[admin.tokens.only-X]` and `[admin.tokens.not-X]` for every scope X.
pub fn scoped_tokens_toml() -> String {
    let mut out = String::new();
    for scope in SCOPES {
        let others: Vec<String> = SCOPES
            .iter()
            .filter(|s| *s != scope)
            .map(|s| format!("{s:?}"))
            .collect();
        for (name, scopes) in [
            (format!("only-{}", short(scope)), format!("{scope:?}")),
            (format!("not-{}", short(scope)), others.join(", ")),
        ] {
            let var = name.to_uppercase().replace('-', "_");
            out.push_str(&format!(
                "[admin.tokens.{name}]\ntoken = \"env:TOK_{var}\"\nscopes = [{scopes}]\n\n"
            ));
        }
    }
    out
}

/// The values of [`scoped_tokens_toml`]'s tokens in latchkey's environment, and
/// `--admin-token env:LK_ADMIN_TOKEN` (every scope; `ask_world` sets the variable).
pub fn with_scoped_tokens(mut b: LatchkeyBuilder) -> LatchkeyBuilder {
    for scope in SCOPES {
        for name in [
            format!("only-{}", short(scope)),
            format!("not-{}", short(scope)),
        ] {
            let var = format!("TOK_{}", name.to_uppercase().replace('-', "_"));
            b = b.env(&var, &token_value(&name));
        }
    }
    b.arg("--admin-token").arg("env:LK_ADMIN_TOKEN")
}

/// Who calls.
#[derive(Clone, Copy, Debug)]
pub enum Tok {
    /// No `Authorization`.
    None,
    /// A token latchkey does not know.
    Wrong,
    /// `--admin-token`: every scope.
    Full,
    /// The token with only the scope the document names for the operation (none when the
    /// operation needs no token).
    Scoped,
    /// The token with every scope but the one the document names.
    Lacking,
}

/// A request body.
pub enum Body<'a> {
    Empty,
    /// `application/json`.
    Json(Value),
    /// `application/x-www-form-urlencoded`.
    Form(&'a str),
    /// As is, with no content type.
    Raw(&'a str),
}

/// The admin API with the document beside it: every call's answer is checked against it.
pub struct Api {
    pub addr: std::net::SocketAddr,
    pub spec: Spec,
}

impl Api {
    fn token(&self, tok: Tok, method: &str, path: &str) -> Option<String> {
        let scope = || self.spec.scope(method, path);
        match tok {
            Tok::None => None,
            Tok::Wrong => Some("adm-nobody-0000000000000000".to_string()),
            Tok::Full => Some(ADMIN_TOKEN.to_string()),
            Tok::Scoped => scope().map(|s| token_value(&format!("only-{}", short(&s)))),
            Tok::Lacking => scope().map(|s| token_value(&format!("not-{}", short(&s)))),
        }
    }

    /// `METHOD path` as `tok`, its answer checked against the document (and, as its
    /// description says, `Cache-Control: no-store` on every answer but a 204).
    pub fn call(&self, tok: Tok, method: &str, path: &str, body: Body<'_>) -> RawResponse {
        let resp = self.unchecked(tok, method, path, body);
        self.spec.assert(method, path, &resp);
        if resp.status != 204 {
            assert_eq!(
                resp.header("cache-control"),
                Some("no-store"),
                "{method} {path}: {resp:#?}"
            );
        }
        resp
    }

    /// `METHOD path` as `tok`, its answer not checked.
    pub fn unchecked(&self, tok: Tok, method: &str, path: &str, body: Body<'_>) -> RawResponse {
        let bearer = self.token(tok, method, path).map(|t| format!("Bearer {t}"));
        let mut headers: Vec<(&str, &str)> = Vec::new();
        if let Some(b) = &bearer {
            headers.push(("Authorization", b));
        }
        let text = match body {
            Body::Empty => String::new(),
            Body::Json(v) => {
                headers.push(("Content-Type", "application/json"));
                v.to_string()
            }
            Body::Form(s) => {
                headers.push(("Content-Type", "application/x-www-form-urlencoded"));
                s.to_string()
            }
            Body::Raw(s) => s.to_string(),
        };
        http_call(self.addr, method, path, &headers, text.as_bytes())
    }

    /// `METHOD path` with the documented scope's token, asserted `status`; the JSON body
    /// (`Null` when it is not JSON).
    pub fn expect(&self, status: u16, method: &str, path: &str, body: Body<'_>) -> Value {
        let tok = if self.spec.operation(method, path).is_some() {
            Tok::Scoped
        } else {
            Tok::Full
        };
        let resp = self.call(tok, method, path, body);
        assert_eq!(resp.status, status, "{method} {path}: {resp:#?}");
        serde_json::from_slice(&resp.body).unwrap_or(Value::Null)
    }
}
