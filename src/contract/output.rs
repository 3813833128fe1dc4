//! The output contract (DESIGN §5): `session.warning`, `session.terminated` and
//! `session.summary`, exactly as the JSON Schemas in `schemas/` describe them.
//!
//! Guarantees: every output has a deterministic `event_id` (a hash of session, detector,
//! level and episode, or of the session's close), so consumers can drop duplicates and a
//! finding re-emitted after a crash is recognisably the same one.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest as _, Sha256};

use crate::contract::event::{hex, Outcome};
use crate::engine::detectors::DetectorKind;
use crate::engine::levels::{Level, Mode};
use crate::engine::state::SessionState;

/// Version of the output schemas.
pub const SCHEMA_VERSION: u32 = 1;
/// The most bytes an output's JSON takes, whatever its event names: a session id past
/// [`crate::contract::event::MAX_SESSION_ID_BYTES`] and other ids past
/// [`crate::contract::event::MAX_ID_BYTES`] are refused, labels kept to
/// [`crate::engine::state::MAX_LABEL`] bytes, tool names cut to
/// [`crate::engine::MAX_SHOWN_TOOL_NAME`] in reasons and hints and to 40 in stats, a Kafka
/// topic's name is at most 249 bytes, evidence holds numbers and digests of at most the
/// window's calls, and JSON writes a byte as at most six: about 15 kB at worst today
/// (`outputs_at_their_worst_stay_under_the_bound`), with room for fields to come.
/// Far under a broker's largest message (1 MB by default):
/// an output the broker refuses as too large is sent again until it is taken, and its
/// worker waits on it.
pub const MAX_OUTPUT_BYTES: usize = 32 * 1024;

/// Per-tool counts in `stats`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolStats {
    pub tool: String,
    pub calls: u64,
    pub repeats: u64,
}

/// Session statistics carried by every output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    pub events: u64,
    pub turns: u64,
    pub llm_calls: u64,
    pub tool_calls: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: u64,
    pub cache_write_tokens: u64,
    /// `null` when the session never reported a cost.
    pub cost_usd: Option<f64>,
    pub wall_seconds: f64,
    pub duplicates_dropped: u64,
    pub events_after_termination: u64,
    pub tools: Vec<ToolStats>,
}

/// `usd` to the micro-dollar; one too large to scale (past 1.8e302) as it is: the
/// scaled value would be infinite, which JSON writes as `null`.
fn micro_rounded(usd: f64) -> f64 {
    let micros = (usd * 1e6).round();
    if micros.is_finite() {
        micros / 1e6
    } else {
        usd
    }
}

impl Stats {
    pub fn of(st: &SessionState) -> Stats {
        let s = &st.stats;
        Stats {
            events: s.events,
            turns: s.turns,
            llm_calls: s.llm_calls,
            tool_calls: s.tool_calls,
            input_tokens: s.input_tokens,
            output_tokens: s.output_tokens,
            cache_read_tokens: s.cache_read_tokens,
            cache_write_tokens: s.cache_write_tokens,
            cost_usd: s.has_cost.then(|| micro_rounded(s.cost_usd)),
            wall_seconds: st.wall_seconds(),
            duplicates_dropped: s.duplicates,
            events_after_termination: s.dropped_after_termination,
            tools: st
                .tools
                .iter()
                .map(|t| ToolStats {
                    tool: t.tool.clone(),
                    calls: t.calls,
                    repeats: t.repeats,
                })
                .collect(),
        }
    }
}

/// The input event that fired a finding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Trigger {
    pub topic: Option<String>,
    pub partition: Option<i32>,
    pub offset: Option<i64>,
    pub event_id: String,
    /// The OpenTelemetry trace of that event (events mapped from spans carry it), so a
    /// kill switch that knows its agent's trace can match it; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
}

/// `session.warning` or `session.terminated`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FindingEvent {
    #[serde(rename = "type")]
    pub kind: String,
    pub schema_version: u32,
    pub event_id: String,
    pub session_id: String,
    pub run_id: Option<String>,
    pub agent_id: Option<String>,
    pub tenant: Option<String>,
    pub detector: DetectorKind,
    pub level: Level,
    pub reason: String,
    pub hint: String,
    pub evidence: Map<String, Value>,
    pub stats: Stats,
    pub trigger: Trigger,
    pub event_time: String,
    pub detected_at: String,
    pub mode: Mode,
    /// Only on `session.terminated`: the detector that stopped the session.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub stop_reason: Option<DetectorKind>,
}

