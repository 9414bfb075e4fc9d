//! Reading queries and building replies, without sockets: every refusal class, and a property
//! test that no byte string panics the reader or yields anything but silence or a well-formed
//! reply to the same id.

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{DNSClass, Name, RecordType};
use proptest::prelude::*;

use super::*;

fn query(name: &str, qtype: RecordType) -> Message {
    let mut m = Message::new(0x1234, MessageType::Query, OpCode::Query);
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(Name::from_ascii(name).expect("name"), qtype));
    m
}

fn bytes(m: &Message) -> Vec<u8> {
    m.to_vec().expect("encode")
}

fn decode(reply: &Reply, transport: Transport) -> Message {
    Message::from_vec(&reply.encode(transport).expect("encodes")).expect("decodes")
}

#[test]
fn an_address_question_is_asked_with_its_name_normalised_and_kept_as_sent() {
    let Read::Ask(q) = read(&bytes(&query("Up.Example.COM.", RecordType::A))) else {
        panic!("not asked")
    };
    assert_eq!(
        (q.name.as_str(), q.as_sent.as_str()),
        ("up.example.com", "Up.Example.COM")
    );
    assert_eq!(q.qtype, RecordType::A);
    let ips: Vec<IpAddr> = vec!["192.0.2.1".parse().unwrap(), "2001:db8::1".parse().unwrap()];
    let reply = q.answer(&ips, 30);
    assert_eq!(
        reply.addresses(),
        vec![ips[0]],
        "only the question's family"
    );
    let m = decode(&reply, Transport::Udp);
    assert_eq!(m.id, 0x1234);
    assert_eq!(m.message_type, MessageType::Response);
    assert!(m.recursion_desired && m.recursion_available);
    assert_eq!(m.queries.len(), 1, "the question is echoed");
    assert_eq!(m.answers.len(), 1);
    assert_eq!(m.answers[0].ttl, 30);
}

#[test]
fn tunnelling_types_and_other_classes_are_refused_with_their_type_named() {
    for (qtype, shown) in [
        (RecordType::TXT, "TXT"),
        (RecordType::NULL, "NULL"),
        (RecordType::ANY, "ANY"),
        (RecordType::SRV, "SRV"),
        (RecordType::MX, "MX"),
        (RecordType::CNAME, "CNAME"),
        (RecordType::Unknown(65280), "TYPE65280"),
    ] {
        let Read::Reject(r) = read(&bytes(&query("up.example.com", qtype))) else {
            panic!("{shown} was not refused")
        };
        assert_eq!(r.reason, Reason::DnsTypeRefused, "{shown}");
        assert_eq!(r.qtype.as_deref(), Some(shown));
        assert_eq!(r.name.as_deref(), Some("up.example.com"));
        assert_eq!(
            decode(&r.reply, Transport::Udp).response_code,
            ResponseCode::Refused
        );
    }
    let mut chaos = query("version.bind", RecordType::A);
    chaos.queries[0].set_query_class(DNSClass::CH);
    let Read::Reject(r) = read(&bytes(&chaos)) else {
        panic!("CH was not refused")
    };
    assert_eq!(r.reason, Reason::DnsTypeRefused);
}

#[test]
fn malformed_and_odd_queries_get_formerr_notimp_or_silence() {
    let mut two = query("a.example", RecordType::A);
    two.add_query(Query::query(
        Name::from_ascii("b.example").unwrap(),
        RecordType::A,
    ));
    let mut none = query("a.example", RecordType::A);
    none.queries.clear();
    let mut notify = query("a.example", RecordType::A);
    notify.metadata.op_code = OpCode::Notify;
    for (m, rcode) in [
        (two, ResponseCode::FormErr),
        (none, ResponseCode::FormErr),
        (notify, ResponseCode::NotImp),
    ] {
        let Read::Reject(r) = read(&bytes(&m)) else {
            panic!("not refused: {m:?}")
        };
        assert_eq!(r.reason, Reason::BadRequest);
        let reply = decode(&r.reply, Transport::Udp);
        assert_eq!((reply.id, reply.response_code), (0x1234, rcode));
    }
    // A truncated question still has a header: FORMERR to its id.
    let whole = bytes(&query("a.example", RecordType::A));
    let Read::Reject(r) = read(&whole[..whole.len() - 3]) else {
        panic!("cut query")
    };
    assert_eq!(r.reply.response_code(), ResponseCode::FormErr);
    // Not even a header, or an answer: nothing is sent back.
    assert!(matches!(read(&whole[..11]), Read::Ignore(_)));
    let mut answer = query("a.example", RecordType::A);
    answer.metadata.message_type = MessageType::Response;
    assert!(matches!(read(&bytes(&answer)), Read::Ignore(_)));
}

