//! Every rendered object, checked against the Kubernetes API's schemas by `kubernetes-validate`
//! (pinned in tests/clients/requirements.txt; it carries the schemas, so it runs offline) in
//! strict mode — an unknown field is an error — at the oldest Kubernetes the manifests support
//! and the newest the validator knows. An object whose kind it has no schema for is a failure
//! here too (the validator only warns), and so is an object it does not report on: a test that
//! validated nothing cannot pass. And the validator is shown to fail on a misspelled field.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_yaml_ng::Value;

use super::super::text;
use super::{manifests, rendered};
use crate::support::latchkey::wait_with_timeout;
use crate::support::toolchain::python;

/// The Kubernetes versions validated against: the oldest the manifests support (1.29's API has
/// every field they use, topology spread's `matchLabelKeys` included) and the newest the pinned
/// validator has schemas for.
const KUBERNETES_VERSIONS: &[&str] = &["1.29.0", "1.37.0"];

/// Validates `docs` at `version`: `Err` with the validator's output unless every object is
/// reported as passed and nothing failed or was warned about.
fn validate(docs: &[Value], version: &str) -> Result<(), String> {
    let dir = tempfile::tempdir().expect("temp dir");
    // As JSON (which is YAML): re-emitted YAML could be read back by the validator's YAML 1.1
    // parser with other types (`yes` as a boolean).
    let file = dir.path().join("objects.yaml");
    let text_of: Vec<String> = docs
        .iter()
        .map(|d| serde_json::to_string(d).expect("JSON of an object"))
        .collect();
    std::fs::write(&file, text_of.join("\n---\n")).expect("write objects");
    let out = run_validator(&file, version);
    let lines: Vec<&str> = out.lines().collect();
    let mut problems: Vec<String> = lines
        .iter()
        .filter(|l| !l.starts_with("INFO "))
        .map(|l| l.to_string())
        .collect();
    for doc in docs {
        let resource = format!(
            "resource {}/{} against",
            text(&doc["kind"]).to_lowercase(),
            text(&doc["metadata"]["name"])
        );
        if !lines
            .iter()
            .any(|l| l.starts_with("INFO ") && l.contains(" passed for ") && l.contains(&resource))
        {
            problems.push(format!("not reported as passed: {resource}"));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!("{}\n--- output:\n{out}", problems.join("\n")))
    }
}

/// `python -m kubernetes_validate --strict --kubernetes-version VERSION FILE`'s output (its
/// exit status is not trusted alone: it exits 0 on a kind it has no schema for).
fn run_validator(file: &Path, version: &str) -> String {
    let mut cmd = Command::new(python());
    cmd.args([
        "-m",
        "kubernetes_validate",
        "--strict",
        "--kubernetes-version",
        version,
    ])
    .arg(file);
    let out = wait_with_timeout(&mut cmd, Duration::from_secs(120));
    assert!(
        matches!(out.code(), Some(0 | 1)),
        "python -m kubernetes_validate did not run ({:?}): {}{}",
        out.code(),
        out.stdout,
        out.stderr
    );
    format!("{}{}", out.stdout, out.stderr)
}

#[test]
fn every_rendered_object_is_valid_against_the_kubernetes_schemas() {
    let docs: Vec<Value> = manifests().into_iter().map(|(_, d)| d).collect();
    let mut failures = Vec::new();
    for version in KUBERNETES_VERSIONS {
        if let Err(why) = validate(&docs, version) {
            failures.push(format!("Kubernetes {version}:\n{why}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn the_validator_rejects_a_misspelled_field_and_a_kind_it_does_not_know() {
    let deployment = rendered("single")
        .iter()
        .find(|d| text(&d["kind"]) == "Deployment")
        .expect("a Deployment")
        .clone();
    let version = KUBERNETES_VERSIONS[0];
    validate(std::slice::from_ref(&deployment), version)
        .unwrap_or_else(|why| panic!("the unchanged Deployment: {why}"));

    let mut misspelled = deployment.clone();
    let container = misspelled["spec"]["template"]["spec"]["containers"][0]
        .as_mapping_mut()
        .expect("a container");
    let pull = container
        .remove("imagePullPolicy")
        .expect("the Deployment sets imagePullPolicy");
    container.insert("imagePullPolicey".into(), pull);
    let why = validate(&[misspelled], version).expect_err("a misspelled field is rejected");
    assert!(why.contains("imagePullPolicey"), "{why}");

    let mut unknown = deployment;
    unknown["kind"] = Value::String("Deploymint".into());
    let why = validate(&[unknown], version).expect_err("an unknown kind is rejected");
    assert!(why.contains("Deploymint"), "{why}");
}
