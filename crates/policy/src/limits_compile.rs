//! Validation of the limits keys: the `[limits.NAME]` tables, the `limits = [...]` lists on
//! rules, identities and credentials that attach them, and the `[prices."MODEL"]` tables over
//! the shipped price table. Every problem is reported at its `file:line:col` with the field it
//! concerns; only a table with none becomes a [`Limit`].
//!
//! Policy only: how a request is charged and where counters live is `governance::limits`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use toml::Spanned;

use super::compile::{line_col, FileCx, PolicyError};
use super::limits::{
    parse_bytes, parse_on_store_error, parse_per, parse_rate, parse_spend, parse_tokens,
    shipped_prices, Concurrency, Limit, OnStoreError, Per, DEFAULT_RESERVE_TOKENS, MAX_CONCURRENCY,
    MAX_QUEUE, MAX_RESERVE_TOKENS,
};
use super::prices::{Price, PriceTable};
use super::schema::{Entry, LimitList, RawLimit, RawPolicyFile, RawPrice};
use super::Origin;

/// What `limits = [...]` lists resolve against: every `[limits.NAME]` declared (valid or not,
/// so a broken one is reported once, not again at each list naming it), with the measures of
/// those that compiled that need to see request bodies.
#[derive(Debug, Default)]
pub(super) struct LimitNames {
    declared: BTreeMap<String, Option<Vec<&'static str>>>,
}

impl LimitNames {
    fn list(&self) -> String {
        if self.declared.is_empty() {
            return "the policy declares none".to_string();
        }
        let names: Vec<&str> = self.declared.keys().map(String::as_str).collect();
        format!("declared: {}", names.join(", "))
    }
}

/// Compiles every file's `[limits.NAME]` tables: the valid limits, sorted by name, and every
/// declared name.
pub(super) fn compile_limits(
    parsed: &mut [(&Path, &str, RawPolicyFile)],
    errors: &mut Vec<PolicyError>,
) -> (Vec<Limit>, LimitNames) {
    let mut limits = Vec::new();
    let mut names = LimitNames::default();
    let mut first_at: BTreeMap<String, Origin> = BTreeMap::new();
    for (file, text, raw) in parsed.iter_mut() {
        let mut cx = FileCx {
            file,
            text,
            errors: &mut *errors,
        };
        for (name, entry) in std::mem::take(&mut raw.limits) {
            let d = cx.declare("limits", "limit", name, &mut first_at);
            let name = d.name;
            if d.unique {
                names.declared.insert(name.clone(), None);
            }
            let limit = cx.limit(&d.field, &name, entry, d.origin);
            if let (true, Some(limit)) = (d.unique, limit) {
                let body: Vec<&'static str> = limit
                    .measures()
                    .into_iter()
                    .filter(|m| m.meters_body())
                    .map(|m| m.as_str())
                    .collect();
                names.declared.insert(name, Some(body));
                limits.push(limit);
            }
        }
    }
    limits.sort_by(|a, b| a.name.cmp(&b.name));
    (limits, names)
}

/// Compiles every file's `[prices."MODEL"]` over the shipped table. Model names are matched
/// without regard to case, so they are stored lowercased; one model priced twice is an error.
pub(super) fn compile_prices(
    parsed: &mut [(&Path, &str, RawPolicyFile)],
    errors: &mut Vec<PolicyError>,
) -> PriceTable {
    let mut overrides: Vec<(String, Price)> = Vec::new();
    let mut first_at: BTreeMap<String, Origin> = BTreeMap::new();
    for (file, text, raw) in parsed.iter_mut() {
        let mut cx = FileCx {
            file,
            text,
            errors: &mut *errors,
        };
        for (name, entry) in std::mem::take(&mut raw.prices) {
            let name_span = name.span();
            let model = name.get_ref().trim().to_ascii_lowercase();
            // Like the reader's own messages (`prices.gpt-4o: missing key`), unquoted.
            let field = format!("prices.{}", name.get_ref());
            let origin = Origin {
                file: file.to_path_buf(),
                line: line_col(text, name_span.start).0,
            };
            let why = if model.is_empty() {
                Some("an empty model name".to_string())
            } else if model.len() > 128 {
                Some("a model name is at most 128 bytes".to_string())
            } else if model.chars().any(|c| c.is_whitespace() || c.is_control()) {
                Some("a model name has no spaces or control characters".to_string())
            } else if let Some(rest) = model.strip_prefix("models/") {
                Some(format!(
                    "write the model without Gemini's \"models/\" prefix: [prices.{rest:?}]"
                ))
            } else {
                first_at.get(&model).map(|first| {
                    format!("model {model:?} is priced twice (names ignore case), first at {first}")
                })
            };
            if let Some(why) = &why {
                cx.error(name_span, format!("{field}: {why}"));
            } else {
                first_at.insert(model.clone(), origin);
            }
            if let (None, Some(price)) = (why, cx.price(&field, entry)) {
                overrides.push((model, price));
            }
        }
    }
    shipped_prices().with_overrides(overrides)
}

