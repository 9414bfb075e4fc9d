//! The one `text/event-stream` parser of the proxy (WHATWG HTML, "interpreting an event
//! stream"): the usage meter reads model-provider streams with it, and the MCP `tools/list`
//! filter finds the events it must rewrite with it, so the two can never disagree about where
//! an event ends or what its data is.
//!
//! Incremental and bounded: fed chunks in order (a line end, a `\r\n` pair, a byte-order mark
//! may be split anywhere), it keeps only the current event's data (up to [`Limits::max_data`];
//! past it the data is dropped and the event reported oversized) and, when asked to, the
//! event's raw bytes (up to [`Limits::max_raw`]; past it feeding fails). Lines end at `\n`,
//! `\r\n` or `\r`; `data:` lines join with `\n`; one space after the colon is skipped; a blank
//! line ends an event; `:` lines are comments; a leading byte-order mark is ignored.
//!
//! Every blank line is reported (an [`Event`] with no data, when only comments or other
//! fields came before it), so a caller passing raw bytes on sends a keep-alive at once. At the
//! end of the stream, an event the stream ended inside (no blank line after it, even a last
//! line with no line end) is flushed with [`Event::ended`] false: a conforming client drops
//! it, a lenient one reads it, so a reader that must see what any client may see reads it too.

/// The longest `event:` name kept (longer ones are reported as absent).
pub const MAX_NAME: usize = 64;

/// A decoded event's data above this capacity is freed rather than kept for the next event.
const KEEP_CAPACITY: usize = 64 * 1024;

/// How much the parser may hold.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The most data of one event kept; a larger event is reported [`Event::oversized`].
    pub max_data: usize,
    /// Keep each event's raw bytes, at most this many (feeding fails past it); `None`: no
    /// raw bytes are kept ([`Event::raw`] is empty).
    pub max_raw: Option<usize>,
}

/// One event's raw bytes passed [`Limits::max_raw`].
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("an event-stream event is over {0} bytes")]
pub struct TooLarge(pub usize);

/// What a blank line (or the end of the stream) ended.
#[derive(Debug, Clone, Copy)]
pub struct Event<'a> {
    /// The data lines joined with `\n`; `None` when the event had no `data` field or its data
    /// passed the limit.
    pub data: Option<&'a [u8]>,
    /// The data passed [`Limits::max_data`] and was dropped.
    pub oversized: bool,
    /// The last `event:` field's value, when there was one of at most [`MAX_NAME`] bytes.
    pub name: Option<&'a [u8]>,
    /// Every byte of the stream since the previous event, this event's ending included (when
    /// raw bytes are kept): the events' raw bytes, concatenated, are the stream.
    pub raw: &'a [u8],
    /// How many bytes at the start of `raw` (0 or 1) are the `\n` of a `\r\n` that ended the
    /// previous event: not a line of this one. When a stream ends with that `\n`, it is
    /// reported alone (`raw.len() == carried`, nothing else in the event).
    pub carried: usize,
    /// Ended by a blank line; false for what the stream ended inside.
    pub ended: bool,
    /// The stream's first event: a byte-order mark before its first line is not part of it.
    pub first: bool,
}

impl<'a> Event<'a> {
    /// This event's lines as the parser read them (after the [`Event::carried`] byte), each
    /// without its line end and with whether it is a `data` field, and the byte that ended the
    /// event (its blank line's `\r` or `\n`; nothing for what the stream ended inside). How a
    /// filter rewrites an event's data and keeps its other lines, never disagreeing with the
    /// parser about which lines are data.
    pub fn lines(&self) -> (Vec<(&'a [u8], bool)>, &'a [u8]) {
        let raw = &self.raw[self.carried..];
        let (body, end) = if self.ended && !raw.is_empty() {
            raw.split_at(raw.len() - 1)
        } else {
            (raw, &b""[..])
        };
        let mut lines = Vec::new();
        let mut push = |line: &'a [u8]| {
            let first = self.first && lines.is_empty();
            lines.push((line, is_data_line(line, first)));
        };
        let (mut start, mut i) = (0, 0);
        while i < body.len() {
            match body[i] {
                b'\r' | b'\n' => {
                    push(&body[start..i]);
                    let crlf = body[i] == b'\r' && body.get(i + 1) == Some(&b'\n');
                    i += if crlf { 2 } else { 1 };
                    start = i;
                }
                _ => i += 1,
            }
        }
        if start < body.len() {
            push(&body[start..]);
        }
        (lines, end)
    }
}

/// Whether one line is a `data` field: its name (up to a `:` or the line's end; after a
/// byte-order mark on the stream's first line) is `data`, as [`Parser`] reads it.
fn is_data_line(line: &[u8], first: bool) -> bool {
    let line = match first {
        true => line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line),
        false => line,
    };
    let name = line.split(|&b| b == b':').next().unwrap_or_default();
    field_of(name) == Field::Data
}

