//! Stamps the git revision into `latchkey --version`, so a report names the exact build.
//!
//! `LATCHKEY_BUILD_REV` overrides it (release tarballs, distro builds); outside a git checkout
//! the version says `unknown revision` rather than failing the build.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

/// A crate built from its published package has no `.git`, but `cargo package` recorded the
/// commit in `.cargo_vcs_info.json` (`{"git": {"sha1": "…"}, …}`).
fn packaged_rev() -> Option<String> {
    let text = std::fs::read_to_string(".cargo_vcs_info.json").ok()?;
    let after = text.split("\"sha1\"").nth(1)?;
    let sha: String = after
        .trim_start_matches([' ', ':', '"'])
        .chars()
        .take_while(char::is_ascii_hexdigit)
        .collect();
    (sha.len() >= 7).then(|| format!("{}, packaged", &sha[..7]))
}

fn main() {
    println!("cargo:rerun-if-env-changed=LATCHKEY_BUILD_REV");
    let rev = match std::env::var("LATCHKEY_BUILD_REV") {
        Ok(r) if !r.trim().is_empty() => r.trim().to_string(),
        _ => {
            // Rebuild the stamp when HEAD moves (a commit, a checkout): HEAD itself, the ref it
            // points at, and packed-refs where refs end up after `git gc`.
            if let Some(git_dir) = git(&["rev-parse", "--git-dir"]) {
                println!("cargo:rerun-if-changed={git_dir}/HEAD");
                if let Some(common) = git(&["rev-parse", "--git-common-dir"]) {
                    println!("cargo:rerun-if-changed={common}/packed-refs");
                    if let Some(head_ref) = git(&["symbolic-ref", "-q", "HEAD"]) {
                        println!("cargo:rerun-if-changed={common}/{head_ref}");
                    }
                }
            }
            git(&["log", "-1", "--format=%h %cs"])
                .or_else(packaged_rev)
                .unwrap_or_else(|| "unknown revision".into())
        }
    };
    println!(
        "cargo:rustc-env=LATCHKEY_VERSION={} ({rev})",
        std::env::var("CARGO_PKG_VERSION").unwrap_or_default()
    );
}