impl FileCx<'_> {
    /// Validates one `[limits.NAME]`; `None` if it has a problem (recorded).
    fn limit(
        &mut self,
        field: &str,
        name: &str,
        entry: Entry<RawLimit>,
        origin: Origin,
    ) -> Option<Limit> {
        let before = self.errors.len();
        let raw = entry.raw;
        let at = |key: &str| format!("{field}.{key}");
        fn value<T>(
            cx: &mut FileCx<'_>,
            at: String,
            v: &Option<Spanned<String>>,
            parse: fn(&str) -> Result<T, String>,
        ) -> Option<T> {
            let v = v.as_ref()?;
            match parse(v.get_ref().trim()) {
                Ok(x) => Some(x),
                Err(why) => {
                    cx.error(v.span(), format!("{at}: {why}"));
                    None
                }
            }
        }
        let per = value(self, at("per"), &raw.per, parse_per);
        let on_store_error = value(
            self,
            at("on_store_error"),
            &raw.on_store_error,
            parse_on_store_error,
        );
        let requests = value(self, at("requests"), &raw.requests, parse_rate);
        let bytes_up = value(self, at("bytes_up"), &raw.bytes_up, parse_bytes);
        let llm_tokens = value(self, at("llm_tokens"), &raw.llm_tokens, parse_tokens);
        let spend = value(self, at("spend"), &raw.spend, parse_spend);

        let (max, queue) = self.concurrency(field, &raw);
        let reserve_tokens = self.reserve_tokens(field, &raw);
        // Written, valid or not: a mistyped measure is reported as that, not as a missing one.
        let any = raw.keys.iter().any(|k| {
            matches!(
                *k,
                "requests" | "concurrency" | "bytes_up" | "llm_tokens" | "spend"
            )
        });
        if !any {
            self.error(
                entry.span.clone(),
                format!("{field}: a limit needs at least one of requests, concurrency, bytes_up, llm_tokens or spend"),
            );
        }
        if !entry.complete || self.errors.len() > before {
            return None;
        }
        Some(Limit {
            name: name.to_string(),
            per: per.unwrap_or(Per::Identity),
            requests,
            concurrency: max.map(|max| Concurrency {
                max,
                queue: queue.unwrap_or_default(),
            }),
            bytes_up,
            llm_tokens,
            spend,
            on_store_error: on_store_error.unwrap_or(OnStoreError::Deny),
            reserve_tokens: reserve_tokens?,
            include_usage: raw.include_usage.is_some_and(|i| *i.get_ref()),
            origin,
        })
    }

    /// `concurrency` (1 to [`MAX_CONCURRENCY`]) and its `queue` (at most [`MAX_QUEUE`]; zero
    /// without one).
    fn concurrency(&mut self, field: &str, raw: &RawLimit) -> (Option<u32>, Option<Duration>) {
        let at = |key: &str| format!("{field}.{key}");
        let max = raw
            .concurrency
            .as_ref()
            .and_then(|c| match u32::try_from(*c.get_ref()) {
                Ok(n) if (1..=MAX_CONCURRENCY).contains(&n) => Some(n),
                _ => {
                    let why = if *c.get_ref() == 0 {
                        "0 admits nothing: remove the rule instead, or allow at least 1".to_string()
                    } else {
                        format!("{} is not 1 to {MAX_CONCURRENCY}", c.get_ref())
                    };
                    self.error(c.span(), format!("{}: {why}", at("concurrency")));
                    None
                }
            });
        let queue = match &raw.queue {
            None => Some(Duration::ZERO),
            Some(q) if raw.concurrency.is_none() => {
                self.error(
                    q.span(),
                    format!("{}: queue is how long a request waits for a concurrency slot; set concurrency, or remove queue", at("queue")),
                );
                None
            }
            Some(q) => match humantime::parse_duration(q.get_ref().trim()) {
                Ok(d) if d <= MAX_QUEUE => Some(d),
                Ok(_) => {
                    self.error(
                        q.span(),
                        format!(
                            "{}: {:?} is longer than {}: a queued request holds its client's connection open",
                            at("queue"),
                            q.get_ref(),
                            humantime::format_duration(MAX_QUEUE)
                        ),
                    );
                    None
                }
                Err(_) => {
                    self.error(
                        q.span(),
                        format!(
                            "{}: {:?} is not a duration like \"5s\" or \"500ms\" (\"0s\" refuses at once)",
                            at("queue"),
                            q.get_ref()
                        ),
                    );
                    None
                }
            },
        };
        (max, queue)
    }

    /// `reserve_tokens` (and `include_usage`), which only a limit metering model-provider
    /// usage (`llm_tokens` or `spend`) takes.
    fn reserve_tokens(&mut self, field: &str, raw: &RawLimit) -> Option<u64> {
        let at = |key: &str| format!("{field}.{key}");
        let meters_llm = raw.llm_tokens.is_some() || raw.spend.is_some();
        let needs_llm = |key: &str| {
            format!(
                "{}: {key} applies to model-provider usage; set llm_tokens or spend, or remove {key}",
                at(key)
            )
        };
        let reserve_tokens = match &raw.reserve_tokens {
            None => Some(DEFAULT_RESERVE_TOKENS),
            Some(r) if !meters_llm => {
                self.error(r.span(), needs_llm("reserve_tokens"));
                None
            }
            Some(r) => match u64::try_from(*r.get_ref()) {
                Ok(n) if (1..=MAX_RESERVE_TOKENS).contains(&n) => Some(n),
                _ => {
                    self.error(
                        r.span(),
                        format!(
                            "{}: {} is not 1 to {MAX_RESERVE_TOKENS} tokens",
                            at("reserve_tokens"),
                            r.get_ref()
                        ),
                    );
                    None
                }
            },
        };
        if let (Some(i), false) = (&raw.include_usage, meters_llm) {
            self.error(i.span(), needs_llm("include_usage"));
        }
        reserve_tokens
    }

    /// Validates one `[prices."MODEL"]`; `None` if it has a problem (recorded).
    fn price(&mut self, field: &str, entry: Entry<RawPrice>) -> Option<Price> {
        let before = self.errors.len();
        let raw = entry.raw;
        let mut usd = |key: &str, v: &Option<Spanned<f64>>| {
            let v = v.as_ref()?;
            let x = *v.get_ref();
            if x.is_finite() && x >= 0.0 {
                Some(x)
            } else {
                self.error(
                    v.span(),
                    format!("{field}.{key}: {x} is not a price: USD per million tokens, 0 or more"),
                );
                None
            }
        };
        let input = usd("input", &raw.input);
        let output = usd("output", &raw.output);
        let cached_input = usd("cached_input", &raw.cached_input);
        if !entry.complete || self.errors.len() > before {
            return None;
        }
        Some(Price {
            input: input?,
            output: output?,
            cached_input,
        })
    }

    /// Validates a `limits = ["NAME", …]` list at `field`: each a declared limit, each once,
    /// and (on a tunnel rule) none that meters what a tunnel hides.
    pub(super) fn limit_list(
        &mut self,
        field: &str,
        list: LimitList,
        known: &LimitNames,
        tunnel: bool,
    ) -> Vec<String> {
        let Some(list) = list else {
            return Vec::new();
        };
        if list.get_ref().is_empty() {
            self.error(
                list.span(),
                format!("{field}: an empty list charges nothing; remove the key"),
            );
        }
        let mut out: Vec<String> = Vec::new();
        for (i, n) in list.into_inner().into_iter().enumerate() {
            let at = format!("{field}[{i}]");
            let name = n.get_ref().as_str();
            match known.declared.get(name) {
                None => self.error(
                    n.span(),
                    format!(
                        "{at}: unknown limit {name:?}; {}{}",
                        known.list(),
                        super::did_you_mean(name, known.declared.keys().map(String::as_str))
                    ),
                ),
                Some(_) if out.iter().any(|o| o == name) => self.error(
                    n.span(),
                    format!("{at}: limit {name:?} is listed twice"),
                ),
                Some(Some(body)) if tunnel && !body.is_empty() => self.error(
                    n.span(),
                    format!(
                        "{at}: limit {name:?} meters {}, which latchkey cannot see in a tunnel (it relays encrypted bytes); a tunnel rule takes limits with only requests, concurrency (they count CONNECTs) or bytes_up (the bytes relayed upstream)",
                        body.join(" and ")
                    ),
                ),
                Some(_) => out.push(name.to_string()),
            }
        }
        out
    }
}
