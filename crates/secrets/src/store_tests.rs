//! Tests of the secret store: sources, rotation, exec helpers, the redaction set.

use super::*;
use crate::redaction_set::Values;
use crate::{MAX_LIVE_PER_NAME, MAX_RETIRED, MAX_RETIRED_PER_NAME};

const SECRET: &str = "sk-test-0123456789abcdef";

#[test]
fn sources_parse_and_reject_unknown_kinds() {
    let d = Duration::from_secs(1);
    assert_eq!(Source::parse("env:X", d, d), Ok(Source::Env("X".into())));
    assert!(Source::parse("vault:x", d, d).is_err(), "a mount alone");
    assert!(Source::parse("vault:secret/x#f", d, d).is_ok());
    assert!(Source::parse("vaultx:secret/x", d, d).is_err());
    assert!(Source::parse("env:", d, d).is_err());
    assert!(Source::parse("nothing", d, d).is_err());
}

#[test]
fn a_missing_env_var_or_short_value_is_a_load_error_naming_it() {
    let e = SecretStore::load(vec![(
        "a".into(),
        Source::Env("LATCHKEY_TEST_SURELY_UNSET_VAR".into()),
    )])
    .expect_err("error");
    assert_eq!(e[0].0, "a");
    assert!(
        e[0].1.contains("LATCHKEY_TEST_SURELY_UNSET_VAR is not set"),
        "{e:?}"
    );
    let dir = tempfile::tempdir().expect("tmp");
    let p = dir.path().join("s");
    std::fs::write(&p, "short\n").expect("write");
    let e = SecretStore::load(vec![("b".into(), Source::File(p))]).expect_err("error");
    assert!(e[0].1.contains("shorter than 8"), "{e:?}");
}

#[tokio::test]
async fn a_changed_file_is_picked_up_and_the_old_value_stays_redacted() {
    let dir = tempfile::tempdir().expect("tmp");
    let p = dir.path().join("s");
    std::fs::write(&p, format!("{SECRET}\n")).expect("write");
    let store = SecretStore::load(vec![("f".into(), Source::File(p.clone()))]).expect("load");
    assert!(store
        .get("f")
        .await
        .expect("value")
        .ct_eq(SECRET.as_bytes()));
    std::fs::write(&p, "sk-test-rotated-value-99").expect("write");
    assert!(store
        .get("f")
        .await
        .expect("value")
        .ct_eq(b"sk-test-rotated-value-99"));
    let s = store.scrubber().expect("scrubber").expect("values");
    let (out, names) = s.scrub(format!("old {SECRET} new sk-test-rotated-value-99").as_bytes());
    assert_eq!(names.len(), 2);
    assert!(!String::from_utf8_lossy(&out).contains("sk-test"));
}

#[tokio::test]
async fn exec_helpers_are_cached_and_failures_name_the_secret_not_the_output() {
    let dir = tempfile::tempdir().expect("tmp");
    let counter = dir.path().join("n");
    let cmd = format!("echo x >> {}; echo {SECRET}", counter.display());
    let store = SecretStore::load(vec![
        (
            "e".into(),
            Source::Exec {
                command: cmd,
                ttl: Duration::from_secs(60),
                timeout: Duration::from_secs(5),
            },
        ),
        (
            "bad".into(),
            Source::Exec {
                command: "echo leaked-stderr >&2; exit 3".into(),
                ttl: Duration::from_secs(60),
                timeout: Duration::from_secs(5),
            },
        ),
        (
            "slow".into(),
            Source::Exec {
                command: "sleep 5".into(),
                ttl: Duration::from_secs(60),
                timeout: Duration::from_millis(200),
            },
        ),
    ])
    .expect("load");
    let (a, b) = tokio::join!(store.get("e"), store.get("e"));
    assert!(a.expect("a").ct_eq(SECRET.as_bytes()));
    assert!(b.expect("b").ct_eq(SECRET.as_bytes()));
    assert!(store.get("e").await.is_ok());
    let runs = std::fs::read_to_string(&counter).expect("counter");
    assert_eq!(runs.lines().count(), 1, "helper ran more than once");
    let e = store.get("bad").await.expect_err("fails").to_string();
    assert!(e.contains("\"bad\"") && e.contains("exit"), "{e}");
    assert!(!e.contains("leaked-stderr"), "{e}");
    let e = store.get("slow").await.expect_err("times out").to_string();
    assert!(e.contains("within"), "{e}");
}

