//! The hash chain that makes the log tamper-evident (book "Audit": verify).
//!
//! Every line the writer appends starts `{"seq":N,"prev":"HEX",` and goes on with the record's
//! own fields: `seq` counts lines from 1 across every file of the log (rotation and restarts
//! continue it), and `prev` is the SHA-256 of the previous line's bytes (without its newline;
//! [`GENESIS`] for the first line ever). Editing, deleting or reordering a line breaks the link
//! of the line after it. Every N lines or T seconds, at rotation and at a clean stop, the writer
//! appends a checkpoint line, `{"seq":N,"prev":"HEX","checkpoint":{…}}`, whose Ed25519
//! signature covers its `seq` and `prev`, so the whole chain up to it: rewriting the chain
//! after an edit needs the signing key. Lines after the last checkpoint are held only by the
//! chain. Depends on [`super::key`] only.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::time::SystemTime;

use aws_lc_rs::digest;
use serde::{Deserialize, Serialize};

use super::key::SigningKey;

/// `prev` of the first line ever written.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// Where the chain stands: the last line's `seq` and hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    pub seq: u64,
    pub last: String,
}

impl Default for Chain {
    fn default() -> Self {
        Self {
            seq: 0,
            last: GENESIS.to_string(),
        }
    }
}

/// The hex SHA-256 of one line's bytes (without its newline).
pub fn line_hash(line: &[u8]) -> String {
    let mut out = String::with_capacity(64);
    hash_into(line, &mut out);
    out
}

/// [`line_hash`] into `out` (cleared first), reusing its buffer: the writer's chain, per line.
fn hash_into(line: &[u8], out: &mut String) {
    let digest = digest::digest(&digest::SHA256, line);
    let mut hex = [0u8; 64];
    out.clear();
    // 32 bytes always fit 64 hex digits, which are ASCII.
    if hex::encode_to_slice(digest.as_ref(), &mut hex).is_ok() {
        out.push_str(std::str::from_utf8(&hex).unwrap_or_default());
    }
}

impl Chain {
    /// Appends `object` (one serialised JSON object, `{…}`) to `out` as the next line of the
    /// chain: `seq` and `prev` first, then the object's own fields, then a newline.
    pub fn append(&mut self, object: &[u8], out: &mut Vec<u8>) {
        let copied: Result<(), std::convert::Infallible> = self.append_with(out, |o| {
            o.extend_from_slice(object);
            Ok(())
        });
        let Ok(()) = copied;
    }

    /// As [`Self::append`], with the object serialised by `write` straight into `out` (no
    /// copy, no allocation). When `write` fails, `out` and the chain are left as they were.
    pub fn append_with<E>(
        &mut self,
        out: &mut Vec<u8>,
        write: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
    ) -> Result<(), E> {
        let start = out.len();
        out.extend_from_slice(b"{\"seq\":");
        out.extend_from_slice(itoa::Buffer::new().format(self.seq + 1).as_bytes());
        out.extend_from_slice(b",\"prev\":\"");
        out.extend_from_slice(self.last.as_bytes());
        out.push(b'"');
        let body = out.len();
        if let Err(e) = write(out) {
            out.truncate(start);
            return Err(e);
        }
        // The object's own `{` becomes the comma after the head; an empty object (or anything
        // that is not an object) adds nothing.
        match out.get(body..) {
            Some([b'{', next, ..]) if *next != b'}' => out[body] = b',',
            _ => {
                out.truncate(body);
                out.push(b'}');
            }
        }
        self.seq += 1;
        hash_into(&out[start..], &mut self.last);
        out.push(b'\n');
        Ok(())
    }

    /// Appends a signed checkpoint over the chain so far; `records` is how many lines it
    /// covers since the previous checkpoint, `last` marks a clean stop.
    pub fn checkpoint(
        &mut self,
        key: &SigningKey,
        records: u64,
        last: bool,
        now: SystemTime,
        out: &mut Vec<u8>,
    ) {
        let ts = humantime::format_rfc3339_millis(now).to_string();
        let seq = self.seq + 1;
        let message = checkpoint_message(seq, &self.last, &ts, records, last);
        let body = Checkpoint {
            ts,
            records,
            last,
            key: key.public().to_string(),
            sig: key.sign(message.as_bytes()),
        };
        let object = serde_json::json!({ "checkpoint": body });
        self.append(object.to_string().as_bytes(), out);
    }

