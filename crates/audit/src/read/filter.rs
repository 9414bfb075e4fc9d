//! Filters: `--since`/`--until` times, reason codes, host patterns and verdicts, and the filter
//! a query applies to each record.

use super::*;

/// `--since` / `--until`: an RFC 3339 time (UTC unless it carries an offset; a date alone is
/// its midnight UTC), or a duration meaning that long before `now` (`1h`, `30m`, `7d`).
pub fn parse_instant(value: &str, now: SystemTime) -> Result<SystemTime, ReadError> {
    let bad = |why: String| ReadError::Time {
        value: value.to_string(),
        why,
    };
    let v = value.trim();
    if v.starts_with(|c: char| c.is_ascii_digit()) && !v.contains(['-', ':']) {
        let ago = humantime::parse_duration(v).map_err(|e| bad(e.to_string()))?;
        return now
            .checked_sub(ago)
            .ok_or_else(|| bad("that is before the clock's epoch".to_string()));
    }
    if v.len() == 10 {
        return humantime::parse_rfc3339_weak(&format!("{v}T00:00:00Z"))
            .map_err(|e| bad(e.to_string()));
    }
    // humantime reads `Z` or no zone; an offset `±HH:MM` is applied here.
    let (base, offset) = match split_offset(v) {
        Some((base, secs)) => (base, secs),
        None => (v, 0),
    };
    let local = humantime::parse_rfc3339_weak(base).map_err(|e| bad(e.to_string()))?;
    let shifted = if offset >= 0 {
        local.checked_sub(Duration::from_secs(offset.unsigned_abs()))
    } else {
        local.checked_add(Duration::from_secs(offset.unsigned_abs()))
    };
    shifted.ok_or_else(|| bad("out of range".to_string()))
}

/// `2026-05-01T12:00:00+02:00` → (`2026-05-01T12:00:00`, +7200).
pub(super) fn split_offset(v: &str) -> Option<(&str, i64)> {
    let b = v.as_bytes();
    if b.len() < 17 || !(v.contains('T') || v.contains(' ')) {
        return None;
    }
    let tail = &b[b.len() - 6..];
    let sign = match tail[0] {
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    let digit = |i: usize| char::from(tail[i]).to_digit(10).map(i64::from);
    if tail[3] != b':' {
        return None;
    }
    let hours = digit(1)? * 10 + digit(2)?;
    let minutes = digit(4)? * 10 + digit(5)?;
    if hours > 23 || minutes > 59 {
        return None;
    }
    Some((&v[..v.len() - 6], sign * (hours * 3600 + minutes * 60)))
}

/// `--reason`: a known reason code ([`crate::reason::Reason::ALL`]), or an error listing them.
pub fn parse_reason(code: &str) -> Result<&'static str, ReadError> {
    use crate::reason::Reason;
    Reason::ALL
        .iter()
        .map(|r| r.code())
        .find(|c| *c == code)
        .ok_or_else(|| ReadError::Reason {
            code: code.to_string(),
            known: Reason::ALL
                .iter()
                .map(|r| r.code())
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// `--host`: a host name, or a glob where `*` stands for any run of characters
/// (`*.example.com` matches every subdomain of example.com, not example.com itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPattern(String);

impl HostPattern {
    pub fn parse(pattern: &str) -> Result<Self, ReadError> {
        let bad = |why| ReadError::Host {
            pattern: pattern.to_string(),
            why,
        };
        if pattern.is_empty() {
            return Err(bad("empty"));
        }
        if pattern.chars().any(|c| c.is_whitespace() || c == '/') {
            return Err(bad(
                "a host has no spaces or slashes; give the host alone, without a scheme or a path",
            ));
        }
        let lower = pattern.to_ascii_lowercase();
        Ok(Self(lower.strip_suffix('.').unwrap_or(&lower).to_string()))
    }

    pub fn matches(&self, host: &str) -> bool {
        let host = host.to_ascii_lowercase();
        glob(
            self.0.as_bytes(),
            host.strip_suffix('.').unwrap_or(&host).as_bytes(),
        )
    }
}

/// `*` matches one or more bytes; everything else matches itself. The classic wildcard match
/// with one backtrack point (the last `*`), linear in practice.
pub(super) fn glob(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    // The last `*` seen, and where the text it has taken ends.
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if pattern.get(p) == Some(&b'*') {
            star = Some((p, t + 1));
            p += 1;
            t += 1;
        } else if pattern.get(p) == Some(&text[t]) {
            p += 1;
            t += 1;
        } else if let Some((sp, end)) = star {
            // Let that `*` take one byte more.
            if end >= text.len() {
                return false;
            }
            star = Some((sp, end + 1));
            p = sp + 1;
            t = end + 1;
        } else {
            return false;
        }
    }
    p == pattern.len()
}

/// What a filter may ask of a record's `decision`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    Deny,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Allow => "allow",
            Verdict::Deny => "deny",
        }
    }
}

/// Every filter given; a record must pass all of them. `since` is inclusive, `until` is not.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub identity: Option<String>,
    /// Only records of this runtime session (its id).
    pub session: Option<String>,
    /// Only records admitted under a session of this profile.
    pub profile: Option<String>,
    pub host: Option<HostPattern>,
    pub decision: Option<Verdict>,
    pub reason: Option<&'static str>,
    pub rule: Option<String>,
    pub since: Option<SystemTime>,
    pub until: Option<SystemTime>,
}

impl Filter {
    pub fn matches(&self, r: &Line) -> bool {
        let f = &r.fields;
        self.identity.as_ref().is_none_or(|i| *i == f.identity)
            && self
                .session
                .as_ref()
                .is_none_or(|s| f.session.as_ref() == Some(s))
            && self
                .profile
                .as_ref()
                .is_none_or(|p| f.profile.as_ref() == Some(p))
            && self
                .host
                .as_ref()
                .is_none_or(|h| f.host.as_deref().is_some_and(|host| h.matches(host)))
            && self.decision.is_none_or(|d| d.as_str() == f.decision)
            && self.reason.is_none_or(|c| c == f.reason)
            && self
                .rule
                .as_ref()
                .is_none_or(|rule| f.rule.as_ref() == Some(rule))
            && self.since.is_none_or(|t| r.at >= t)
            && self.until.is_none_or(|t| r.at < t)
    }
}
