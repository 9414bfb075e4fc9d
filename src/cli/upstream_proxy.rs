//! `latchkey serve --upstream-proxy URL [--upstream-proxy-credentials USER:SOURCE]
//! [--upstream-proxy-bypass LIST]`: the flags, validated into an [`UpstreamProxy`] for the
//! dialer (`crates/upstream/src/chain.rs`), every problem named by its flag and entry.
//!
//! The password is read through a [`SecretStore`] (an `env:` or `file:` source now, at start, so
//! a missing one never serves; an `exec:` one when first needed, then as its TTL says) and
//! reaches the dialer only behind the [`ProxyPassword`] trait: never in argv, never formatted.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use zeroize::Zeroizing;

use super::args::ServeArgs;
use super::given::flag;
use crate::secrets::{SecretStore, Source};
use crate::upstream::chain::PasswordFuture;
use crate::upstream::{Bypass, ProxyAuth, ProxyPassword, ProxyUrl, UpstreamProxy};

/// The name the password has in its one-slot store (and in its errors).
const SECRET: &str = "upstream-proxy";

/// How long an `exec:` password is reused, and how long its command may run (the defaults a
/// policy's `[secrets]` entry has).
const EXEC_TTL: Duration = Duration::from_secs(300);
const EXEC_TIMEOUT: Duration = Duration::from_secs(10);

/// The upstream proxy the flags ask for, or `None` without `--upstream-proxy`.
pub(super) fn from_args(args: &ServeArgs) -> anyhow::Result<Option<UpstreamProxy>> {
    let Some(raw) = args.upstream_proxy.as_deref() else {
        return Ok(None);
    };
    let url =
        ProxyUrl::parse(raw).map_err(|e| anyhow::anyhow!("{}: {e}", flag("upstream_proxy")))?;
    let bypass = Bypass::parse(&args.upstream_proxy_bypass).map_err(|errors| {
        anyhow::anyhow!("{}: {}", flag("upstream_proxy_bypass"), errors.join("; "))
    })?;
    let auth = args
        .upstream_proxy_credentials
        .as_deref()
        .map(credentials)
        .transpose()?;
    Ok(Some(UpstreamProxy { url, auth, bypass }))
}

/// `USER:SOURCE`. Errors never echo the spec: a password typed in place of the source would be
/// in it.
fn credentials(spec: &str) -> anyhow::Result<ProxyAuth> {
    let name = flag("upstream_proxy_credentials");
    let (user, source) = spec.split_once(':').ok_or_else(|| {
        anyhow::anyhow!(
            "{name}: expected USER:SOURCE, SOURCE being env:VAR, file:PATH or exec:COMMAND"
        )
    })?;
    let source = Source::parse(source, EXEC_TTL, EXEC_TIMEOUT)
        .map_err(|e| anyhow::anyhow!("{name}: the password source: {e}"))?;
    let store = SecretStore::load(vec![(SECRET.to_string(), source)]).map_err(|errors| {
        let why: Vec<String> = errors.into_iter().map(|(_, e)| e).collect();
        anyhow::anyhow!("{name}: the password: {}", why.join("; "))
    })?;
    ProxyAuth::new(user, Arc::new(StorePassword(store)))
        .map_err(anyhow::Error::msg)
        .with_context(|| name.clone())
}

/// The password, read from its store on every proxied connection.
struct StorePassword(SecretStore);

impl ProxyPassword for StorePassword {
    fn password(&self) -> PasswordFuture<'_> {
        Box::pin(async move {
            let value = self.0.get(SECRET).await.map_err(|e| e.to_string())?;
            Ok(Zeroizing::new(value.expose().to_vec()))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn serve(extra: &[&str]) -> ServeArgs {
        let mut argv = vec!["latchkey", "serve"];
        argv.extend_from_slice(extra);
        match crate::cli::Cli::try_parse_from(argv)
            .expect("parsed")
            .command
        {
            crate::cli::Command::Serve(args) => *args,
            _ => panic!("not serve"),
        }
    }

    #[tokio::test]
    async fn the_password_comes_from_its_source_and_is_in_no_output() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("pass");
        std::fs::write(&path, "hunter2-hunter2\n").expect("write");
        let spec = format!("alice:file:{}", path.display());
        let args = serve(&[
            "--upstream-proxy",
            "http://10.0.0.5:3128",
            "--upstream-proxy-credentials",
            &spec,
        ]);
        let proxy = from_args(&args).expect("built").expect("a proxy");
        let auth = proxy.auth.as_ref().expect("auth");
        assert_eq!(auth.user(), "alice");
        assert!(!format!("{proxy:?}").contains("hunter2"));
        let password = StorePassword(
            SecretStore::load(vec![(SECRET.into(), Source::File(path.clone()))]).expect("store"),
        );
        assert_eq!(
            &password.password().await.expect("read")[..],
            b"hunter2-hunter2"
        );
    }

    #[test]
    fn bad_values_name_their_flag_and_never_echo_a_password() {
        for (argv, want) in [
            (
                vec!["--upstream-proxy", "https://p:443"],
                "--upstream-proxy: ",
            ),
            (
                vec!["--upstream-proxy", "http://u:hunter2@p:3128"],
                "--upstream-proxy-credentials USER:SOURCE",
            ),
            (
                vec![
                    "--upstream-proxy",
                    "http://p:3128",
                    "--upstream-proxy-bypass",
                    "10.0.0.0/8,a b",
                ],
                "--upstream-proxy-bypass: \"a b\"",
            ),
            (
                vec![
                    "--upstream-proxy",
                    "http://p:3128",
                    "--upstream-proxy-credentials",
                    "alice:hunter2",
                ],
                "--upstream-proxy-credentials: the password source",
            ),
            (
                vec![
                    "--upstream-proxy",
                    "http://p:3128",
                    "--upstream-proxy-credentials",
                    "hunter2",
                ],
                "expected USER:SOURCE",
            ),
            (
                vec![
                    "--upstream-proxy",
                    "http://p:3128",
                    "--upstream-proxy-credentials",
                    "alice:env:LATCHKEY_TEST_UNSET_PROXY_PASSWORD",
                ],
                "--upstream-proxy-credentials: the password",
            ),
        ] {
            let e = format!("{:#}", from_args(&serve(&argv)).expect_err("refused"));
            assert!(e.contains(want), "{argv:?}: {e}");
            assert!(!e.contains("hunter2"), "{argv:?}: {e}");
        }
    }
}
