//! Runtime sessions as a platform drives them: JSON calls to the admin API (`/sessions`), and
//! the credentials a sandbox presents.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};

use base64::Engine;
use serde_json::Value;

use super::clients::{dial, read_response, RawResponse};
use super::latchkey::Latchkey;

/// `METHOD PATH` with a JSON `body` on `lk`'s admin API, with `token` as the bearer if given:
/// the status and the JSON answer (`null` for an empty one).
pub fn admin_json(
    lk: &Latchkey,
    method: &str,
    path: &str,
    body: Option<&Value>,
    token: Option<&str>,
) -> (u16, Value) {
    let addr = lk.admin_addr();
    let text = body.map(Value::to_string).unwrap_or_default();
    let mut tcp = dial(addr);
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        text.len()
    );
    if let Some(t) = token {
        head.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    head.push_str("\r\n");
    tcp.write_all(head.as_bytes()).expect("send admin request");
    tcp.write_all(text.as_bytes()).expect("send admin body");
    let resp = read_response(&mut tcp, false)
        .unwrap_or_else(|e| panic!("read admin answer to {method} {path}: {e}"));
    // JSON, or (a 401's plain text) the text itself.
    let value = if resp.body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&resp.body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&resp.body).into_owned()))
    };
    (resp.status, value)
}

/// `POST /sessions` with `body`, asserted `201`: the session made (id, token, env, …).
pub fn create(lk: &Latchkey, body: &Value) -> Value {
    let (status, made) = admin_json(lk, "POST", "/sessions", Some(body), None);
    assert_eq!(status, 201, "POST /sessions {body}: {made:#}");
    made
}

/// `DELETE /sessions/ID`, asserted `204`.
pub fn revoke(lk: &Latchkey, id: &str) {
    let (status, answer) = admin_json(lk, "DELETE", &format!("/sessions/{id}"), None, None);
    assert_eq!(status, 204, "DELETE /sessions/{id}: {answer:#}");
}

/// `Basic base64(ID:TOKEN)`, as a sandbox's `HTTPS_PROXY=http://ID:TOKEN@…` sends it.
pub fn basic(session: &Value) -> String {
    let id = session["id"].as_str().expect("session id");
    let token = session["token"].as_str().expect("session token");
    let pair = format!("{id}:{token}");
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(pair)
    )
}

/// `CONNECT authority` on a fresh connection to `proxy` with `Proxy-Authorization: auth`: the
/// open stream and the answer's head.
pub fn connect_as(proxy: SocketAddr, authority: &str, auth: &str) -> (TcpStream, RawResponse) {
    let mut tcp = dial(proxy);
    let _ = write!(
        tcp,
        "CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\nProxy-Authorization: {auth}\r\n\r\n"
    );
    let resp = read_response(&mut tcp, true).expect("read CONNECT response");
    (tcp, resp)
}
