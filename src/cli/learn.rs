//! `latchkey learn`: least-privilege rules proposed from audit logs, as
//! [`crate::review::learn`] generalises them, written as a policy file with a comment per rule
//! and a `tests/` case file that pins each rule.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::SystemTime;

use anyhow::Context;

use crate::audit::read::{Filter, Item, Line, Reader, Requests, Rows};
use crate::policy::ask::UNKNOWN;
use crate::policy::identity::DEFAULT_IDENTITY;
use crate::policy::{LoadError, Policy, PolicySources, Scheme, SecretLoading};
use crate::reason::Reason;
use crate::review::cases::{load_cases_dir, parse_cases, run_case};
use crate::review::explain::{explain, Verdict};
use crate::review::learn::{self, Caps, LearnedCase, Learner, Seen};
mod files;
use files::*;

/// `latchkey learn` flags.
#[derive(clap::Args, Debug)]
pub struct LearnArgs {
    /// Audit files or directories (an audit file, its rotated segments, or a directory holding
    /// them), in any order: they are read in chain order.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// The policy the learned rules add to: requests it already allows are not learned again
    /// (unless --all), and learned rules for an identity it defines are added to that
    /// identity's `rules`.
    #[arg(long, env = "LATCHKEY_POLICIES", default_value = "policies")]
    pub policies: PathBuf,
    /// Where the learned rules go [default: POLICIES/learned.toml].
    #[arg(long, env = "LATCHKEY_LEARN_OUT", value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Where the case file pinning them goes [default: POLICIES/tests/learned.toml].
    #[arg(long, env = "LATCHKEY_LEARN_TESTS", value_name = "FILE")]
    pub tests: Option<PathBuf>,
    /// Only requests that arrived at or after T: RFC 3339 or a duration ago (`7d`).
    // Read from no variable, as `audit query --since`: a filter is asked on the command line.
    #[arg(long, value_name = "T", value_parser = super::audit_query::instant)]
    pub since: Option<SystemTime>,
    /// Only this identity's requests (repeatable).
    #[arg(long, env = "LATCHKEY_LEARN_IDENTITY", value_name = "NAME")]
    pub identity: Vec<String>,
    /// Propose a rule only for traffic seen at least N times.
    #[arg(
        long,
        env = "LATCHKEY_LEARN_MIN_COUNT",
        value_name = "N",
        default_value_t = 1,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub min_count: u64,
    /// Also learn requests the policy already allows.
    #[arg(long)]
    pub all: bool,
    /// Print the proposed files on stdout; write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Overwrite the output files if they exist.
    #[arg(long)]
    pub force: bool,
}

/// How the files learn writes begin: a file that does not is never replaced.
const POLICY_MARK: &str = "# Rules proposed by `latchkey learn`";
const CASES_MARK: &str = "# Cases pinning the rules `latchkey learn`";

/// Runs `latchkey learn`.
pub fn run(args: &LearnArgs) -> anyhow::Result<ExitCode> {
    let out_path = args
        .out
        .clone()
        .unwrap_or_else(|| args.policies.join("learned.toml"));
    let tests_path = args
        .tests
        .clone()
        .unwrap_or_else(|| args.policies.join("tests").join("learned.toml"));
    may_replace(args, &out_path, &tests_path)?;
    let mut current = match Current::read(args, &out_path)? {
        Ok(current) => current,
        Err(failed) => return Ok(failed),
    };
    let identities: BTreeSet<String> = current
        .policy
        .iter()
        .flat_map(|p| p.identities().iter().map(|i| i.name.clone()))
        .collect();
    check_identities(args, &identities)?;
    let (learner, tally) = read_log(args, &identities, current.policy.as_ref())?;
    let proposal = propose(args, learner, &current);
    if proposal.rules.is_empty() {
        println!("nothing to learn: every request read is already allowed, filtered out or not learnable; no file written");
        return Ok(tally.exit());
    }
    let header = header(args, &tally);
    let learned_text = learn::render_policy(&header, &proposal.rules);
    let edited = grant(&mut current, &proposal)?;
    let new_policy = compile_with(args, &current.sources, &out_path, &learned_text)?;
    let (cases, cases_text) = learned_cases(args, &new_policy, &proposal, &out_path, &tests_path)?;
    warn_existing_cases(&args.policies, &tests_path, &new_policy);

    let mut writes: Vec<(PathBuf, String)> = vec![
        (out_path.clone(), learned_text),
        (tests_path.clone(), cases_text),
    ];
    writes.extend(edited);
    if args.dry_run {
        for (path, text) in &writes {
            println!("# ---- {}", path.display());
            print!("{text}");
        }
    } else {
        for (path, text) in &writes {
            write_file(path, text)?;
        }
    }
    report(
        args,
        &proposal,
        (&out_path, &tests_path),
        &writes,
        cases.len(),
    );
    Ok(tally.exit())
}

