//! Policy problems as `serve` and `check` print them: `FILE:LINE:COL: message`.

/// `(line, col, message)` of every `…FILE:LINE:COL: message` line in `output` about `file`.
pub fn problems_in(output: &str, file: &str) -> Vec<(u32, u32, String)> {
    let needle = format!("{file}:");
    output
        .lines()
        .filter_map(|line| {
            let start = line.find(&needle)?;
            // The file name must be whole: at the start, or after a path separator or space.
            if start > 0 && !matches!(line.as_bytes()[start - 1], b'/' | b'\\' | b' ') {
                return None;
            }
            let rest = &line[start + needle.len()..];
            let (line_no, rest) = rest.split_once(':')?;
            let (col, message) = rest.split_once(':')?;
            Some((
                line_no.parse().ok()?,
                col.parse().ok()?,
                message.trim().to_string(),
            ))
        })
        .collect()
}

/// Asserts a `FILE:LINE:COL: message` problem at `line` of `file` whose message mentions `word`.
pub fn assert_problem(output: &str, file: &str, line: u32, word: &str) {
    let problems = problems_in(output, file);
    assert!(
        problems
            .iter()
            .any(|(l, c, m)| *l == line && *c >= 1 && m.contains(word)),
        "expected `{file}:{line}:COL: …{word}…`, got {problems:?} in:\n{output}"
    );
}
