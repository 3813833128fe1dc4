//! The growth workload of `benches/pipeline.rs` and `benches/store.rs` (issue 32).

/// The configuration the growth workload runs under: the step and tool-call ceilings out
/// of reach. Without it every session that takes more than 200 events is terminated at
/// its 200th (`turn_cap`) and its later events are dropped unapplied, so a run with few
/// sessions and many events each would measure mostly dropped events, and compare them
/// with a run with many sessions whose every event is applied. (The wall-clock ceiling,
/// 4 h of event time, would warn from about the 115 millionth event on.)
pub const GROWTH_CONFIG: &str =
    "[detectors.turn_cap]\nterminate_at = 1e12\n[detectors.tool_call_cap]\nterminate_at = 1e12\n";

/// The configuration of a workload run in-process: [`GROWTH_CONFIG`], and a session gap
/// of ten years, so that no session closes however long the run's event time grows.
#[allow(dead_code)] // the pipeline bench runs its own configuration
pub fn growth_config_never_closing(origin: &str) -> loopwarden::config::Config {
    loopwarden::config::Config::from_toml_str(
        &format!("[engine]\nsession_gap_secs = 315360000\n{GROWTH_CONFIG}"),
        origin,
        std::iter::empty(),
    )
    .unwrap()
}

/// Events of `sessions` sessions, round-robin, none completing: the `k`-th event is step
/// `k / sessions` of session `k % sessions`, a tool call with arguments and a result of
/// its own (under [`GROWTH_CONFIG`] no detector has a reason to fire), 0.1 ms of event
/// time apart (so a session's events are `sessions / 10` ms apart: under the 30-minute
/// session gap up to 18M sessions). Returns the session id and the event's JSON.
pub fn growth_event(k: u64, sessions: u64) -> (String, String) {
    let (session, step) = (k % sessions, k / sessions);
    let id = format!("grow-{session:08}");
    let ms = 1_763_000_000_000 + k as i64 / 10;
    let json = format!(
        concat!(
            r#"{{"type":"tool.called","event_id":"{id}#{step}","session_id":"{id}","#,
            r#""timestamp":"{ts}","tool":"read_file","args":{{"path":"src/m{session}/f{step}.rs"}},"#,
            r#""result":"fn step_{step}() {{ /* session {session} */ }}"}}"#
        ),
        id = id,
        step = step,
        session = session,
        ts = loopwarden::contract::event::format_rfc3339_ms(ms),
    );
    (id, json)
}
