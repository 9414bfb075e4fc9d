//! Path reach, compared exactly: the path globs of the rules that match, as DFAs walked side by
//! side over the bytes a request path can hold, and the example path a difference shows.

use super::*;

/// Bytes a request path can hold (RFC 3986 `pchar` and `/`), most readable first: a witness
/// path is made of these.
pub(super) const PATH_BYTES: &[u8] =
    b"abcdefghijklmnopqrstuvwxyz0123456789/-_.ABCDEFGHIJKLMNOPQRSTUVWXYZ~!$&'()*+,;=:@%";

/// A set of paths as one DFA over the union of its globs.
pub(super) struct PathSet {
    pub(super) dfa: dense::DFA<Vec<u32>>,
    pub(super) start: StateID,
}

impl PathSet {
    /// `None` for the empty set (or a set whose DFA cannot be built: treated as empty only
    /// for examples, never for the decision that something changed).
    pub(super) fn build(paths: &Paths) -> Option<PathSet> {
        let patterns: Vec<String> = match paths {
            Paths::None => return None,
            Paths::All => vec!["(?s-u)^/.*$".to_string()],
            Paths::Globs(g) => g
                .iter()
                .filter_map(|g| path_glob(g).ok().map(|g| g.regex().to_string()))
                .collect(),
        };
        let dfa = dense::Builder::new()
            .syntax(syntax::Config::new().utf8(false).unicode(false))
            .thompson(thompson::Config::new().utf8(false))
            .configure(
                dense::Config::new()
                    .start_kind(StartKind::Anchored)
                    .match_kind(MatchKind::All)
                    .dfa_size_limit(Some(16 << 20))
                    .determinize_size_limit(Some(16 << 20)),
            )
            .build_many(&patterns)
            .ok()?;
        let start = dfa
            .start_state(&start::Config::new().anchored(Anchored::Yes))
            .ok()?;
        Some(PathSet { dfa, start })
    }

    pub(super) fn contains(&self, path: &[u8]) -> bool {
        let mut s = self.start;
        for &b in path {
            s = self.dfa.next_state(s, b);
            if self.dfa.is_dead_state(s) {
                return false;
            }
        }
        self.dfa.is_match_state(self.dfa.next_eoi_state(s))
    }
}

/// The shortest path (over [`PATH_BYTES`]) in `now` and not in `before`.
pub(super) fn witness(now: &Paths, before: &Paths) -> Option<String> {
    let a = PathSet::build(now)?;
    let b = PathSet::build(before);
    // States: (a, b) where b = None is "outside every glob of `before` for good".
    type Key = (StateID, Option<StateID>);
    let mut seen: HashMap<Key, (Option<Key>, u8)> = HashMap::new();
    let first: Key = (a.start, b.as_ref().map(|b| b.start));
    seen.insert(first, (None, 0));
    let mut queue = VecDeque::from([first]);
    let accepted = |k: &Key| {
        a.dfa.is_match_state(a.dfa.next_eoi_state(k.0))
            && match (&b, k.1) {
                (Some(b), Some(s)) => !b.dfa.is_match_state(b.dfa.next_eoi_state(s)),
                _ => true,
            }
    };
    while let Some(k) = queue.pop_front() {
        if accepted(&k) && k != first {
            let mut bytes = Vec::new();
            let mut at = k;
            while let Some((Some(prev), byte)) = seen.get(&at).copied() {
                bytes.push(byte);
                at = prev;
            }
            bytes.reverse();
            return String::from_utf8(bytes).ok();
        }
        if seen.len() >= MAX_STATES {
            return None;
        }
        for &byte in PATH_BYTES {
            let na = a.dfa.next_state(k.0, byte);
            if a.dfa.is_dead_state(na) {
                continue;
            }
            let nb = match (&b, k.1) {
                (Some(b), Some(s)) => {
                    let t = b.dfa.next_state(s, byte);
                    (!b.dfa.is_dead_state(t)).then_some(t)
                }
                _ => None,
            };
            let next = (na, nb);
            if let std::collections::hash_map::Entry::Vacant(e) = seen.entry(next) {
                e.insert((Some(k), byte));
                queue.push_back(next);
            }
        }
    }
    None
}

/// Readable paths a glob matches: `*` → `x`, `**` → `x/y` and `x`, a class → a byte it holds,
/// `{a,b}` → each alternative. Candidates only: each is checked against the DFAs.
pub(super) fn instantiate(glob: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let chars: Vec<char> = glob.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let push = |out: &mut Vec<String>, s: &str| {
            for o in out.iter_mut() {
                o.push_str(s);
            }
        };
        match c {
            '\\' if i + 1 < chars.len() => {
                push(&mut out, &chars[i + 1].to_string());
                i += 2;
            }
            '*' if chars.get(i + 1) == Some(&'*') => {
                let mut more = out.clone();
                push(&mut out, "x/y");
                push(&mut more, "x");
                out.extend(more);
                i += 2;
            }
            '*' => {
                push(&mut out, "x");
                i += 1;
            }
            '[' => {
                let end = chars[i + 1..]
                    .iter()
                    .position(|&c| c == ']')
                    .map(|p| i + 1 + p);
                let Some(end) = end else {
                    push(&mut out, "[");
                    i += 1;
                    continue;
                };
                let class: String = chars[i + 1..end].iter().collect();
                let pick = if class.starts_with('!') || class.starts_with('^') {
                    ['x', 'q', 'z', '0', '_']
                        .into_iter()
                        .find(|c| !class.contains(*c))
                        .unwrap_or('x')
                } else {
                    class.chars().next().unwrap_or('x')
                };
                push(&mut out, &pick.to_string());
                i = end + 1;
            }
            '{' => {
                let end = chars[i + 1..]
                    .iter()
                    .position(|&c| c == '}')
                    .map(|p| i + 1 + p);
                let Some(end) = end else {
                    push(&mut out, "{");
                    i += 1;
                    continue;
                };
                let inner: String = chars[i + 1..end].iter().collect();
                let mut next = Vec::new();
                for alt in inner.split(',') {
                    for o in &out {
                        next.push(format!("{o}{}", alt.replace('*', "x")));
                    }
                }
                out = next;
                i = end + 1;
            }
            c => {
                push(&mut out, &c.to_string());
                i += 1;
            }
        }
        if out.len() > 16 {
            out.truncate(16);
        }
    }
    out
}
