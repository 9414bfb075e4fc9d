//! DNS messages, read and written with hickory-proto (never parsed by hand): what one datagram
//! or TCP frame asks ([`read`]) and the reply to it ([`Reply`]). No sockets, no policy: the
//! resolver decides what a [`Question`] gets.
//!
//! What is refused here, before policy sees anything: anything that is not a standard query
//! with exactly one question (FORMERR, NOTIMP), classes other than IN and every type but A,
//! AAAA, HTTPS and SVCB (REFUSED: TXT, NULL, ANY, SRV, MX, CNAME, ... are what DNS tunnels ride
//! on), and names that are not host names (REFUSED). Depends on `reason` and `wire` only.

use std::net::IpAddr;

use hickory_proto::op::{Edns, Header, Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use hickory_proto::serialize::binary::{BinDecodable, BinDecoder};

use crate::reason::Reason;

/// The largest UDP reply latchkey sends to a client that advertises EDNS (the DNS flag day
/// 2020 size, which avoids IP fragmentation).
pub const MAX_UDP_PAYLOAD: u16 = 1232;
/// The UDP reply size without EDNS (RFC 1035).
const PLAIN_UDP_PAYLOAD: usize = 512;
/// Most addresses in one answer: plenty for a client, and a reply that always fits.
pub const MAX_ANSWERS: usize = 8;
/// The DNS header is 12 bytes; anything shorter is not a DNS message.
const HEADER_LEN: usize = 12;
/// Records a query may carry besides its question: an EDNS OPT (and a cookie or padding option
/// inside it). More is not a query a stub resolver sends.
const MAX_ADDITIONALS: u16 = 2;

/// How the message came: the reply's size limit depends on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Udp,
    Tcp,
}

impl Transport {
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Udp => "udp",
            Transport::Tcp => "tcp",
        }
    }
}

/// What one message asks.
#[derive(Debug)]
pub enum Read {
    /// Not a DNS query at all (shorter than a header, or a response): nothing is sent back, so
    /// latchkey never answers an answer (no reflection loops).
    Ignore(&'static str),
    /// Refused before policy: answer `reply` as it is.
    Reject(Rejected),
    /// One well-formed question for policy to decide.
    Ask(Question),
}

/// A query refused before policy, and why.
#[derive(Debug)]
pub struct Rejected {
    pub reply: Reply,
    pub reason: Reason,
    /// The query type, when the question could be read.
    pub qtype: Option<String>,
    /// The name asked for as sent (case kept, escaped as DNS presentation format, no trailing
    /// dot), when it could be read: the resolver checks it for secrets before recording it.
    pub name: Option<String>,
    /// Why, for the log.
    pub why: &'static str,
}

/// One question for an address (A, AAAA) or service binding (HTTPS, SVCB) of a host name.
#[derive(Debug)]
pub struct Question {
    pub reply: Reply,
    pub qtype: RecordType,
    /// The name as sent (case kept, no trailing dot): what the secret check reads.
    pub as_sent: String,
    /// The name normalised (lower case): what policy matches.
    pub name: String,
    /// The name exactly as asked, for the answer records.
    qname: Name,
}

impl Question {
    /// The reply with `ips` (of the question's family) as the answer, `ttl` seconds each.
    pub fn answer(mut self, ips: &[IpAddr], ttl: u32) -> Reply {
        for ip in ips.iter().take(MAX_ANSWERS) {
            let fits = matches!(
                (self.qtype, ip),
                (RecordType::A, IpAddr::V4(_)) | (RecordType::AAAA, IpAddr::V6(_))
            );
            if fits {
                let record = Record::from_rdata(self.qname.clone(), ttl, RData::from(*ip));
                self.reply.message.add_answer(record);
            }
        }
        self.reply
    }
}

/// A reply being built: the request's id, opcode and question echoed, EDNS answered with EDNS.
#[derive(Debug)]
pub struct Reply {
    message: Message,
    /// The largest reply the client takes over UDP.
    udp_limit: usize,
}

impl Reply {
    /// A reply to what `header` says (no question echoed: it could not be read).
    fn for_header(header: &Header) -> Self {
        let mut message = Message::response(header.id, header.op_code);
        message.metadata.recursion_desired = header.recursion_desired;
        message.metadata.recursion_available = true;
        Self {
            message,
            udp_limit: PLAIN_UDP_PAYLOAD,
        }
    }

