//! The demo's four checks (allow, inject, redact, deny) and its audit check: each judges what
//! the sandbox and the echo saw against what latchkey promises, and says what it did not see.

use super::*;

/// One check: the request, what the sandbox saw, and whether it is what latchkey promises.
pub(super) struct Check {
    title: &'static str,
    curl: String,
    reply: Option<Reply>,
    shown: String,
    problems: Vec<String>,
}

/// Runs the four checks, prints each with its curl equivalent, then the audit records.
pub(super) async fn self_check(
    ws: &Workspace,
    files: &Files,
    secret: &SecretValue,
    echo: &Echo,
    proxy: SocketAddr,
) -> Result<bool, DemoError> {
    let tls = client::tls_trusting(&files.ca_pem).map_err(DemoError::Setup)?;
    let port = echo.port();
    let ca = ws.path(CA_DIR).join(crate::proxy::ca::CA_CERT_FILE);
    let curl = |extra: &str, path: &str| {
        format!(
            "curl -sS -i --noproxy '' --proxy {} --cacert {}{extra} https://{HOST}:{port}{path}",
            sh_word(&format!("http://{proxy}")),
            sh_quote(&ca)
        )
    };
    let expected = Zeroizing::new([b"Bearer ".as_slice(), secret.expose()].concat());
    let marker = format!("[REDACTED:{SECRET_NAME}]");

    let steps: [(&'static str, &'static str, http::Method, &str, String); 4] = [
        (
            "allow",
            "allow: a GET the policy allows reaches the echo",
            http::Method::GET,
            "/hello",
            curl("", "/hello"),
        ),
        (
            "inject",
            "inject: latchkey adds a credential the sandbox never held",
            http::Method::GET,
            "/whoami",
            curl("", "/whoami"),
        ),
        (
            "redact",
            "redact: the echo reflects that credential; latchkey scrubs it from the response",
            http::Method::GET,
            "/reflect",
            curl("", "/reflect"),
        ),
        (
            "deny",
            "deny: anything else is refused (deny by default), with the reason",
            http::Method::POST,
            "/hello",
            curl(" -X POST", "/hello"),
        ),
    ];

    let mut checks = Vec::new();
    let mut ids = Vec::new();
    for (i, (step, title, method, path, curl)) in steps.into_iter().enumerate() {
        let req = http::Request::builder()
            .method(method)
            .uri(path)
            .header(echo::STEP_HEADER, step);
        let mut check = Check {
            title,
            curl,
            reply: None,
            shown: String::new(),
            problems: Vec::new(),
        };
        match client::send(proxy, tls.clone(), HOST, port, req).await {
            Ok(reply) => {
                ids.push(reply.header("x-latchkey-id").to_string());
                if contains(&reply_bytes(&reply), secret.expose()) {
                    check
                        .problems
                        .push("the response holds the demo secret's value".to_string());
                }
                check.reply = Some(reply);
                match step {
                    "allow" => judge_allow(&mut check, echo),
                    "inject" => judge_inject(&mut check, echo, &expected, secret.len()),
                    "redact" => judge_redact(&mut check, echo, &expected, &marker),
                    _ => judge_deny(&mut check, echo),
                }
            }
            Err(why) => check.problems.push(why),
        }
        show(i, &check);
        checks.push(check);
    }

    let mut failed = checks.iter().filter(|c| !c.problems.is_empty()).count();
    if !audit_checks(ws, files, &ids).await {
        failed += 1;
    }
    if let Some(problem) = ws.leaks(secret, files.audit_offset) {
        say(&format!("FAILED: {problem}\n"));
        failed += 1;
    }
    if failed == 0 {
        say("\nAll four checks passed: allow, inject, redact, deny.\n");
    } else {
        say(&format!(
            "\nlatchkey demo: {failed} check(s) failed (see FAILED above; latchkey's log: {}).\n",
            ws.path(LOG_FILE).display()
        ));
    }
    Ok(failed == 0)
}

/// Prints step `i`'s check: what it ran, what it saw, and whether it passed.
fn show(i: usize, check: &Check) {
    say(&format!("{}. {}\n  $ {}\n", i + 1, check.title, check.curl));
    if !check.shown.is_empty() {
        say(&format!("  → {}\n", check.shown));
    }
    if check.problems.is_empty() {
        say("  ok\n\n");
    } else {
        for p in &check.problems {
            say(&format!("  FAILED: {p}\n"));
        }
        say("\n");
    }
}

