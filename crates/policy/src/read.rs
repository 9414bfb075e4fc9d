//! Reading a spanned TOML table key by key: each value is checked for its type on its own, and
//! every problem is reported at the key or value it concerns.

use std::ops::Range;

use toml::Spanned;
use toml_edit::{Item, TableLike, Value};

use super::schema::{
    Claims, Report, StringMap, ADMIN_TOKEN_KEYS, ATTEST_KEYS, CREDENTIAL_KEYS, IDENTITY_KEYS,
    LIMIT_KEYS, NOTIFY_KEYS, OIDC_ROLE_KEYS, PRICE_KEYS, PROFILE_KEYS, RULE_KEYS, SECRET_KEYS,
};

/// A named table (`[secrets.NAME]`): the name, and the table or (if it is not one) its span.
pub(super) type Named<'a> = (Spanned<String>, Result<Fields<'a>, Range<usize>>);

/// A table of the document (a `[header]` table or an inline one), read key by key.
pub struct Fields<'a> {
    table: &'a dyn TableLike,
    pub span: Range<usize>,
    /// `rules[0]`, `secrets.openai`; empty at the top level.
    path: String,
    /// False when a key was unknown.
    pub(super) complete: bool,
}

impl<'a> Fields<'a> {
    /// Reports every key of `table` not in `known`, at the key, with the closest known key.
    pub fn new(
        table: &'a dyn TableLike,
        span: Range<usize>,
        path: String,
        known: &[&str],
        r: &mut dyn Report,
    ) -> Self {
        let mut complete = true;
        for (key, item) in table.iter() {
            if known.contains(&key) {
                continue;
            }
            complete = false;
            let at = table
                .get_key_value(key)
                .and_then(|(k, _)| k.span())
                .or_else(|| item.span())
                .unwrap_or_else(|| span.clone());
            let hint = match closest(key, known) {
                Some(k) => format!("did you mean `{k}`?"),
                None => format!("known keys: {}", known.join(", ")),
            };
            let what = if path.is_empty() {
                format!("unknown top-level key `{key}`")
            } else {
                format!("{path}: unknown key `{key}`")
            };
            r.error(at, format!("{what}; {hint}"));
        }
        Fields {
            table,
            span,
            path,
            complete,
        }
    }

    /// `rules[0]`, `deny[1]`: how this table's messages name it.
    pub(super) fn path(&self) -> &str {
        &self.path
    }