    /// A reply to `request`, echoing its question and its EDNS.
    fn for_request(request: &Message) -> Self {
        let mut message = Message::response(request.id, request.op_code);
        message.metadata.recursion_desired = request.recursion_desired;
        message.metadata.recursion_available = true;
        message.add_queries(request.queries.iter().cloned());
        let mut udp_limit = PLAIN_UDP_PAYLOAD;
        if let Some(edns) = &request.edns {
            udp_limit = usize::from(edns.max_payload().clamp(512, MAX_UDP_PAYLOAD));
            let mut ours = Edns::new();
            ours.set_max_payload(MAX_UDP_PAYLOAD);
            message.set_edns(ours);
        }
        Self { message, udp_limit }
    }

    /// Sets the response code.
    #[must_use]
    pub fn rcode(mut self, rcode: ResponseCode) -> Self {
        self.message.metadata.response_code = rcode;
        self
    }

    /// The response code set.
    pub fn response_code(&self) -> ResponseCode {
        self.message.response_code
    }

    /// The addresses in the answer section.
    pub fn addresses(&self) -> Vec<IpAddr> {
        self.message
            .answers
            .iter()
            .filter_map(|r| match &r.data {
                RData::A(a) => Some(IpAddr::V4(a.0)),
                RData::AAAA(a) => Some(IpAddr::V6(a.0)),
                _ => None,
            })
            .collect()
    }

    /// The reply's bytes, within what the transport carries: a UDP reply too large for the
    /// client is sent truncated (TC set, so it retries over TCP). `None` only if hickory
    /// cannot encode it, which a reply built here never is.
    pub fn encode(&self, transport: Transport) -> Option<Vec<u8>> {
        let bytes = self.message.to_vec().ok()?;
        let limit = match transport {
            Transport::Udp => self.udp_limit,
            Transport::Tcp => usize::from(u16::MAX),
        };
        if bytes.len() <= limit {
            return Some(bytes);
        }
        self.message.truncate().to_vec().ok()
    }
}

/// The REFUSED reply to a message latchkey answers without deciding it (over the rate cap): to
/// its question when it reads, to its header otherwise; `None` for what is not a query.
pub fn refused(bytes: &[u8]) -> Option<Vec<u8>> {
    let reply = match read(bytes) {
        Read::Ignore(_) => return None,
        Read::Reject(r) => r.reply,
        Read::Ask(q) => q.reply,
    };
    reply.rcode(ResponseCode::Refused).encode(Transport::Udp)
}

/// The stable name of a response code, for the audit record.
pub fn rcode_name(rcode: ResponseCode) -> &'static str {
    match rcode {
        ResponseCode::NoError => "NOERROR",
        ResponseCode::FormErr => "FORMERR",
        ResponseCode::ServFail => "SERVFAIL",
        ResponseCode::NXDomain => "NXDOMAIN",
        ResponseCode::NotImp => "NOTIMP",
        ResponseCode::Refused => "REFUSED",
        _ => "OTHER",
    }
}

/// A query type as DNS presentation format names it (`A`, `TXT`, `TYPE65280`).
pub fn type_name(qtype: RecordType) -> String {
    match qtype {
        RecordType::Unknown(code) => format!("TYPE{code}"),
        known => <&'static str>::from(known).to_string(),
    }
}

