//! loopwarden: a stream processor that stops runaway AI agents from the outside.
//!
//! It reads the events agent platforms already publish (`cost.attributed` per LLM call,
//! `tool.called` per tool call), keeps a small bounded state per session, runs loop and
//! runaway detectors on every event, and emits `session.warning`, `session.terminated`
//! and `session.summary` events. See `DESIGN.md` in the repository for the contract.
//!
//! The layers, each a folder, from the bytes in to the findings out:
//! - [`contract`]: what crosses the process's edge — the input events and their
//!   validation ([`contract::event`]), raw JSON read without building a tree
//!   ([`contract::json`], with byte classes of 64-byte blocks: [`contract::classes`]), OpenTelemetry spans read as events ([`contract::otlp`]), and
//!   the outputs ([`contract::output`]);
//! - [`engine`]: the judgement — levels and modes ([`engine::levels`], its lowest
//!   layer), the trajectory every detector reads ([`engine::trajectory`]), the detectors
//!   (one file each, with their own settings and counters, and the list that makes them
//!   a set), the session as stored ([`engine::state`]), the policy, fingerprints, text
//!   and content features, the state stores; pure and synchronous, its clock the events'
//!   own time;
//! - [`bus`]: the engine on Kafka — topics, client settings and librdkafka's C heap
//!   ([`bus::kafka`]), the consumer-group pipeline with its delivery, changelog and
//!   rebalances ([`bus::pipeline`]), and the OTLP ingest ([`bus::ingest`]);
//! - [`telemetry`]: metrics, spans and the health endpoints;
//! - [`tools`]: the engine over files and fleets — `replay`, `backtest`, `eval`,
//!   `simulate`, `demo`, the feeder, the file driver, and the fuzzers' entry points;
//! - [`config`] (the configuration file and `LOOPWARDEN_` variables, parsed raw then
//!   validated), [`shutdown`], [`prefetch`] (memory hints for the hot paths) and
//!   [`heap`] (the service's huge pages) serve every layer.

#![cfg_attr(not(test), warn(clippy::too_many_lines))]

// Linked into every binary of the crate, its tests too, whether or not the binary names
// it: its `override` feature makes it the process's `malloc` (the C heap,
// `bus::kafka::c_heap`).
extern crate mimalloc;

pub mod bus;
pub mod config;
pub mod contract;
pub mod engine;
pub mod heap;
pub mod prefetch;
pub mod shutdown;
pub mod telemetry;
pub mod tools;
