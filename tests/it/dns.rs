//! latchkey's allowlisting DNS resolver (`serve --dns`), asked by real clients: `dig` over UDP
//! and TCP (answers in `self` and `real` style, NXDOMAIN, refused tunnelling types, the rate
//! cap), and a sandbox namespace whose only resolver is latchkey (`getent`, Python's
//! `getaddrinfo`). Every query's audit record is checked.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::latchkey::wait_with_timeout;
use crate::support::netns::{Gateway, PROXY_IP, SANDBOX_IP};
use crate::support::secrets::{secrets_toml, OPENAI, SECRET_ENV};
use crate::support::toolchain;
use crate::support::{assert_record, latchkey, Latchkey};

const POLICY: &str = "[[rules]]\nname = \"up\"\nhosts = [\"up.test\"]\n\n\
                      [[rules]]\nname = \"wild\"\nhosts = [\"*.wild.test\"]\nports = [8443]\n\n\
                      [[rules]]\nname = \"inside\"\nhosts = [\"inside.test\"]\n";

/// The resolver's address, from the `latchkey: dns listening on ADDR` line (waits 5 s).
fn dns_addr(lk: &Latchkey) -> SocketAddr {
    const LINE: &str = "latchkey: dns listening on ";
    assert!(
        lk.wait_stderr_contains(LINE, Duration::from_secs(5)),
        "no dns line:\n{}",
        lk.stderr_text()
    );
    lk.stderr_text()
        .lines()
        .find_map(|l| l.trim_end().strip_prefix(LINE))
        .and_then(|a| a.parse().ok())
        .expect("dns address")
}

/// What dig printed for each query: the status and the answer's data.
#[derive(Debug)]
struct Dug {
    status: String,
    answers: Vec<String>,
}

/// `dig @ADDR -p PORT +tries=1 +time=3 +noall +comments +answer ARGS...`, one entry per query
/// (a `-f` batch asks several).
fn dig_all(addr: SocketAddr, args: &[&str]) -> Vec<Dug> {
    let mut cmd = std::process::Command::new(toolchain::tool("dig"));
    cmd.arg(format!("@{}", addr.ip()))
        .arg("-p")
        .arg(addr.port().to_string())
        .args(["+tries=1", "+time=3", "+noall", "+comments", "+answer"])
        .args(args);
    let out = wait_with_timeout(&mut cmd, Duration::from_secs(60));
    let mut dug: Vec<Dug> = Vec::new();
    for line in out.stdout.lines() {
        if let Some(rest) = line.split("status: ").nth(1) {
            let status = rest.split(',').next().unwrap_or_default().to_string();
            dug.push(Dug {
                status,
                answers: Vec::new(),
            });
        } else if !line.starts_with(';') && !line.trim().is_empty() {
            if let (Some(last), Some(data)) = (dug.last_mut(), line.split_whitespace().last()) {
                last.answers.push(data.to_string());
            }
        }
    }
    assert!(!dug.is_empty(), "dig {args:?} printed no status: {out:#?}");
    dug
}

fn dig(addr: SocketAddr, args: &[&str]) -> Dug {
    let mut all = dig_all(addr, args);
    assert_eq!(all.len(), 1, "dig {args:?}: {all:#?}");
    all.remove(0)
}

/// [`assert_record`], with `dns` compared field by field (only the fields `expected` names).
fn assert_dns_record(record: &Value, mut expected: Value) {
    let dns = expected
        .as_object_mut()
        .and_then(|o| o.remove("dns"))
        .unwrap_or_else(|| json!({}));
    assert_record(record, expected);
    for (name, want) in dns.as_object().expect("dns fields as a JSON object") {
        assert_eq!(
            record["dns"].get(name),
            Some(want),
            "audit field dns.{name}: expected {want}, record: {record:#}"
        );
    }
}

