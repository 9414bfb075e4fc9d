//! Reach diff: what one policy allows that another does not, per identity, computed from the
//! compiled matchers and confirmed request by request with [`super::explain`].
