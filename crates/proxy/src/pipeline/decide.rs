//! The identify and decide phases: who is asking (still), and whether policy lets them.
//!
//! Deny by default: a request goes on only under a rule that allows it, or — report-only — under
//! the empty report rule with the denial it would have had kept for the record. The mapping
//! from a [`Decision`] to a [`Verdict`] is a pure function, so report-only mode is tested here
//! without a socket. This module reads the policy; it never touches the request body, the
//! network or the audit record.

use super::super::websocket;
use super::admit::Admitted;
use super::request::{Arrived, Req};
use crate::policy::{Decision, Identity, Policy, Rule, Target};
use crate::reason::{Reason, Refusal};

/// The identify and decide phases: the identity must still exist in the policy in force; deny
/// by default; report-only lets a policy denial through, marked; a rule's `ask` (or `[ask]
/// unknown` for a policy denial) needs a person first (the ask phase). Under a rule with
/// `paths`, the path must have one reading.
///
/// Guarantees: on `Ok`, the request context, under the verdict's rule, with `asking` set when
/// someone must be asked (only what a rule with `ask` allows, or what no rule allows under
/// `[ask] unknown`: report-only lets that through unasked); the record names the rule and
/// whether it is a would-be denial.
pub(super) fn decide<'a>(at: Arrived<'a>, target: Admitted) -> Result<Req<'a>, Refusal> {
    let (proxy, policy): (_, &'a Policy) = (at.proxy, at.policy);
    let identity = identity(policy, &at.ctx.identity)?;
    let decision = policy.decide(&Target {
        identity,
        narrowing: at.scoped.as_ref().map(|s| &s.narrowing),
        scheme: target.scheme,
        host: &target.host,
        port: target.port,
        method: &at.head.method,
        path: target.path(),
        websocket: websocket::requested(&at.head.headers),
        query: target.path_and_query.split_once('?').map(|(_, q)| q),
        headers: Some(&at.head.headers),
    });
    // Predicates that read the body are settled by the predicates phase, body in hand.
    let pending = (decision.allowed() && decision.body.is_some()).then(|| decision.clone());
    let asking = policy.asks(&decision);
    let denial = (!decision.allowed()).then_some(decision.reason);
    let verdict = verdict(decision, proxy.report_all, &proxy.report_rule)
        .or_else(|refusal| ask_unknown(refusal, asking, &proxy.unknown_rule))?;
    let asking = asking.filter(|a| a.rule.is_some() || verdict.would_deny.is_none());
    if let Some(w) = &verdict.would_deny {
        tracing::warn!(audit.id = %at.entry.id(), reason = w.reason.code(), message = %at.entry.scrub_text(&w.message), "report-only: would deny");
    }
    rule_path(&target, verdict.rule)?;
    let would_deny = verdict.would_deny.as_ref().map(|w| w.reason);
    at.entry.allow(verdict.record_rule(), would_deny);
    let mut req = Req::new(at, target, identity, verdict);
    req.asking = asking.map(|a| (a, denial));
    req.pending = pending;
    Ok(req)
}

/// Checks the identity the connection-level step found is still defined by the policy in force
/// (a reload may have removed it since the connection began: fail closed).
///
/// Guarantees: `Ok(None)` only when the policy defines no identities (every rule applies);
/// otherwise `Ok(Some(_))` with the identity, or a `proxy_auth_required` refusal.
pub(crate) fn identity<'p>(
    policy: &'p Policy,
    name: &str,
) -> Result<Option<&'p Identity>, Refusal> {
    if policy.identities().is_empty() {
        return Ok(None);
    }
    match policy.identity(name) {
        Some(i) => Ok(Some(i)),
        None => Err(Refusal::new(
            Reason::ProxyAuthRequired,
            format!("identity '{name}' is not defined by the policy in force"),
        )),
    }
}

/// A request policy lets go on, and under what.
#[derive(Debug)]
pub(super) struct Verdict<'a> {
    /// The rule the request goes on under: the one that allowed it, or the empty report rule.
    pub rule: &'a Rule,
    /// Report-only: the denial policy would have made, kept for the record and the log.
    pub would_deny: Option<WouldDeny<'a>>,
}

