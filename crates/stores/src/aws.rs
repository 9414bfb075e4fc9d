//! AWS Secrets Manager (`GetSecretValue`) and SSM Parameter Store (`GetParameter`, decrypted):
//! AWS JSON 1.1 calls signed with latchkey's own AWS identity, under the rule `secret:NAME`.
//!
//! A value is used until the policy's `refresh` (AWS gives no lease). Errors name the secret id
//! or parameter and AWS's error type and message (capped), never a value; a missing JSON key
//! is reported with the key names the secret has, never their values.

use crate::secrets::{Fetched, SecretValue};
use crate::signing::{AwsIdentity, TokenTransport};

/// The longest AWS error message repeated in an error.
const MESSAGE_CAP: usize = 200;

/// `aws-sm:ID[?stage=S|?version_id=V][?region=R][#json_key]`.
pub(crate) struct SmSecret<'a> {
    pub id: &'a str,
    pub json_key: Option<&'a str>,
    pub stage: Option<&'a str>,
    pub version_id: Option<&'a str>,
    pub region: Option<&'a str>,
}

/// The region a call goes to: the location's, else latchkey's AWS configuration.
fn region(identity: &AwsIdentity, at: Option<&str>, what: &str) -> Result<String, String> {
    at.map(str::to_string)
        .or_else(|| identity.region())
        .ok_or_else(|| {
            format!(
                "{what}: no region (add ?region=R, or set AWS_REGION or a profile region for latchkey)"
            )
        })
}

/// One signed call; the answer's JSON, or an error naming `what` and AWS's error.
async fn call(
    identity: &AwsIdentity,
    transport: &dyn TokenTransport,
    name: &str,
    what: &str,
    (service, region, target): (&str, &str, &str),
    body: serde_json::Value,
) -> Result<serde_json::Value, String> {
    let answer = identity
        .call_json(
            transport,
            format!("secret:{name}"),
            service,
            region,
            target,
            body.to_string().into_bytes(),
        )
        .await
        .map_err(|why| format!("{what}: {why}"))?;
    let json: Option<serde_json::Value> = serde_json::from_slice(&answer.body).ok();
    if !(200..300).contains(&answer.status) {
        let field = |k: &str| {
            json.as_ref()
                .and_then(|j| j.get(k).or_else(|| j.get(k.to_ascii_lowercase())))
                .and_then(|v| v.as_str())
                .map(|v| v.chars().take(MESSAGE_CAP).collect::<String>())
        };
        // `__type` may be `namespace#Type`: the type is enough.
        let kind = field("__type")
            .map(|t| t.rsplit('#').next().unwrap_or_default().to_string())
            .unwrap_or_else(|| "an error".to_string());
        let message = field("Message")
            .map(|m| format!(": {m}"))
            .unwrap_or_default();
        return Err(format!(
            "{what}: {service} answered {} {kind}{message}",
            answer.status
        ));
    }
    json.ok_or_else(|| format!("{what}: {service} answered something that is not JSON"))
}

/// Secrets Manager `GetSecretValue`.
pub(crate) async fn secrets_manager(
    identity: &AwsIdentity,
    transport: &dyn TokenTransport,
    name: &str,
    s: SmSecret<'_>,
) -> Result<Fetched, String> {
    let what = format!("aws-sm:{}", s.id);
    let region = region(identity, s.region, &what)?;
    let mut body = serde_json::json!({ "SecretId": s.id });
    if let Some(stage) = s.stage {
        body["VersionStage"] = stage.into();
    }
    if let Some(v) = s.version_id {
        body["VersionId"] = v.into();
    }
    let json = call(
        identity,
        transport,
        name,
        &what,
        ("secretsmanager", &region, "secretsmanager.GetSecretValue"),
        body,
    )
    .await?;
    let value = match (json.get("SecretString"), json.get("SecretBinary")) {
        (Some(serde_json::Value::String(text)), _) => match s.json_key {
            None => text.as_bytes().to_vec(),
            Some(key) => json_field(text, key, &what)?,
        },
        (_, Some(serde_json::Value::String(b64))) => {
            if s.json_key.is_some() {
                return Err(format!(
                    "{what}: the secret is binary, so it has no JSON key to take"
                ));
            }
            use base64::Engine;
            base64::engine::general_purpose::STANDARD
                .decode(b64.trim())
                .map_err(|_| format!("{what}: SecretBinary is not base64"))?
        }
        _ => {
            return Err(format!(
                "{what}: the answer has no SecretString or SecretBinary"
            ))
        }
    };
    Ok(Fetched {
        value: SecretValue::new(value),
        valid_for: None,
    })
}

/// `key` of the JSON object `text`, as a string (a number or boolean as written).
fn json_field(text: &str, key: &str, what: &str) -> Result<Vec<u8>, String> {
    let parsed: serde_json::Value = serde_json::from_str(text)
        .map_err(|_| format!("{what}: #{key}: the secret is not a JSON object"))?;
    let Some(object) = parsed.as_object() else {
        return Err(format!("{what}: #{key}: the secret is not a JSON object"));
    };
    match object.get(key) {
        Some(serde_json::Value::String(v)) => Ok(v.as_bytes().to_vec()),
        Some(v @ (serde_json::Value::Number(_) | serde_json::Value::Bool(_))) => {
            Ok(v.to_string().into_bytes())
        }
        Some(_) => Err(format!("{what}: #{key} is not a string")),
        None => {
            let names: Vec<&str> = object.keys().map(String::as_str).collect();
            Err(format!(
                "{what}: no key {key:?} in the secret (its keys: {})",
                names.join(", ")
            ))
        }
    }
}

/// SSM `GetParameter`, decrypted.
pub(crate) async fn ssm(
    identity: &AwsIdentity,
    transport: &dyn TokenTransport,
    name: &str,
    (param, version, at_region): (&str, Option<u64>, Option<&str>),
) -> Result<Fetched, String> {
    let what = format!("aws-ssm:{param}");
    let region = region(identity, at_region, &what)?;
    let full = match version {
        Some(v) => format!("{param}:{v}"),
        None => param.to_string(),
    };
    let json = call(
        identity,
        transport,
        name,
        &what,
        ("ssm", &region, "AmazonSSM.GetParameter"),
        serde_json::json!({ "Name": full, "WithDecryption": true }),
    )
    .await?;
    let value = json
        .get("Parameter")
        .and_then(|p| p.get("Value"))
        .and_then(|v| v.as_str())
        .ok_or_else(|| format!("{what}: the answer has no Parameter.Value"))?;
    Ok(Fetched {
        value: SecretValue::new(value.as_bytes().to_vec()),
        valid_for: None,
    })
}

#[cfg(test)]
#[path = "aws_tests.rs"]
mod tests;
