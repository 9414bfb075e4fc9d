//! Secrets: values that only latchkey holds, referenced by name from policy.
//!
//! [`SecretValue`] cannot be printed or serialised; [`scrub::Scrubber`] finds any value in
//! force (raw and encoded) so responses can be redacted and outbound leaks refused. This module
//! knows no sockets.

pub mod placeholder;
pub mod scrub;
mod store;
pub(crate) mod template;
mod value;

pub use store::{
    RedactionStats, SecretError, SecretStore, Source, MAX_LIVE_PER_NAME, MAX_RETIRED,
    MAX_RETIRED_PER_NAME, MIN_SECRET_LEN, RETIRED_KEEP,
};
pub use template::{Template, TemplateError};
pub use value::SecretValue;