/// Prints the audit records of the requests `ids` and judges them; whether they pass.
async fn audit_checks(ws: &Workspace, files: &Files, ids: &[String]) -> bool {
    match audit_lines(ws, files.audit_offset, ids).await {
        Ok(lines) => {
            say(&format!(
                "Audit records ({}), each request's outcome (its decision record came before the upstream\n  was dialed); secrets appear by name only:\n",
                ws.path(AUDIT_FILE).display()
            ));
            for line in &lines {
                say(&format!("  {line}\n"));
            }
            let problems = judge_audit(&lines);
            for p in &problems {
                say(&format!("  FAILED: {p}\n"));
            }
            problems.is_empty()
        }
        Err(why) => {
            say(&format!("FAILED: {why}\n"));
            false
        }
    }
}

pub(super) fn reply_bytes(reply: &Reply) -> Vec<u8> {
    let mut all = reply.body.to_vec();
    for (name, value) in &reply.headers {
        all.extend_from_slice(name.as_str().as_bytes());
        all.extend_from_slice(value.as_bytes());
    }
    all
}

/// The reply, judged: every expectation not met becomes a problem.
pub(super) fn expect(check: &mut Check, ok: bool, problem: impl FnOnce(&Reply) -> String) {
    if !ok {
        if let Some(r) = &check.reply {
            let p = problem(r);
            check.problems.push(p);
        }
    }
}

pub(super) fn body_json(reply: &Reply) -> Value {
    serde_json::from_slice(&reply.body).unwrap_or(Value::Null)
}

pub(super) fn judge_allow(check: &mut Check, echo: &Echo) {
    let Some(r) = &check.reply else { return };
    let json = body_json(r);
    // An allowed response carries only latchkey's id (the refusal headers are for denials).
    let id = r.header("x-latchkey-id");
    check.shown = format!(
        "{} from the echo upstream, which saw {} {}; x-latchkey-id: {id} (its audit record's id)",
        r.status,
        json["method"].as_str().unwrap_or("?"),
        json["path"].as_str().unwrap_or("?"),
    );
    let ok = r.status == 200
        && !id.is_empty()
        && r.header("x-latchkey-decision").is_empty()
        && json["echo"] == HOST
        && json["path"] == "/hello";
    let reached = echo.with_step("allow", |_| ()).is_some();
    expect(check, ok && reached, |r| {
        format!(
            "expected 200 from the echo with an x-latchkey-id, got {} {}{}",
            r.status,
            r.header("x-latchkey-reason"),
            if reached {
                ""
            } else {
                "; the echo received nothing"
            }
        )
    });
}

pub(super) fn judge_inject(check: &mut Check, echo: &Echo, expected: &[u8], secret_len: usize) {
    let Some(r) = &check.reply else { return };
    let json = body_json(r);
    let scheme = json["authorization_received"]["scheme"]
        .as_str()
        .unwrap_or("");
    let bytes = json["authorization_received"]["credential_bytes"]
        .as_u64()
        .unwrap_or(0);
    // What left latchkey, as the echo recorded it, compared here without showing it.
    let got_secret = echo.with_step("inject", |s| {
        s.authorization.as_ref().is_some_and(|a| a.ct_eq(expected))
    });
    check.shown = if scheme.is_empty() {
        "the echo received no Authorization header".to_string()
    } else {
        format!(
            "the sandbox sent no Authorization header; the echo received \
             \"Authorization: {scheme} <{bytes} bytes>\" (the demo secret; its value is not shown)"
        )
    };
    let ok = r.status == 200
        && scheme == "Bearer"
        && bytes == secret_len as u64
        && got_secret == Some(true);
    expect(check, ok, |r| {
        format!(
            "expected the echo to receive \"Authorization: Bearer <the demo secret>\"; status {}, {}",
            r.status,
            match got_secret {
                None => "the echo received nothing",
                Some(false) => "the echo's Authorization was not the demo secret",
                Some(true) => "the echo's description of it is wrong",
            }
        )
    });
}

