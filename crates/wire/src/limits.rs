//! Size caps that policy validation and the proxy share: a policy value may not promise more
//! than the proxy will hold. Depends on nothing in the crate.

/// The most of a request body latchkey holds whole for a feature that needs it (body
/// placeholders; SigV4's `max_signed_body` is capped at it, which policy validation checks).
/// Larger bodies stream.
pub const SCAN_LIMIT: usize = 8 * 1024 * 1024;