/// `--force` replaces what learn wrote, never a file a person wrote; without it, nothing is
/// replaced.
fn may_replace(args: &LearnArgs, out_path: &Path, tests_path: &Path) -> anyhow::Result<()> {
    for (path, mark) in [(out_path, POLICY_MARK), (tests_path, CASES_MARK)] {
        if !path.exists() {
            continue;
        }
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        if !text.starts_with(mark) {
            anyhow::bail!(
                "{} exists and is not a file latchkey learn wrote: refusing to replace it (choose another --out/--tests)",
                path.display()
            );
        }
        if !args.dry_run && !args.force {
            anyhow::bail!(
                "{} exists: pass --force to replace it, or --out/--tests to write elsewhere",
                path.display()
            );
        }
    }
    Ok(())
}

/// The current policy, without the file a --force run replaces (and without its rule names in
/// identities' `rules`, which the new file's names replace).
struct Current {
    sources: PolicySources,
    /// The index the replaced file had in the sources, if one is replaced.
    replaced: Option<usize>,
    /// The rule names the replaced file had.
    old_names: BTreeSet<String>,
    /// `None`: a directory with no policy yet (or none at all): the learned file is the first.
    policy: Option<Policy>,
}

impl Current {
    /// Reads the policy directory; `Err` is the exit of a policy that does not load.
    fn read(args: &LearnArgs, out_path: &Path) -> anyhow::Result<Result<Current, ExitCode>> {
        let mut sources = match PolicySources::read_dir(&args.policies) {
            Ok(s) => s,
            Err(LoadError::Empty(_)) => PolicySources::default(),
            Err(LoadError::Dir { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                PolicySources::default()
            }
            Err(e) => return Ok(Err(load_failed(&args.policies, e))),
        };
        let replaced = same_file_index(&sources, out_path);
        let mut old_names = BTreeSet::new();
        if let Some(i) = replaced {
            let (path, text) = sources.files.remove(i);
            old_names = rule_names(&path, &text)?;
            for (path, text) in &mut sources.files {
                if let Some(edited) = edit_identity_rules(path, text, &BTreeMap::new(), &old_names)?
                {
                    *text = edited;
                }
            }
        }
        let policy = if sources.files.is_empty() {
            None
        } else {
            match sources.compile(SecretLoading::Skip) {
                Ok(p) => Some(p),
                Err(e) => return Ok(Err(load_failed(&args.policies, e))),
            }
        };
        Ok(Ok(Current {
            sources,
            replaced,
            old_names,
            policy,
        }))
    }
}

/// Every `--identity` names an identity the policy defines.
fn check_identities(args: &LearnArgs, identities: &BTreeSet<String>) -> anyhow::Result<()> {
    for name in &args.identity {
        let known = if identities.is_empty() {
            name == DEFAULT_IDENTITY
        } else {
            identities.contains(name)
        };
        if !known {
            anyhow::bail!(
                "{} {name:?}: the policy in {} does not define it{} (it defines: {})",
                super::given::flag("identity"),
                args.policies.display(),
                crate::policy::did_you_mean(name, identities.iter().map(String::as_str)),
                if identities.is_empty() {
                    DEFAULT_IDENTITY.to_string()
                } else {
                    identities.iter().cloned().collect::<Vec<_>>().join(", ")
                }
            );
        }
    }
    Ok(())
}

/// Reads the log, one row per request, into a learner; the tally says what became of each.
fn read_log(
    args: &LearnArgs,
    identities: &BTreeSet<String>,
    policy: Option<&Policy>,
) -> anyhow::Result<(Learner, Tally)> {
    let mut reader = Reader::open(&args.files)?;
    let mut requests = Requests::new(
        Rows::PerRequest,
        Filter {
            since: args.since,
            ..Filter::default()
        },
    );
    let mut learner = Learner::new(Caps::default());
    let mut tally = Tally::default();
    let mut rows = Vec::new();
    let mut reading = true;
    while reading {
        match reader.next_item()? {
            Some(Item::Record(line)) => requests.push(*line, &mut rows),
            Some(Item::Damaged(d)) => {
                tally.damaged += 1;
                if tally.damaged <= 20 {
                    eprintln!("latchkey: warning: {d}: skipped");
                }
            }
            None => {
                requests.finish(&mut rows);
                reading = false;
            }
        }
        for row in rows.drain(..) {
            tally.rows += 1;
            match learnable(&row, args, identities, policy) {
                Ok(seen) => {
                    tally.learned += 1;
                    learner.add(seen);
                }
                Err(Skip::AlreadyAllowed) => tally.already_allowed += 1,
                Err(Skip::Asked) => tally.asked += 1,
                Err(Skip::Filtered) => tally.filtered += 1,
                Err(Skip::NotLearnable) => tally.not_learnable += 1,
                Err(Skip::UnknownIdentity(name)) => {
                    *tally.unknown_identities.entry(name).or_default() += 1;
                }
            }
        }
    }
    tally.report(&args.files);
    if learner.dropped > 0 {
        eprintln!(
            "latchkey: warning: {} request(s) not learned: over the cap of distinct hosts or paths held",
            learner.dropped
        );
    }
    Ok((learner, tally))
}

/// The learner's proposal, named apart from the policy's rules (a --force run reuses the
/// names it replaces); what was seen too rarely is said on stderr.
fn propose(args: &LearnArgs, learner: Learner, current: &Current) -> learn::Proposal {
    let mut taken: BTreeSet<String> = current
        .policy
        .iter()
        .flat_map(|p| p.rules().iter().map(|r| r.name.clone()))
        .collect();
    taken.extend(current.old_names.iter().cloned());
    for name in &current.old_names {
        taken.remove(name);
    }
    let proposal = learner.propose(args.min_count, &taken);
    for r in &proposal.rare {
        eprintln!(
            "latchkey: not proposed (seen {} < --min-count {}): {} {}:{} {}{}",
            r.count,
            args.min_count,
            r.method,
            r.host,
            r.port,
            r.glob,
            identity_suffix(&r.identity)
        );
    }
    proposal
}

/// Grants the new rules to the identities they are for, in the policy's files: the files
/// edited (with those a --force run edited to drop the replaced names, even when nothing is
/// granted).
fn grant(
    current: &mut Current,
    proposal: &learn::Proposal,
) -> anyhow::Result<Vec<(PathBuf, String)>> {
    let mut grants: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in &proposal.rules {
        if r.identity != DEFAULT_IDENTITY {
            grants
                .entry(r.identity.clone())
                .or_default()
                .push(r.name.clone());
        }
    }
    let mut edited: Vec<(PathBuf, String)> = Vec::new();
    for (path, text) in &mut current.sources.files {
        if let Some(new_text) = edit_identity_rules(path, text, &grants, &BTreeSet::new())? {
            *text = new_text;
            edited.push((path.clone(), text.clone()));
        }
    }
    if current.replaced.is_some() {
        for (path, text) in &current.sources.files {
            let on_disk = std::fs::read_to_string(path).unwrap_or_default();
            if &on_disk != text && !edited.iter().any(|(p, _)| p == path) {
                edited.push((path.clone(), text.clone()));
            }
        }
    }
    Ok(edited)
}

/// The policy with the learned file added: it must compile (else learn has a bug).
fn compile_with(
    args: &LearnArgs,
    sources: &PolicySources,
    out_path: &Path,
    learned_text: &str,
) -> anyhow::Result<Policy> {
    let mut files = sources.files.clone();
    files.push((out_path.to_path_buf(), learned_text.to_string()));
    match PolicySources::from_files(&args.policies, files)
        .and_then(|s| s.compile(SecretLoading::Skip))
    {
        Ok(p) => Ok(p),
        Err(e) => {
            anyhow::bail!(
                "the learned rules do not compile with the policy (a bug in learn; nothing written):\n{}",
                load_error_text(&e)
            )
        }
    }
}

/// Cases: what was seen is allowed (under the rule that decides it), what is just outside is
/// denied; rendered, read back and run against the new policy (each must pass).
fn learned_cases(
    args: &LearnArgs,
    new_policy: &Policy,
    proposal: &learn::Proposal,
    out_path: &Path,
    tests_path: &Path,
) -> anyhow::Result<(Vec<LearnedCase>, String)> {
    let learned_names: BTreeSet<&str> = proposal.rules.iter().map(|r| r.name.as_str()).collect();
    let mut cases: Vec<LearnedCase> = Vec::new();
    for rule in &proposal.rules {
        for mut c in learn::cases_for(rule) {
            let e = explain(new_policy, c.identity.as_deref(), &c.method, &c.url)
                .with_context(|| format!("case {:?}", c.name))?;
            match (c.allow, e.allowed(), e.rule.as_deref()) {
                (true, true, Some(r)) if learned_names.contains(r) || args.all => {
                    c.rule = r.to_string();
                    cases.push(c);
                }
                (true, _, _) => anyhow::bail!(
                    "self-check: {} {} was seen but the learned policy decides {} ({}): a bug in learn; nothing written",
                    c.method,
                    c.url,
                    e.decision.as_str(),
                    e.message
                ),
                // Just outside the learned rule: pinned when the policy denies it. One that
                // goes to a person instead (`[ask] unknown`) or that another rule allows is
                // not a deny to pin.
                (false, false, _) if e.decision == Verdict::Deny => cases.push(c),
                (false, _, _) => {}
            }
        }
    }
    let cases_text = learn::render_cases(&cases_header(out_path), &cases);
    let parsed = parse_cases(tests_path, &cases_text, new_policy).map_err(|problems| {
        anyhow::anyhow!(
            "self-check: the learned cases do not read (a bug in learn; nothing written):\n{}",
            problems
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n")
        )
    })?;
    for case in &parsed {
        let run = run_case(new_policy, case);
        if !run.passed() {
            anyhow::bail!(
                "self-check: learned case {:?} fails: {} (a bug in learn; nothing written)",
                case.name,
                run.failures.join("; ")
            );
        }
    }
    Ok((cases, cases_text))
}

/// Says what was learned (a line per rule on stdout) and written (on stderr), and which
/// learned rules allow writes, for review.
fn report(
    args: &LearnArgs,
    proposal: &learn::Proposal,
    (out_path, tests_path): (&Path, &Path),
    writes: &[(PathBuf, String)],
    cases: usize,
) {
    for r in &proposal.rules {
        let ports: Vec<String> = r.ports.iter().map(u16::to_string).collect();
        println!(
            "{} {} {}:{} {}{}",
            r.name,
            r.methods.join(","),
            r.host,
            ports.join(","),
            r.paths.join(" "),
            identity_suffix(&r.identity)
        );
    }
    let verb = if args.dry_run { "would write" } else { "wrote" };
    eprintln!(
        "latchkey: {verb} {} ({} rule{}) and {} ({} case{})",
        out_path.display(),
        proposal.rules.len(),
        plural(proposal.rules.len()),
        tests_path.display(),
        cases,
        plural(cases)
    );
    for (path, _) in writes.iter().skip(2) {
        eprintln!(
            "latchkey: {verb} {}: identities granted the learned rules",
            path.display()
        );
    }
    for r in &proposal.rules {
        let w = r.writes();
        if !w.is_empty() {
            eprintln!(
                "latchkey: REVIEW: rule {} allows writes ({}) on {}: confirm the agent must do this",
                r.name,
                w.join(", "),
                r.host
            );
        }
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

fn identity_suffix(identity: &str) -> String {
    if identity == DEFAULT_IDENTITY {
        String::new()
    } else {
        format!(" (identity {identity})")
    }
}

/// Why a request is not learned.
enum Skip {
    /// The policy allows it already (and --all was not given).
    AlreadyAllowed,
    /// A rule with `ask` decides it: each such request goes to a person.
    Asked,
    /// --identity or the record kind leaves it out.
    Filtered,
    /// Refused for a reason a rule cannot change (secrets, address guard, framing…), or a
    /// path no glob can pin.
    NotLearnable,
    /// An identity the policy does not define.
    UnknownIdentity(String),
}

/// What was read and what became of it.
#[derive(Default)]
struct Tally {
    rows: u64,
    learned: u64,
    already_allowed: u64,
    asked: u64,
    filtered: u64,
    not_learnable: u64,
    damaged: u64,
    unknown_identities: BTreeMap<String, u64>,
}

impl Tally {
    fn report(&self, files: &[PathBuf]) {
        let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
        eprintln!(
            "latchkey: read {} request{} from {}: {} to learn, {} already allowed (--all learns them too), {} decided by a rule that asks a person (never learned as an allow), {} filtered out, {} not learnable (refused for a reason no rule changes, or a path no glob pins)",
            self.rows,
            if self.rows == 1 { "" } else { "s" },
            names.join(", "),
            self.learned,
            self.already_allowed,
            self.asked,
            self.filtered,
            self.not_learnable
        );
        for (name, n) in &self.unknown_identities {
            eprintln!(
                "latchkey: warning: {n} request(s) of identity {name:?} skipped: the policy does not define it"
            );
        }
    }

    /// 0, or 2 when damaged lines were skipped (as `audit query` does).
    fn exit(&self) -> ExitCode {
        if self.damaged == 0 {
            return ExitCode::SUCCESS;
        }
        eprintln!(
            "latchkey: warning: {} damaged line(s) skipped: the log is not intact (`latchkey audit verify` tells what happened)",
            self.damaged
        );
        ExitCode::from(2)
    }
}

/// The request `row` stands for, if it is one to learn.
fn learnable(
    row: &Line,
    args: &LearnArgs,
    identities: &BTreeSet<String>,
    policy: Option<&Policy>,
) -> Result<Seen, Skip> {
    let f = &row.fields;
    if !args.identity.is_empty() && !args.identity.contains(&f.identity) {
        return Err(Skip::Filtered);
    }
    let raw: serde_json::Value = serde_json::from_str(&row.raw).map_err(|_| Skip::NotLearnable)?;
    let method = f.method.as_deref().ok_or(Skip::NotLearnable)?;
    if matches!(method, "CONNECT" | "DNS" | "APPROVAL") {
        return Err(Skip::Filtered);
    }
    let scheme = match raw["scheme"].as_str() {
        Some("https") => Scheme::Https,
        Some("http") => Scheme::Http,
        _ => return Err(Skip::NotLearnable),
    };
    let port = raw["port"]
        .as_u64()
        .and_then(|p| u16::try_from(p).ok())
        .ok_or(Skip::NotLearnable)?;
    let host = f
        .host
        .as_deref()
        .map(|h| h.trim_end_matches('.').to_ascii_lowercase())
        .filter(|h| {
            !h.is_empty()
                && h.parse::<std::net::IpAddr>().is_err()
                && h.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_')
        })
        .ok_or(Skip::NotLearnable)?;
    let path = f.path.as_deref().ok_or(Skip::NotLearnable)?;
    let path = path.split('?').next().unwrap_or(path);
    if !path.starts_with('/')
        || crate::wire::path::ambiguity(path).is_some()
        || crate::wire::path::check_rule_path(path, true).is_err()
    {
        return Err(Skip::NotLearnable);
    }
    let reason = Reason::ALL
        .into_iter()
        .find(|r| r.code() == f.reason)
        .ok_or(Skip::NotLearnable)?;
    let ok = match f.decision.as_str() {
        "allow" => reason.is_allow() || (f.would_deny && reason.is_policy_denial()),
        "deny" => reason.is_policy_denial(),
        _ => false,
    };
    if !ok {
        return Err(Skip::NotLearnable);
    }
    let identity = f.identity.clone();
    let defined = if identities.is_empty() {
        identity == DEFAULT_IDENTITY
    } else {
        identities.contains(&identity)
    };
    if !defined {
        return Err(Skip::UnknownIdentity(identity));
    }
    // What the policy decides now, whatever the record says (it was written under the policy
    // of its day): a rule is learned only where one can change that decision, so the learned
    // policy always allows what was learned (the self-check below).
    if let Some(policy) = policy {
        let url = crate::policy::display_url(scheme, &host, port, path);
        let now = explain(policy, Some(&identity), method, &url).map_err(|_| Skip::NotLearnable)?;
        match now.decision {
            Verdict::Allow if args.all => {}
            Verdict::Allow => return Err(Skip::AlreadyAllowed),
            // A rule with `ask` decides it: a person answers each time (an approved request is
            // in the log as allowed); learn never turns that question into an allow.
            Verdict::Ask if now.ask.as_ref().is_none_or(|a| a.rule != UNKNOWN) => {
                return Err(Skip::Asked)
            }
            // `[ask] unknown = true` asks because no rule allows it: a learned rule does.
            Verdict::Ask => {}
            Verdict::Deny => {
                let reason = Reason::ALL.into_iter().find(|r| r.code() == now.reason);
                if !reason.is_some_and(Reason::is_policy_denial) {
                    return Err(Skip::NotLearnable);
                }
            }
        }
    }
    Ok(Seen {
        identity,
        scheme,
        host,
        port,
        method: method.to_string(),
        path: path.to_string(),
        at: row.at,
    })
}

/// The learned file's header: what it is, from what, when, under which filters.
fn header(args: &LearnArgs, tally: &Tally) -> Vec<String> {
    let files: Vec<String> = args.files.iter().map(|f| f.display().to_string()).collect();
    let mut filters = Vec::new();
    if let Some(since) = args.since {
        filters.push(format!("--since {}", learn::rfc3339_seconds(since)));
    }
    for name in &args.identity {
        filters.push(format!("--identity {name}"));
    }
    if args.min_count > 1 {
        filters.push(format!("--min-count {}", args.min_count));
    }
    if args.all {
        filters.push("--all".to_string());
    }
    vec![
        format!(
            "{}: each allows exactly the methods, path globs and ports",
            &POLICY_MARK[2..]
        ),
        "seen in the audit log (ids, UUIDs, hashes and dates in paths generalised to `*`).".to_string(),
        format!(
            "From {} ({} requests learned), {}; filters: {}.",
            files.join(", "),
            tally.learned,
            learn::rfc3339_seconds(SystemTime::now()),
            if filters.is_empty() {
                "none".to_string()
            } else {
                filters.join(" ")
            }
        ),
        "No rule here carries a credential: add those by hand where the agent needs one.".to_string(),
        "A `# REVIEW:` line marks a rule that allows writes. `latchkey diff` shows the reach this adds.".to_string(),
    ]
}

fn cases_header(out: &Path) -> Vec<String> {
    vec![
        format!(
            "{} wrote to {}: requests seen (allow) and",
            &CASES_MARK[2..],
            out.display()
        ),
        "requests just outside them: a method not seen, a sibling path, another port (deny)."
            .to_string(),
    ]
}

#[cfg(test)]
#[path = "learn_tests.rs"]
mod tests;
