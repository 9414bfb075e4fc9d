//! `latchkey env`: the environment a sandbox needs to use latchkey, for every common client.
//!
//! Clients disagree on where they read trust from, so one bundle (system roots plus latchkey's
//! CA: hosts on `tunnel = true` rules still present their real certificates) is written next to
//! the CA and every PEM variable points at it (Deno's `DENO_CERT` too); the JVM, which reads no
//! PEM, gets the same certificates as a PKCS#12 truststore beside it (`cli::trust`), named by
//! `JAVA_TOOL_OPTIONS`.
//!
//! Uses `proxy::ca` for the CA and `cli::trust` for the truststore, nothing else in the crate:
//! it never starts a proxy.

use std::path::{Path, PathBuf};

/// System trust bundles, first match wins.
const SYSTEM_BUNDLES: [&str; 4] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
    "/etc/ssl/ca-bundle.pem",
];

/// File name of the combined bundle inside the CA directory.
pub const BUNDLE_FILE: &str = "latchkey-bundle.pem";

/// Variables that take a path to a PEM bundle.
const BUNDLE_VARS: [&str; 12] = [
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "GIT_SSL_CAINFO",
    "PIP_CERT",
    "AWS_CA_BUNDLE",
    "HTTPLIB2_CA_CERTS",
    "CLOUDSDK_CORE_CUSTOM_CA_CERTS_FILE",
    "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH",
    "NIX_SSL_CERT_FILE",
    "NODE_EXTRA_CA_CERTS",
    "DENO_CERT",
];

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// `export NAME='value'` lines for `eval`.
    Shell,
    /// `NAME=value` lines for env files.
    Dotenv,
    /// One JSON object.
    Json,
}

#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    #[error("cannot write trust bundle {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot resolve {path}: {source}")]
    Path {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("--no-proxy {0:?}: a host list must not hold control characters")]
    NoProxy(String),
    #[error(transparent)]
    Trust(#[from] super::trust::TrustError),
}

/// `latchkey env`: reads the CA certificate `serve` made (never creating one: a fresh CA would
/// be one no running latchkey signs with), writes the bundle next to it and prints the
/// variables in `format`.
pub fn run(
    proxy_url: &str,
    ca_dir: &Path,
    format: Format,
    no_proxy: &str,
    install: Option<&Path>,
) -> anyhow::Result<std::process::ExitCode> {
    let cert_pem = super::ca::existing_cert(ca_dir)?;
    let vars = variables(proxy_url, ca_dir, &cert_pem, no_proxy)?;
    // The system store first: a failed install must not leave half the output evaluated.
    if let Some(root) = install {
        let done = super::trust::install(&cert_pem, root)?;
        for line in super::ca::install_report(&done, root) {
            eprintln!("latchkey: {line}");
        }
    }
    print!("{}", render(&vars, format));
    Ok(std::process::ExitCode::SUCCESS)
}

/// Writes `dir/latchkey-bundle.pem` (the system roots, if any, then the CA) and returns its
/// path with the system roots it read (the truststore holds the same).
pub fn write_bundle(dir: &Path, ca_pem: &str) -> Result<(PathBuf, Option<String>), EnvError> {
    let bundle = dir.join(BUNDLE_FILE);
    let mut text = String::new();
    let system = SYSTEM_BUNDLES
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok());
    match &system {
        Some(system) => {
            text.push_str(system);
            if !text.ends_with('\n') {
                text.push('\n');
            }
        }
        None => {
            tracing::warn!("no system trust bundle found: the bundle trusts latchkey's CA only")
        }
    }
    text.push_str("# latchkey CA\n");
    text.push_str(ca_pem);
    std::fs::write(&bundle, text).map_err(|source| EnvError::Write {
        path: bundle.clone(),
        source,
    })?;
    Ok((bundle, system))
}

/// `NO_PROXY` by default: loopback stays off the proxy, so a sandbox's local services (a dev
/// server, a test database) keep working. The rendered output says so, because a trial
/// against a local upstream then silently bypasses latchkey.
pub const DEFAULT_NO_PROXY: &str = "localhost,127.0.0.1,::1";

