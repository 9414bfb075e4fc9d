//! Limits and budgets: charging a request to the `[limits]` its rule, identity and credential
//! name — reserved before the request is sent, settled when its response ends.