/// A policy denial that report-only mode let through.
#[derive(Debug)]
pub(super) struct WouldDeny<'a> {
    pub reason: Reason,
    /// The rule that came closest, if any: the record names it.
    pub closest: Option<&'a str>,
    /// The denial's sentence, for the log line.
    pub message: String,
}

impl Verdict<'_> {
    /// The rule the record names: the closest rule of a would-be denial, else the rule in force.
    pub fn record_rule(&self) -> &str {
        self.would_deny
            .as_ref()
            .and_then(|w| w.closest)
            .unwrap_or(&self.rule.name)
    }
}

/// Maps policy's decision to a verdict: allowed, let through report-only, or refused.
///
/// Assumes: `decision` came from [`Policy::decide`] for this request. Guarantees: only a policy
/// denial ([`Reason::is_policy_denial`]) is ever let through, and only under `--mode report`
/// (`report_all`) or a closest rule in report mode; it then runs under `report_rule`, so no
/// secret rides on a would-be denial. Every other denial is a refusal naming the closest rule.
pub(super) fn verdict<'a>(
    decision: Decision<'a>,
    report_all: bool,
    report_rule: &'a Rule,
) -> Result<Verdict<'a>, Refusal> {
    match decision.rule {
        Some(rule) if decision.allowed() => Ok(Verdict {
            rule,
            would_deny: None,
        }),
        closest
            if decision.reason.is_policy_denial()
                && (report_all || closest.is_some_and(|r| r.report)) =>
        {
            Ok(Verdict {
                rule: report_rule,
                would_deny: Some(WouldDeny {
                    reason: decision.reason,
                    closest: closest.map(|r| r.name.as_str()),
                    message: decision.message,
                }),
            })
        }
        rule => Err(Refusal {
            reason: decision.reason,
            rule: rule.map(|r| r.name.clone()),
            message: decision.message,
        }),
    }
}

/// A policy denial that `[ask] unknown` turns into a question: it goes on (to the ask phase)
/// under the empty `unknown` rule. Any other refusal stands.
pub(super) fn ask_unknown<'a>(
    refusal: Refusal,
    asking: Option<crate::policy::Asking<'_>>,
    unknown: &'a Rule,
) -> Result<Verdict<'a>, Refusal> {
    match asking {
        Some(a) if a.rule.is_none() && refusal.reason.is_policy_denial() => Ok(Verdict {
            rule: unknown,
            would_deny: None,
        }),
        _ => Err(refusal),
    }
}