/// The field a name names.
fn field_of(name: &[u8]) -> Field {
    match name {
        b"data" => Field::Data,
        b"event" => Field::Event,
        _ => Field::Other,
    }
}

/// Where the parser is in the current line.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum LineState {
    /// Reading the field name (up to `:` or the line's end).
    #[default]
    Field,
    /// Just after the `:`; one space is skipped.
    Space,
    /// Reading the value.
    Value,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Field {
    #[default]
    Other,
    Data,
    Event,
}

/// An incremental event-stream parser (see the module documentation).
#[derive(Debug)]
pub struct Parser {
    limits: Limits,
    state: LineState,
    /// The field name read so far (names that matter are short; longer ones are `Other`).
    name: [u8; 16],
    name_len: usize,
    name_overflow: bool,
    field: Field,
    /// The last byte was a `\r`: a `\n` next is the same line end.
    after_cr: bool,
    /// Past the first line (a byte-order mark is skipped only before it).
    past_first_line: bool,
    data: Vec<u8>,
    has_data: bool,
    oversized: bool,
    event: Vec<u8>,
    has_event: bool,
    event_overflow: bool,
    /// The current event's raw bytes from earlier chunks (when kept).
    raw: Vec<u8>,
    /// The raw bytes held start with the `\n` of the previous event's `\r\n`.
    carried: bool,
    /// A byte other than a carried `\n` arrived since the last event.
    pending: bool,
    /// Feeding failed: every later call fails the same way.
    failed: Option<TooLarge>,
    /// No event has been reported yet.
    first_event: bool,
}

impl Parser {
    pub fn new(limits: Limits) -> Parser {
        Parser {
            limits,
            state: LineState::Field,
            name: [0; 16],
            name_len: 0,
            name_overflow: false,
            field: Field::Other,
            after_cr: false,
            past_first_line: false,
            data: Vec::new(),
            has_data: false,
            oversized: false,
            event: Vec::new(),
            has_event: false,
            event_overflow: false,
            raw: Vec::new(),
            carried: false,
            pending: false,
            failed: None,
            first_event: true,
        }
    }

    /// Memory held now (the buffers of the current event's data, name and raw bytes).
    pub fn held(&self) -> usize {
        self.data.capacity() + self.raw.capacity() + self.event.capacity()
    }

    /// Takes the next chunk; `on` gets each event it ends, in order.
    ///
    /// Errors: the current event's raw bytes passed [`Limits::max_raw`] (never when raw bytes
    /// are not kept); the parser then stays failed.
    pub fn feed<F: FnMut(Event<'_>)>(&mut self, chunk: &[u8], on: &mut F) -> Result<(), TooLarge> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        let mut seg = 0;
        let mut i = 0;
        while i < chunk.len() {
            if self.after_cr {
                self.after_cr = false;
                if chunk[i] == b'\n' {
                    if !self.pending && self.keeps_raw() {
                        self.carried = true;
                    }
                    i += 1;
                    continue;
                }
            }
            self.pending = true;
            let blank = match self.state {
                LineState::Field => {
                    let b = chunk[i];
                    i += 1;
                    match b {
                        b'\n' | b'\r' => {
                            self.after_cr = b == b'\r';
                            self.end_of_line()
                        }
                        b':' => {
                            self.start_value();
                            self.state = LineState::Space;
                            false
                        }
                        _ if self.name_len < self.name.len() => {
                            self.name[self.name_len] = b;
                            self.name_len += 1;
                            false
                        }
                        _ => {
                            self.name_overflow = true;
                            false
                        }
                    }
                }
                LineState::Space => {
                    if chunk[i] == b' ' {
                        i += 1;
                    }
                    self.state = LineState::Value;
                    false
                }
                LineState::Value => {
                    let rest = &chunk[i..];
                    let end = memchr::memchr2(b'\n', b'\r', rest);
                    self.value(&rest[..end.unwrap_or(rest.len())]);
                    match end {
                        Some(e) => {
                            self.after_cr = rest[e] == b'\r';
                            i += e + 1;
                            self.end_of_line()
                        }
                        None => {
                            i = chunk.len();
                            false
                        }
                    }
                }
            };
            if blank {
                self.dispatch(&chunk[seg..i], true, on)?;
                seg = i;
            }
        }
        self.keep(&chunk[seg..])
    }

    /// The stream has ended: a line it ended inside counts as a line, and an event it ended
    /// inside (anything since the last blank line) is flushed with `ended` false.
    pub fn finish<F: FnMut(Event<'_>)>(&mut self, on: &mut F) -> Result<(), TooLarge> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        let mid_line = self.state != LineState::Field || self.name_len > 0 || self.name_overflow;
        if mid_line {
            // Blank only for a stream of just a byte-order mark: flushed below like any line
            // the stream ended inside.
            self.end_of_line();
        }
        let something = self.pending || (self.carried && !self.raw.is_empty());
        if something {
            self.dispatch(&[], false, on)?;
        }
        Ok(())
    }