/// The DNS records written so far.
fn dns_records(lk: &Latchkey) -> Vec<Value> {
    lk.audit_records()
        .into_iter()
        .filter(|r| r["method"] == "DNS")
        .collect()
}

/// Waits (5 s) until `n` DNS records are written; returns them all.
fn wait_dns(lk: &Latchkey, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let records = dns_records(lk);
        if records.len() >= n {
            return records;
        }
        assert!(
            Instant::now() < deadline,
            "expected {n} DNS records, found {records:#?}\nstderr:\n{}",
            lk.stderr_text()
        );
        std::thread::sleep(Duration::from_millis(25));
    }
}

fn self_latchkey(extra: &[&str]) -> Latchkey {
    let mut b = latchkey()
        .policy("main.toml", POLICY)
        .arg("--dns")
        .arg("127.0.0.1:0")
        .arg("--dns-self")
        .arg("192.0.2.53,2001:db8::53");
    for a in extra {
        b = b.arg(a);
    }
    b.run()
}

#[test]
fn dns_allowed_names_get_latchkeys_own_address_and_every_other_name_nxdomain() {
    let lk = self_latchkey(&[]);
    let addr = dns_addr(&lk);
    // (name, type asked, type recorded, status, answers)
    let cases: [(&str, &str, &str, &str, &[&str]); 7] = [
        ("up.test", "A", "A", "NOERROR", &["192.0.2.53"]),
        ("UP.Test.", "AAAA", "AAAA", "NOERROR", &["2001:db8::53"]),
        ("a.b.wild.test", "A", "A", "NOERROR", &["192.0.2.53"]),
        // Clients ask for HTTPS records (type 65) first: an empty answer, so they fall back to
        // A/AAAA.
        ("up.test", "TYPE65", "HTTPS", "NOERROR", &[]),
        ("evil.test", "A", "A", "NXDOMAIN", &[]),
        // A wildcard never matches its apex, nor does a suffix that only looks alike.
        ("wild.test", "A", "A", "NXDOMAIN", &[]),
        ("up.test.evil", "AAAA", "AAAA", "NXDOMAIN", &[]),
    ];
    for (name, qtype, _, status, answers) in cases {
        let d = dig(addr, &[name, qtype]);
        let got: Vec<&str> = d.answers.iter().map(String::as_str).collect();
        assert_eq!(
            (d.status.as_str(), got.as_slice()),
            (status, answers),
            "{name} {qtype}"
        );
    }
    let records = wait_dns(&lk, cases.len());
    for (record, (name, _, qtype, status, answers)) in records.iter().zip(cases) {
        let allowed = status == "NOERROR";
        let rule = match name {
            _ if !allowed => Value::Null,
            "a.b.wild.test" => json!("wild"),
            _ => json!("up"),
        };
        assert_dns_record(
            record,
            json!({"method": "DNS", "host": name.to_ascii_lowercase().trim_end_matches('.'),
                   "scheme": null, "port": null, "status": null, "upstream": null,
                   "decision": if allowed { "allow" } else { "deny" },
                   "reason": if allowed { "allowed" } else { "no_rule" }, "rule": rule,
                   "dns": {"type": qtype, "rcode": status, "answer": answers,
                           "transport": "udp", "queries": 1}}),
        );
        assert!(
            record["client"]
                .as_str()
                .is_some_and(|c| c.starts_with("127.0.0.1:")),
            "{record}"
        );
    }
}

