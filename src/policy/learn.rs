//! Learning: least-privilege rules that cover exactly the requests seen.
