//! `latchkey ca init`, `show` and `install`: create latchkey's CA once, print it, and add it to a
//! system trust store (`cli::trust`).

use std::path::Path;
use std::process::ExitCode;

use super::args::CaAction;
use crate::proxy::{CertAuthority, InitOutcome};

/// Runs one `ca` subcommand; the CA itself is `proxy::ca`'s (created 0600, never overwritten).
pub fn run(action: CaAction) -> anyhow::Result<ExitCode> {
    match action {
        CaAction::Init { ca_dir, export } => {
            let outcome = crate::proxy::ca::init(&ca_dir)?;
            let ca = CertAuthority::load(&ca_dir)?;
            match outcome {
                InitOutcome::Created => println!("created CA in {}", ca_dir.display()),
                InitOutcome::Existing => {
                    println!("CA already exists in {} (left unchanged)", ca_dir.display())
                }
            }
            println!("certificate: {}", ca.cert_path().display());
            println!("sha256:      {}", ca.fingerprint());
            match export {
                Some(dir) => {
                    for path in export_trust(ca.cert_pem(), &dir)? {
                        println!("wrote {}", path.display());
                    }
                }
                None => println!(
                    "trust it in a sandbox with: eval \"$(latchkey env --ca-dir {})\"",
                    ca_dir.display()
                ),
            }
        }
        CaAction::Install { ca_dir, root } => {
            // The certificate only: an image that trusts latchkey never holds its key.
            let pem = existing_cert(&ca_dir)?;
            let done = super::trust::install(&pem, &root)?;
            for line in install_report(&done, &root) {
                println!("{line}");
            }
        }
        CaAction::Show { ca_dir } => {
            existing_cert(&ca_dir)?;
            let ca = CertAuthority::load(&ca_dir)?;
            println!("certificate: {}", ca.cert_path().display());
            println!("sha256:      {}", ca.fingerprint());
            print!("{}", ca.cert_pem());
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `ca init --export DIR`: what a sandbox needs to trust the CA, never its key, written into
/// `dir` (which must exist: it is a volume or a directory the operator made) with the names
/// `latchkey env` gives them, so a sandbox mounting `dir` at its CA directory path gets the
/// variables `env` renders right. Returns the paths written.
pub fn export_trust(ca_pem: &str, dir: &Path) -> anyhow::Result<Vec<std::path::PathBuf>> {
    anyhow::ensure!(
        dir.is_dir(),
        "--export {}: not a directory (make it first; it receives the CA certificate, the \
         bundle and the JVM truststore)",
        dir.display()
    );
    let cert = dir.join(crate::proxy::ca::CA_CERT_FILE);
    std::fs::write(&cert, ca_pem)
        .map_err(|e| anyhow::anyhow!("--export: cannot write {}: {e}", cert.display()))?;
    let (bundle, system) = super::env::write_bundle(dir, ca_pem)?;
    let truststore = super::trust::write_truststore(dir, ca_pem, system.as_deref())?;
    Ok(vec![cert, bundle, truststore])
}

/// The CA certificate (PEM) in `ca_dir`, for a command that needs the CA latchkey serves with
/// and must never make one (`env`, `ca show`, `ca install`): only `serve` and `ca init` create a
/// CA. A missing one is an error naming the directory looked in (and the flag or variable that
/// chose it), how to create one there, and how to point at another.
pub fn existing_cert(ca_dir: &Path) -> anyhow::Result<String> {
    let cert = ca_dir.join(crate::proxy::ca::CA_CERT_FILE);
    match std::fs::read_to_string(&cert) {
        Ok(pem) => Ok(pem),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let shown = ca_dir.display().to_string();
            let absolute = std::path::absolute(ca_dir)
                .map(|a| a.display().to_string())
                .unwrap_or_else(|_| shown.clone());
            let looked = if absolute == shown {
                shown.clone()
            } else {
                format!("{shown} ({absolute})")
            };
            let flag = super::given::flag("ca_dir");
            let chosen = if flag == "--ca-dir" {
                String::new()
            } else {
                format!(", chosen by {flag}")
            };
            anyhow::bail!(
                "no latchkey CA in {looked}{chosen}: {} does not exist. Point at the CA your \
                 `latchkey serve` uses with --ca-dir DIR (or LATCHKEY_CA_DIR), or create one \
                 here with `latchkey ca init --ca-dir {shown}` (`latchkey serve --ca-dir \
                 {shown}` creates it too)",
                crate::proxy::ca::CA_CERT_FILE
            )
        }
        Err(e) => Err(anyhow::anyhow!("cannot read {}: {e}", cert.display())),
    }
}

/// What an install did, one line each (`ca install` prints them, `env --install` sends them to
/// stderr so its stdout stays shell lines).
pub fn install_report(done: &super::trust::Installed, root: &std::path::Path) -> Vec<String> {
    let mut lines = vec![format!("wrote {} ({:?})", done.path.display(), done.system)];
    lines.push(if done.updated {
        "ran update-ca-certificates: the system store trusts latchkey's CA".to_string()
    } else {
        format!(
            "now run update-ca-certificates inside {} (in a Dockerfile: RUN update-ca-certificates)",
            root.display()
        )
    });
    lines
}