fn token(i: usize) -> SecretValue {
    SecretValue::new(format!("eyJ-minted-token-{i:06}-0123456789abcdef").into_bytes())
}

fn redacts(store: &SecretStore, value: &SecretValue) -> bool {
    let s = store.scrubber().expect("scrubber").expect("values");
    let mut text = b"reflected: ".to_vec();
    text.extend_from_slice(value.expose());
    let (out, names) = s.scrub(&text);
    !names.is_empty() && !out.windows(value.len()).any(|w| w == value.expose())
}

#[test]
fn alternating_keys_neither_grow_the_set_nor_bump_the_generation() {
    let store = SecretStore::empty();
    let (a, b) = (token(1), token(2));
    store.set_minted("credential:jwt", "host-a", &a);
    store.set_minted("credential:jwt", "host-b", &b);
    assert!(redacts(&store, &a) && redacts(&store, &b));
    let before = store.redaction_stats();
    for i in 0..2_000 {
        let (key, v) = if i % 2 == 0 {
            ("host-a", &a)
        } else {
            ("host-b", &b)
        };
        store.set_minted("credential:jwt", key, v);
        store.scrubber().expect("scrubber");
    }
    let after = store.redaction_stats();
    assert_eq!(after.values, 2, "{after:?}");
    assert_eq!(after.generation, before.generation, "{after:?}");
    assert_eq!(
        after.builds, before.builds,
        "no rebuild without a new value"
    );
}

#[test]
fn a_new_value_retires_the_old_one_and_retired_values_are_capped_oldest_first() {
    let store = SecretStore::empty();
    let n = MAX_RETIRED_PER_NAME + 20;
    for i in 0..n {
        store.set_minted("credential:gh", "", &token(i));
    }
    assert_eq!(
        store.redaction_stats().values,
        1 + MAX_RETIRED_PER_NAME,
        "one live value and the newest retired ones"
    );
    assert!(redacts(&store, &token(n - 1)), "the live value");
    assert!(redacts(&store, &token(n - 2)), "the newest retired value");
    assert!(redacts(&store, &token(n - MAX_RETIRED_PER_NAME - 1)));
    assert!(!redacts(&store, &token(0)), "the oldest left the set");
    // A retired value handed out again is live again, without a new generation.
    let g = store.redaction_stats().generation;
    store.set_minted("credential:gh", "", &token(n - 2));
    assert_eq!(store.redaction_stats().generation, g);
    assert_eq!(store.redaction_stats().values, 1 + MAX_RETIRED_PER_NAME);
}

#[test]
fn live_values_per_name_and_retired_values_in_all_are_bounded() {
    let store = SecretStore::empty();
    // Many hosts under a wildcard, each with its own token.
    let hosts = MAX_LIVE_PER_NAME + MAX_RETIRED_PER_NAME;
    for i in 0..hosts {
        store.set_minted("credential:jwt", &format!("host-{i}"), &token(i));
    }
    let live = store.redaction.shared.values.lock().expect("lock").live["credential:jwt"].len();
    assert_eq!(live, MAX_LIVE_PER_NAME);
    // The least recently used were retired, not dropped.
    assert!(redacts(&store, &token(0)));
    assert!(redacts(&store, &token(hosts - 1)));
    // Cycling through them again adds nothing: each comes back from the retired values
    // and another goes there.
    let g = store.redaction_stats().generation;
    for i in 0..hosts {
        store.set_minted("credential:jwt", &format!("host-{i}"), &token(i));
    }
    assert_eq!(store.redaction_stats().generation, g);
    // One host more and the oldest retired value leaves the set.
    store.set_minted("credential:jwt", "host-new", &token(hosts));
    assert!(!redacts(&store, &token(0)));
    assert!(redacts(&store, &token(1)));
    for n in 0..(MAX_RETIRED / MAX_RETIRED_PER_NAME + 2) {
        for i in 0..MAX_RETIRED_PER_NAME + 1 {
            store.set_minted(
                &format!("credential:c{n}"),
                "",
                &token(10_000 * (n + 1) + i),
            );
        }
    }
    let v = store.redaction.shared.values.lock().expect("lock");
    assert!(v.retired.len() <= MAX_RETIRED, "{}", v.retired.len());
    let live: usize = v.live.values().map(HashMap::len).sum();
    assert!(v.count() <= MAX_RETIRED + live);
}

