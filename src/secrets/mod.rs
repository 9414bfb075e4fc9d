//! Secrets: values that only latchkey holds, referenced by name from policy.
//!
//! [`SecretValue`] cannot be printed or serialised; [`scrub::Scrubber`] finds any value in
//! force (raw and encoded) so responses can be redacted and outbound leaks refused. This module
//! knows no sockets.

pub mod scrub;
mod value;

pub use value::SecretValue;