/// Writes the combined bundle and returns the variables, in a stable order. `no_proxy` is the
/// `NO_PROXY`/`no_proxy` list; empty gives both the empty value, which [`render`] prints as an
/// unset (shell) or an empty value, so every request goes through latchkey, even after an
/// earlier `eval` set them.
pub fn variables(
    proxy_url: &str,
    ca_dir: &Path,
    ca_pem: &str,
    no_proxy: &str,
) -> Result<Vec<(String, String)>, EnvError> {
    // The list also lands in a comment line of `eval`ed shell output: a line break there
    // would turn the rest of the list into a command.
    if no_proxy.chars().any(char::is_control) {
        return Err(EnvError::NoProxy(no_proxy.to_string()));
    }
    let ca_dir = ca_dir.canonicalize().map_err(|source| EnvError::Path {
        path: ca_dir.to_path_buf(),
        source,
    })?;
    let (bundle, system) = write_bundle(&ca_dir, ca_pem)?;
    let bundle = bundle.display().to_string();
    let mut vars = vec![
        ("HTTP_PROXY".to_string(), proxy_url.to_string()),
        ("HTTPS_PROXY".to_string(), proxy_url.to_string()),
        ("http_proxy".to_string(), proxy_url.to_string()),
        ("https_proxy".to_string(), proxy_url.to_string()),
    ];
    vars.push(("NO_PROXY".to_string(), no_proxy.to_string()));
    vars.push(("no_proxy".to_string(), no_proxy.to_string()));
    vars.push(("SSL_CERT_DIR".to_string(), ca_dir.display().to_string()));
    vars.extend(BUNDLE_VARS.iter().map(|v| (v.to_string(), bundle.clone())));
    let truststore = super::trust::write_truststore(&ca_dir, ca_pem, system.as_deref())?;
    match super::trust::java_tool_options(&truststore) {
        Some(options) => vars.push(("JAVA_TOOL_OPTIONS".to_string(), options)),
        None => tracing::warn!(
            path = %truststore.display(),
            "JAVA_TOOL_OPTIONS left out: the truststore's path holds both quote characters, \
             which the JVM cannot read there; use a --ca-dir without them"
        ),
    }
    Ok(vars)
}

/// The comment line printed before `NO_PROXY` in the shell and dotenv formats.
fn no_proxy_comment(list: &str) -> String {
    format!(
        "# NO_PROXY: requests to {} bypass latchkey (curl applies it even over -x); \
         --no-proxy '' to send them through latchkey too\n",
        list.replace(',', ", ")
    )
}

/// The two variables an empty `--no-proxy` clears.
fn is_no_proxy(name: &str) -> bool {
    name.eq_ignore_ascii_case("no_proxy")
}