    fn at(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    /// A key's value and its span (the value's, else the key's).
    pub(super) fn get(&self, key: &str) -> Option<(Range<usize>, &'a Item)> {
        let (k, item) = self.table.get_key_value(key)?;
        if item.is_none() {
            return None;
        }
        let span = item
            .span()
            .or_else(|| k.span())
            .unwrap_or_else(|| self.span.clone());
        Some((span, item))
    }

    /// Like a reader, but a missing key is an error at the table.
    pub fn required<T>(
        &self,
        r: &mut dyn Report,
        key: &str,
        read: impl FnOnce(&Self, &mut dyn Report, &str) -> Option<T>,
    ) -> Option<T> {
        if self.get(key).is_none() {
            let what = if self.path.is_empty() {
                format!("missing top-level key `{key}`")
            } else {
                format!("{}: missing key `{key}`", self.path)
            };
            r.error(self.span.clone(), what);
            return None;
        }
        read(self, r, key)
    }

    fn scalar<T>(
        &self,
        r: &mut dyn Report,
        key: &str,
        ty: Ty,
        read: impl Fn(&Value) -> Option<T>,
    ) -> Option<Spanned<T>> {
        let (span, item) = self.get(key)?;
        match item.as_value().and_then(&read) {
            Some(v) => Some(Spanned::new(span, v)),
            None => {
                r.error(span, mismatch(&self.at(key), ty.one, item));
                None
            }
        }
    }

    pub fn string(&self, r: &mut dyn Report, key: &str) -> Option<Spanned<String>> {
        self.scalar(r, key, STRING, |v| v.as_str().map(str::to_string))
    }

    pub(super) fn int(&self, r: &mut dyn Report, key: &str) -> Option<Spanned<i64>> {
        self.scalar(r, key, INTEGER, Value::as_integer)
    }

    /// A number: a float, or an integer taken as one.
    pub(super) fn number(&self, r: &mut dyn Report, key: &str) -> Option<Spanned<f64>> {
        self.scalar(r, key, NUMBER, |v| {
            v.as_float().or_else(|| v.as_integer().map(|i| i as f64))
        })
    }

    pub(super) fn boolean(&self, r: &mut dyn Report, key: &str) -> Option<Spanned<bool>> {
        self.scalar(r, key, BOOLEAN, Value::as_bool)
    }

    /// A list whose wrongly typed elements are reported and left out.
    fn list<T>(
        &self,
        r: &mut dyn Report,
        key: &str,
        ty: Ty,
        read: impl Fn(&Value) -> Option<T>,
    ) -> Option<Spanned<Vec<Spanned<T>>>> {
        let (span, item) = self.get(key)?;
        let Some(array) = item.as_array() else {
            let mut message = mismatch(&self.at(key), &format!("a list of {}", ty.many), item);
            if let Some(v) = item.as_value().filter(|v| read(v).is_some()) {
                message.push_str(&format!("; write {key} = [{}]", v.to_string().trim()));
            }
            r.error(span, message);
            return None;
        };
        let mut out = Vec::new();
        for (i, v) in array.iter().enumerate() {
            let at = v.span().unwrap_or_else(|| span.clone());
            match read(v) {
                Some(x) => out.push(Spanned::new(at, x)),
                None => r.error(
                    at,
                    format!(
                        "{}[{i}]: expected {}, found {}",
                        self.at(key),
                        ty.one,
                        value_kind(v)
                    ),
                ),
            }
        }
        Some(Spanned::new(span, out))
    }

    pub fn strings(&self, r: &mut dyn Report, key: &str) -> Option<Spanned<Vec<Spanned<String>>>> {
        self.list(r, key, STRING, |v| v.as_str().map(str::to_string))
    }

    pub(super) fn ints(&self, r: &mut dyn Report, key: &str) -> Option<Spanned<Vec<Spanned<i64>>>> {
        self.list(r, key, INTEGER, Value::as_integer)
    }

    /// A sub-table, its own keys checked against `known`.
    pub(super) fn table(
        &self,
        r: &mut dyn Report,
        key: &str,
        known: &[&str],
    ) -> Option<Fields<'a>> {
        let (span, item) = self.get(key)?;
        let Some(table) = item.as_table_like() else {
            r.error(span, mismatch(&self.at(key), "a table", item));
            return None;
        };
        let fields = Fields::new(table, span, self.at(key), known, r);
        Some(fields)
    }

    /// A table of strings (`[rules.inject.headers]`); wrongly typed values are left out.
    pub fn string_map(&self, r: &mut dyn Report, key: &str) -> Option<Spanned<StringMap>> {
        let (span, item) = self.get(key)?;
        let Some(table) = item.as_table_like() else {
            r.error(span, mismatch(&self.at(key), "a table of strings", item));
            return None;
        };
        let mut out = Vec::new();
        for (name, value) in table.iter() {
            let key_span = key_span(table, name, &span);
            let value_span = value.span().unwrap_or_else(|| key_span.clone());
            match value.as_str() {
                Some(v) => out.push((
                    Spanned::new(key_span, name.to_string()),
                    Spanned::new(value_span, v.to_string()),
                )),
                None => r.error(
                    value_span,
                    mismatch(&format!("{}.{name}", self.at(key)), STRING.one, value),
                ),
            }
        }
        Some(Spanned::new(span, out))
    }

    /// JWT claims: any TOML values, kept as JSON.
    pub(super) fn claims(&self, r: &mut dyn Report, key: &str) -> Option<Spanned<Claims>> {
        let (span, item) = self.get(key)?;
        let Some(table) = item.as_table_like() else {
            r.error(span, mismatch(&self.at(key), "a table", item));
            return None;
        };
        let mut out = Vec::new();
        for (name, value) in table.iter() {
            let at = value.span().unwrap_or_else(|| key_span(table, name, &span));
            match item_json(value) {
                Ok(json) => out.push((name.to_string(), at, json)),
                Err(why) => r.error(at, format!("{}.{name}: {why}", self.at(key))),
            }
        }
        Some(Spanned::new(span, out))
    }

