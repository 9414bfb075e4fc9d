//! Integration tests for latchkey: the real binary, real upstream servers on loopback, real
//! clients (curl, Python `requests`, rustls on a raw socket).
//!
//! Every test starts its own `latchkey serve` on `127.0.0.1:0` and its own upstreams, so tests run
//! in parallel and never share state. Each test asserts on what the client saw, on what reached
//! (or did not reach) the upstream, and on the audit record; every audit line any test reads is
//! checked against the record schema (`support::audit`).

// A test may unwrap what it just built (the crate denies unwrap/expect outside tests).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

mod admin_openapi;
mod approvals;
mod approvals_admin;
mod approvals_notify;
mod approvals_replicas;
mod approvals_restart;
mod approvals_slack;
mod audit_ceiling;
mod audit_crash;
mod audit_export;
mod audit_query;
mod audit_schema;
mod audit_ship;
mod audit_sink;
mod audit_verify;
mod bad_input;
mod ca_and_env;
mod cli_surface;
mod connect_gate;
mod console;
mod console_browser;
mod console_chain;
mod console_oidc;
mod credentials_client_cert;
mod credentials_github;
mod credentials_grants;
mod credentials_hmac;
mod credentials_jwt;
mod credentials_oauth;
mod credentials_policy;
mod credentials_sigv4;
mod demo;
mod deploy_compose;
mod deploy_manifests;
mod deploy_systemd;
mod dns;
mod first_run;
mod gateway;
mod gateway_dns_routed;
mod gateway_setup;
mod gateway_transparent;
mod identities;
mod inner_policy;
mod limits_admin;
mod limits_bytes_up;
mod limits_concurrency;
mod limits_plain;
mod limits_rate;
mod limits_replicas;
mod limits_restart;
mod limits_spend;
mod limits_tokens;
mod limits_truth;
mod limits_usage;
mod limits_websocket;
mod mcp;
mod mitm;
mod network_addresses;
mod network_limits;
mod network_smuggling;
mod paths;
mod plain_http;
mod policy_ask_cli;
mod policy_cli;
mod policy_diff;
mod policy_learn;
mod policy_ops;
mod policy_predicates;
mod policy_repo_example;
mod policy_roundtrip;
mod presets;
mod readme_snippets;
mod refusal_reason;
mod reload_admin;
mod report_only;
mod request_adversarial;
mod request_checks;
mod request_streaming;
mod response_adversarial;
mod response_phase;
mod s3_moto;
mod secret_stores_aws;
mod secret_stores_serve;
mod secret_stores_vault;
mod secrets_cleartext;
mod secrets_clients;
mod secrets_exfiltration;
mod secrets_hygiene;
mod secrets_inject;
mod secrets_path;
mod secrets_placeholders;
mod secrets_plain_http;
mod secrets_policy;
mod secrets_redaction;
mod secrets_rotation;
mod secrets_split;
mod secrets_streaming;
mod sessions;
mod sessions_attest;
mod sessions_cut;
mod shutdown;
mod socks;
mod state_files;
mod state_store;
mod token_capture;
mod trust;
mod tunnel;
mod upstream_failures;
mod upstream_proxy;
mod websocket;

// The docs, checked against the code and the built binary; the book's links and contents.
mod docs;
mod docs_book;

// The module layering, checked against the source.
mod layering;

// File and function sizes, checked against the source.
mod size;
