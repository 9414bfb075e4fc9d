//! latchkey's DNS side: what its resolver handed out ([`pins`]), so listeners can tie a
//! connection's address to the names it was answered for. Depends on nothing in `proxy`.

pub mod pins;

pub use pins::Pins;