    /// `[secrets.NAME]`-style tables: each value must itself be a table.
    pub(super) fn named_tables(&self, key: &str, r: &mut dyn Report) -> Vec<Named<'a>> {
        let Some((span, item)) = self.get(key) else {
            return Vec::new();
        };
        let Some(table) = item.as_table_like() else {
            r.error(span, mismatch(key, "a table", item));
            return Vec::new();
        };
        let known: &[&str] = match key {
            "secrets" => SECRET_KEYS,
            "identities" => IDENTITY_KEYS,
            "profiles" => PROFILE_KEYS,
            "attest" => ATTEST_KEYS,
            "tokens" => ADMIN_TOKEN_KEYS,
            "roles" => OIDC_ROLE_KEYS,
            "notify" => NOTIFY_KEYS,
            "limits" => LIMIT_KEYS,
            "prices" => PRICE_KEYS,
            _ => &[],
        };
        let mut out = Vec::new();
        for (name, value) in table.iter() {
            let name_span = key_span(table, name, &span);
            let path = format!("{}.{name}", self.at(key));
            let value_span = value.span().unwrap_or_else(|| name_span.clone());
            let fields = match value.as_table_like() {
                Some(t) if key == "credentials" => {
                    let mut all = CREDENTIAL_KEYS.to_vec();
                    // `limits` applies to every kind, so it is not among the kind-checked keys.
                    all.extend(["kind", "limits"]);
                    Ok(Fields::new(t, value_span, path, &all, r))
                }
                Some(t) => Ok(Fields::new(t, value_span, path, known, r)),
                None => {
                    r.error(
                        value_span.clone(),
                        format!(
                            "{}; write [{path}] with its keys",
                            mismatch(&path, "a table", value)
                        ),
                    );
                    Err(value_span)
                }
            };
            out.push((Spanned::new(name_span, name.to_string()), fields));
        }
        out
    }

    /// `[[rules]]`: a list of tables (also accepted as `rules = [{ ... }]`).
    pub(super) fn table_list(
        &self,
        key: &str,
        r: &mut dyn Report,
    ) -> Vec<Result<Fields<'a>, Range<usize>>> {
        self.table_list_of(key, RULE_KEYS, r)
    }

    /// A list of tables (`[[key]]` or `key = [{ ... }]`) whose entries take the keys `known`.
    pub fn table_list_of(
        &self,
        key: &str,
        known: &[&str],
        r: &mut dyn Report,
    ) -> Vec<Result<Fields<'a>, Range<usize>>> {
        let Some((span, item)) = self.get(key) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        match item {
            Item::ArrayOfTables(list) => {
                for (i, t) in list.iter().enumerate() {
                    let at = t.span().unwrap_or_else(|| span.clone());
                    out.push(Ok(Fields::new(t, at, format!("{key}[{i}]"), known, r)));
                }
            }
            Item::Value(Value::Array(list)) => {
                for (i, v) in list.iter().enumerate() {
                    let at = v.span().unwrap_or_else(|| span.clone());
                    let path = format!("{key}[{i}]");
                    match v.as_inline_table() {
                        Some(t) => out.push(Ok(Fields::new(t, at, path, known, r))),
                        None => {
                            r.error(
                                at.clone(),
                                format!("{path}: expected a table, found {}", value_kind(v)),
                            );
                            out.push(Err(at));
                        }
                    }
                }
            }
            other => r.error(
                span,
                format!(
                    "{}; write each {} as [[{key}]]",
                    mismatch(key, "a list of tables", other),
                    key.strip_suffix('s').unwrap_or("entry")
                ),
            ),
        }
        out
    }
}

/// A type's name in messages, alone and in a list.
#[derive(Clone, Copy)]
struct Ty {
    one: &'static str,
    many: &'static str,
}

