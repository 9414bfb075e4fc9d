//! `latchkey diff`: hand-built policy pairs, one per kind of widening and narrowing.