#[test]
fn values_out_of_use_for_the_retention_window_leave_the_set() {
    let mut v = Values::default();
    let t0 = Instant::now();
    let name: Arc<str> = Arc::from("credential:x");
    assert!(v.mint(&name, "k", &token(1), t0).added);
    assert!(
        v.mint(&name, "k", &token(2), t0 + Duration::from_secs(10))
            .added
    );
    assert_eq!(
        v.mint(&name, "k", &token(2), t0 + Duration::from_secs(20)),
        Change::default()
    );
    assert_eq!(v.count(), 2);
    let (changed, next) = v.sweep(t0 + Duration::from_secs(15));
    assert!(!changed);
    assert_eq!(next, Some(t0 + Duration::from_secs(10) + RETIRED_KEEP));
    // token 1 was retired at +10 s; token 2 last handed out at +20 s.
    let (changed, _) = v.sweep(t0 + Duration::from_secs(11) + RETIRED_KEEP);
    assert!(changed);
    assert_eq!(v.count(), 1);
    let (changed, next) = v.sweep(t0 + Duration::from_secs(21) + RETIRED_KEEP);
    assert!(changed && next.is_none());
    assert_eq!(v.count(), 0);
}

#[test]
fn a_change_that_only_removes_values_keeps_the_old_matcher_and_makes_nobody_wait() {
    let store = SecretStore::empty();
    store.set_minted("credential:a", "", &token(1));
    store.set_minted("credential:a", "", &token(2));
    let first = store.scrubber().expect("scrubber").expect("values");
    let builds = store.redaction_stats().builds;
    // An hour on, both are out of use and leave the set.
    assert!(store
        .redaction
        .shared
        .sweep_at(Instant::now() + RETIRED_KEEP + Duration::from_secs(1)));
    assert_eq!(store.redaction_stats().values, 0);
    let again = store
        .scrubber()
        .expect("scrubber")
        .expect("the previous matcher");
    assert!(
        Arc::ptr_eq(&first, &again),
        "a superset is safe to keep using"
    );
    assert_eq!(store.redaction_stats().builds, builds);
    // A new value makes it unsafe: rebuilt, without the values that left.
    store.set_minted("credential:a", "", &token(3));
    assert!(redacts(&store, &token(3)));
    assert!(!redacts(&store, &token(1)));
    assert_eq!(store.redaction_stats().builds, builds + 1);
}

fn file_source(dir: &Path, name: &str, value: &str) -> Source {
    let p = dir.join(name);
    std::fs::write(&p, value).expect("write");
    Source::File(p)
}

