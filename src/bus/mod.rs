//! The bus: the engine on Kafka. Topic and client settings and the checks made at start
//! (`kafka`), the consumer-group pipeline — batches, delivery, the changelog, rebalances
//! (`pipeline`; DESIGN §6) — and the OTLP ingest that re-publishes agents' traces as
//! events (`ingest`).
//!
//! Guarantees: at least once end to end (exactly once on request); the pipeline module's
//! docs say what holds at each step.

pub mod ingest;
pub mod kafka;
pub mod pipeline;
