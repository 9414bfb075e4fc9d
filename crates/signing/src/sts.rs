//! The STS `AssumeRole` answer, read with a real XML parser (`quick-xml`): elements matched by
//! local name in any namespace or prefix, entity and character references resolved, CDATA
//! taken as it is. The answer arrives bounded (the token transport reads at most
//! [`super::exchange::MAX_ANSWER`] bytes).
//!
//! Errors say what was missing or where the XML broke, never what the answer held: it carries
//! the role's secret key.

use bytes::Bytes;
use http::header::HeaderValue;
use http::HeaderMap;
use quick_xml::events::Event;
use quick_xml::Reader;
use zeroize::Zeroizing;

use super::exchange::{Exchange, Route, TokenTransport};
use super::sigv4;

/// The temporary credentials of an `AssumeRole` answer.
pub struct AssumedKeys {
    pub access_key_id: Zeroizing<String>,
    pub secret_access_key: Zeroizing<String>,
    pub session_token: Zeroizing<String>,
    /// As written (RFC 3339), when the answer gives one.
    pub expiration: Option<String>,
}

/// Why an answer held no usable credentials.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StsError {
    /// Not well-formed XML. Only the position is kept: the text may hold the keys.
    #[error("STS AssumeRole answered XML that does not parse (at byte {at})")]
    Malformed { at: u64 },
    /// Well-formed, but without these elements inside `Credentials`.
    #[error("STS AssumeRole answered without credentials (no {})", .missing.join(", "))]
    Missing { missing: Vec<&'static str> },
}

/// The fields read from `Credentials`, by local name.
const FIELDS: [&str; 4] = [
    "AccessKeyId",
    "SecretAccessKey",
    "SessionToken",
    "Expiration",
];

/// Reads the credentials out of an `AssumeRoleResponse`: the text of `AccessKeyId`,
/// `SecretAccessKey`, `SessionToken` and `Expiration` inside a `Credentials` element (the
/// first such element, trimmed).
pub fn parse(body: &[u8]) -> Result<AssumedKeys, StsError> {
    let mut reader = Reader::from_reader(body);
    reader.config_mut().trim_text(true);
    let malformed = |reader: &Reader<&[u8]>| StsError::Malformed {
        at: reader.error_position(),
    };
    let mut fields: [Option<Zeroizing<String>>; 4] = Default::default();
    // Local names of the open elements.
    let mut open: Vec<Vec<u8>> = Vec::new();
    // The field being read: inside `Credentials` (not yet closed), a direct child.
    let field_here = |open: &[Vec<u8>]| -> Option<usize> {
        match open {
            [.., parent, field] if parent.as_slice() == b"Credentials" => {
                FIELDS.iter().position(|f| f.as_bytes() == field.as_slice())
            }
            _ => None,
        }
    };
    // Only the first `Credentials` element counts.
    let mut credentials_done = false;
    loop {
        let event = reader.read_event().map_err(|_| malformed(&reader))?;
        let text: Option<Zeroizing<String>> = match event {
            Event::Start(e) => {
                open.push(e.local_name().as_ref().to_vec());
                None
            }
            Event::End(_) => {
                if open.pop().as_deref() == Some(b"Credentials".as_slice()) {
                    credentials_done = true;
                }
                None
            }
            Event::Text(t) => Some(Zeroizing::new(
                t.xml10_content()
                    .map_err(|_| malformed(&reader))?
                    .into_owned(),
            )),
            Event::CData(c) => Some(Zeroizing::new(
                c.xml10_content()
                    .map_err(|_| malformed(&reader))?
                    .into_owned(),
            )),
            Event::GeneralRef(r) => {
                let resolved = match r.resolve_char_ref().map_err(|_| malformed(&reader))? {
                    Some(c) => c.to_string(),
                    None => {
                        let name = r.decode().map_err(|_| malformed(&reader))?;
                        quick_xml::escape::resolve_predefined_entity(&name)
                            .ok_or_else(|| malformed(&reader))?
                            .to_string()
                    }
                };
                Some(Zeroizing::new(resolved))
            }
            Event::Eof => break,
            _ => None,
        };
        if credentials_done {
            continue;
        }
        if let (Some(text), Some(i)) = (text, field_here(&open)) {
            fields[i]
                .get_or_insert_with(|| Zeroizing::new(String::new()))
                .push_str(&text);
        }
    }
    let [a, s, t, e] = fields.map(|f| f.map(|v| Zeroizing::new(v.trim().to_string())));
    match (a, s, t) {
        (Some(a), Some(s), Some(t)) if !a.is_empty() && !s.is_empty() && !t.is_empty() => {
            Ok(AssumedKeys {
                access_key_id: a,
                secret_access_key: s,
                session_token: t,
                expiration: e.map(|e| e.to_string()),
            })
        }
        (a, s, t) => {
            let missing = [(a, FIELDS[0]), (s, FIELDS[1]), (t, FIELDS[2])]
                .into_iter()
                .filter(|(v, _)| v.as_ref().is_none_or(|v| v.is_empty()))
                .map(|(_, name)| name)
                .collect();
            Err(StsError::Missing { missing })
        }
    }
}

