//! loopwarden: a stream processor that stops runaway AI agents from the outside.
//!
//! It reads the events agent platforms already publish (`cost.attributed` per LLM call,
//! `tool.called` per tool call), keeps a small bounded state per session, runs loop and
//! runaway detectors on every event, and emits `session.warning`, `session.terminated`
//! and `session.summary` events. See `DESIGN.md` in the repository for the contract.
//!
//! Layers, from the bytes in to the findings out:
//! - [`event`]: the input contract and its validation (bad input is a [`event::BadEvent`]);
//! - [`json`]: checking raw JSON and reading it without building a tree;
//! - [`fingerprint`]: canonical SHA-256 digests of actions and results;
//! - [`text`]: features of assistant text (sketches, chanting);
//! - [`hash`]: the fast in-process hashes (result shapes, text tokens);
//! - [`classes`]: byte classes of 64-byte blocks as bit masks (SSE2 on x86_64);
//! - [`state`]: bounded per-session state;
//! - [`detectors`]: the detectors, one module each, and the list that makes them a set;
//! - [`policy`] and [`config`]: levels, modes, thresholds and overrides;
//! - [`engine`]: levels, episodes, modes, tombstones and session expiry;
//! - [`output`]: the output contract;
//! - [`store`]: sled and in-memory state stores;
//! - [`driver`]: the engine over a file on every core, in one thread's order;
//! - [`replay`], [`backtest`] and [`eval`]: the file-driven commands.

#![cfg_attr(not(test), warn(clippy::too_many_lines))]

pub mod backtest;
pub mod classes;
pub mod config;
pub mod content;
pub mod demo;
pub mod detectors;
pub mod driver;
pub mod engine;
pub mod eval;
pub mod event;
pub mod feed;
pub mod fingerprint;
#[doc(hidden)]
pub mod fuzz;
pub mod hash;
pub mod ingest;
pub mod json;
pub mod kafka;
pub mod otlp;
pub mod output;
pub mod pipeline;
pub mod policy;
pub mod replay;
pub mod shutdown;
pub mod simulate;
pub mod state;
pub mod store;
pub mod telemetry;
pub mod text;