/// Why a session closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClosedBy {
    /// `session.completed` arrived.
    Completed,
    /// No event for `session_gap` of event time.
    IdleTimeout,
    /// `replay` reached the end of its input.
    EndOfInput,
}

impl ClosedBy {
    /// The name used on the wire and in metric labels.
    pub fn name(self) -> &'static str {
        match self {
            ClosedBy::Completed => "completed",
            ClosedBy::IdleTimeout => "idle_timeout",
            ClosedBy::EndOfInput => "end_of_input",
        }
    }
}

/// `session.summary`: one per closed session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SummaryEvent {
    #[serde(rename = "type")]
    pub kind: String,
    pub schema_version: u32,
    pub event_id: String,
    pub session_id: String,
    pub run_id: Option<String>,
    pub agent_id: Option<String>,
    pub tenant: Option<String>,
    /// `done`, `idle_timeout`, `end_of_input`, or the detector that terminated it.
    pub stop_reason: String,
    pub closed_by: ClosedBy,
    /// The runtime's own `stop_reason` from `session.completed`, when it gave one.
    pub runtime_stop_reason: Option<String>,
    /// The task's outcome from `session.completed`, when the runtime gave one.
    pub outcome: Option<Outcome>,
    /// A shadow-mode detector that would have terminated the session.
    pub shadow_stop_reason: Option<DetectorKind>,
    pub started_at: String,
    pub ended_at: String,
    pub stats: Stats,
    /// Findings per detector and level, e.g. `{"repeat": {"warning": 1, "terminate": 1}}`.
    pub findings: BTreeMap<String, BTreeMap<String, u32>>,
    /// The OpenTelemetry trace of the event that completed the session (a root agent
    /// span's end), when it carried one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
}

/// Any output of the engine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Output {
    Finding(Box<FindingEvent>),
    Summary(Box<SummaryEvent>),
}

impl Output {
    pub fn session_id(&self) -> &str {
        match self {
            Output::Finding(f) => &f.session_id,
            Output::Summary(s) => &s.session_id,
        }
    }

    pub fn event_id(&self) -> &str {
        match self {
            Output::Finding(f) => &f.event_id,
            Output::Summary(s) => &s.event_id,
        }
    }

    pub fn type_name(&self) -> &str {
        match self {
            Output::Finding(f) => &f.kind,
            Output::Summary(s) => &s.kind,
        }
    }

    /// Whether the output goes to the bus (shadow findings are only reported locally).
    pub fn is_published(&self) -> bool {
        match self {
            Output::Finding(f) => f.mode != Mode::Shadow,
            Output::Summary(_) => true,
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("outputs always serialize")
    }
}

/// `event_id` of a finding: hash of session (its id and first event time), detector,
/// level and episode. The first event time tells a session id that comes back after its
/// session closed (an agent that resumes after `idle_timeout`, a runtime that reuses ids)
/// from the session before: its episodes count from 0 again, and with the same ids its
/// findings, a termination too, would be dropped as duplicates by every consumer that
/// drops them (`loopwarden-guard` among them).
pub fn finding_event_id(
    session_id: &str,
    first_event_ms: i64,
    detector: DetectorKind,
    level: Level,
    episode: u32,
) -> String {
    let mut h = Sha256::new();
    h.update(session_id.as_bytes());
    h.update([0]);
    h.update(first_event_ms.to_be_bytes());
    h.update(detector.name().as_bytes());
    h.update([0]);
    h.update(level.name().as_bytes());
    h.update([0]);
    h.update(episode.to_be_bytes());
    hex(&h.finalize()[..16])
}

/// `event_id` of a summary: hash of session and its first event time (a session id that
/// comes back after closing is a new session with a new summary).
pub fn summary_event_id(session_id: &str, first_event_ms: i64) -> String {
    let mut h = Sha256::new();
    h.update(session_id.as_bytes());
    h.update([0]);
    h.update(b"summary");
    h.update(first_event_ms.to_be_bytes());
    hex(&h.finalize()[..16])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closed_by_names_are_the_wire_names() {
        for c in [
            ClosedBy::Completed,
            ClosedBy::IdleTimeout,
            ClosedBy::EndOfInput,
        ] {
            assert_eq!(serde_json::to_value(c).unwrap(), c.name());
        }
    }
}