/// Renders variables in a format. The shell and dotenv formats say in a comment which hosts
/// `NO_PROXY` keeps away from latchkey; JSON has no comments and stays plain. An empty
/// `NO_PROXY` is `unset NO_PROXY no_proxy` in the shell format (an `eval` clears what an
/// earlier one set) and an empty value in dotenv and JSON (which cannot unset).
pub fn render(vars: &[(String, String)], format: Format) -> String {
    let line = |k: &str, v: &str, text: String| -> String {
        if k == "NO_PROXY" && !v.is_empty() {
            no_proxy_comment(v) + &text
        } else {
            text
        }
    };
    match format {
        Format::Shell => vars
            .iter()
            .map(|(k, v)| match (is_no_proxy(k), v.is_empty()) {
                (true, true) if k == "NO_PROXY" => "unset NO_PROXY no_proxy\n".to_string(),
                (true, true) => String::new(),
                _ => line(k, v, format!("export {k}='{}'\n", v.replace('\'', "'\\''"))),
            })
            .collect(),
        Format::Dotenv => vars
            .iter()
            .map(|(k, v)| line(k, v, format!("{k}={v}\n")))
            .collect(),
        Format::Json => {
            let map: serde_json::Map<String, serde_json::Value> = vars
                .iter()
                .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                .collect();
            let mut s = serde_json::Value::Object(map).to_string();
            s.push('\n');
            s
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_values_are_quoted() {
        let v = vec![("A".to_string(), "it's".to_string())];
        assert_eq!(render(&v, Format::Shell), "export A='it'\\''s'\n");
    }

    /// A CA certificate in PEM, as `proxy::ca` writes one.
    fn ca_pem() -> String {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.self_signed(&key).expect("cert").pem()
    }

    #[test]
    fn every_bundle_variable_points_at_a_bundle_holding_the_ca() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pem = ca_pem();
        let vars =
            variables("http://127.0.0.1:3128", dir.path(), &pem, DEFAULT_NO_PROXY).expect("vars");
        for name in BUNDLE_VARS {
            let (_, path) = vars.iter().find(|(k, _)| k == name).expect(name);
            let text = std::fs::read_to_string(path).expect("bundle");
            assert!(text.ends_with(&pem));
        }
        let (_, java) = vars
            .iter()
            .find(|(k, _)| k == "JAVA_TOOL_OPTIONS")
            .expect("JAVA_TOOL_OPTIONS");
        let store = dir
            .path()
            .canonicalize()
            .expect("canonical")
            .join(super::super::trust::TRUSTSTORE_FILE);
        assert!(
            java.contains(&format!("-Djavax.net.ssl.trustStore={} ", store.display())),
            "{java}"
        );
        assert!(store.is_file());
        assert!(vars
            .iter()
            .any(|(k, v)| k == "HTTPS_PROXY" && v == "http://127.0.0.1:3128"));
    }

    fn vars_with(no_proxy: &str) -> Result<Vec<(String, String)>, EnvError> {
        let dir = tempfile::tempdir().expect("tempdir");
        variables("http://127.0.0.1:3128", dir.path(), &ca_pem(), no_proxy)
    }

    #[test]
    fn shell_and_dotenv_say_in_a_comment_that_no_proxy_bypasses_latchkey() {
        let vars = vars_with(DEFAULT_NO_PROXY).expect("vars");
        for format in [Format::Shell, Format::Dotenv] {
            let text = render(&vars, format);
            let lines: Vec<&str> = text.lines().collect();
            let comments: Vec<usize> = (0..lines.len())
                .filter(|&i| lines[i].starts_with('#'))
                .collect();
            assert_eq!(comments.len(), 1, "{format:?}: {text}");
            let (comment, next) = (lines[comments[0]], lines[comments[0] + 1]);
            assert!(
                comment.contains("localhost, 127.0.0.1, ::1 bypass latchkey")
                    && comment.contains("--no-proxy ''"),
                "{comment}"
            );
            assert!(
                next.contains("NO_PROXY="),
                "{format:?}: the comment precedes NO_PROXY: {text}"
            );
        }
        let json: serde_json::Value =
            serde_json::from_str(&render(&vars, Format::Json)).expect("JSON stays valid");
        assert_eq!(json["NO_PROXY"], DEFAULT_NO_PROXY);
    }

    #[test]
    fn an_empty_no_proxy_list_unsets_both_variables_in_every_format() {
        let vars = vars_with("").expect("vars");
        let shell = render(&vars, Format::Shell);
        assert!(!shell.contains('#'), "{shell}");
        let unsets: Vec<&str> = shell
            .lines()
            .filter(|l| l.contains("no_proxy") || l.contains("NO_PROXY"))
            .collect();
        assert_eq!(unsets, vec!["unset NO_PROXY no_proxy"], "{shell}");
        let dotenv = render(&vars, Format::Dotenv);
        assert!(
            dotenv.lines().any(|l| l == "NO_PROXY=") && dotenv.lines().any(|l| l == "no_proxy="),
            "{dotenv}"
        );
        let json: serde_json::Value =
            serde_json::from_str(&render(&vars, Format::Json)).expect("JSON");
        assert_eq!(
            (&json["NO_PROXY"], &json["no_proxy"]),
            (&"".into(), &"".into())
        );
    }

    #[test]
    fn a_no_proxy_list_with_a_line_break_is_refused() {
        let err = vars_with("localhost\nrm -rf ~").expect_err("a newline would end the comment");
        assert!(err.to_string().starts_with("--no-proxy "), "{err}");
    }
}