#[test]
fn dns_tunnelling_types_are_refused_and_audited_with_their_type() {
    let lk = self_latchkey(&[]);
    let addr = dns_addr(&lk);
    // TYPE10 is NULL, which dig has no name for.
    let types = [
        ("TXT", "TXT"),
        ("ANY", "ANY"),
        ("TYPE10", "NULL"),
        ("SRV", "SRV"),
        ("MX", "MX"),
        ("CNAME", "CNAME"),
    ];
    for (asked, _) in types {
        let d = dig(addr, &["up.test", asked]);
        assert_eq!(d.status, "REFUSED", "{asked}: {d:?}");
        assert!(d.answers.is_empty(), "{asked}: {d:?}");
    }
    // Refused whatever the name: an exfiltration label gets no answer either.
    let d = dig(addr, &["c2VjcmV0.evil.test", "TXT"]);
    assert_eq!(d.status, "REFUSED");
    let records = wait_dns(&lk, types.len() + 1);
    for (record, (_, shown)) in records.iter().zip(types) {
        assert_dns_record(
            record,
            json!({"method": "DNS", "host": "up.test", "decision": "deny", "rule": null,
                   "reason": "dns_type_refused",
                   "dns": {"type": shown, "rcode": "REFUSED", "answer": []}}),
        );
    }
    assert_dns_record(
        &records[types.len()],
        json!({"host": "c2vjcmv0.evil.test", "reason": "dns_type_refused",
               "dns": {"type": "TXT"}}),
    );
}

#[test]
fn dns_a_name_holding_a_secret_value_or_placeholder_is_refused_and_never_recorded() {
    let policy = format!(
        "{}[[rules]]\nname = \"wild\"\nhosts = [\"*.wild.test\"]\n",
        secrets_toml(&["openai"])
    );
    let mut b = latchkey()
        .policy("main.toml", &policy)
        .arg("--dns")
        .arg("127.0.0.1:0");
    for (name, value) in SECRET_ENV {
        b = b.env(name, value);
    }
    let lk = b.run();
    let addr = dns_addr(&lk);
    let lower = OPENAI.to_ascii_lowercase();
    // A DNS name keeps the case it was sent in; the check reads it before any lookup, whatever
    // the type asked (a TXT query is how an exfiltration would go).
    let cases = [
        (OPENAI, "A", "secret_value_unbound"),
        (lower.as_str(), "AAAA", "secret_value_unbound"),
        ("__LATCHKEY_openai__", "A", "placeholder_not_bound"),
        (OPENAI, "TXT", "dns_type_refused"),
    ];
    for (label, qtype, _) in cases {
        let d = dig(addr, &[&format!("{label}.wild.test"), qtype]);
        assert_eq!(
            (d.status.as_str(), d.answers.len()),
            ("REFUSED", 0),
            "{label} {qtype}"
        );
    }
    // The same subdomain without a secret is answered.
    assert_eq!(dig(addr, &["a.wild.test", "A"]).status, "NOERROR");
    let records = wait_dns(&lk, cases.len() + 1);
    for (record, (_, qtype, reason)) in records.iter().zip(cases) {
        assert_dns_record(
            record,
            json!({"host": "[REDACTED]", "decision": "deny", "reason": reason,
                   "dns": {"type": qtype, "rcode": "REFUSED", "answer": []}}),
        );
    }
    for text in [lk.audit_text(), lk.stderr_text()] {
        assert!(
            !text.contains(OPENAI) && !text.contains(&lower),
            "the secret leaked: {text}"
        );
    }
}