pub(super) fn judge_redact(check: &mut Check, echo: &Echo, expected: &[u8], marker: &str) {
    let Some(r) = &check.reply else { return };
    let json = body_json(r);
    let reflected = json["headers"]["authorization"].as_str().unwrap_or("");
    let header = r.header("x-echo-authorization");
    let sent = echo.with_step("redact", |s| {
        s.authorization.as_ref().is_some_and(|a| a.ct_eq(expected))
    });
    check.shown = format!(
        "the echo sent its Authorization header back; the sandbox got \"authorization\": \"{reflected}\" \
         in the body and x-echo-authorization: {header}"
    );
    let ok = r.status == 200
        && reflected == format!("Bearer {marker}")
        && header == format!("Bearer {marker}")
        && sent == Some(true);
    expect(check, ok, |_| {
        format!(
            "expected the echo to reflect the demo secret and the sandbox to see \"Bearer {marker}\" instead{}",
            if sent == Some(true) { "" } else { " (the echo did not receive the secret)" }
        )
    });
}

pub(super) fn judge_deny(check: &mut Check, echo: &Echo) {
    let Some(r) = &check.reply else { return };
    let text = r.text();
    let reached = echo.with_step("deny", |s| s.method.clone());
    check.shown = format!(
        "{}, x-latchkey-reason: {}, closest rule: {}: \"{}\"; {}",
        r.status,
        r.header("x-latchkey-reason"),
        r.header("x-latchkey-rule"),
        text.trim_end(),
        if reached.is_some() {
            "the request reached the echo"
        } else {
            "nothing reached the echo"
        }
    );
    let ok = r.status == 403
        && r.header("x-latchkey-decision") == "deny"
        && r.header("x-latchkey-reason") == "method_not_allowed"
        && r.header("x-latchkey-rule") == RULE
        && text.starts_with("latchkey: denied:")
        && reached.is_none();
    expect(check, ok, |r| {
        format!(
            "expected 403 method_not_allowed under rule {RULE}, got {} {}{}",
            r.status,
            r.header("x-latchkey-reason"),
            if reached.is_some() {
                "; the denied request reached the echo"
            } else {
                ""
            }
        )
    });
}

/// Waits for the records of the four requests (by `x-latchkey-id`), in request order.
pub(super) async fn audit_lines(
    ws: &Workspace,
    offset: u64,
    ids: &[String],
) -> Result<Vec<String>, String> {
    let deadline = tokio::time::Instant::now() + AUDIT_DEADLINE;
    loop {
        let text = std::fs::read(ws.path(AUDIT_FILE)).unwrap_or_default();
        let text = String::from_utf8_lossy(text.get(offset as usize..).unwrap_or_default());
        let found: Vec<String> = ids
            .iter()
            .filter_map(|id| {
                text.lines()
                    .find(|l| {
                        // The outcome record: a request's decision record comes first.
                        serde_json::from_str::<Value>(l).is_ok_and(|v| {
                            v["id"].as_str() == Some(id.as_str()) && v["phase"] == "outcome"
                        })
                    })
                    .map(str::to_string)
            })
            .collect();
        if found.len() == ids.len() {
            return Ok(found);
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!(
                "{} of {} audit records did not reach {AUDIT_FILE} within {}s",
                ids.len() - found.len(),
                ids.len(),
                AUDIT_DEADLINE.as_secs()
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The records say what happened: three allowed under the rule (the two that carried the
/// secret name it), one denied.
pub(super) fn judge_audit(lines: &[String]) -> Vec<String> {
    let want = [
        ("allow", "allowed"),
        ("allow", "allowed"),
        ("allow", "allowed"),
        ("deny", "method_not_allowed"),
    ];
    if lines.len() != want.len() {
        return vec![format!("expected 4 audit records, found {}", lines.len())];
    }
    let mut problems = Vec::new();
    for (i, (line, (decision, reason))) in lines.iter().zip(want).enumerate() {
        let v: Value = serde_json::from_str(line).unwrap_or(Value::Null);
        if v["decision"] != decision || v["reason"] != reason || v["rule"] != RULE {
            problems.push(format!(
                "record {}: expected decision {decision}, reason {reason}, rule {RULE}",
                i + 1
            ));
        }
        let names_secret = v["secrets"]
            .as_array()
            .is_some_and(|s| s.iter().any(|n| n == SECRET_NAME));
        if decision == "allow" && !names_secret {
            problems.push(format!(
                "record {}: the injected secret is not named in \"secrets\"",
                i + 1
            ));
        }
    }
    if lines
        .get(2)
        .and_then(|l| serde_json::from_str::<Value>(l).ok())
        .and_then(|v| v["redactions"].as_u64())
        .unwrap_or(0)
        == 0
    {
        problems.push("record 3: no redaction counted".to_string());
    }
    problems
}
