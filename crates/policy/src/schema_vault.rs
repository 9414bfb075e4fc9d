//! The raw form of `[vault]` (the default Vault/OpenBao connection) and `[vault.NAME]` (more
//! connections), as read; `vault_compile` checks and compiles them.
//!
//! In `[vault]`, the connection keys (`address`, `ca`, …) belong to the default connection and
//! every other key must be a table: a named connection.

use std::ops::Range;

use toml::Spanned;

use super::read::Fields;
use super::schema::Report;

/// The keys of a connection.
pub(super) const VAULT_KEYS: &[&str] = &["address", "ca", "namespace", "auth", "allow_private"];

/// The keys of a connection's `auth` table.
pub(super) const VAULT_AUTH_KEYS: &[&str] = &[
    "method",
    "token",
    "role_id",
    "secret_id",
    "mount",
    "role",
    "token_file",
];

/// One connection as read.
#[derive(Debug, Default)]
pub struct RawVault {
    pub address: Option<Spanned<String>>,
    pub ca: Option<Spanned<String>>,
    pub namespace: Option<Spanned<String>>,
    pub auth: Option<RawVaultAuth>,
    pub allow_private: Option<Spanned<Vec<Spanned<String>>>>,
}

/// A connection's `auth` table.
#[derive(Debug, Default)]
pub struct RawVaultAuth {
    /// The table's span.
    pub span: Range<usize>,
    pub method: Option<Spanned<String>>,
    pub token: Option<Spanned<String>>,
    pub role_id: Option<Spanned<String>>,
    pub secret_id: Option<Spanned<String>>,
    pub mount: Option<Spanned<String>>,
    pub role: Option<Spanned<String>>,
    pub token_file: Option<Spanned<String>>,
}

/// The connections of one file: `(name, span of the name or table, connection)`; the default
/// connection's name is `""`.
pub type RawVaults = Vec<(Spanned<String>, RawVault)>;

fn read_connection(t: &Fields<'_>, r: &mut dyn Report) -> RawVault {
    RawVault {
        address: t.string(r, "address"),
        ca: t.string(r, "ca"),
        namespace: t.string(r, "namespace"),
        auth: t.table(r, "auth", VAULT_AUTH_KEYS).map(|a| RawVaultAuth {
            span: a.span.clone(),
            method: a.string(r, "method"),
            token: a.string(r, "token"),
            role_id: a.string(r, "role_id"),
            secret_id: a.string(r, "secret_id"),
            mount: a.string(r, "mount"),
            role: a.string(r, "role"),
            token_file: a.string(r, "token_file"),
        }),
        allow_private: t.strings(r, "allow_private"),
    }
}

/// Reads `[vault]` of the file's top-level table `root`.
pub(super) fn read(root: &Fields<'_>, r: &mut dyn Report) -> RawVaults {
    let Some((span, item)) = root.get("vault") else {
        return Vec::new();
    };
    let Some(table) = item.as_table_like() else {
        r.error(
            span,
            "vault: expected a table ([vault] with address and auth, or [vault.NAME])".into(),
        );
        return Vec::new();
    };
    let mut out = Vec::new();
    // Every key that is not a connection key but a table is a named connection.
    let named: Vec<&str> = table
        .iter()
        .filter(|(k, v)| !VAULT_KEYS.contains(k) && v.as_table_like().is_some())
        .map(|(k, _)| k)
        .collect();
    let mut known: Vec<&str> = VAULT_KEYS.to_vec();
    known.extend(&named);
    let default = Fields::new(table, span.clone(), "vault".into(), &known, r);
    if VAULT_KEYS.iter().any(|k| table.contains_key(k)) {
        out.push((
            Spanned::new(span.clone(), String::new()),
            read_connection(&default, r),
        ));
    }
    for name in named {
        let Some(fields) = default.table(r, name, VAULT_KEYS) else {
            continue;
        };
        let name_span = table
            .get_key_value(name)
            .and_then(|(k, _)| k.span())
            .unwrap_or_else(|| fields.span.clone());
        out.push((
            Spanned::new(name_span, name.to_string()),
            read_connection(&fields, r),
        ));
    }
    out
}