const STRING: Ty = Ty {
    one: "a string",
    many: "strings",
};
const INTEGER: Ty = Ty {
    one: "an integer",
    many: "integers",
};
const NUMBER: Ty = Ty {
    one: "a number",
    many: "numbers",
};
const BOOLEAN: Ty = Ty {
    one: "true or false",
    many: "booleans",
};

fn mismatch(at: &str, expected: &str, found: &Item) -> String {
    format!("{at}: expected {expected}, found {}", item_kind(found))
}

fn item_kind(item: &Item) -> &'static str {
    match item {
        Item::None => "nothing",
        Item::Table(_) => "a table",
        Item::ArrayOfTables(_) => "a list of tables",
        Item::Value(v) => value_kind(v),
    }
}

fn value_kind(v: &Value) -> &'static str {
    match v {
        Value::String(_) => "a string",
        Value::Integer(_) => "an integer",
        Value::Float(_) => "a float",
        Value::Boolean(_) => "a boolean",
        Value::Datetime(_) => "a date-time",
        Value::Array(_) => "a list",
        Value::InlineTable(_) => "a table",
    }
}

fn key_span(table: &dyn TableLike, name: &str, fallback: &Range<usize>) -> Range<usize> {
    table
        .get_key_value(name)
        .and_then(|(k, _)| k.span())
        .unwrap_or_else(|| fallback.clone())
}

/// A TOML value as JSON (a date-time becomes its text).
fn item_json(item: &Item) -> Result<serde_json::Value, String> {
    match item {
        Item::Value(v) => value_json(v),
        Item::Table(t) => table_json(t),
        Item::ArrayOfTables(list) => list
            .iter()
            .map(|t| table_json(t))
            .collect::<Result<Vec<_>, _>>()
            .map(serde_json::Value::Array),
        Item::None => Ok(serde_json::Value::Null),
    }
}

fn table_json(t: &dyn TableLike) -> Result<serde_json::Value, String> {
    let mut map = serde_json::Map::new();
    for (k, v) in t.iter() {
        map.insert(k.to_string(), item_json(v)?);
    }
    Ok(serde_json::Value::Object(map))
}

fn value_json(v: &Value) -> Result<serde_json::Value, String> {
    Ok(match v {
        Value::String(s) => serde_json::Value::String(s.value().clone()),
        Value::Integer(i) => serde_json::Value::from(*i.value()),
        Value::Float(f) => serde_json::Number::from_f64(*f.value())
            .map(serde_json::Value::Number)
            .ok_or_else(|| format!("{} is not a finite number", f.value()))?,
        Value::Boolean(b) => serde_json::Value::Bool(*b.value()),
        Value::Datetime(d) => serde_json::Value::String(d.value().to_string()),
        Value::Array(a) => {
            serde_json::Value::Array(a.iter().map(value_json).collect::<Result<Vec<_>, _>>()?)
        }
        Value::InlineTable(t) => table_json(t)?,
    })
}

/// `; did you mean "NAME"?` when one of `known` is close enough to `name` to be its typo, else
/// nothing: the tail of every "unknown secret/rule/credential/identity..." message, in policy
/// files, case files and on the command line alike.
pub fn did_you_mean<'k>(name: &str, known: impl IntoIterator<Item = &'k str>) -> String {
    // One edit away from a one- or two-letter name is any other short name: no guess.
    if name.chars().count() < 3 {
        return String::new();
    }
    let known: Vec<&str> = known.into_iter().filter(|k| *k != name).collect();
    match closest(name, &known) {
        Some(k) => format!("; did you mean {k:?}?"),
        None => String::new(),
    }
}

/// The known key closest to a misspelt one, if it is close enough to be a typo.
pub(super) fn closest<'k>(key: &str, known: &[&'k str]) -> Option<&'k str> {
    let limit = (key.chars().count() / 3).clamp(1, 3);
    known
        .iter()
        .map(|k| (edit_distance(key, k), *k))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// Levenshtein distance over characters (keys are short).
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (row[j + 1] + 1)
                .min(row[j] + 1)
                .min(diag + usize::from(ca != *cb));
            diag = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}
