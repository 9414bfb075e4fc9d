//! The review tools' tests over compiled policies, by subject.

mod ask;
mod limits;
mod properties;
mod schemes;

#[test]
fn explain_reads_wss_urls_and_says_which_rule_allows_an_upgrade() {
    let p = crate::policy::compile_sources(&[(
        std::path::Path::new("test.toml"),
        "[[rules]]\nname = \"plain\"\nhosts = [\"rt.example.com\"]\npaths = [\"/v1/**\"]\n\n\
         [[rules]]\nname = \"realtime\"\nhosts = [\"rt.example.com\"]\npaths = [\"/v1/realtime\"]\nwebsocket = true\n",
    )])
    .expect("compiles");
    let e =
        crate::explain::explain(&p, None, "GET", "wss://rt.example.com/v1/other").expect("explain");
    assert_eq!(e.reason, "websocket_not_allowed");
    let e = crate::explain::explain(&p, None, "GET", "wss://rt.example.com/v1/realtime")
        .expect("explain");
    assert!(e.allowed());
}
