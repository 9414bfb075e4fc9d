//! Tests of [`Jwks::parse`] (only usable signing keys are kept) and [`JwksCache`] (ttl,
//! refetch on an unknown kid at most once per `min_refresh`, stale sets within `max_stale`,
//! one shared fetch).

use super::*;

#[test]
fn jwks_keeps_only_usable_signing_keys() {
    let k = keys();
    let set = jwks();
    assert_eq!(set.len(), 3);
    assert!(!set.is_empty());
    assert!(set.has_kid("rsa-1") && set.has_kid("ec-1") && set.has_kid("ed-1"));
    assert!(!set.has_kid("rsa-2"));
    let oct = json!({"kty": "oct", "kid": "h", "k": b64(b"0123456789abcdef0123456789abcdef"), "alg": "HS256"});
    let bare_oct = json!({"kty": "oct", "use": "sig", "kid": "h2", "k": b64(b"0123456789abcdef")});
    for keys in [json!([oct]), json!([bare_oct]), json!([oct, bare_oct])] {
        let err = Jwks::parse(json!({ "keys": keys }).to_string().as_bytes()).unwrap_err();
        assert_eq!(err.code(), "jwks");
    }
    let mut enc = rsa_jwk("enc");
    enc["use"] = json!("enc");
    let mut ops = ec_jwk("ops", &k.ec_public);
    ops["key_ops"] = json!(["encrypt"]);
    let mut hs_rsa = rsa_jwk("hs");
    hs_rsa["alg"] = json!("HS256");
    let mut oaep = rsa_jwk("oaep");
    oaep["alg"] = json!("RSA-OAEP");
    let mut short_x = ec_jwk("short", &k.ec_public);
    short_x["x"] = json!(b64(&[1; 31]));
    let small_rsa = json!({"kty": "RSA", "kid": "small", "n": b64(&[0xff; 128]), "e": "AQAB"});
    let p521 =
        json!({"kty": "EC", "crv": "P-521", "kid": "p521", "x": b64(&[1; 66]), "y": b64(&[1; 66])});
    let ed448 = json!({"kty": "OKP", "crv": "Ed448", "kid": "ed448", "x": b64(&[1; 57])});
    let doc = json!({"keys": [
        oct, enc, ops, hs_rsa, oaep, short_x, small_rsa, p521, ed448,
        {"kty": "RSA", "kid": "no-n", "e": "AQAB"}, {"kty": "weird"}, "string", 5, null,
        rsa_jwk("kept")
    ]});
    let set = Jwks::parse(doc.to_string().as_bytes()).unwrap();
    assert_eq!(set.len(), 1, "{set:?}");
    assert!(set.has_kid("kept"));
    for bad in [
        &b"not json"[..],
        b"{}",
        br#"{"keys": {}}"#,
        br#"{"keys": []}"#,
        b"[]",
    ] {
        assert_eq!(Jwks::parse(bad).unwrap_err().code(), "jwks");
    }
    let many = json!({"keys": vec![rsa_jwk("k"); MAX_JWKS_KEYS + 1]});
    assert_eq!(
        Jwks::parse(many.to_string().as_bytes()).unwrap_err().code(),
        "jwks"
    );
    let exactly = json!({"keys": vec![rsa_jwk("k"); MAX_JWKS_KEYS]});
    assert_eq!(
        Jwks::parse(exactly.to_string().as_bytes()).unwrap().len(),
        MAX_JWKS_KEYS
    );
    let mut huge = json!({"keys": [rsa_jwk("k")]});
    huge["padding"] = json!("x".repeat(MAX_JWKS_BYTES));
    assert_eq!(
        Jwks::parse(huge.to_string().as_bytes()).unwrap_err().code(),
        "jwks"
    );
}

#[test]
fn duplicate_kids_try_each_matching_key() {
    // Two keys under one kid (a botched rotation): a token signed by either verifies.
    let k = keys();
    let doc = json!({"keys": [ec_jwk("dup", &k.other_ec_public), ec_jwk("dup", &k.ec_public)]});
    let set = Jwks::parse(doc.to_string().as_bytes()).unwrap();
    verify(
        &sign(Algorithm::ES256, Some("dup"), &claims()),
        &set,
        &expect(),
        now(),
    )
    .unwrap();
}

fn jwks_doc(kids: &[&str]) -> Vec<u8> {
    let keys: Vec<Value> = kids.iter().map(|kid| rsa_jwk(kid)).collect();
    json!({ "keys": keys }).to_string().into_bytes()
}

/// A fetch that counts its calls and answers `answer`.
fn fetcher<'a>(
    calls: &'a AtomicUsize,
    answer: Result<Vec<u8>, String>,
) -> impl FnOnce() -> std::future::Ready<Result<Vec<u8>, String>> + 'a {
    move || {
        calls.fetch_add(1, Ordering::SeqCst);
        std::future::ready(answer)
    }
}

const TTL: Duration = Duration::from_secs(300);
const MIN_REFRESH: Duration = Duration::from_secs(30);
const MAX_STALE: Duration = Duration::from_secs(600);

