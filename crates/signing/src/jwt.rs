//! JWT signing (jsonwebtoken on aws-lc-rs) and claim templates.

use jsonwebtoken::{Algorithm, EncodingKey, Header};

/// Signature algorithms latchkey signs JWTs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JwtAlg {
    Rs256,
    Es256,
    Hs256,
    EdDsa,
}

impl JwtAlg {
    pub fn parse(s: &str) -> Option<JwtAlg> {
        match s {
            "RS256" => Some(JwtAlg::Rs256),
            "ES256" => Some(JwtAlg::Es256),
            "HS256" => Some(JwtAlg::Hs256),
            "EdDSA" => Some(JwtAlg::EdDsa),
            _ => None,
        }
    }
}

/// One claim: a literal JSON value, or a string template using `{{now}}`, `{{identity}}` and
/// `{{host}}` (a claim that is exactly `{{now}}` becomes a number).
#[derive(Debug, Clone, PartialEq)]
pub enum JwtClaim {
    Literal(serde_json::Value),
    Template(String),
}

impl JwtClaim {
    /// Validates the template names in a claim string.
    pub fn parse(v: serde_json::Value) -> Result<JwtClaim, String> {
        let serde_json::Value::String(s) = v else {
            return Ok(JwtClaim::Literal(v));
        };
        if !s.contains("{{") {
            return Ok(JwtClaim::Literal(serde_json::Value::String(s)));
        }
        let mut rest = s.as_str();
        while let Some(i) = rest.find("{{") {
            let after = &rest[i + 2..];
            let end = after
                .find("}}")
                .ok_or_else(|| format!("unclosed '{{{{' in claim {s:?}"))?;
            let name = after[..end].trim();
            if !matches!(name, "now" | "identity" | "host") {
                return Err(format!(
                    "unknown template {{{{{name}}}}} in claim {s:?}: use {{{{now}}}}, {{{{identity}}}} or {{{{host}}}}"
                ));
            }
            rest = &after[end + 2..];
        }
        Ok(JwtClaim::Template(s))
    }

    pub fn uses_identity(&self) -> bool {
        matches!(self, JwtClaim::Template(s) if s.contains("identity"))
    }

    pub fn uses_host(&self) -> bool {
        matches!(self, JwtClaim::Template(s) if s.contains("host"))
    }

    pub fn render(&self, now: u64, identity: &str, host: &str) -> serde_json::Value {
        match self {
            JwtClaim::Literal(v) => v.clone(),
            JwtClaim::Template(s) if s.trim() == "{{now}}" || s.trim() == "{{ now }}" => {
                serde_json::json!(now)
            }
            JwtClaim::Template(s) => {
                let mut out = String::new();
                let mut rest = s.as_str();
                while let Some(i) = rest.find("{{") {
                    out.push_str(&rest[..i]);
                    let after = &rest[i + 2..];
                    let end = after.find("}}").unwrap_or(after.len());
                    match after[..end].trim() {
                        "now" => out.push_str(&now.to_string()),
                        "identity" => out.push_str(identity),
                        "host" => out.push_str(host),
                        _ => {}
                    }
                    rest = after.get(end + 2..).unwrap_or_default();
                }
                out.push_str(rest);
                serde_json::Value::String(out)
            }
        }
    }
}

/// Signs `claims` with `key` (a PEM private key, or the HMAC secret for HS256).
pub fn sign(
    alg: JwtAlg,
    key: &[u8],
    kid: Option<&str>,
    claims: &serde_json::Value,
) -> Result<String, String> {
    let (algorithm, encoding) = match alg {
        JwtAlg::Rs256 => (Algorithm::RS256, EncodingKey::from_rsa_pem(key)),
        JwtAlg::Es256 => (Algorithm::ES256, EncodingKey::from_ec_pem(key)),
        JwtAlg::EdDsa => (Algorithm::EdDSA, EncodingKey::from_ed_pem(key)),
        JwtAlg::Hs256 => (Algorithm::HS256, Ok(EncodingKey::from_secret(key))),
    };
    // The error kind only: jsonwebtoken's messages never include key bytes, but be sure.
    let encoding = encoding.map_err(|e| format!("invalid key ({:?})", e.kind()))?;
    let mut header = Header::new(algorithm);
    header.kid = kid.map(str::to_string);
    jsonwebtoken::encode(&header, claims, &encoding).map_err(|e| format!("{:?}", e.kind()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_templates_render_and_reject_unknown_names() {
        let c = JwtClaim::parse(serde_json::json!("{{now}}")).expect("ok");
        assert_eq!(c.render(42, "ci", "h"), serde_json::json!(42));
        let c = JwtClaim::parse(serde_json::json!("agent:{{identity}}@{{host}}")).expect("ok");
        assert_eq!(
            c.render(1, "ci", "api.test"),
            serde_json::json!("agent:ci@api.test")
        );
        assert!(c.uses_identity() && c.uses_host());
        assert!(JwtClaim::parse(serde_json::json!("{{secret.x}}")).is_err());
        assert_eq!(
            JwtClaim::parse(serde_json::json!(5)).expect("ok"),
            JwtClaim::Literal(serde_json::json!(5))
        );
    }

    #[test]
    fn hs256_tokens_have_three_parts_and_bad_keys_are_refused() {
        let t = sign(
            JwtAlg::Hs256,
            b"0123456789abcdef",
            Some("k1"),
            &serde_json::json!({"a": 1}),
        )
        .expect("sign");
        assert_eq!(t.split('.').count(), 3);
        assert!(sign(JwtAlg::Rs256, b"not a pem", None, &serde_json::json!({})).is_err());
    }
}
