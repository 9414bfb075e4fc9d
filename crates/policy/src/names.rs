//! Which host names policy could allow at all, for a caller that must answer before it knows
//! the port, method, path or identity (latchkey's resolver). Uses the same host index as
//! [`Policy::decide`], so a name is allowable here exactly when some rule's host pattern (exact
//! or `*.` wildcard) names it. Knows nothing of DNS.

use super::{Policy, Rule};

impl Policy {
    /// The first rule, in decision order, whose host patterns match `host` (normalised), for
    /// any port, method, path or identity.
    pub fn rule_for_host(&self, host: &str) -> Option<&Rule> {
        self.candidates(host).next()
    }

    /// Whether some rule's host pattern matches `host` (normalised): a request to it could be
    /// allowed on some port, for some identity.
    pub fn could_allow_host(&self, host: &str) -> bool {
        self.rule_for_host(host).is_some()
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    fn policy(text: &str) -> crate::Policy {
        crate::compile_sources(&[(Path::new("main.toml"), text)]).expect("valid policy")
    }

    #[test]
    fn exact_and_wildcard_hosts_are_allowable_and_nothing_else() {
        let p = policy(
            "[[rules]]\nname = \"api\"\nhosts = [\"api.example.com\"]\nports = [8443]\n\n\
             [[rules]]\nname = \"cdn\"\nhosts = [\"*.cdn.example\"]\nmethods = [\"GET\"]\n",
        );
        assert!(p.could_allow_host("api.example.com"));
        assert_eq!(
            p.rule_for_host("api.example.com").map(|r| r.name.as_str()),
            Some("api")
        );
        assert!(p.could_allow_host("a.cdn.example"));
        assert!(p.could_allow_host("a.b.cdn.example"));
        assert_eq!(
            p.rule_for_host("x.cdn.example").map(|r| r.name.as_str()),
            Some("cdn")
        );
        // A wildcard never matches its apex; nothing matches a sibling or a suffix trick.
        for host in [
            "cdn.example",
            "example.com",
            "www.example.com",
            "api.example.com.evil",
            "evilcdn.example",
        ] {
            assert!(!p.could_allow_host(host), "{host}");
        }
    }
}