#[test]
fn names_that_are_not_host_names_are_refused() {
    // A label holding a dot or a space decodes, but is no host name policy could name.
    let cases: [&[&[u8]]; 3] = [
        &[b"a.b", b"example"],
        &[b"a b", b"example"],
        &[b"1", b"2", b"3", b"4"],
    ];
    for labels in cases {
        let name = Name::from_labels(labels.iter().copied()).expect("labels");
        let mut m = Message::new(7, MessageType::Query, OpCode::Query);
        m.add_query(Query::query(name, RecordType::A));
        let Read::Reject(r) = read(&bytes(&m)) else {
            panic!("asked: {labels:?}")
        };
        assert_eq!(r.reason, Reason::BadRequest, "{labels:?}");
        assert_eq!(r.reply.response_code(), ResponseCode::Refused);
    }
}

/// A query for `labels`, written byte by byte: hickory refuses to build the over-long ones.
fn raw_query(labels: &[usize]) -> Vec<u8> {
    let mut raw = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    for &len in labels {
        raw.push(len as u8);
        raw.extend(std::iter::repeat_n(b'a', len));
    }
    raw.extend_from_slice(&[0, 0, 1, 0, 1]);
    raw
}

#[test]
fn over_long_labels_and_names_are_formerr_and_the_longest_host_name_is_asked() {
    for labels in [&[64usize, 4][..], &[63, 63, 63, 63]] {
        let Read::Reject(r) = read(&raw_query(labels)) else {
            panic!("{labels:?} was not refused")
        };
        assert_eq!(r.reply.response_code(), ResponseCode::FormErr, "{labels:?}");
        assert_eq!(r.reason, Reason::BadRequest);
    }
    // 251 characters: within both DNS's 255 wire bytes and a host name's 253.
    let Read::Ask(q) = read(&raw_query(&[63, 63, 63, 59])) else {
        panic!("the longest name was not asked")
    };
    assert_eq!(q.name.len(), 251);
}

#[test]
fn a_udp_reply_never_exceeds_what_the_client_takes() {
    let ips: Vec<IpAddr> = (1..=20)
        .map(|i| format!("2001:db8::{i}").parse().unwrap())
        .collect();
    let label = "a".repeat(60);
    let long = format!("{label}.{label}.{label}.example");
    let mut m = query(&long, RecordType::AAAA);
    let Read::Ask(q) = read(&bytes(&m)) else {
        panic!("not asked")
    };
    let reply = q.answer(&ips, 30);
    assert_eq!(reply.addresses().len(), MAX_ANSWERS);
    assert!(reply.encode(Transport::Udp).expect("udp").len() <= 512);
    assert_eq!(decode(&reply, Transport::Tcp).answers.len(), MAX_ANSWERS);
    // With EDNS the client takes more, up to latchkey's own cap.
    let mut edns = Edns::new();
    edns.set_max_payload(4096);
    m.set_edns(edns);
    let Read::Ask(q) = read(&bytes(&m)) else {
        panic!("not asked")
    };
    let reply = q.answer(&ips, 30);
    let udp = decode(&reply, Transport::Udp);
    assert_eq!(udp.answers.len(), MAX_ANSWERS);
    assert!(udp.edns.is_some(), "EDNS is answered with EDNS");
}

/// What a reader's outcome sends, with every question answered with an address.
fn sent(bytes: &[u8]) -> Option<Vec<u8>> {
    match read(bytes) {
        Read::Ignore(_) => None,
        Read::Reject(r) => r.reply.encode(Transport::Udp),
        Read::Ask(q) => {
            let ips = ["192.0.2.1".parse().unwrap(), "2001:db8::1".parse().unwrap()];
            q.answer(&ips, 30).encode(Transport::Udp)
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_get_silence_or_a_well_formed_reply_to_their_id(
        raw in proptest::collection::vec(any::<u8>(), 0..600)
    ) {
        if let Some(out) = sent(&raw) {
            let reply = Message::from_vec(&out).expect("the reply decodes");
            prop_assert_eq!(reply.message_type, MessageType::Response);
            prop_assert_eq!(reply.id, u16::from_be_bytes([raw[0], raw[1]]));
            prop_assert!(out.len() <= 512);
        }
    }

    #[test]
    fn mutated_queries_get_silence_or_a_well_formed_reply(
        flips in proptest::collection::vec((0usize..64, any::<u8>()), 1..6),
        cut in 0usize..64,
    ) {
        let mut raw = bytes(&query("api.example.com", RecordType::AAAA));
        for (at, b) in flips {
            let i = at % raw.len();
            raw[i] ^= b;
        }
        raw.truncate(raw.len().saturating_sub(cut % 8));
        if let Some(out) = sent(&raw) {
            let reply = Message::from_vec(&out).expect("the reply decodes");
            prop_assert_eq!(reply.message_type, MessageType::Response);
        }
    }
}