    /// Where the chain stood at the end of `path`: its last whole line's `seq` and hash.
    /// `None` when the file is absent or holds no whole line. `torn` is set when the file
    /// ends in a partial line (a write cut short): the caller ends it before appending.
    pub fn resume(path: &Path) -> std::io::Result<Option<Resumed>> {
        let mut file = match File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let meta = file.metadata()?;
        let len = meta.len();
        // Only a regular file has an end to read back from (not /dev/full, a FIFO).
        if len == 0 || !meta.is_file() {
            return Ok(None);
        }
        // Read back from the end until the last whole line is in view (records are small;
        // the cap keeps a damaged file from being read whole).
        const CAP: u64 = 16 << 20;
        let mut window = 64 * 1024u64;
        loop {
            let take = window.min(len);
            file.seek(SeekFrom::Start(len - take))?;
            let mut buf = Vec::with_capacity(take as usize);
            (&mut file).take(take).read_to_end(&mut buf)?;
            let torn = buf.last() != Some(&b'\n');
            let at_start = take == len;
            if torn {
                // A write that lost only its newline left a whole line: the chain goes on
                // from it (a prefix of a line is never a whole JSON object).
                let tail = match buf.iter().rposition(|&b| b == b'\n') {
                    Some(p) => Some(&buf[p + 1..]),
                    None if at_start => Some(&buf[..]),
                    None => None,
                };
                if let Some(head) = tail.and_then(|t| serde_json::from_slice::<Head>(t).ok()) {
                    return Ok(Some(Resumed {
                        chain: Some(Chain {
                            seq: head.seq,
                            last: line_hash(tail.unwrap_or_default()),
                        }),
                        torn,
                    }));
                }
            }
            let line = match buf.iter().rposition(|&b| b == b'\n') {
                Some(end) => match buf[..end].iter().rposition(|&b| b == b'\n') {
                    Some(p) => Some(&buf[p + 1..end]),
                    None if at_start => Some(&buf[..end]),
                    None => None,
                },
                None if at_start => return Ok(Some(Resumed { chain: None, torn })),
                None => None,
            };
            let Some(line) = line else {
                if take >= CAP {
                    return Ok(Some(Resumed { chain: None, torn }));
                }
                window *= 4;
                continue;
            };
            let seq = serde_json::from_slice::<Head>(line).ok().map(|h| h.seq);
            return Ok(Some(Resumed {
                chain: seq.map(|seq| Chain {
                    seq,
                    last: line_hash(line),
                }),
                torn,
            }));
        }
    }
}

/// What [`Chain::resume`] found at the end of a file.
#[derive(Debug)]
pub struct Resumed {
    /// The chain at the last whole line; `None` when that line carries no `seq` (a log
    /// written before the chain existed: the chain starts again at 1 after it).
    pub chain: Option<Chain>,
    /// The file ends in a partial line.
    pub torn: bool,
}

/// The bytes a checkpoint's signature covers.
pub fn checkpoint_message(seq: u64, prev: &str, ts: &str, records: u64, last: bool) -> String {
    format!(
        "latchkey-audit-checkpoint-v1 seq={seq} prev={prev} ts={ts} records={records} last={last}"
    )
}

/// A checkpoint line's `checkpoint` object.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Checkpoint {
    pub ts: String,
    /// Lines since the previous checkpoint.
    pub records: u64,
    /// Written at a clean stop: nothing follows it until latchkey starts again.
    #[serde(default)]
    pub last: bool,
    /// The public key that signed it, `ed25519:…` (informative: verify trusts `--key`).
    pub key: String,
    pub sig: String,
}

/// The head every chained line starts with.
#[derive(Debug, Deserialize)]
pub struct Head {
    pub seq: u64,
    pub prev: String,
    #[serde(default)]
    pub checkpoint: Option<Checkpoint>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_carry_seq_and_the_previous_line_s_hash() {
        let mut chain = Chain::default();
        let mut out = Vec::new();
        chain.append(br#"{"id":"a"}"#, &mut out);
        chain.append(br#"{}"#, &mut out);
        let text = String::from_utf8(out).expect("utf8");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            format!(r#"{{"seq":1,"prev":"{GENESIS}","id":"a"}}"#)
        );
        let second: serde_json::Value = serde_json::from_str(lines[1]).expect("json");
        assert_eq!(second["seq"], 2);
        assert_eq!(second["prev"], line_hash(lines[0].as_bytes()));
        assert_eq!(chain.last, line_hash(lines[1].as_bytes()));
    }

    #[test]
    fn a_checkpoint_signs_the_chain_so_far() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (key, _) = SigningKey::load_or_create(&dir.path().join("k")).expect("key");
        let mut chain = Chain::default();
        let mut out = Vec::new();
        chain.append(br#"{"id":"a"}"#, &mut out);
        let prev = chain.last.clone();
        chain.checkpoint(&key, 1, false, SystemTime::now(), &mut out);
        let text = String::from_utf8(out).expect("utf8");
        let line = text.lines().nth(1).expect("checkpoint line");
        let head: Head = serde_json::from_str(line).expect("head");
        let cp = head.checkpoint.expect("checkpoint");
        assert_eq!((head.seq, head.prev.as_str()), (2, prev.as_str()));
        let msg = checkpoint_message(2, &prev, &cp.ts, 1, false);
        assert!(key.public().verifies(msg.as_bytes(), &cp.sig));
    }

    #[test]
    fn resume_finds_the_last_whole_line_and_a_torn_end() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("a.jsonl");
        assert!(Chain::resume(&path).expect("absent").is_none());
        let mut chain = Chain::default();
        let mut out = Vec::new();
        for _ in 0..3 {
            chain.append(br#"{"id":"x"}"#, &mut out);
        }
        std::fs::write(&path, &out).expect("write");
        let r = Chain::resume(&path).expect("read").expect("some");
        assert_eq!(r.chain.as_ref(), Some(&chain));
        assert!(!r.torn);
        out.extend_from_slice(br#"{"seq":4,"pr"#);
        std::fs::write(&path, &out).expect("write");
        let r = Chain::resume(&path).expect("read").expect("some");
        assert_eq!(r.chain.as_ref(), Some(&chain));
        assert!(r.torn);
        std::fs::write(&path, b"{\"id\":1}\n").expect("write");
        let r = Chain::resume(&path).expect("read").expect("some");
        assert!(r.chain.is_none());
    }
}
