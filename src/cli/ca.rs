//! `latchkey ca init` and `latchkey ca show`: create latchkey's CA once, and print it.

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
        CaAction::Show { ca_dir } => {
            let ca = CertAuthority::load(&ca_dir)?;
            println!("certificate: {}", ca.cert_path().display());
            println!("sha256:      {}", ca.fingerprint());
            print!("{}", ca.cert_pem());
        }
    }
    Ok(ExitCode::SUCCESS)
}