#[tokio::test]
async fn a_reconcile_keeps_unchanged_slots_rereads_changed_ones_and_drops_removed_ones() {
    let dir = tempfile::tempdir().expect("tmp");
    let kept = file_source(dir.path(), "kept", "sk-kept-0123456789");
    let changed = file_source(dir.path(), "changed", "sk-changed-old-0123");
    let gone = file_source(dir.path(), "gone", "sk-gone-0123456789");
    let old = SecretStore::load(vec![
        ("kept".into(), kept.clone()),
        ("changed".into(), changed),
        ("gone".into(), gone),
    ])
    .expect("load");
    old.set_minted("credential:jwt", "host-a", &token(1));
    let moved = file_source(dir.path(), "changed-2", "sk-changed-new-0123");
    let new = old
        .reconcile(&[("kept".into(), kept), ("changed".into(), moved)])
        .expect("reconcile");
    // Unchanged: the very slot (its value object, stamp and cache) goes on.
    assert!(Arc::ptr_eq(&old.slots["kept"], &new.slots["kept"]));
    // Changed: read afresh from its new source.
    assert!(!Arc::ptr_eq(&old.slots["changed"], &new.slots["changed"]));
    assert_eq!(
        new.get("changed").await.expect("value").expose(),
        b"sk-changed-new-0123"
    );
    // Removed: not in the new generation.
    assert!(!new.contains("gone"));
    assert!(matches!(
        new.get("gone").await,
        Err(SecretError::Unknown(_))
    ));
    new.take_over(&old);
    // What was handed out before stays redacted: minted, changed and removed values alike.
    for v in [
        "sk-kept-0123456789",
        "sk-changed-old-0123",
        "sk-gone-0123456789",
    ] {
        assert!(
            redacts(&new, &SecretValue::new(v.as_bytes().to_vec())),
            "{v}"
        );
    }
    assert!(redacts(&new, &token(1)));
    assert!(redacts(
        &new,
        &SecretValue::new(b"sk-changed-new-0123".to_vec())
    ));
    // One redaction set: a value minted under either generation is redacted by both.
    new.set_minted("credential:jwt", "host-b", &token(2));
    assert!(redacts(&old, &token(2)));
}

#[tokio::test]
async fn a_request_in_flight_keeps_its_generation_and_what_it_reads_later_stays_redacted() {
    let dir = tempfile::tempdir().expect("tmp");
    let gone = file_source(dir.path(), "gone", "sk-gone-0123456789");
    let old = SecretStore::load(vec![("gone".into(), gone.clone())]).expect("load");
    let new = old.reconcile(&[]).expect("reconcile");
    new.take_over(&old);
    // The old generation still resolves what it declared.
    assert_eq!(
        old.get("gone").await.expect("still declared").expose(),
        b"sk-gone-0123456789"
    );
    // Its file rotates while that request runs: the value it reads now is redacted by the
    // generation in force too, though that one no longer declares it.
    std::thread::sleep(Duration::from_millis(20));
    let Source::File(path) = &gone else {
        unreachable!("a file source")
    };
    std::fs::write(path, "sk-gone-rotated-01234").expect("rotate");
    assert_eq!(
        old.get("gone").await.expect("rotated").expose(),
        b"sk-gone-rotated-01234"
    );
    assert!(redacts(
        &new,
        &SecretValue::new(b"sk-gone-rotated-01234".to_vec())
    ));
}

#[test]
fn a_reconcile_that_cannot_read_a_changed_secret_changes_nothing() {
    let dir = tempfile::tempdir().expect("tmp");
    let a = file_source(dir.path(), "a", "sk-a-0123456789ab");
    let old = SecretStore::load(vec![("a".into(), a.clone())]).expect("load");
    let before = old.redaction_stats();
    let missing = Source::File(dir.path().join("missing"));
    let errors = old
        .reconcile(&[("a".into(), a), ("b".into(), missing)])
        .expect_err("b is unreadable");
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].0, "b");
    assert_eq!(old.redaction_stats(), before);
    assert!(redacts(
        &old,
        &SecretValue::new(b"sk-a-0123456789ab".to_vec())
    ));
}

#[test]
fn concurrent_callers_share_one_build_per_generation_and_always_see_earlier_values() {
    let store = Arc::new(SecretStore::empty());
    store.set_minted("credential:a", "", &token(0));
    store.scrubber().expect("scrubber");
    for round in 1..20usize {
        let builds = store.redaction_stats().builds;
        store.set_minted("credential:a", "", &token(round));
        let barrier = Arc::new(std::sync::Barrier::new(8));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (store, barrier) = (store.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    redacts(&store, &token(round))
                })
            })
            .collect();
        for t in threads {
            assert!(
                t.join().expect("join"),
                "a caller got a matcher without the value"
            );
        }
        assert_eq!(store.redaction_stats().builds, builds + 1, "round {round}");
    }
}