#[test]
fn dns_malformed_messages_and_stalled_or_oversized_tcp_are_refused_and_audited() {
    use hickory_proto::op::{Message, MessageType, OpCode, Query};
    use hickory_proto::rr::{Name, RecordType};
    use std::io::{Read, Write};

    let lk = self_latchkey(&[]);
    let addr = dns_addr(&lk);
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").expect("udp client");
    udp.set_read_timeout(Some(Duration::from_secs(2)))
        .expect("timeout");
    let mut buf = [0u8; 1500];

    // Not a DNS message: nothing comes back.
    udp.send_to(b"hello", addr).expect("send");
    assert!(udp.recv_from(&mut buf).is_err(), "garbage was answered");
    // Two questions in one query: FORMERR, to its id.
    let mut two = Message::new(0x4242, MessageType::Query, OpCode::Query);
    for name in ["up.test", "evil.test"] {
        two.add_query(Query::query(
            Name::from_ascii(name).expect("name"),
            RecordType::A,
        ));
    }
    udp.send_to(&two.to_vec().expect("encode"), addr)
        .expect("send");
    let (n, _) = udp.recv_from(&mut buf).expect("an answer to two questions");
    let reply = Message::from_vec(&buf[..n]).expect("a well-formed reply");
    assert_eq!(
        (reply.id, reply.response_code),
        (0x4242, hickory_proto::op::ResponseCode::FormErr)
    );

    // TCP: a length past the cap closes the connection; so does a client that sends nothing.
    #[allow(clippy::disallowed_methods)] // the test's client, dialing the resolver under test
    let mut big = std::net::TcpStream::connect(addr).expect("tcp");
    big.write_all(&60_000u16.to_be_bytes()).expect("write");
    big.set_read_timeout(Some(Duration::from_secs(3)))
        .expect("timeout");
    assert_eq!(big.read(&mut buf).expect("closed, not timed out"), 0);
    #[allow(clippy::disallowed_methods)] // the test's client, dialing the resolver under test
    let mut idle = std::net::TcpStream::connect(addr).expect("tcp");
    idle.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let started = Instant::now();
    assert_eq!(idle.read(&mut buf).expect("closed, not timed out"), 0);
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );

    let records = wait_dns(&lk, 4);
    let expected = [
        ("udp", Value::Null, "bad_request"),
        ("udp", json!("FORMERR"), "bad_request"),
        ("tcp", Value::Null, "bad_request"),
        ("tcp", Value::Null, "header_timeout"),
    ];
    for (record, (transport, rcode, reason)) in records.iter().zip(expected) {
        assert_dns_record(
            record,
            json!({"host": null, "decision": "deny", "rule": null, "reason": reason,
                   "dns": {"type": null, "rcode": rcode, "transport": transport}}),
        );
    }
}

#[test]
fn dns_answers_follow_a_policy_reload_from_the_next_query() {
    let lk = self_latchkey(&[]);
    let addr = dns_addr(&lk);
    assert_eq!(dig(addr, &["new.test", "A"]).status, "NXDOMAIN");
    assert_eq!(dig(addr, &["up.test", "A"]).status, "NOERROR");
    // Written aside and renamed into place, as a deploy tool would, then reloaded now.
    let dir = lk.scratch().join("policies");
    std::fs::write(
        dir.join(".main.toml.new"),
        "[[rules]]\nname = \"new\"\nhosts = [\"new.test\"]\n",
    )
    .expect("write policy");
    std::fs::rename(dir.join(".main.toml.new"), dir.join("main.toml")).expect("rename");
    let (code, body) = crate::support::admin::reload(&lk);
    assert_eq!(code, 200, "{body:#}");
    let d = dig(addr, &["new.test", "A"]);
    assert_eq!(
        (d.status.as_str(), d.answers.as_slice()),
        ("NOERROR", &["192.0.2.53".to_string()][..])
    );
    assert_eq!(dig(addr, &["up.test", "A"]).status, "NXDOMAIN");
    let records = wait_dns(&lk, 4);
    assert_ne!(records[0]["policy"], records[2]["policy"], "{records:#?}");
    assert_dns_record(
        &records[2],
        json!({"host": "new.test", "rule": "new", "reason": "allowed"}),
    );
    assert_dns_record(&records[3], json!({"host": "up.test", "reason": "no_rule"}));
}

