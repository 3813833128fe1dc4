//! The contract: what crosses the process's edge. Input events and their validation
//! (`event`; DESIGN §1), raw JSON read without building a tree (`json`, with byte
//! classes of 64-byte blocks as bit masks: `classes`), agents' OpenTelemetry spans read
//! as events (`otlp`), and the outputs (`output`; DESIGN §5).
//!
//! Guarantees: every input is either an event or a refusal that says what and where;
//! nothing here keeps state or does I/O.

pub mod classes;
pub mod event;
pub mod json;
pub mod otlp;
pub mod output;
