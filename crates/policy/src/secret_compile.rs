//! One secret declaration compiled: `[secrets.NAME]`'s source, an `exec:` helper's `ttl` and
//! `timeout`, a store's `refresh` and `stale_for`, each problem reported at its key.

use super::compile::FileCx;
use super::schema::RawSecret;
use crate::secrets::Source;

impl FileCx<'_> {
    /// Validates one `[secrets.NAME]`; `None` if it has a problem (recorded).
    pub(super) fn secret(&mut self, field: &str, secret: RawSecret) -> Option<Source> {
        let mut duration = |key: &str, v: &Option<toml::Spanned<String>>, default: u64| match v {
            None => Some(std::time::Duration::from_secs(default)),
            Some(v) => match humantime::parse_duration(v.get_ref()) {
                Ok(d) if !d.is_zero() => Some(d),
                _ => {
                    self.error(
                        v.span(),
                        format!(
                            "{field}.{key}: {:?} is not a duration like \"30s\" or \"5m\"",
                            v.get_ref()
                        ),
                    );
                    None
                }
            },
        };
        let ttl = duration("ttl", &secret.ttl, 300);
        let timeout = duration("timeout", &secret.timeout, 10);
        // A missing source was reported while reading.
        let raw_source = secret.source.as_ref()?;
        // A bad ttl or timeout (reported) does not stop the source being checked.
        let durations = ttl.zip(timeout);
        let (ttl, timeout) = durations.unwrap_or_default();
        let remote_keys = self.remote_durations(field, &secret);
        match Source::parse(raw_source.get_ref(), ttl, timeout) {
            Ok(source) => {
                if !matches!(source, Source::Exec { .. })
                    && (secret.ttl.is_some() || secret.timeout.is_some())
                {
                    self.error(
                        raw_source.span(),
                        format!("{field}: ttl and timeout apply to exec: sources only"),
                    );
                    return None;
                }
                let source = match (source, remote_keys) {
                    (Source::Remote(mut remote), Some((refresh, stale_for))) => {
                        remote.refresh = refresh.unwrap_or(remote.refresh);
                        remote.stale_for = stale_for.unwrap_or(remote.stale_for);
                        Source::Remote(remote)
                    }
                    (Source::Remote(_), None) => return None,
                    (source, _) if secret.refresh.is_some() || secret.stale_for.is_some() => {
                        self.error(
                            raw_source.span(),
                            format!("{field}: refresh and stale_for apply to vault:, aws-sm: and aws-ssm: sources only"),
                        );
                        let _ = source;
                        return None;
                    }
                    (source, _) => source,
                };
                durations.map(|_| source)
            }
            Err(e) => {
                self.error(raw_source.span(), format!("{field}.source: {e}"));
                None
            }
        }
    }

    /// A remote source's `refresh` (at least a second) and `stale_for` (may be `0s`); `None`
    /// when either is not a duration (reported).
    #[allow(clippy::type_complexity)]
    fn remote_durations(
        &mut self,
        field: &str,
        secret: &RawSecret,
    ) -> Option<(Option<std::time::Duration>, Option<std::time::Duration>)> {
        let mut ok = true;
        let mut read = |key: &str, v: &Option<toml::Spanned<String>>, min: std::time::Duration| {
            let v = v.as_ref()?;
            match humantime::parse_duration(v.get_ref()) {
                Ok(d) if d >= min => Some(d),
                _ => {
                    ok = false;
                    self.error(
                        v.span(),
                        format!(
                            "{field}.{key}: {:?} is not a duration of at least {} like \"5m\"",
                            v.get_ref(),
                            humantime::format_duration(min)
                        ),
                    );
                    None
                }
            }
        };
        let refresh = read(
            "refresh",
            &secret.refresh,
            crate::secrets::remote::MIN_REFRESH,
        );
        let stale_for = read("stale_for", &secret.stale_for, std::time::Duration::ZERO);
        ok.then_some((refresh, stale_for))
    }
}