#[test]
fn dns_over_tcp_answers_like_udp() {
    let lk = self_latchkey(&[]);
    let addr = dns_addr(&lk);
    let d = dig(addr, &["+tcp", "up.test", "A"]);
    assert_eq!(
        (d.status.as_str(), d.answers.as_slice()),
        ("NOERROR", &["192.0.2.53".to_string()][..])
    );
    let d = dig(addr, &["+tcp", "evil.test", "A"]);
    assert_eq!(d.status, "NXDOMAIN");
    let d = dig(addr, &["+tcp", "up.test", "TXT"]);
    assert_eq!(d.status, "REFUSED");
    let records = wait_dns(&lk, 3);
    for (record, (reason, rcode)) in records.iter().zip([
        ("allowed", "NOERROR"),
        ("no_rule", "NXDOMAIN"),
        ("dns_type_refused", "REFUSED"),
    ]) {
        assert_dns_record(
            record,
            json!({"method": "DNS", "reason": reason,
                   "dns": {"rcode": rcode, "transport": "tcp", "queries": 1}}),
        );
    }
}

#[test]
fn dns_real_answers_come_through_the_address_guard() {
    let lk = latchkey()
        .policy("main.toml", POLICY)
        .arg("--dns")
        .arg("127.0.0.1:0")
        .arg("--dns-answer")
        .arg("real")
        .arg("--allow-private")
        .arg("192.0.2.0/24")
        .resolve("up.test", "192.0.2.10")
        .resolve("inside.test", "10.1.2.3")
        .run();
    let addr = dns_addr(&lk);
    let d = dig(addr, &["up.test", "A"]);
    assert_eq!(
        (d.status.as_str(), d.answers.as_slice()),
        ("NOERROR", &["192.0.2.10".to_string()][..])
    );
    // The pin is IPv4 only: no AAAA to hand out.
    let d = dig(addr, &["up.test", "AAAA"]);
    assert_eq!((d.status.as_str(), d.answers.len()), ("NOERROR", 0));
    // An allowed name that resolves to a private address --allow-private does not cover.
    let d = dig(addr, &["inside.test", "A"]);
    assert_eq!((d.status.as_str(), d.answers.len()), ("REFUSED", 0));
    let d = dig(addr, &["evil.test", "A"]);
    assert_eq!(d.status, "NXDOMAIN");
    let records = wait_dns(&lk, 4);
    assert_dns_record(
        &records[0],
        json!({"host": "up.test", "reason": "allowed", "rule": "up",
               "dns": {"type": "A", "rcode": "NOERROR", "answer": ["192.0.2.10"]}}),
    );
    assert_dns_record(
        &records[1],
        json!({"host": "up.test", "reason": "allowed", "dns": {"type": "AAAA", "answer": []}}),
    );
    assert_dns_record(
        &records[2],
        json!({"host": "inside.test", "decision": "deny", "rule": "inside",
               "reason": "non_public_address", "dns": {"rcode": "REFUSED", "answer": []}}),
    );
    assert_dns_record(
        &records[3],
        json!({"host": "evil.test", "reason": "no_rule", "dns": {"rcode": "NXDOMAIN"}}),
    );
}