#[test]
fn debug_prints_no_value_and_no_command() {
    let store = SecretStore::empty();
    store.set_minted("credential:a", "k", &token(7));
    store.scrubber().expect("scrubber");
    let src = Source::Exec {
        command: "echo sk-inline-value-oops".into(),
        ttl: Duration::from_secs(1),
        timeout: Duration::from_secs(1),
    };
    let printed = format!("{store:?} {store:#?} {src:?} {:?}", store.redaction_stats());
    assert!(!printed.contains("minted-token"), "{printed}");
    assert!(!printed.contains("sk-inline"), "{printed}");
}

/// Whether process `pid` is gone (or a zombie nobody has reaped yet: it runs no more).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z')),
    }
}

fn wait_gone(pid: u32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if gone(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

fn pids(path: &Path) -> Vec<u32> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let pids: Vec<u32> = text
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        if pids.len() >= 2 || Instant::now() > deadline {
            return pids;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn exec(command: String, timeout: Duration) -> Source {
    Source::Exec {
        command,
        ttl: Duration::from_secs(60),
        timeout,
    }
}

#[tokio::test]
async fn a_timed_out_helper_is_killed_with_everything_it_started() {
    let dir = tempfile::tempdir().expect("tmp");
    let pidfile = dir.path().join("pids");
    // A grandchild in the background (holding stdout open), and one in the foreground.
    let cmd = format!(
        "sleep 30 & echo $! > {p}; sh -c 'echo $$ >> {p}; exec sleep 30'",
        p = pidfile.display()
    );
    let store =
        SecretStore::load(vec![("e".into(), exec(cmd, Duration::from_millis(500)))]).expect("load");
    let e = store.get("e").await.expect_err("times out").to_string();
    assert!(e.contains("within"), "{e}");
    let pids = pids(&pidfile);
    assert_eq!(pids.len(), 2, "{pids:?}");
    for pid in pids {
        assert!(wait_gone(pid), "helper descendant {pid} still runs");
    }
}

#[tokio::test]
async fn a_helper_whose_caller_goes_away_is_killed_with_its_children() {
    let dir = tempfile::tempdir().expect("tmp");
    let pidfile = dir.path().join("pids");
    let cmd = format!(
        "sleep 30 & echo $! > {p}; echo $$ >> {p}; wait",
        p = pidfile.display()
    );
    let store =
        SecretStore::load(vec![("e".into(), exec(cmd, Duration::from_secs(60)))]).expect("load");
    let cancelled = tokio::time::timeout(Duration::from_millis(500), store.get("e")).await;
    assert!(cancelled.is_err(), "the helper should still be running");
    let pids = pids(&pidfile);
    assert_eq!(pids.len(), 2, "{pids:?}");
    for pid in pids {
        assert!(wait_gone(pid), "helper process {pid} outlived its caller");
    }
}

#[tokio::test]
async fn a_helper_printing_too_much_is_refused_and_killed() {
    let dir = tempfile::tempdir().expect("tmp");
    let pidfile = dir.path().join("pids");
    let cmd = format!(
        "echo $$ > {p}; echo $$ >> {p}; yes sk-endless-output-0123456789",
        p = pidfile.display()
    );
    let store =
        SecretStore::load(vec![("e".into(), exec(cmd, Duration::from_secs(30)))]).expect("load");
    let started = Instant::now();
    let e = store.get("e").await.expect_err("refused").to_string();
    assert!(e.contains("more than"), "{e}");
    assert!(!e.contains("sk-endless"), "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "did not wait for the timeout"
    );
    for pid in pids(&pidfile) {
        assert!(wait_gone(pid), "helper {pid} still runs");
    }
}
