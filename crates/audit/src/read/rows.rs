//! Rows: which records a query turns into rows (requests joined with their outcome).

use super::*;

/// Which records become rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Rows {
    /// One per request: its outcome record, or its decision record when no outcome followed
    /// (latchkey stopped while the request was in flight).
    #[default]
    PerRequest,
    /// Every decision record.
    Decision,
    /// Every outcome record.
    Outcome,
    /// Every record.
    Any,
}

/// Turns records into rows. Per request, an outcome comes out when it is read; a decision that
/// passed the filter waits for its outcome, and comes out itself only at the end of the log
/// (or, past [`MAX_PENDING`] or [`MAX_PENDING_BYTES`] waiting, when it is the oldest: a
/// request still open after ten thousand others is taken as left alone; should its outcome
/// come after all, it is a row of its own): only the end shows that no outcome followed.
pub struct Requests {
    pub(super) rows: Rows,
    pub(super) filter: Filter,
    pub(super) pending: HashMap<String, u64>,
    pub(super) order: BTreeMap<u64, Line>,
    pub(super) next: u64,
    /// The bytes of the lines in `order`.
    pub(super) held: usize,
}

impl Requests {
    pub fn new(rows: Rows, filter: Filter) -> Self {
        Self {
            rows,
            filter,
            pending: HashMap::new(),
            order: BTreeMap::new(),
            next: 0,
            held: 0,
        }
    }

    /// Takes one record; pushes the rows it releases onto `out`.
    pub fn push(&mut self, line: Line, out: &mut Vec<Line>) {
        match self.rows {
            Rows::Any => self.emit_if(line, out),
            Rows::Decision if line.decision_phase => self.emit_if(line, out),
            Rows::Outcome if !line.decision_phase => self.emit_if(line, out),
            Rows::Decision | Rows::Outcome => {}
            Rows::PerRequest if line.decision_phase => {
                if !self.filter.matches(&line) {
                    return;
                }
                let n = self.next;
                self.next += 1;
                if let Some(old) = self.pending.insert(line.id().to_string(), n) {
                    // The same id decided twice: keep the later one.
                    self.take(old);
                }
                self.held += line.raw.len();
                self.order.insert(n, line);
                while self.order.len() > MAX_PENDING || self.held > MAX_PENDING_BYTES {
                    let Some((_, oldest)) = self.order.pop_first() else {
                        break;
                    };
                    self.held -= oldest.raw.len();
                    self.pending.remove(oldest.id());
                    out.push(oldest);
                }
            }
            Rows::PerRequest => {
                if let Some(n) = self.pending.remove(line.id()) {
                    self.take(n);
                }
                self.emit_if(line, out);
            }
        }
    }

    /// The decisions no outcome followed, in log order.
    pub fn finish(&mut self, out: &mut Vec<Line>) {
        self.pending.clear();
        self.held = 0;
        out.extend(std::mem::take(&mut self.order).into_values());
    }

    /// Drops the waiting decision `n` (its outcome came, or a later decision replaced it).
    pub(super) fn take(&mut self, n: u64) {
        if let Some(line) = self.order.remove(&n) {
            self.held -= line.raw.len();
        }
    }

    pub(super) fn emit_if(&self, line: Line, out: &mut Vec<Line>) {
        if self.filter.matches(&line) {
            out.push(line);
        }
    }
}
