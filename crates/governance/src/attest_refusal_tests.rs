//! Tests of every refusal [`verify`] promises: algorithm confusion, key selection, tampering,
//! embedded keys, odd headers, oversized tokens, and error messages that never show the token.

use super::*;

#[test]
fn alg_none_is_refused() {
    for alg in ["none", "None", "NONE", ""] {
        let header = b64(json!({"alg": alg, "kid": "rsa-1", "typ": "JWT"})
            .to_string()
            .as_bytes());
        let payload = b64(claims().to_string().as_bytes());
        for token in [
            format!("{header}.{payload}."),
            format!("{header}.{payload}"),
        ] {
            let err = refused(&token);
            assert!(
                matches!(err.code(), "algorithm_not_allowed" | "malformed"),
                "{alg}: {err}"
            );
        }
        let err = refused(&format!("{header}.{payload}."));
        assert_eq!(err.code(), "algorithm_not_allowed", "{alg}");
    }
    // Also with a one-key set and no kid.
    let header = b64(br#"{"alg":"none"}"#);
    let payload = b64(claims().to_string().as_bytes());
    let one = Jwks::parse(json!({"keys": [rsa_jwk("rsa-1")]}).to_string().as_bytes()).unwrap();
    assert_eq!(
        refused_by(&format!("{header}.{payload}."), &one),
        AttestError::AlgorithmNotAllowed { alg: "none" }
    );
}

#[test]
fn hs256_signed_with_the_public_key_is_refused() {
    let public = keys().rsa.public_key();
    let spki = AsDer::<aws_lc_rs::encoding::PublicKeyX509Der>::as_der(public).unwrap();
    let pem = format!(
        "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
        STANDARD.encode(spki.as_ref())
    );
    let pkcs1 = public.as_ref().to_vec();
    let pkcs1_pem = format!(
        "-----BEGIN RSA PUBLIC KEY-----\n{}\n-----END RSA PUBLIC KEY-----\n",
        STANDARD.encode(&pkcs1)
    );
    let jwk_n = rsa_jwk("rsa-1")["n"].as_str().unwrap().to_owned();
    let one = Jwks::parse(json!({"keys": [rsa_jwk("rsa-1")]}).to_string().as_bytes()).unwrap();
    let secrets = [
        pem.as_bytes(),
        pkcs1_pem.as_bytes(),
        spki.as_ref(),
        &pkcs1,
        jwk_n.as_bytes(),
    ];
    for secret in secrets {
        for (alg, kid) in [
            (Algorithm::HS256, Some("rsa-1")),
            (Algorithm::HS384, Some("rsa-1")),
            (Algorithm::HS512, None),
        ] {
            let mut header = Header::new(alg);
            header.kid = kid.map(str::to_owned);
            let token = encode(&header, &claims(), &EncodingKey::from_secret(secret)).unwrap();
            for set in [&jwks(), &one] {
                let err = refused_by(&token, set);
                assert_eq!(err.code(), "algorithm_not_allowed", "{alg:?}: {err}");
            }
        }
    }
}

#[test]
fn the_algorithm_must_fit_the_key_type() {
    // RS256 header, kid of the EC key (signed with the RSA key).
    let rs_on_ec = sign(Algorithm::RS256, Some("ec-1"), &claims());
    assert_eq!(
        refused(&rs_on_ec),
        AttestError::KeyAlgorithmMismatch {
            kid: "\"ec-1\"".into(),
            alg: "RS256"
        }
    );
    assert_eq!(refused(&rs_on_ec).code(), "algorithm_not_allowed");
    // ES256 header and signature, kid of the RSA key.
    let es_on_rsa = sign(Algorithm::ES256, Some("rsa-1"), &claims());
    assert_eq!(refused(&es_on_rsa).code(), "algorithm_not_allowed");
    let ed_on_ec = sign(Algorithm::EdDSA, Some("ec-1"), &claims());
    assert_eq!(refused(&ed_on_ec).code(), "algorithm_not_allowed");
    // A JWK's alg narrows its key to that one algorithm.
    let mut narrowed = rsa_jwk("rsa-1");
    narrowed["alg"] = json!("PS256");
    let set = Jwks::parse(json!({"keys": [narrowed]}).to_string().as_bytes()).unwrap();
    let rs = sign(Algorithm::RS256, Some("rsa-1"), &claims());
    assert_eq!(refused_by(&rs, &set).code(), "algorithm_not_allowed");
    verify(
        &sign(Algorithm::PS256, Some("rsa-1"), &claims()),
        &set,
        &expect(),
        now(),
    )
    .unwrap();
}

#[test]
fn tampering_breaks_the_signature() {
    let token = sign(Algorithm::RS256, Some("rsa-1"), &claims());
    let parts: Vec<&str> = token.split('.').collect();
    let forged = claims_with("sub", json!("system:serviceaccount:kube-system:admin"));
    let tampered = format!(
        "{}.{}.{}",
        parts[0],
        b64(forged.to_string().as_bytes()),
        parts[2]
    );
    assert_eq!(
        refused(&tampered),
        AttestError::BadSignature {
            kid: "\"rsa-1\"".into()
        }
    );
    assert_eq!(refused(&tampered).code(), "bad_signature");
    // A flipped signature byte, a truncated or missing signature.
    let mut signature = URL_SAFE_NO_PAD.decode(parts[2]).unwrap();
    signature[10] ^= 1;
    let flipped = format!("{}.{}.{}", parts[0], parts[1], b64(&signature));
    assert_eq!(refused(&flipped).code(), "bad_signature");
    let truncated = format!("{}.{}.{}", parts[0], parts[1], &parts[2][..20]);
    assert!(matches!(
        refused(&truncated).code(),
        "bad_signature" | "malformed"
    ));
    let empty = format!("{}.{}.", parts[0], parts[1]);
    assert_eq!(refused(&empty).code(), "bad_signature");
    // The same for EC and Ed keys.
    for (alg, kid) in [(Algorithm::ES256, "ec-1"), (Algorithm::EdDSA, "ed-1")] {
        let token = sign(alg, Some(kid), &claims());
        let parts: Vec<&str> = token.split('.').collect();
        let tampered = format!(
            "{}.{}.{}",
            parts[0],
            b64(forged.to_string().as_bytes()),
            parts[2]
        );
        assert_eq!(refused(&tampered).code(), "bad_signature", "{alg:?}");
    }
}

#[test]
fn embedded_keys_in_the_header_are_never_used() {
    let k = keys();
    // The attacker signs with their own EC key and embeds it (and URLs to it) in the header.
    let mut header = Header::new(Algorithm::ES256);
    header.kid = Some("ec-1".into());
    header.jku = Some("https://evil.example/jwks.json".into());
    header.x5u = Some("https://evil.example/cert.pem".into());
    header.jwk = Some(serde_json::from_value(ec_jwk("ec-1", &k.other_ec_public)).unwrap());
    let forged = encode(
        &header,
        &claims(),
        &EncodingKey::from_ec_der(&k.other_ec_pkcs8),
    )
    .unwrap();
    assert_eq!(refused(&forged).code(), "bad_signature");
    // A genuine token carrying the same headers still verifies against the JWKS key.
    let genuine = encode(&header, &claims(), &EncodingKey::from_ec_der(&k.ec_pkcs8)).unwrap();
    verify(&genuine, &jwks(), &expect(), now()).unwrap();
}

#[test]
fn crit_and_odd_headers_are_refused() {
    let crit = sign_raw(
        r#"{"alg":"RS256","kid":"rsa-1","crit":["exp"],"exp":1}"#,
        &claims(),
    );
    assert_eq!(refused(&crit), AttestError::CriticalHeader);
    let b64_false = sign_raw(
        r#"{"alg":"RS256","kid":"rsa-1","b64":false,"crit":["b64"]}"#,
        &claims(),
    );
    assert_eq!(refused(&b64_false).code(), "critical_header");
    // The hand-signed path itself works (so the refusals above are about the header).
    verify(
        &sign_raw(r#"{"alg":"RS256","kid":"rsa-1"}"#, &claims()),
        &jwks(),
        &expect(),
        now(),
    )
    .unwrap();
    for header in [
        r#"{"kid":"rsa-1"}"#,
        r#"{"alg":256,"kid":"rsa-1"}"#,
        r#"{"alg":"RS256","kid":7}"#,
        r#"["RS256"]"#,
        "not json",
    ] {
        assert_eq!(
            refused(&sign_raw(header, &claims())).code(),
            "malformed",
            "{header}"
        );
    }
    // jsonwebtoken reads unknown header fields as strings only: anything else is refused.
    let extra = sign_raw(r#"{"alg":"RS256","kid":"rsa-1","x":{"y":1}}"#, &claims());
    assert_eq!(refused(&extra).code(), "malformed");
    let unknown_alg = sign_raw(r#"{"alg":"RS256\u0000","kid":"rsa-1"}"#, &claims());
    assert_eq!(
        refused(&unknown_alg),
        AttestError::AlgorithmNotAllowed {
            alg: "(unrecognised)"
        }
    );
}

#[test]
fn payload_must_be_a_json_object() {
    for payload in [json!(["iss"]), json!("x"), json!(5)] {
        let token = sign_raw(r#"{"alg":"RS256","kid":"rsa-1"}"#, &payload);
        assert_eq!(refused(&token).code(), "malformed", "{payload}");
    }
}

#[test]
fn malformed_tokens_are_refused() {
    let token = sign(Algorithm::RS256, Some("rsa-1"), &claims());
    for bad in [
        String::new(),
        "abc".into(),
        "a.b".into(),
        format!("{token}.extra"),
        format!(" {token}"),
        format!("Bearer {token}"),
        token.replacen('.', "=.", 1),
        token.replace('-', "+"),
    ] {
        if bad == token {
            continue;
        }
        let err = refused(&bad);
        assert!(
            matches!(err.code(), "malformed" | "bad_signature"),
            "{bad:?}: {err}"
        );
    }
}

#[test]
fn oversized_tokens_are_refused_unread() {
    let big = claims_with("padding", json!("x".repeat(MAX_TOKEN_BYTES)));
    let token = sign(Algorithm::RS256, Some("rsa-1"), &big);
    assert_eq!(
        refused(&token),
        AttestError::TooLarge {
            limit: MAX_TOKEN_BYTES
        }
    );
    assert_eq!(refused(&token).code(), "too_large");
    assert_eq!(
        refused(&"a".repeat(MAX_TOKEN_BYTES + 1)).code(),
        "too_large"
    );
}

#[test]
fn errors_never_show_the_token() {
    let k = keys();
    let base = sign(Algorithm::RS256, Some("rsa-1"), &claims());
    let parts: Vec<&str> = base.split('.').collect();
    let tokens = [
        sign(
            Algorithm::RS256,
            Some("rsa-1"),
            &claims_with("aud", json!("x")),
        ),
        sign(
            Algorithm::RS256,
            Some("rsa-1"),
            &claims_with("iss", json!("https://evil.example")),
        ),
        sign(
            Algorithm::RS256,
            Some("rsa-1"),
            &claims_with("exp", json!("secret-looking-exp")),
        ),
        sign(Algorithm::RS256, Some("nope"), &claims()),
        format!(
            "{}.{}.{}",
            parts[0],
            parts[1],
            b64(b"not the signature at all")
        ),
        format!(
            "{}.{}.{}",
            parts[0],
            b64(b"{\"iss\":\"tampered-claims-text\"}"),
            parts[2]
        ),
        encode(
            &Header::new(Algorithm::HS256),
            &claims(),
            &EncodingKey::from_secret(b"k"),
        )
        .unwrap(),
        encode(
            &Header::new(Algorithm::ES256),
            &claims(),
            &EncodingKey::from_ec_der(&k.other_ec_pkcs8),
        )
        .unwrap(),
        format!("{}.{}!.{}", parts[0], parts[1], parts[2]),
    ];
    for token in &tokens {
        let err = refused(token);
        assert!(!err.to_string().contains("tampered-claims-text"), "{err}");
        assert!(!err.to_string().contains("secret-looking-exp"), "{err}");
        assert!(!err.to_string().contains("evil"), "{err}");
    }
}
