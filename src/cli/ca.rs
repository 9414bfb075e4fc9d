//! `latchkey ca init`, `show` and `install`: create latchkey's CA once, print it, and add it to a
//! system trust store (`cli::trust`).

use std::process::ExitCode;

use super::args::CaAction;
use crate::proxy::{CertAuthority, InitOutcome};

/// Runs one `ca` subcommand; the CA itself is `proxy::ca`'s (created 0600, never overwritten).
pub fn run(action: CaAction) -> anyhow::Result<ExitCode> {
    match action {
        CaAction::Init { ca_dir } => {
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
            println!(
                "trust it in a sandbox with: eval \"$(latchkey env --ca-dir {})\"",
                ca_dir.display()
            );
        }
        CaAction::Install { ca_dir, root } => {
            // The certificate only: an image that trusts latchkey never holds its key.
            let cert = ca_dir.join(crate::proxy::ca::CA_CERT_FILE);
            let pem = std::fs::read_to_string(&cert)
                .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", cert.display()))?;
            let done = super::trust::install(&pem, &root)?;
            for line in install_report(&done, &root) {
                println!("{line}");
            }
        }
        CaAction::Show { ca_dir } => {
            let ca = CertAuthority::load(&ca_dir)?;
            println!("certificate: {}", ca.cert_path().display());
            println!("sha256:      {}", ca.fingerprint());
            print!("{}", ca.cert_pem());
        }
    }
    Ok(ExitCode::SUCCESS)
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