    fn keeps_raw(&self) -> bool {
        self.limits.max_raw.is_some()
    }

    /// Holds `bytes` of the current event's raw bytes, within the limit.
    fn keep(&mut self, bytes: &[u8]) -> Result<(), TooLarge> {
        let Some(max) = self.limits.max_raw else {
            return Ok(());
        };
        if self.raw.len() + bytes.len() > max {
            self.failed = Some(TooLarge(max));
            self.raw = Vec::new();
            self.data = Vec::new();
            return Err(TooLarge(max));
        }
        self.raw.extend_from_slice(bytes);
        Ok(())
    }

    /// The field name of the current line (without a leading byte-order mark on the first).
    fn field_name(&self) -> &[u8] {
        let name = &self.name[..self.name_len];
        if self.past_first_line {
            name
        } else {
            name.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(name)
        }
    }

    /// The field name has ended (at its `:` or, for a line without one, at the line's end).
    fn start_value(&mut self) {
        self.field = if self.name_overflow {
            Field::Other
        } else {
            field_of(self.field_name())
        };
        match self.field {
            Field::Data => {
                if self.has_data {
                    self.value(b"\n");
                }
                self.has_data = true;
            }
            Field::Event => {
                self.event.clear();
                self.has_event = true;
                self.event_overflow = false;
            }
            Field::Other => {}
        }
    }

    fn value(&mut self, bytes: &[u8]) {
        match self.field {
            Field::Data => {
                if !self.oversized && !push_bounded(&mut self.data, bytes, self.limits.max_data) {
                    self.oversized = true;
                    self.data = Vec::new();
                }
            }
            Field::Event => {
                if self.event.len() + bytes.len() <= MAX_NAME {
                    self.event.extend_from_slice(bytes);
                } else {
                    self.event_overflow = true;
                }
            }
            Field::Other => {}
        }
    }

    /// A line ended; whether it was blank (the event ends).
    fn end_of_line(&mut self) -> bool {
        let mut blank = false;
        if self.state == LineState::Field {
            if self.field_name().is_empty() && !self.name_overflow {
                blank = true;
            } else {
                // A field without a colon: its value is empty.
                self.start_value();
            }
        }
        self.state = LineState::Field;
        self.name_len = 0;
        self.name_overflow = false;
        self.field = Field::Other;
        self.past_first_line = true;
        blank
    }

    /// Reports the current event (its raw bytes: those held, then `tail`), then forgets it.
    fn dispatch<F: FnMut(Event<'_>)>(
        &mut self,
        tail: &[u8],
        ended: bool,
        on: &mut F,
    ) -> Result<(), TooLarge> {
        let raw: &[u8] = match self.limits.max_raw {
            None => &[],
            Some(_) if self.raw.is_empty() => tail,
            Some(_) => {
                self.keep(tail)?;
                &self.raw
            }
        };
        if let Some(max) = self.limits.max_raw {
            if raw.len() > max {
                self.failed = Some(TooLarge(max));
                return Err(TooLarge(max));
            }
        }
        let event = Event {
            data: (self.has_data && !self.oversized).then_some(&self.data[..]),
            oversized: self.oversized,
            name: (self.has_event && !self.event_overflow).then_some(&self.event[..]),
            raw,
            carried: usize::from(self.carried && !raw.is_empty()),
            ended,
            first: self.first_event,
        };
        self.first_event = false;
        on(event);
        if self.data.capacity() > KEEP_CAPACITY {
            self.data = Vec::new();
        } else {
            self.data.clear();
        }
        if self.raw.capacity() > KEEP_CAPACITY {
            self.raw = Vec::new();
        } else {
            self.raw.clear();
        }
        self.has_data = false;
        self.oversized = false;
        self.event.clear();
        self.has_event = false;
        self.event_overflow = false;
        self.carried = false;
        self.pending = false;
        Ok(())
    }
}

/// Appends `bytes` to `buf` unless that would pass `max`; grows the buffer to at most `max`,
/// so data near the bound does not double its allocation past it.
pub fn push_bounded(buf: &mut Vec<u8>, bytes: &[u8], max: usize) -> bool {
    let need = buf.len() + bytes.len();
    if need > max {
        return false;
    }
    if need > buf.capacity() {
        let target = need.max(buf.capacity() * 2).min(max);
        buf.reserve_exact(target - buf.len());
    }
    buf.extend_from_slice(bytes);
    true
}

/// Whether a `Content-Type` value names an event stream (`text/event-stream`, any case, any
/// parameters).
pub fn is_event_stream(content_type: &str) -> bool {
    content_type
        .split(';')
        .next()
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("text/event-stream"))
}

#[cfg(test)]
#[path = "sse_tests.rs"]
mod tests;