/// Reads one message. Never panics, whatever the bytes (a property test holds it to that).
pub fn read(bytes: &[u8]) -> Read {
    if bytes.len() < HEADER_LEN {
        return Read::Ignore("shorter than a DNS header");
    }
    let Ok(header) = Header::read(&mut BinDecoder::new(bytes)) else {
        return Read::Ignore("not a DNS header");
    };
    if header.message_type == MessageType::Response {
        return Read::Ignore("a response, not a query");
    }
    let reject = |reply: Reply, rcode, reason, why| {
        Read::Reject(Rejected {
            reply: reply.rcode(rcode),
            reason,
            qtype: None,
            name: None,
            why,
        })
    };
    if header.op_code != OpCode::Query {
        let why = "only standard queries are answered";
        return reject(
            Reply::for_header(&header),
            ResponseCode::NotImp,
            Reason::BadRequest,
            why,
        );
    }
    // Checked on the header before the message is decoded: hickory sizes its question list
    // from this count, and a query has exactly one question (RFC 9619).
    let counts = header.counts;
    if counts.queries != 1
        || counts.answers != 0
        || counts.authorities != 0
        || counts.additionals > MAX_ADDITIONALS
    {
        let why = "a query has exactly one question and no records besides EDNS";
        return reject(
            Reply::for_header(&header),
            ResponseCode::FormErr,
            Reason::BadRequest,
            why,
        );
    }
    let request = match Message::from_vec(bytes) {
        Ok(m) => m,
        // Labels over 63 bytes and names over 255 end here too.
        Err(_) => {
            let why = "the query does not decode";
            return reject(
                Reply::for_header(&header),
                ResponseCode::FormErr,
                Reason::BadRequest,
                why,
            );
        }
    };
    let reply = Reply::for_request(&request);
    let Some(query) = request.queries.first() else {
        let why = "the query has no question";
        return reject(reply, ResponseCode::FormErr, Reason::BadRequest, why);
    };
    let qtype = query.query_type();
    let qname = query.name().clone();
    let shown = qname.to_ascii();
    let shown = shown.strip_suffix('.').unwrap_or(&shown).to_string();
    let refuse = |reply: Reply, reason, why| {
        Read::Reject(Rejected {
            reply: reply.rcode(ResponseCode::Refused),
            reason,
            qtype: Some(type_name(qtype)),
            name: Some(shown.clone()),
            why,
        })
    };
    if query.query_class() != DNSClass::IN {
        return refuse(reply, Reason::DnsTypeRefused, "only class IN is answered");
    }
    if !matches!(
        qtype,
        RecordType::A | RecordType::AAAA | RecordType::HTTPS | RecordType::SVCB
    ) {
        let why = "only A, AAAA, HTTPS and SVCB queries are answered";
        return refuse(reply, Reason::DnsTypeRefused, why);
    }
    let Some(as_sent) = host_name(&qname) else {
        return refuse(reply, Reason::BadRequest, "the name is not a host name");
    };
    let name = match crate::wire::host::normalize_host(&as_sent) {
        Ok(name) if matches!(crate::wire::host::parse_ip_host(&name), Ok(None)) => name,
        _ => return refuse(reply, Reason::BadRequest, "the name is not a host name"),
    };
    Read::Ask(Question {
        reply,
        qtype,
        as_sent,
        name,
        qname,
    })
}

/// The name as a host name (labels of letters, digits, `-` and `_` joined by dots, case kept),
/// or `None`: a label holding anything else (a dot, a space, a byte DNS carries but no host
/// name has) is never escaped into something policy might match.
fn host_name(name: &Name) -> Option<String> {
    let mut out = String::new();
    for label in name.iter() {
        if label.is_empty()
            || !label
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_')
        {
            return None;
        }
        if !out.is_empty() {
            out.push('.');
        }
        out.extend(label.iter().map(|&b| char::from(b)));
    }
    (!out.is_empty()).then_some(out)
}

#[cfg(test)]
#[path = "message_tests.rs"]
mod tests;