/// Where one STS call goes: the audit rule it is made under, the endpoint URL, the route, and
/// the region its signature is scoped to.
pub(super) struct StsCall<'a> {
    pub rule: String,
    pub endpoint: &'a str,
    pub route: Route,
    pub region: &'a str,
}

/// POSTs the form `form` (`Action=AssumeRole...`) to STS, signed with `keys` (or unsigned:
/// `AssumeRoleWithWebIdentity` carries its own proof), and reads the credentials it answers.
/// The error names the endpoint and status, never the answer's text.
pub(super) async fn call(
    call: StsCall<'_>,
    action: &str,
    form: String,
    keys: Option<&sigv4::Keys<'_>>,
    transport: &dyn TokenTransport,
) -> Result<AssumedKeys, String> {
    let endpoint = call.endpoint;
    let mut headers = HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-www-form-urlencoded; charset=utf-8"),
    );
    if let Some(keys) = keys {
        sigv4::sign_post(
            keys,
            sigv4::Scope {
                region: call.region,
                service: "sts",
            },
            endpoint,
            &mut headers,
            form.as_bytes(),
        )
        .map_err(|why| format!("cannot sign {action}: {why}"))?;
    }
    let mut ex = Exchange::post(
        call.rule,
        endpoint.to_string(),
        headers
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        Bytes::from(form),
    );
    ex.route = call.route;
    let answer = transport
        .call(ex)
        .await
        .map_err(|why| format!("STS {endpoint}: {why}"))?;
    if !(200..300).contains(&answer.status) {
        return Err(format!(
            "STS {action} at {endpoint} answered {}{}",
            answer.status,
            error_code(&answer.body)
                .map(|c| format!(" ({c})"))
                .unwrap_or_default()
        ));
    }
    parse(&answer.body).map_err(|e| e.to_string())
}

/// The `Code` of an STS error answer (`AccessDenied`, `ExpiredTokenException`): a short word,
/// never a key; anything longer or odd is left out.
fn error_code(body: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    let start = text.find("<Code>")? + "<Code>".len();
    let code = &text[start..start + text[start..].find("</Code>")?];
    (!code.is_empty() && code.len() <= 64 && code.bytes().all(|b| b.is_ascii_alphanumeric()))
        .then(|| code.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ANSWER: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<AssumeRoleResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <AssumeRoleResult>
    <AssumedRoleUser><Arn>arn:aws:sts::1:assumed-role/r/s</Arn><AssumedRoleId>AROA:s</AssumedRoleId></AssumedRoleUser>
    <Credentials>
      <AccessKeyId>ASIAEXAMPLE</AccessKeyId>
      <SecretAccessKey> wJalr&amp;XUtn&#x2F;FEMI </SecretAccessKey>
      <SessionToken><![CDATA[FwoG<token>&more]]></SessionToken>
      <Expiration>2030-01-01T00:00:00Z</Expiration>
    </Credentials>
  </AssumeRoleResult>
  <ResponseMetadata><RequestId>1</RequestId></ResponseMetadata>
</AssumeRoleResponse>"#;

    #[test]
    fn credentials_are_read_with_entities_cdata_and_any_prefix() {
        let k = parse(ANSWER.as_bytes()).expect("parsed");
        assert_eq!(k.access_key_id.as_str(), "ASIAEXAMPLE");
        assert_eq!(k.secret_access_key.as_str(), "wJalr&XUtn/FEMI");
        assert_eq!(k.session_token.as_str(), "FwoG<token>&more");
        assert_eq!(k.expiration.as_deref(), Some("2030-01-01T00:00:00Z"));

        let prefixed = ANSWER
            .replace("<Credentials>", "<sts:Credentials xmlns:sts=\"urn:x\">")
            .replace("</Credentials>", "</sts:Credentials>")
            .replace("AccessKeyId>", "sts:AccessKeyId>");
        let k = parse(prefixed.as_bytes()).expect("prefixed");
        assert_eq!(k.access_key_id.as_str(), "ASIAEXAMPLE");
    }

    #[test]
    fn what_is_missing_is_named_and_broken_xml_refused_without_its_text() {
        let no_token = ANSWER.replace(
            "<SessionToken><![CDATA[FwoG<token>&more]]></SessionToken>",
            "",
        );
        assert_eq!(
            parse(no_token.as_bytes()).err(),
            Some(StsError::Missing {
                missing: vec!["SessionToken"]
            })
        );
        // A field outside `Credentials` does not count.
        let outside = "<R><AccessKeyId>A</AccessKeyId><Credentials/></R>";
        let err = parse(outside.as_bytes()).err().expect("refused");
        assert!(
            err.to_string()
                .contains("AccessKeyId, SecretAccessKey, SessionToken"),
            "{err}"
        );
        for broken in [
            "<R><Credentials><SecretAccessKey>wJalrXUtnFEMI</Oops></Credentials></R>",
            "<R><Credentials><SecretAccessKey>wJalr&bogus;XUtnFEMI</SecretAccessKey></Credentials></R>",
        ] {
            let err = parse(broken.as_bytes()).err().expect("refused");
            assert!(matches!(err, StsError::Malformed { .. }), "{err:?}");
            assert!(!err.to_string().contains("wJalr"), "{err}");
        }
    }
}
