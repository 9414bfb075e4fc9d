//! A rule's `mcp` table, compiled: which JSON-RPC methods, tools and tool arguments an agent
//! may use on an MCP server behind the rule's hosts and paths (book "MCP tool rules").
//!
//! Host and path say *which server*; this says *which calls*. The proxy parses the JSON-RPC
//! messages and asks here by name; nothing here reads a request.

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};

/// The methods a rule with `mcp` allows when it does not list them: what a tool-calling
/// client needs (the handshake, liveness, notifications, listing and calling tools).
pub const DEFAULT_METHODS: &[&str] = &[
    "initialize",
    "ping",
    "notifications/*",
    "tools/list",
    "tools/call",
];

/// Compiled globs over names, with their source text for messages.
#[derive(Debug)]
pub struct NameGlobs {
    pub globs: Vec<String>,
    set: GlobSet,
}

impl NameGlobs {
    /// Compiles `globs`; `segments`: `*` stays inside a `/`-separated segment (arguments such
    /// as `org/repo`), else it matches any run of characters (method and tool names).
    pub fn new(globs: &[String], segments: bool) -> Result<NameGlobs, String> {
        let mut builder = GlobSetBuilder::new();
        for g in globs {
            let glob = GlobBuilder::new(g)
                .literal_separator(segments)
                .backslash_escape(true)
                .build()
                .map_err(|e| format!("invalid glob {g:?}: {}", e.kind()))?;
            builder.add(glob);
        }
        let set = builder.build().map_err(|e| e.to_string())?;
        Ok(NameGlobs {
            globs: globs.to_vec(),
            set,
        })
    }

    pub fn is_match(&self, name: &str) -> bool {
        self.set.is_match(name)
    }
}

/// A rule's JSON-RPC rules.
#[derive(Debug)]
pub struct McpRules {
    /// `None`: every tool not denied.
    pub tools: Option<NameGlobs>,
    pub deny_tools: Option<NameGlobs>,
    pub methods: NameGlobs,
    /// `args.NAME = "glob"`: where a `tools/call` passes argument NAME, it must be a string
    /// matching the glob.
    pub args: Vec<(String, NameGlobs)>,
    /// Remove the tools a call would be refused for from `tools/list` results.
    pub filter_list: bool,
}

/// An argument value, as far as a constraint can judge it.
pub enum ArgValue<'a> {
    Absent,
    Str(&'a str),
    /// Present but not a string (a number, object, list): never matches a glob.
    Other,
}

impl McpRules {
    /// Whether `method` may be sent; `Err` says why not.
    pub fn method(&self, method: &str) -> Result<(), String> {
        if self.methods.is_match(method) {
            return Ok(());
        }
        Err(format!(
            "method '{method}' is not allowed (methods: {})",
            self.methods.globs.join(", ")
        ))
    }

    /// Whether tool `name` may be called (listed, not denied); `Err` says why not.
    pub fn tool(&self, name: &str) -> Result<(), String> {
        if let Some(deny) = self.deny_tools.as_ref().filter(|d| d.is_match(name)) {
            return Err(format!(
                "tool '{name}' is denied (deny_tools: {})",
                deny.globs.join(", ")
            ));
        }
        match &self.tools {
            Some(allow) if !allow.is_match(name) => Err(format!(
                "tool '{name}' is not allowed (tools: {})",
                allow.globs.join(", ")
            )),
            _ => Ok(()),
        }
    }

    /// Whether a `tools/call` of `name` with these arguments may be sent.
    pub fn call<'a>(&self, name: &str, arg: impl Fn(&str) -> ArgValue<'a>) -> Result<(), String> {
        self.tool(name)?;
        for (arg_name, globs) in &self.args {
            let ok = match arg(arg_name) {
                ArgValue::Absent => true,
                ArgValue::Str(v) => globs.is_match(v),
                ArgValue::Other => false,
            };
            if !ok {
                return Err(format!(
                    "tool '{name}': argument '{arg_name}' must be a string matching {}",
                    globs.globs.join(", ")
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn globs(g: &[&str], segments: bool) -> NameGlobs {
        let g: Vec<String> = g.iter().map(|s| s.to_string()).collect();
        NameGlobs::new(&g, segments).expect("globs")
    }

    fn rules() -> McpRules {
        McpRules {
            tools: Some(globs(&["search_*", "get_issue"], false)),
            deny_tools: Some(globs(&["*delete*"], false)),
            methods: globs(DEFAULT_METHODS, false),
            args: vec![("repo".to_string(), globs(&["acme/*"], true))],
            filter_list: true,
        }
    }

    #[test]
    fn tools_are_listed_denied_and_constrained_by_argument() {
        let r = rules();
        assert!(r.tool("search_issues").is_ok());
        assert!(r.tool("get_issue").is_ok());
        assert!(r
            .tool("create_issue")
            .is_err_and(|e| e.contains("not allowed")));
        // Deny wins over allow.
        assert!(r
            .tool("search_delete_me")
            .is_err_and(|e| e.contains("denied")));
        let args = |v: ArgValue<'static>| {
            move |_: &str| match &v {
                ArgValue::Absent => ArgValue::Absent,
                ArgValue::Str(s) => ArgValue::Str(s),
                ArgValue::Other => ArgValue::Other,
            }
        };
        assert!(r
            .call("get_issue", args(ArgValue::Str("acme/widgets")))
            .is_ok());
        assert!(r.call("get_issue", args(ArgValue::Absent)).is_ok());
        assert!(r
            .call("get_issue", args(ArgValue::Str("acme/widgets/x")))
            .is_err());
        assert!(r
            .call("get_issue", args(ArgValue::Str("evil/widgets")))
            .is_err());
        assert!(r.call("get_issue", args(ArgValue::Other)).is_err());
    }

    #[test]
    fn the_default_methods_are_what_a_tool_calling_client_needs() {
        let r = rules();
        for m in [
            "initialize",
            "notifications/initialized",
            "tools/list",
            "tools/call",
            "ping",
        ] {
            assert!(r.method(m).is_ok(), "{m}");
        }
        for m in ["resources/read", "prompts/get", "sampling/createMessage"] {
            assert!(r.method(m).is_err(), "{m}");
        }
    }
}
