//! Secrets: values that only latchkey holds, referenced by name from policy, and the
//! credential-brokering steps that work on them.
//!
//! [`SecretValue`] cannot be printed or serialised; [`scrub::Scrubber`] finds any value in
//! force (raw and encoded) so responses can be redacted and outbound leaks refused. The
//! brokering steps — the leak checks ([`leak`], [`detector`], [`decoded`]), placeholder
//! substitution ([`substitute`], [`query`]) and injection ([`inject`]) — take plain data
//! (header maps, templates, values, names). This module knows no sockets and imports nothing
//! from `policy`, `proxy` or `upstream` (`policy` depends on it).

// The crates this one uses, under the module names the code knows them by.
use latchkey_state as state;
use latchkey_wire as wire;
use latchkey_wire::files;
use latchkey_wire::reason;

mod audit_scrub;
pub mod captured;
pub mod decoded;
pub mod detector;
mod exec;
pub mod inject;
pub mod leak;
pub mod placeholder;
pub mod query;
mod redaction_set;
pub mod remote;
pub mod scrub;
mod sieve;
mod store;
mod store_remote;
pub mod substitute;
pub mod template;
mod value;
mod variants;

pub use redaction_set::{MAX_LIVE_PER_NAME, MAX_RETIRED, MAX_RETIRED_PER_NAME, RETIRED_KEEP};
pub use remote::{Fetch, Fetched, Location, Remote, VaultAuth, VaultConnection};
pub use store::{RedactionStats, SecretError, SecretStore, Source, MIN_SECRET_LEN};
pub use store_remote::{FAILURE_KEPT, RETRY_EVERY};
pub use template::{Template, TemplateError};
pub use value::SecretValue;
