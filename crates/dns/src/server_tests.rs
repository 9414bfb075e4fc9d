//! The resolver in-process, on real sockets: a `real` answer is pinned for the listeners that
//! check addresses against it, TCP framing works, and the server stops with the proxy.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;
use crate::proxy::limits::Limits;
use crate::proxy::{CertAuthority, ProxyConfig};
use crate::upstream::UpstreamConfig;

const POLICY: &str = "[[rules]]\nname = \"up\"\nhosts = [\"up.test\"]\n";

fn proxy(dir: &std::path::Path) -> Arc<Proxy> {
    let policy = crate::policy::compile_sources(&[(std::path::Path::new("main.toml"), POLICY)])
        .expect("policy");
    let (ca, _) = CertAuthority::load_or_create(&dir.join("ca")).expect("ca");
    let audit = crate::audit::AuditLog::open(&dir.join("audit.jsonl")).expect("audit");
    let mut upstream = UpstreamConfig::default();
    upstream
        .resolve
        .insert("up.test".into(), "192.0.2.10".parse().expect("ip"));
    upstream
        .allow_private
        .push(crate::wire::cidr::Cidr::parse("192.0.2.0/24").expect("cidr"));
    Proxy::new(ProxyConfig {
        policy: crate::proxy::Generation::first(
            policy,
            Arc::new(crate::secrets::captured::Captured::in_memory()),
        )
        .expect("secrets"),
        ca,
        audit,
        upstream,
        response_timeout: Duration::from_secs(5),
        limits: Limits::default(),
        policies_dir: dir.to_path_buf(),
        report_all: false,
        max_decoded_body: 1 << 20,
        max_buffered_bytes: 1 << 20,
        max_buffered_bytes_per_client: 1 << 18,
        body_timeout: Duration::from_secs(5),
        correlation: Default::default(),
        aws: None,
    })
    .expect("proxy")
}

fn query(name: &str, qtype: RecordType) -> Vec<u8> {
    let mut m = Message::new(42, MessageType::Query, OpCode::Query);
    m.add_query(Query::query(Name::from_ascii(name).expect("name"), qtype));
    m.to_vec().expect("encode")
}

fn addresses(reply: &[u8]) -> (ResponseCode, Vec<IpAddr>) {
    let m = Message::from_vec(reply).expect("reply decodes");
    assert_eq!(m.id, 42);
    let ips = m
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            hickory_proto::rr::RData::A(a) => Some(IpAddr::V4(a.0)),
            _ => None,
        })
        .collect();
    (m.response_code, ips)
}

#[tokio::test]
async fn a_real_answer_is_pinned_tcp_is_framed_and_the_server_stops_with_the_proxy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let proxy = proxy(dir.path());
    let config = DnsConfig {
        style: Style::Real,
        rate: 100,
    };
    let listener = DnsListener::bind("127.0.0.1:0".parse().expect("addr"), config).expect("bind");
    let addr: SocketAddr = listener.local_addr().expect("addr");
    let served = tokio::spawn(serve(proxy.clone(), listener));

    let client = tokio::net::UdpSocket::bind("127.0.0.1:0")
        .await
        .expect("client");
    client
        .send_to(&query("Up.Test.", RecordType::A), addr)
        .await
        .expect("send");
    let mut buf = [0u8; 1500];
    let (n, _) = tokio::time::timeout(Duration::from_secs(5), client.recv_from(&mut buf))
        .await
        .expect("an answer in time")
        .expect("recv");
    let ip: IpAddr = "192.0.2.10".parse().expect("ip");
    assert_eq!(addresses(&buf[..n]), (ResponseCode::NoError, vec![ip]));
    assert!(
        proxy.pins().answered("up.test", ip),
        "the answer was not pinned"
    );

    // A test client dialing the resolver under test on loopback, not a way out.
    #[allow(clippy::disallowed_methods)]
    let mut tcp = tokio::net::TcpStream::connect(addr).await.expect("tcp");
    let q = query("evil.test", RecordType::A);
    let mut framed = (q.len() as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(&q);
    tcp.write_all(&framed).await.expect("write");
    let mut len = [0u8; 2];
    tcp.read_exact(&mut len).await.expect("length");
    let mut reply = vec![0u8; usize::from(u16::from_be_bytes(len))];
    tcp.read_exact(&mut reply).await.expect("reply");
    assert_eq!(addresses(&reply), (ResponseCode::NXDomain, vec![]));
    assert!(!proxy.pins().answered("evil.test", ip));

    proxy.begin_shutdown();
    tokio::time::timeout(Duration::from_secs(5), served)
        .await
        .expect("the server stops with the proxy")
        .expect("task")
        .expect("served");
    assert!(proxy.audit().flush(Duration::from_secs(5)));
    let text = std::fs::read_to_string(dir.path().join("audit.jsonl")).expect("audit");
    let records: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    assert_eq!(records.len(), 2, "{text}");
    assert_eq!(
        records[0]["dns"]["answer"],
        serde_json::json!(["192.0.2.10"])
    );
    assert_eq!(records[1]["dns"]["transport"], "tcp");
    assert_eq!(records[1]["reason"], "no_rule");
}
