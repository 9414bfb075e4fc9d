//! Paths: a seen path as a pattern of literal and variable segments (ids, UUIDs, dates, hashes),
//! and the patterns generalised until a rule needs few of them.

use super::*;

/// One path segment of a pattern.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) enum Seg {
    Lit(String),
    /// `*`, or `*.EXT`.
    Any(Option<String>),
}

/// Segments, and whether a `/**` follows them.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct Pattern {
    pub(super) segs: Vec<Seg>,
    pub(super) deep: bool,
}

impl Pattern {
    pub(super) fn glob(&self) -> String {
        let mut out = String::new();
        for s in &self.segs {
            out.push('/');
            match s {
                Seg::Lit(l) => escape_into(l, &mut out),
                Seg::Any(None) => out.push('*'),
                Seg::Any(Some(ext)) => {
                    out.push_str("*.");
                    escape_into(ext, &mut out);
                }
            }
        }
        if self.deep {
            out.push_str("/**");
        }
        if out.is_empty() {
            out.push('/');
        }
        out
    }
}

pub(super) fn escape_into(literal: &str, out: &mut String) {
    for c in literal.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '{' | '}' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
}

/// A path's segments (`/a/b/` → `a`, `b`, ``), each generalised when it is an id.
pub(super) fn shape(path: &str) -> Pattern {
    let rest = path.strip_prefix('/').unwrap_or(path);
    if rest.is_empty() {
        return Pattern {
            segs: Vec::new(),
            deep: false,
        };
    }
    Pattern {
        segs: rest.split('/').map(classify).collect(),
        deep: false,
    }
}

/// `*` for an id-like segment (`*.EXT` when it has a short extension), the literal otherwise.
pub(super) fn classify(segment: &str) -> Seg {
    if is_variable(segment) {
        return Seg::Any(None);
    }
    if let Some((stem, ext)) = segment.rsplit_once('.') {
        if !ext.is_empty()
            && ext.len() <= 5
            && ext.bytes().all(|b| b.is_ascii_alphanumeric())
            && is_variable(stem)
        {
            return Seg::Any(Some(ext.to_string()));
        }
    }
    Seg::Lit(segment.to_string())
}

/// Numeric ids, UUIDs, hex hashes, dates and timestamps, long random tokens.
pub fn is_variable(segment: &str) -> bool {
    let s = segment;
    if s.is_empty() {
        return false;
    }
    let b = s.as_bytes();
    let digits = b.iter().filter(|c| c.is_ascii_digit()).count();
    // Numeric ids.
    if digits == b.len() {
        return true;
    }
    // Hex hashes: 7 or more hex digits, at least one a digit (`deadbeef` stays a word).
    if b.len() >= 7 && digits > 0 && b.iter().all(u8::is_ascii_hexdigit) {
        return true;
    }
    if is_uuid(s) || is_date(s) {
        return true;
    }
    // Long random tokens: 20+ characters of [A-Za-z0-9_-] mixing letters and digits, with no
    // run of 6 or more lower-case letters (a slug such as `release-notes-2026-q1` reads as words).
    if b.len() >= 20
        && digits > 0
        && b.iter().any(u8::is_ascii_alphabetic)
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || *c == b'_' || *c == b'-')
    {
        let longest_word = s
            .split(|c: char| !c.is_ascii_lowercase())
            .map(str::len)
            .max()
            .unwrap_or(0);
        return longest_word < 6;
    }
    false
}

pub(super) fn is_uuid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

/// `2026-05-01`, or that followed by `T` and a time (RFC 3339, `:` possibly as `%3A`).
pub(super) fn is_date(s: &str) -> bool {
    let b = s.as_bytes();
    let ymd = b.len() >= 10
        && b[..4].iter().all(u8::is_ascii_digit)
        && b[4] == b'-'
        && b[5..7].iter().all(u8::is_ascii_digit)
        && b[7] == b'-'
        && b[8..10].iter().all(u8::is_ascii_digit);
    if !ymd {
        return false;
    }
    let rest = &s[10..];
    if rest.is_empty() {
        return true;
    }
    let Some(time) = rest.strip_prefix('T').or_else(|| rest.strip_prefix('t')) else {
        return false;
    };
    let time = time.replace("%3A", ":").replace("%3a", ":");
    let tb = time.as_bytes();
    tb.len() >= 8
        && tb[..2].iter().all(u8::is_ascii_digit)
        && tb[2] == b':'
        && tb[3..5].iter().all(u8::is_ascii_digit)
        && tb[5] == b':'
        && tb[6..8].iter().all(u8::is_ascii_digit)
        && time[8..]
            .chars()
            .all(|c| c.is_ascii_digit() || matches!(c, '.' | 'Z' | 'z' | '+' | '-' | ':'))
}