#[test]
fn dns_a_flood_over_the_rate_cap_is_refused_and_summed_up_in_few_records() {
    let lk = self_latchkey(&["--dns-rate", "5/s"]);
    let addr = dns_addr(&lk);
    let batch = lk.scratch().join("batch");
    std::fs::write(&batch, "up.test A\n".repeat(40)).expect("batch file");
    let started = Instant::now();
    let dug = dig_all(addr, &["-f", batch.to_str().expect("utf-8")]);
    let elapsed = started.elapsed().as_secs_f64();
    assert_eq!(dug.len(), 40, "{dug:#?}");
    let ok = dug.iter().filter(|d| d.status == "NOERROR").count();
    let refused = dug.iter().filter(|d| d.status == "REFUSED").count();
    assert_eq!(ok + refused, 40, "{dug:#?}");
    // The burst of 5, and 5 more for every second the batch took.
    let most = 5 + (elapsed * 5.0).ceil() as usize;
    assert!(
        (5..=most).contains(&ok),
        "{ok} answered in {elapsed:.2} s under a cap of 5/s: {dug:#?}"
    );
    assert!(
        refused > 0,
        "nothing was refused in {elapsed:.2} s: {dug:#?}"
    );

    // Each answered query has its record; the refused ones are summed up, one record per
    // client per second at most.
    let deadline = Instant::now() + Duration::from_secs(5);
    let (answered, summaries) = loop {
        let records = dns_records(&lk);
        let (summaries, answered): (Vec<Value>, Vec<Value>) = records
            .into_iter()
            .partition(|r| r["reason"] == "dns_rate_limited");
        let summed: u64 = summaries
            .iter()
            .filter_map(|r| r["dns"]["queries"].as_u64())
            .sum();
        if summed as usize >= refused && answered.len() >= ok {
            break (answered, summaries);
        }
        assert!(
            Instant::now() < deadline,
            "{refused} refused, summed up {summed}: {summaries:#?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(answered.len(), ok);
    let summed: u64 = summaries
        .iter()
        .filter_map(|r| r["dns"]["queries"].as_u64())
        .sum();
    assert_eq!(summed as usize, refused);
    // One a second at most (the batch, and the second the last one is counted in).
    assert!(
        summaries.len() <= 2 + elapsed.ceil() as usize,
        "{summaries:#?}"
    );
    for s in &summaries {
        assert_dns_record(
            s,
            json!({"method": "DNS", "host": null, "decision": "deny", "rule": null,
                   "reason": "dns_rate_limited",
                   "dns": {"type": null, "rcode": "REFUSED", "answer": [], "transport": "udp"}}),
        );
    }
}

#[test]
fn dns_resolver_flags_that_cannot_work_stop_serve_before_it_listens() {
    for (args, says) in [
        (&["--dns", "0.0.0.0:0"][..], "name it with --dns-self IP"),
        (
            &["--dns-self", "192.0.2.1"][..],
            "--dns-self is set but --dns is not",
        ),
        (
            &["--dns", "127.0.0.1:0", "--dns-rate", "0"][..],
            "is not a rate",
        ),
    ] {
        let mut b = latchkey().policy("main.toml", POLICY);
        for a in args {
            b = b.arg(a);
        }
        let out = b.run_expecting_failure();
        assert_ne!(out.code(), Some(0), "{args:?}");
        assert!(out.stderr.contains(says), "{args:?}: {}", out.stderr);
    }
}

#[test]
fn gateway_a_sandbox_whose_only_resolver_is_latchkey_resolves_only_allowed_names() {
    let mut gw = Gateway::new();
    gw.sandbox.etc_file(
        "resolv.conf",
        &format!("nameserver {PROXY_IP}\noptions attempts:1 timeout:2\n"),
    );
    gw.sandbox.etc_file("nsswitch.conf", "hosts: files dns\n");
    gw.sandbox
        .etc_file("hosts", "127.0.0.1 localhost\n::1 localhost\n");
    let lk = latchkey()
        .guarded()
        .netns(gw.proxy.name())
        .listen(&format!("{PROXY_IP}:3128"))
        .arg("--dns")
        .arg(&format!("{PROXY_IP}:53"))
        .policy("main.toml", POLICY)
        .run();
    assert_eq!(
        dns_addr(&lk),
        format!("{PROXY_IP}:53").parse().expect("addr")
    );

    let out = gw.sandbox.sh("getent hosts up.test");
    assert!(out.contains(PROXY_IP) && out.contains("up.test"), "{out}");
    let out = gw.sandbox.sh("getent hosts evil.test; echo rc=$?");
    assert!(
        out.trim_end().ends_with("rc=2"),
        "evil.test resolved: {out}"
    );
    let python = |name: &str| {
        let script = format!(
            "import socket\ntry:\n    print(sorted({{a[4][0] for a in socket.getaddrinfo({name:?}, 443, proto=socket.IPPROTO_TCP)}}))\nexcept socket.gaierror as e:\n    print('gaierror', e.errno == socket.EAI_NONAME)\n"
        );
        let out = wait_with_timeout(
            gw.sandbox
                .command(toolchain::tool("python3"))
                .arg("-c")
                .arg(script),
            Duration::from_secs(20),
        );
        assert_eq!(out.code(), Some(0), "{out:#?}");
        out.stdout.trim().to_string()
    };
    assert_eq!(python("up.test"), format!("['{PROXY_IP}']"));
    assert_eq!(python("evil.test"), "gaierror True");

    let records = wait_dns(&lk, 4);
    let from_sandbox = |r: &Value| {
        r["client"]
            .as_str()
            .is_some_and(|c| c.starts_with(&format!("{SANDBOX_IP}:")))
    };
    assert!(records.iter().all(from_sandbox), "{records:#?}");
    let up_a = records
        .iter()
        .find(|r| r["host"] == "up.test" && r["dns"]["type"] == "A")
        .unwrap_or_else(|| panic!("no A record for up.test: {records:#?}"));
    assert_dns_record(
        up_a,
        json!({"decision": "allow", "reason": "allowed", "rule": "up",
               "dns": {"rcode": "NOERROR", "answer": [PROXY_IP]}}),
    );
    let evil: Vec<&Value> = records
        .iter()
        .filter(|r| r["host"] == "evil.test")
        .collect();
    assert!(!evil.is_empty(), "{records:#?}");
    for r in evil {
        assert_dns_record(
            r,
            json!({"decision": "deny", "reason": "no_rule", "dns": {"rcode": "NXDOMAIN"}}),
        );
    }
}

#[test]
fn gateway_in_real_style_the_sandbox_learns_the_upstreams_real_address_and_nothing_else() {
    use crate::support::netns::{UPSTREAM_IP, UPSTREAM_NET};
    let mut gw = Gateway::new();
    gw.sandbox.etc_file(
        "resolv.conf",
        &format!("nameserver {PROXY_IP}\noptions attempts:1 timeout:2\n"),
    );
    gw.sandbox.etc_file("nsswitch.conf", "hosts: files dns\n");
    gw.sandbox
        .etc_file("hosts", "127.0.0.1 localhost\n::1 localhost\n");
    let lk = latchkey()
        .guarded()
        .netns(gw.proxy.name())
        .listen(&format!("{PROXY_IP}:3128"))
        .arg("--dns")
        .arg(&format!("{PROXY_IP}:53"))
        .arg("--dns-answer")
        .arg("real")
        .arg("--allow-private")
        .arg(UPSTREAM_NET)
        .resolve("up.test", UPSTREAM_IP)
        // Allowed by policy, but private and not opened: never handed out.
        .resolve("inside.test", "10.9.9.9")
        .policy("main.toml", POLICY)
        .run();
    dns_addr(&lk);
    let out = gw.sandbox.sh("getent ahostsv4 up.test | head -1");
    assert!(out.starts_with(UPSTREAM_IP), "{out}");
    for name in ["inside.test", "evil.test"] {
        let out = gw
            .sandbox
            .sh(&format!("getent ahostsv4 {name}; echo rc=$?"));
        assert!(out.trim_end().ends_with("rc=2"), "{name} resolved: {out}");
    }
    let records = wait_dns(&lk, 3);
    let find = |host: &str, qtype: &str| {
        records
            .iter()
            .find(|r| r["host"] == host && r["dns"]["type"] == qtype)
            .unwrap_or_else(|| panic!("no {qtype} record for {host}: {records:#?}"))
    };
    assert_dns_record(
        find("up.test", "A"),
        json!({"reason": "allowed", "rule": "up",
               "dns": {"rcode": "NOERROR", "answer": [UPSTREAM_IP]}}),
    );
    assert_dns_record(
        find("inside.test", "A"),
        json!({"decision": "deny", "reason": "non_public_address", "rule": "inside",
               "dns": {"rcode": "REFUSED", "answer": []}}),
    );
    assert_dns_record(
        find("evil.test", "A"),
        json!({"reason": "no_rule", "dns": {"rcode": "NXDOMAIN"}}),
    );
}
