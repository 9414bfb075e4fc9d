//! Telemetry: what latchkey tells an observability backend about the traffic it decided.
//!
//! [`otlp`] exports one OpenTelemetry span per request (`--otlp URL`), built from the request's
//! outcome audit record as the audit writer hands it over: the span says exactly what the audit
//! log says, with HTTP and GenAI semantic-convention attributes, and never more (secret names,
//! never values; query values redacted as in the record).
//!
//! Depends on `audit` (the record and the [`crate::audit::Tap`] it is handed through),
//! `upstream` (the guarded client every byte to the collector goes through) and `wire`; nothing
//! depends on it but `cli`.

// The crates this one uses, under the module names the code knows them by.
use latchkey_audit as audit;
use latchkey_upstream as upstream;
use latchkey_wire as wire;

pub mod otlp;

pub use otlp::{start, traces_url, OtlpError, OtlpOptions, OtlpStats, OtlpTap};