/// Under a rule with `paths`, refuses `;` parameters and empty segments: the rule matched one
/// reading of the path, and an upstream may act on another (`ambiguous_path`).
///
/// Assumes: `rule` is the verdict's rule. Guarantees: on `Ok`, the path the rule matched is the
/// only one an upstream can read.
pub(super) fn rule_path(target: &Admitted, rule: &Rule) -> Result<(), Refusal> {
    crate::wire::path::check_rule_path(target.path(), rule.paths.is_some()).map_err(|why| {
        Refusal::new(
            Reason::AmbiguousPath,
            format!(
                "path {:?} {why}: an upstream may resolve it differently than policy matched it",
                target.path()
            ),
        )
        .under(&rule.name)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(name: &str, report: bool) -> Rule {
        Rule {
            name: name.to_string(),
            report,
            ..Rule::report_only()
        }
    }

    fn decision<'a>(reason: Reason, rule: Option<&'a Rule>) -> Decision<'a> {
        Decision {
            reason,
            rule,
            message: format!("because {reason}"),
            body: None,
        }
    }

    #[test]
    fn an_allow_goes_on_under_its_rule_and_is_no_would_be_denial() {
        let (api, report) = (rule("api", false), Rule::report_only());
        for report_all in [false, true] {
            let v = verdict(decision(Reason::Allowed, Some(&api)), report_all, &report)
                .expect("allowed");
            assert_eq!(v.rule.name, "api");
            assert!(v.would_deny.is_none());
            assert_eq!(v.record_rule(), "api");
        }
    }

    #[test]
    fn a_policy_denial_is_refused_under_the_closest_rule_outside_report_mode() {
        let (api, report) = (rule("api", false), Rule::report_only());
        let r = verdict(
            decision(Reason::MethodNotAllowed, Some(&api)),
            false,
            &report,
        )
        .expect_err("refused");
        assert_eq!(r.reason, Reason::MethodNotAllowed);
        assert_eq!(r.rule.as_deref(), Some("api"));
        assert_eq!(r.message, "because method_not_allowed");
        let r = verdict(decision(Reason::NoRule, None), false, &report).expect_err("refused");
        assert_eq!((r.reason, r.rule), (Reason::NoRule, None));
    }

    #[test]
    fn report_mode_lets_a_policy_denial_through_under_the_empty_rule_naming_the_closest() {
        let (api, report) = (rule("api", false), Rule::report_only());
        let v =
            verdict(decision(Reason::PathNotAllowed, Some(&api)), true, &report).expect("reported");
        assert_eq!(
            v.rule.name, "report-only",
            "no secret rides on a would-be denial"
        );
        let w = v.would_deny.as_ref().expect("marked");
        assert_eq!((w.reason, w.closest), (Reason::PathNotAllowed, Some("api")));
        assert_eq!(v.record_rule(), "api");
        let v = verdict(decision(Reason::NoRule, None), true, &report).expect("reported");
        assert_eq!(v.record_rule(), "report-only");
    }

    #[test]
    fn a_rule_in_report_mode_lets_only_its_own_near_misses_through() {
        let (audit, report) = (rule("audit-me", true), Rule::report_only());
        let v = verdict(
            decision(Reason::IdentityNotAllowed, Some(&audit)),
            false,
            &report,
        )
        .expect("reported");
        assert_eq!(v.record_rule(), "audit-me");
        assert!(verdict(decision(Reason::NoRule, None), false, &report).is_err());
    }

    #[test]
    fn a_compiled_policy_feeds_the_verdict_and_only_explain_words_an_allow() {
        let text = "[[rules]]\nname = \"api\"\nhosts = [\"api.test\"]\nmethods = [\"GET\"]\n\n\
                    [[rules]]\nname = \"watch\"\nhosts = [\"watch.test\"]\nmethods = [\"GET\"]\nmode = \"report\"\n";
        let policy = crate::policy::compile_sources(&[(std::path::Path::new("p.toml"), text)])
            .unwrap_or_else(|e| panic!("policy: {e:?}"));
        let report = Rule::report_only();
        let target = |host, method| crate::policy::Target {
            identity: None,
            narrowing: None,
            websocket: false,
            scheme: crate::policy::Scheme::Https,
            host,
            port: 443,
            method,
            path: "/x",
            query: None,
            headers: None,
        };
        let (get, post) = (http::Method::GET, http::Method::POST);
        let allow = policy.decide(&target("api.test", &get));
        assert!(allow.message.is_empty(), "the hot path formats no sentence");
        let explained = policy.decide_explained(&target("api.test", &get));
        assert_eq!(
            explained.message,
            "rule 'api' allows GET https://api.test/x"
        );
        let v = verdict(allow, false, &report).expect("allowed");
        assert_eq!(v.record_rule(), "api");
        let denied = verdict(policy.decide(&target("api.test", &post)), false, &report);
        let r = denied.expect_err("refused");
        assert_eq!(
            (r.reason, r.rule.as_deref()),
            (Reason::MethodNotAllowed, Some("api"))
        );
        assert!(r.message.contains("allows only GET"), "{}", r.message);
        let v = verdict(policy.decide(&target("watch.test", &post)), false, &report)
            .expect("a report-mode rule lets its near miss through");
        assert_eq!(
            (v.rule.name.as_str(), v.record_rule()),
            ("report-only", "watch")
        );
    }

    #[test]
    fn report_mode_never_lets_a_denial_through_that_is_not_policys() {
        let (audit, report) = (rule("audit-me", true), Rule::report_only());
        for reason in Reason::ALL.into_iter().filter(|r| !r.is_allow()) {
            let out = verdict(decision(reason, Some(&audit)), true, &report);
            assert_eq!(out.is_ok(), reason.is_policy_denial(), "{reason}");
        }
    }
}
