//! `latchkey --version` names the exact build: crate version and git revision.

use std::process::Command;

use crate::support::latchkey::BIN;

#[test]
fn version_names_the_crate_version_and_the_git_revision() {
    let out = Command::new(BIN)
        .arg("--version")
        .output()
        .expect("run latchkey --version");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let expected_prefix = format!("latchkey {} (", env!("CARGO_PKG_VERSION"));
    assert!(text.starts_with(&expected_prefix), "{text}");
    // In a git checkout (CI's fresh clone included) the stamp is HEAD's short hash and date.
    let head = Command::new("git")
        .args(["log", "-1", "--format=%h %cs"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run git");
    if head.status.success() {
        let head = String::from_utf8_lossy(&head.stdout);
        assert_eq!(text.trim(), format!("{expected_prefix}{})", head.trim()));
    } else {
        assert_eq!(text.trim(), format!("{expected_prefix}unknown revision)"));
    }
    // Subcommands print the same stamp.
    let sub = Command::new(BIN)
        .args(["serve", "--version"])
        .output()
        .expect("run");
    assert!(
        String::from_utf8_lossy(&sub.stdout).contains(text.trim().trim_start_matches("latchkey "))
    );
}