/// The globs that cover `paths` (of one method, port, identity and host): each with the
/// requests it stands for and up to [`EXAMPLES`] paths seen under it.
pub(super) fn generalise(paths: &[(&str, &Stat)]) -> Vec<(String, Stat, Vec<String>)> {
    // Pattern → the observed paths under it.
    let mut patterns: BTreeMap<Pattern, Vec<usize>> = BTreeMap::new();
    for (i, (path, _)) in paths.iter().enumerate() {
        patterns.entry(shape(path)).or_default().push(i);
    }
    vary(&mut patterns);
    deepen(&mut patterns);
    let mut out: Vec<(String, Stat, Vec<String>)> = Vec::new();
    for (pattern, members) in patterns {
        let glob = pattern.glob();
        let covered = crate::policy::rule::path_glob(&glob)
            .ok()
            .map(|g| g.compile_matcher());
        // A path the glob does not match after all (it cannot happen with the patterns above;
        // this keeps the promise regardless) gets a glob of its own.
        let (inside, outside): (Vec<usize>, Vec<usize>) = members
            .into_iter()
            .partition(|i| covered.as_ref().is_some_and(|m| m.is_match(paths[*i].0)));
        if let Some(first) = inside.first() {
            let mut stat = paths[*first].1.clone();
            for i in &inside[1..] {
                stat.add(paths[*i].1);
            }
            let examples = inside
                .iter()
                .take(EXAMPLES)
                .map(|i| paths[*i].0.to_string())
                .collect();
            out.push((glob, stat, examples));
        }
        for i in outside {
            let mut exact = String::new();
            escape_into(paths[i].0, &mut exact);
            out.push((exact, paths[i].1.clone(), vec![paths[i].0.to_string()]));
        }
    }
    out
}

/// A segment that takes [`VARY`] or more literal values, everything else equal, becomes `*`.
pub(super) fn vary(patterns: &mut BTreeMap<Pattern, Vec<usize>>) {
    loop {
        let mut changed = false;
        let longest = patterns.keys().map(|p| p.segs.len()).max().unwrap_or(0);
        for at in 0..longest {
            // Surroundings (the pattern with segment `at` blanked) → literal values there.
            let mut around: BTreeMap<Pattern, BTreeSet<String>> = BTreeMap::new();
            for p in patterns.keys() {
                if let Some(Seg::Lit(l)) = p.segs.get(at) {
                    let mut blank = p.clone();
                    blank.segs[at] = Seg::Any(None);
                    around.entry(blank).or_default().insert(l.clone());
                }
            }
            let general: BTreeSet<Pattern> = around
                .into_iter()
                .filter(|(_, values)| values.len() >= VARY)
                .map(|(p, _)| p)
                .collect();
            if general.is_empty() {
                continue;
            }
            let old = std::mem::take(patterns);
            for (p, members) in old {
                let mut key = p.clone();
                if let Some(Seg::Lit(_)) = p.segs.get(at) {
                    let mut blank = p.clone();
                    blank.segs[at] = Seg::Any(None);
                    if general.contains(&blank) {
                        key = blank;
                        changed = true;
                    }
                }
                patterns.entry(key).or_default().extend(members);
            }
        }
        if !changed {
            return;
        }
    }
}

/// [`VARY`] or more patterns of different depths below a prefix with a literal segment become
/// `PREFIX/**`; the deepest such prefix first, so `**` starts as low as it can.
pub(super) fn deepen(patterns: &mut BTreeMap<Pattern, Vec<usize>>) {
    let longest = patterns.keys().map(|p| p.segs.len()).max().unwrap_or(0);
    for len in (1..longest).rev() {
        // Prefix → the patterns strictly below it.
        let mut below: BTreeMap<Vec<Seg>, Vec<Pattern>> = BTreeMap::new();
        for p in patterns.keys() {
            if p.segs.len() > len {
                below
                    .entry(p.segs[..len].to_vec())
                    .or_default()
                    .push(p.clone());
            }
        }
        for (prefix, under) in below {
            if !prefix.iter().any(|s| matches!(s, Seg::Lit(_))) || under.len() < VARY {
                continue;
            }
            let depths: BTreeSet<(usize, bool)> =
                under.iter().map(|p| (p.segs.len(), p.deep)).collect();
            if depths.len() < 2 {
                continue;
            }
            let deep = Pattern {
                segs: prefix,
                deep: true,
            };
            let mut members = Vec::new();
            for p in under {
                if let Some(m) = patterns.remove(&p) {
                    members.extend(m);
                }
            }
            patterns.entry(deep).or_default().extend(members);
        }
    }
}