#[tokio::test]
async fn cache_fetches_once_within_ttl() {
    let cache = JwksCache::new(TTL, MIN_REFRESH, MAX_STALE);
    let calls = AtomicUsize::new(0);
    let t0 = Instant::now();
    let first = cache
        .get(Some("a"), t0, fetcher(&calls, Ok(jwks_doc(&["a"]))))
        .await
        .unwrap();
    assert!(first.has_kid("a"));
    for secs in [1, 100, 299] {
        let at = t0 + Duration::from_secs(secs);
        let set = cache
            .get(Some("a"), at, fetcher(&calls, Ok(jwks_doc(&["b"]))))
            .await
            .unwrap();
        assert!(set.has_kid("a"));
        cache
            .get(None, at, fetcher(&calls, Ok(jwks_doc(&["b"]))))
            .await
            .unwrap();
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // Past the ttl: refetched.
    let set = cache
        .get(Some("a"), t0 + TTL, fetcher(&calls, Ok(jwks_doc(&["b"]))))
        .await
        .unwrap();
    assert!(set.has_kid("b"));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn cache_refetches_an_unknown_kid_at_most_once_per_min_refresh() {
    let cache = JwksCache::new(TTL, MIN_REFRESH, MAX_STALE);
    let calls = AtomicUsize::new(0);
    let t0 = Instant::now();
    let at = |secs| t0 + Duration::from_secs(secs);
    cache
        .get(Some("a"), at(0), fetcher(&calls, Ok(jwks_doc(&["a"]))))
        .await
        .unwrap();
    // Too soon after the first fetch: the old set, no fetch (verify will refuse the kid).
    let set = cache
        .get(
            Some("b"),
            at(10),
            fetcher(&calls, Ok(jwks_doc(&["a", "b"]))),
        )
        .await
        .unwrap();
    assert!(!set.has_kid("b"));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // After min_refresh: one refetch picks up the rotated key.
    let set = cache
        .get(
            Some("b"),
            at(31),
            fetcher(&calls, Ok(jwks_doc(&["a", "b"]))),
        )
        .await
        .unwrap();
    assert!(set.has_kid("b"));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    // A stream of unknown kids makes no more than one fetch per min_refresh.
    for secs in 32..61 {
        cache
            .get(
                Some("zzz"),
                at(secs),
                fetcher(&calls, Ok(jwks_doc(&["a", "b"]))),
            )
            .await
            .unwrap();
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    cache
        .get(
            Some("zzz"),
            at(61),
            fetcher(&calls, Ok(jwks_doc(&["a", "b"]))),
        )
        .await
        .unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    // A known kid never refetches within the ttl.
    cache
        .get(Some("a"), at(200), fetcher(&calls, Ok(jwks_doc(&["c"]))))
        .await
        .unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn cache_serves_the_stale_set_until_max_stale_then_fails_closed() {
    let cache = JwksCache::new(TTL, MIN_REFRESH, MAX_STALE);
    let calls = AtomicUsize::new(0);
    let t0 = Instant::now();
    let at = |secs| t0 + Duration::from_secs(secs);
    let down = || Err::<Vec<u8>, String>("connection refused".into());
    cache
        .get(None, at(0), fetcher(&calls, Ok(jwks_doc(&["a"]))))
        .await
        .unwrap();
    // Past the ttl, the issuer is down: the last good set, within max_stale.
    let set = cache
        .get(None, at(301), fetcher(&calls, down()))
        .await
        .unwrap();
    assert!(set.has_kid("a"));
    // An unusable document is a failed refetch too.
    cache
        .get(
            None,
            at(400),
            fetcher(&calls, Ok(b"{\"keys\":[]}".to_vec())),
        )
        .await
        .unwrap();
    cache
        .get(None, at(899), fetcher(&calls, down()))
        .await
        .unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 4);
    // ttl + max_stale after the last good fetch: fail closed, naming the last failure.
    let err = cache
        .get(None, at(900), fetcher(&calls, down()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "jwks");
    assert!(err.to_string().contains("connection refused"), "{err}");
    // That was within min_refresh of the last attempt (899): no fetch was tried, nor is one
    // now, and it stays closed.
    assert_eq!(calls.load(Ordering::SeqCst), 4);
    let err = cache
        .get(None, at(910), fetcher(&calls, Ok(jwks_doc(&["b"]))))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "jwks");
    assert_eq!(calls.load(Ordering::SeqCst), 4);
    // A due attempt that fails again: still closed.
    let err = cache
        .get(None, at(931), fetcher(&calls, down()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "jwks");
    assert_eq!(calls.load(Ordering::SeqCst), 5);
    // The issuer is back: so is the cache.
    let set = cache
        .get(None, at(962), fetcher(&calls, Ok(jwks_doc(&["b"]))))
        .await
        .unwrap();
    assert!(set.has_kid("b"));
}

#[tokio::test]
async fn cache_with_no_good_set_fails_closed() {
    let cache = JwksCache::new(TTL, MIN_REFRESH, MAX_STALE);
    let calls = AtomicUsize::new(0);
    let t0 = Instant::now();
    let err = cache
        .get(None, t0, fetcher(&calls, Err("HTTP 503".into())))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "jwks");
    assert!(err.to_string().contains("HTTP 503"), "{err}");
    let err = cache
        .get(None, t0 + MIN_REFRESH, fetcher(&calls, Ok(b"[]".to_vec())))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("keys"), "{err}");
    // A caller's very long error is cut short.
    let err = cache
        .get(
            None,
            t0 + MIN_REFRESH * 2,
            fetcher(&calls, Err("e".repeat(10_000))),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().len() < 400, "{}", err.to_string().len());
}

#[tokio::test]
async fn concurrent_callers_share_one_fetch() {
    let cache = JwksCache::new(TTL, MIN_REFRESH, MAX_STALE);
    let calls = AtomicUsize::new(0);
    let now = Instant::now();
    let slow = || async {
        calls.fetch_add(1, Ordering::SeqCst);
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        Ok(jwks_doc(&["a"]))
    };
    let (a, b, c) = tokio::join!(
        cache.get(Some("a"), now, slow),
        cache.get(Some("a"), now, slow),
        cache.get(Some("a"), now, slow)
    );
    assert!(a.unwrap().has_kid("a") && b.unwrap().has_kid("a") && c.unwrap().has_kid("a"));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}
